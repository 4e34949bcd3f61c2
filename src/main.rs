//! The `fluxpipe` command: argument parsing only; each command lives in `cli/`.

use clap::{CommandFactory, Parser, Subcommand};
use fluxpipe::cli;
use std::process::ExitCode;

// jemalloc, as Vector runs on: millions of small, long-lived job entries
// made and freed by different threads fragment the system allocator's
// per-thread arenas (measured by `fluxpipe bench`, docs/benchmarks.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "fluxpipe",
    version = env!("FLUXPIPE_VERSION"),
    about = "A streaming processor for Flux eventlogs",
    after_help = "Without a command, fluxpipe runs the built-in default pipeline over the sample \
corpus shipped with it (tests/corpus): job state transitions, job summaries and anomalies \
as JSON Lines on stdout. `fluxpipe run --help` tells how to run your own."
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replay eventlogs and journals and print every job, rank and anomaly.
    Replay(cli::replay::ReplayArgs),
    /// Convert job ids between encodings, like `flux job id`.
    Id(cli::id::IdArgs),
    /// Run a streaming pipeline (a config file, or the built-in default).
    #[command(
        after_help = "Logs go to stderr: `[log]` in the config, or FLUXPIPE_LOG \
(a tracing filter such as `fluxpipe=info`), which wins. SIGTERM or SIGINT stops cleanly: \
sources stop reading, everything read is delivered, a final checkpoint is written. \
SIGHUP makes file sinks reopen their files (for logrotate). A second SIGTERM or SIGINT \
while it stops stops at once. Exit status: 0 after a clean stop, the end of a finite \
input or the reader of standard output gone; 1 on a config error, an unreadable \
checkpoint (see --reset-state), a data folder another run holds, a failed component or \
records not delivered at the stop; 2 when a second signal stopped it at once."
    )]
    Run(cli::run::RunArgs),
    /// Check a pipeline config file and exit non-zero on any problem.
    #[command(
        after_help = "Checks what `run` would refuse before it starts: TOML syntax, \
unknown keys and wrong types (with the file and line), every source and sink type \
and its options, sink inputs naming real output streams, listen addresses, and every \
alert rule (kind, state, duration). Nothing is opened or bound."
    )]
    Validate(cli::run::ValidateArgs),
    /// List the jobs a running fluxpipe holds, as `flux jobs` does.
    #[command(
        after_help = "Asks the query API of one or several running pipelines (--url, repeated for \
the members of a Kafka consumer group) and merges their answers. The columns are those of \
`flux jobs` that fluxpipe's job records carry; a CLUSTER column appears when jobs of several \
clusters are listed. Unlike `flux jobs`, every user's jobs are listed unless -u is given."
    )]
    Jobs(cli::jobs::JobsArgs),
    /// Show the nodes a running fluxpipe holds, as `flux resource` does.
    Resource(cli::resource::ResourceArgs),
    /// Show the records of chosen output streams of a running fluxpipe, live.
    #[command(
        after_help = "Reads /api/v1/tap of one or several running pipelines (--url, repeated) and \
prints their records as JSON Lines as they are made, until Ctrl-C or --count: for example \
`fluxpipe tap transitions alerts --cluster picl`, `fluxpipe tap resources --node node12`. \
Nothing is reconfigured; a stream no sink takes is made only while a tap reads it. A reader \
too slow for the pipeline loses records, never slows it: a line \
{\"kind\":\"tap_dropped\",\"dropped\":N} says how many."
    )]
    Tap(cli::tap::TapArgs),
    /// A live view of running fluxpipes in the terminal, as `vector top`.
    #[command(
        after_help = "Looks at /metrics and the query API of one or several running pipelines \
(--url, repeated) every --interval seconds: per source and sink, records per second, totals, \
lag, buffers, errors and drops; per cluster, jobs per state and nodes; the alerts firing; \
the checkpoint's age. q, Esc or Ctrl-C leaves. --once prints one frame as text and exits."
    )]
    Top(cli::top::TopArgs),
    /// Ask the job archive a `database` sink keeps: past jobs, node changes.
    #[command(
        after_help = "Reads the SQLite or PostgreSQL database a `database` sink writes (--db, its \
`url`), as `sacct` reads Slurm's: jobs by cluster, user, queue, result, time window, node \
or id, newest end first, printed as `flux jobs` prints them or as JSON Lines; --nodes for \
drains, undrains and outages; --transitions for job state changes. Examples: \
`fluxpipe history --db sqlite:///var/lib/fluxpipe/jobs.db --node node12 --since yesterday --until today`, \
`fluxpipe history --db postgres://fluxpipe@db/fluxpipe --result failed,timeout -q batch --since 7d`."
    )]
    History(cli::history::HistoryArgs),
    /// Report usage from the job archive, grouped as `sreport` groups it.
    #[command(
        after_help = "Reads the archive a `database` sink writes (--db, its `url`). `report jobs`: \
one row per group (--by cluster, queue, user, day, week, month) of the jobs that finished in \
the window: jobs by result, core-, GPU- and node-hours, waits (mean, p50, p90, max) and mean \
run time; --format table, json or csv. Examples: \
`fluxpipe report jobs --db sqlite:///var/lib/fluxpipe/jobs.db --since 30d --by cluster,user --sort core_hours`, \
`fluxpipe report jobs --db postgres://fluxpipe@db/fluxpipe --since 7d --by queue,day --format csv`."
    )]
    Report(cli::report::ReportArgs),
    /// Write synthetic Flux traffic (journal JSON Lines or a KVS dump tree).
    Generate(cli::generate::GenerateArgs),
    /// Measure throughput, memory and latency on a generated workload.
    Bench(cli::bench::BenchArgs),
    /// Print a shell's completion script for fluxpipe.
    #[command(
        after_help = "For example: `fluxpipe completions bash > /etc/bash_completion.d/fluxpipe`, \
`fluxpipe completions zsh > \"${fpath[1]}/_fluxpipe\"`."
    )]
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print fluxpipe's manual page (roff), e.g. `fluxpipe man | man -l -`.
    Man,
    /// Print the command-line reference as Markdown (`docs/cli.md` is its
    /// output: `fluxpipe reference > docs/cli.md`).
    Reference,
}

