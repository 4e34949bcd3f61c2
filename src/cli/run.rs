//! `fluxpipe run`: run a pipeline, from a config file or the built-in
//! default; `fluxpipe validate`: check a config file.

use crate::pipeline::config::{self, Config, LogFormat};
use crate::pipeline::topology;
use anyhow::{Result, anyhow};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Pipeline config (TOML). Without it, the built-in default runs: read
    /// eventlogs from the PATHs given (tailing them), or from standard input,
    /// and print transitions, job summaries and anomalies as JSON Lines.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Checkpoints and state here instead of the config's `data_dir`.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Start from nothing: set the checkpoint in the data folder aside (as
    /// `checkpoint.bin.reset`) instead of restoring it.
    #[arg(long)]
    pub reset_state: bool,
    /// Restore the checkpoint even though it was written by a pipeline
    /// whose sources read other files, topics or groups.
    #[arg(long, conflicts_with = "reset_state")]
    pub adopt_checkpoint: bool,
    /// Files or folders for the built-in default (not with --config,
    /// whose sources say what to read).
    #[arg(conflicts_with = "config")]
    pub paths: Vec<PathBuf>,
    /// The data folder is this run's alone (the embedded default's):
    /// removed when it ends.
    #[arg(skip)]
    pub scratch_data_dir: bool,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Pipeline config (TOML) to check.
    #[arg(long, short, conflicts_with = "file")]
    pub config: Option<PathBuf>,
    /// The config to check, named without `--config`.
    #[arg(required_unless_present = "config")]
    pub file: Option<PathBuf>,
}

/// The built-in default pipeline.
pub fn default_config(paths: &[PathBuf]) -> String {
    let mut text = String::from(
        "# fluxpipe's built-in default\n\
         [sinks.stdout]\n\
         type = \"stdout\"\n\
         inputs = [\"transitions\", \"jobs\", \"anomalies\"]\n\n",
    );
    if paths.is_empty() {
        text.push_str("[sources.stdin]\ntype = \"stdin\"\n");
    } else {
        let include: Vec<String> = paths
            .iter()
            .map(|p| {
                let p = p.display().to_string();
                if std::path::Path::new(&p).is_dir() {
                    format!("{:?}", format!("{}/**/*", p.trim_end_matches('/')))
                } else {
                    format!("{p:?}")
                }
            })
            .collect();
        text.push_str(&format!(
            "[sources.files]\ntype = \"file\"\ninclude = [{}]\n",
            include.join(", ")
        ));
    }
    text
}

fn report(errors: &[config::ConfigError], path: &str) {
    for e in errors {
        eprintln!("fluxpipe: {path}: {e}");
    }
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLUXPIPE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second call (tests running several pipelines) keeps the first.
    let _ = match config.log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

impl RunArgs {
    /// What `fluxpipe` with no command runs: the built-in default pipeline
    /// over the sample corpus shipped in the repository (every job folder
    /// and instance B's journals), tailing it until SIGINT/SIGTERM.
    pub fn embedded_default() -> Self {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
        RunArgs {
            config: None,
            // A fresh folder each time: the demo always starts from the top.
            data_dir: Some(
                std::env::temp_dir().join(format!("fluxpipe-demo-{}", std::process::id())),
            ),
            reset_state: false,
            adopt_checkpoint: false,
            paths: vec![corpus.join("jobs"), corpus.join("instances/B/journals")],
            scratch_data_dir: true,
        }
    }
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let (config, label) = match &args.config {
        Some(path) => match config::load(path) {
            Ok(c) => (c, path.display().to_string()),
            Err(errors) => {
                report(&errors, &path.display().to_string());
                return Ok(ExitCode::FAILURE);
            }
        },
        None => match config::parse(&default_config(&args.paths)) {
            Ok(c) => (c, "built-in default".to_string()),
            Err(errors) => {
                report(&errors, "built-in default");
                return Ok(ExitCode::FAILURE);
            }
        },
    };
    let mut config = config;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    config.adopt_checkpoint = args.adopt_checkpoint;
    init_logging(&config);
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow!("cannot create data_dir {}: {e}", dir.display()))?;
    // Held until this function returns (the kernel lets go if it dies).
    let lock = crate::checkpoint::lock::DataDirLock::acquire(dir)?;
    tracing::info!(
        version = env!("FLUXPIPE_VERSION"),
        config = %label,
        data_dir = %dir.display(),
        sources = config.sources.len(),
        sinks = config.sinks.len(),
        "starting"
    );
    if args.reset_state {
        match crate::checkpoint::file::set_aside(&config.data_dir)? {
            Some(aside) => eprintln!(
                "fluxpipe: --reset-state: starting from nothing; the old checkpoint is kept as {}",
                aside.display()
            ),
            None => eprintln!("fluxpipe: --reset-state: there was no checkpoint"),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the runtime: {e}"))?;
    let data_dir = config.data_dir.clone();
    let result = runtime.block_on(topology::run(config, CancellationToken::new()));
    // A read of standard input may still block in its thread: do not wait
    // for it once the pipeline is done.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    if args.scratch_data_dir {
        drop(lock);
        if let Err(e) = std::fs::remove_dir_all(&data_dir) {
            tracing::warn!(data_dir = %data_dir.display(), "cannot remove the demo's data folder: {e}");
        }
    }
    result?;
    Ok(ExitCode::SUCCESS)
}

pub fn validate(args: ValidateArgs) -> Result<ExitCode> {
    let Some(path) = args.config.or(args.file) else {
        return Err(anyhow!("name the config to check"));
    };
    let label = path.display().to_string();
    match config::load(&path) {
        Ok(c) => {
            // What can be known without starting: the data folder, the
            // addresses, the files.
            let problems = crate::pipeline::preflight::problems(&c);
            for w in crate::pipeline::preflight::warnings(&c) {
                eprintln!("fluxpipe: {label}: warning: {w}");
            }
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("fluxpipe: {label}: {p}");
                }
                return Ok(ExitCode::FAILURE);
            }
            println!(
                "{label}: ok ({}, {})",
                super::listing::counted(c.sources.len(), "source", "sources"),
                super::listing::counted(c.sinks.len(), "sink", "sinks"),
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            report(&errors, &label);
            Ok(ExitCode::FAILURE)
        }
    }
}