/// Die by SIGPIPE when the reader of standard output goes away
/// (`fluxpipe jobs | head`), as Unix tools do, rather than print "Broken
/// pipe". Not for `run`: its sockets and pipes to sinks must fail as
/// errors, which it handles.
fn die_on_closed_output() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: sets the default disposition before any thread is started;
    // no handler of ours is replaced.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// Whether an error is the reader of our output going away.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<fluxpipe::sinks::OutputClosed>().is_some()
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !matches!(args.command, None | Some(Command::Run(_))) {
        die_on_closed_output();
    }
    let result = match args.command {
        Some(Command::Replay(a)) => cli::replay::run(a),
        Some(Command::Id(a)) => cli::id::run(a),
        Some(Command::Run(a)) => cli::run::run(a),
        Some(Command::Validate(a)) => cli::run::validate(a),
        Some(Command::Jobs(a)) => cli::jobs::run(a),
        Some(Command::Resource(a)) => cli::resource::run(a),
        Some(Command::Tap(a)) => cli::tap::run(a),
        Some(Command::Top(a)) => cli::top::run(a),
        Some(Command::History(a)) => cli::history::run(a),
        Some(Command::Report(a)) => cli::report::run(a),
        Some(Command::Generate(a)) => cli::generate::run(a),
        Some(Command::Bench(a)) => cli::bench::run(a),
        Some(Command::Completions { shell }) => {
            clap_complete::generate(
                shell,
                &mut Args::command(),
                "fluxpipe",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man) => clap_mangen::Man::new(Args::command())
            .render(&mut std::io::stdout())
            .map(|()| ExitCode::SUCCESS)
            .map_err(Into::into),
        Some(Command::Reference) => {
            let options = clap_markdown::MarkdownOptions::new()
                .title("The fluxpipe command line".to_string())
                .show_footer(false);
            print!("{}", clap_markdown::help_markdown_custom::<Args>(&options));
            Ok(ExitCode::SUCCESS)
        }
        // The embedded default: the default pipeline over the sample corpus.
        None => cli::run::run(cli::run::RunArgs::embedded_default()),
    };
    match result {
        Ok(code) => code,
        // `fluxpipe ... | head`: the reader had enough; nothing went wrong.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fluxpipe: {e:#}");
            ExitCode::FAILURE
        }
    }
}
