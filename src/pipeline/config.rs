//! Pipeline configuration: TOML in the style of Vector, with named
//! `[sources.NAME]` and `[sinks.NAME]` tables, each with a `type`.
//!
//! Parsing rejects unknown keys and types (serde); `validate` then checks
//! what serde cannot: sink inputs name real output streams, no two
//! listeners share an address, paths can be read or written. Every error
//! names the key and the line.

use crate::component::SocketMode;
use crate::decode::{EventStream, Format};
use crate::flux::jobid::JobId;
use crate::keyed::alerts::Clock;
use crate::keyed::alerts::rule::{Rule, RuleError, RuleKind, default_rules};
use crate::sinks::SinkConfig;
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A whole pipeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Checkpoints and state. Default: `fluxpipe` under the user's data folder.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Worker tasks for the job operator (default: one per core).
    #[serde(default)]
    pub workers: Option<usize>,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub operators: OperatorConfig,
    #[serde(default)]
    pub alerts: AlertsConfig,
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    #[serde(default)]
    pub sources: BTreeMap<String, SourceConfig>,
    #[serde(default)]
    pub sinks: BTreeMap<String, SinkConfig>,
}

fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("fluxpipe")
}

/// `[log]`: the pipeline's own logging (quiet by default).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter, e.g. `warn` or `fluxpipe=debug`.
    #[serde(default = "default_log_level")]
    pub level: String,
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: default_log_level(),
            format: LogFormat::Text,
        }
    }
}

fn default_log_level() -> String {
    "warn".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[operators]`: how long state is kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Seconds an INACTIVE job is kept after its summary, so late
    /// duplicates are recognized instead of starting a new job.
    #[serde(default = "default_inactive_grace")]
    pub inactive_grace_secs: f64,
    /// Seconds a job that never got a `submit` (only exec events, say) is
    /// kept waiting for it before it is dropped with an anomaly.
    #[serde(default = "default_orphan_ttl")]
    pub orphan_ttl_secs: f64,
    /// Most jobs held at once (all workers together). Records of a job not
    /// yet held are refused beyond it (counted in
    /// `fluxpipe_jobs_refused_total` and logged): a flood of submits for
    /// jobs that never end cannot take all memory, and the jobs already
    /// held keep being followed.
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
}

fn default_max_jobs() -> usize {
    // About 2.5 GB at today's ~2.4 KB per job.
    1_000_000
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            inactive_grace_secs: default_inactive_grace(),
            orphan_ttl_secs: default_orphan_ttl(),
            max_jobs: default_max_jobs(),
        }
    }
}

fn default_inactive_grace() -> f64 {
    60.0
}

fn default_orphan_ttl() -> f64 {
    3600.0
}

/// `[checkpoint]`: how often the state and the source positions are saved
/// to `data_dir` (and always at shutdown).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Seconds between checkpoints; 0: only at shutdown.
    #[serde(default = "default_checkpoint_interval")]
    pub interval_secs: f64,
    /// Longest one checkpoint may take (sources reaching the barrier,
    /// shards saving, sinks delivering) before it is abandoned.
    #[serde(default = "default_checkpoint_timeout")]
    pub timeout_secs: f64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval_secs: default_checkpoint_interval(),
            timeout_secs: default_checkpoint_timeout(),
        }
    }
}

fn default_checkpoint_interval() -> f64 {
    10.0
}

fn default_checkpoint_timeout() -> f64 {
    60.0
}

/// `[alerts]`: the clock and the rules.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    #[serde(default)]
    pub clock: Clock,
    /// `[alerts.rules.NAME]`; when absent, the built-in default rules.
    #[serde(default)]
    pub rules: Option<BTreeMap<String, RuleConfig>>,
}

/// `[alerts.rules.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub kind: String,
    /// The job state, for `kind = "job_state"`.
    #[serde(default)]
    pub state: Option<String>,
    /// How long the condition must hold (`90s`, `10m`, `24h`, `7d`).
    #[serde(rename = "for")]
    pub hold: String,
    #[serde(default = "default_severity")]
    pub severity: String,
}

fn default_severity() -> String {
    "warning".into()
}

impl AlertsConfig {
    /// The rules in force, or the first problem: (rule name, key, error).
    pub fn rules(&self) -> Result<Vec<Rule>, (String, &'static str, RuleError)> {
        let Some(rules) = &self.rules else {
            return Ok(default_rules());
        };
        rules
            .iter()
            .map(|(name, r)| {
                let kind = RuleKind::from_parts(&r.kind, r.state.as_deref()).map_err(|e| {
                    let key = match e {
                        RuleError::UnknownKind(_) => "kind",
                        _ => "state",
                    };
                    (name.clone(), key, e)
                })?;
                Rule::new(name, kind, &r.hold, &r.severity).map_err(|e| (name.clone(), "for", e))
            })
            .collect()
    }
}

/// How a source's lines are read: every source type has these keys.
#[derive(Debug, Clone)]
pub struct DecodeConfig {
    pub cluster: String,
    pub format: Format,
    pub stream: Option<EventStream>,
    pub job_id: Option<JobId>,
    pub max_line_bytes: usize,
}

/// Declares a source config struct with its own keys plus the decoding keys
/// every source has. (serde's `flatten` cannot be combined with
/// `deny_unknown_fields`, and unknown keys must be refused.)
macro_rules! source_config {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// Default cluster for inputs that do not name one.
            #[serde(default = "crate::pipeline::config::default_cluster")]
            pub cluster: String,
            /// Line format (`auto` tells them apart per line).
            #[serde(default, deserialize_with = "crate::pipeline::config::de_format")]
            pub format: $crate::decode::Format,
            /// Stream of plain events whose origin does not say.
            #[serde(default, deserialize_with = "crate::pipeline::config::de_stream")]
            pub stream: Option<$crate::decode::EventStream>,
            /// Job of plain job or exec events whose origin does not say.
            #[serde(default, deserialize_with = "crate::pipeline::config::de_jobid")]
            pub job_id: Option<$crate::flux::jobid::JobId>,
            /// Longest line accepted; longer lines go to `dead_letter`.
            #[serde(default = "crate::pipeline::config::default_max_line")]
            pub max_line_bytes: usize,
        }

        impl $name {
            pub fn decode(&self) -> $crate::pipeline::config::DecodeConfig {
                $crate::pipeline::config::DecodeConfig {
                    cluster: self.cluster.clone(),
                    format: self.format,
                    stream: self.stream,
                    job_id: self.job_id,
                    max_line_bytes: self.max_line_bytes,
                }
            }
        }
    };
}
pub(crate) use source_config;

fn default_true() -> bool {
    true
}

pub(crate) fn default_cluster() -> String {
    "default".into()
}

pub(crate) fn default_max_line() -> usize {
    1024 * 1024
}

pub(crate) fn de_format<'de, D: Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
    let s = String::deserialize(d)?;
    Format::parse(&s).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "format: unknown format `{s}`; expected auto, event, job-journal, resource-journal, exec-protocol or envelope"
        ))
    })
}

pub(crate) fn de_stream<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EventStream>, D::Error> {
    let s = String::deserialize(d)?;
    EventStream::parse(&s).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "stream: unknown stream `{s}`; expected job, exec or resource"
        ))
    })
}

pub(crate) fn de_jobid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<JobId>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Num(u64),
        Text(String),
    }
    match Id::deserialize(d)? {
        Id::Num(n) => Ok(Some(JobId(n))),
        Id::Text(s) => JobId::parse(&s)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("job_id: {e}"))),
    }
}

/// `[sources.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceConfig {
    File(FileSourceConfig),
    Socket(SocketSourceConfig),
    Http(crate::sources::http::HttpSourceConfig),
    Stdin(StdinSourceConfig),
    Kafka(KafkaSourceConfig),
}

impl SourceConfig {
    pub fn decode(&self) -> DecodeConfig {
        match self {
            SourceConfig::File(c) => c.decode(),
            SourceConfig::Socket(c) => c.decode(),
            SourceConfig::Http(c) => c.decode(),
            SourceConfig::Stdin(c) => c.decode(),
            SourceConfig::Kafka(c) => c.decode(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadFrom {
    #[default]
    Beginning,
    End,
}

source_config! {
    /// `type = "file"`: eventlogs and journals on disk, tailed.
    FileSourceConfig {
        /// Glob patterns (`**` matches any depth).
        include: Vec<String>,
        #[serde(default)]
        exclude: Vec<String>,
        /// Where to start in a file with no checkpoint.
        #[serde(default)]
        read_from: ReadFrom,
        /// How often to look for new files and appended lines, in milliseconds.
        #[serde(default = "default_poll_ms")]
        poll_interval_ms: u64,
    }
}

fn default_poll_ms() -> u64 {
    250
}

source_config! {
    /// `type = "socket"`: newline-delimited TCP or Unix stream, or UDP datagrams.
    SocketSourceConfig {
        #[serde(default)]
        mode: SocketMode,
        /// `host:port` (tcp, udp) or a socket path (unix).
        address: String,
        /// Most concurrent connections (tcp, unix); more wait in the backlog.
        #[serde(default = "default_max_connections")]
        max_connections: usize,
    }
}

fn default_max_connections() -> usize {
    256
}

source_config! {
    /// `type = "stdin"`.
    StdinSourceConfig {}
}

source_config! {
    /// `type = "kafka"`: a consumer group member (rdkafka, bundled librdkafka).
    KafkaSourceConfig {
        /// `host:port,host:port`.
        bootstrap_servers: String,
        topics: Vec<String>,
        group_id: String,
        /// Keep job and node state in a changelog topic so that members of
        /// the group can take partitions over from each other (scale-out).
        /// Off: one instance per group only.
        #[serde(default = "default_true")]
        changelog: bool,
        /// The changelog topic; default `<group_id>-changelog`. Created
        /// (compacted, as many partitions as the input topic) if missing.
        #[serde(default)]
        changelog_topic: Option<String>,
        /// Passed to librdkafka as they are (SASL, TLS, tuning); they win
        /// over fluxpipe's own settings.
        #[serde(default)]
        librdkafka_options: BTreeMap<String, String>,
    }
}

impl KafkaSourceConfig {
    /// The changelog topic, if the source keeps one.
    pub fn changelog_topic(&self) -> Option<String> {
        self.changelog.then(|| {
            self.changelog_topic
                .clone()
                .unwrap_or_else(|| format!("{}-changelog", self.group_id))
        })
    }
}

/// A configuration error, with the line it concerns when known.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("line {line}: {message}")]
    At { line: usize, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// Parse TOML text into a config and validate it.
pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
    let config: Config = toml::from_str(text).map_err(|e| {
        vec![typed_table_error(text).unwrap_or_else(|| ConfigError::Parse(e.to_string()))]
    })?;
    let errors = validate(&config, text);
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// The error inside a `[sources.NAME]` or `[sinks.NAME]` table, at the
/// line of the key at fault. serde reads a table tagged by `type` into a
/// buffer first, which loses every position but the table's own, so each
/// such table is read again here straight into its type's struct.
fn typed_table_error(text: &str) -> Option<ConfigError> {
    use toml::de::{DeTable, DeValue, Deserializer};
    let root = DeTable::parse(text).ok()?.into_inner();
    for (section, value) in root {
        let DeValue::Table(entries) = value.into_inner() else {
            continue;
        };
        let section = section.into_inner();
        for (name, table) in entries {
            let span = table.span();
            let DeValue::Table(table) = table.into_inner() else {
                continue;
            };
            let kind = table.iter().find_map(|(k, v)| match v.get_ref() {
                DeValue::String(s) if k.get_ref() == "type" => Some(s.to_string()),
                _ => None,
            });
            let Some(kind) = kind else { continue };
            let keys: Vec<(String, std::ops::Range<usize>)> = table
                .iter()
                .map(|(k, v)| (k.get_ref().to_string(), k.span().start..v.span().end))
                .collect();
            let rest: DeTable = table
                .into_iter()
                .filter(|(k, _)| k.get_ref() != "type")
                .collect();
            let de = Deserializer::from(toml::Spanned::new(span.clone(), rest));
            let result = match (&*section, kind.as_str()) {
                ("sources", "file") => FileSourceConfig::deserialize(de).err(),
                ("sources", "socket") => SocketSourceConfig::deserialize(de).err(),
                ("sources", "stdin") => StdinSourceConfig::deserialize(de).err(),
                ("sources", "http") => {
                    crate::sources::http::HttpSourceConfig::deserialize(de).err()
                }
                ("sources", "kafka") => KafkaSourceConfig::deserialize(de).err(),
                ("sinks", kind) => SinkConfig::table_error(kind, de),
                _ => None,
            };
            if let Some(e) = result {
                let at = e.span().map_or(span.start, |s| s.start).min(text.len());
                let line = text.as_bytes()[..at]
                    .iter()
                    .filter(|b| **b == b'\n')
                    .count()
                    + 1;
                let mut path = format!("{section}.{}", name.get_ref());
                let message = e.message();
                if let Some((key, _)) = keys.iter().find(|(_, r)| r.contains(&at)) {
                    // serde names the key itself in some messages only.
                    if !message.starts_with(key.as_str()) && !message.contains(&format!("`{key}`"))
                    {
                        path = format!("{path}.{key}");
                    }
                }
                return Some(ConfigError::At {
                    line,
                    message: format!("{path}: {message}"),
                });
            }
        }
    }
    None
}

/// Read, parse and validate a config file.
pub fn load(path: &Path) -> Result<Config, Vec<ConfigError>> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        vec![ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }]
    })?;
    parse(&text)
}

/// Finds the line of a key in the config text, for error messages.
struct Locator<'t> {
    text: &'t str,
    root: Option<toml::Spanned<toml::de::DeTable<'t>>>,
}

impl<'t> Locator<'t> {
    fn new(text: &'t str) -> Self {
        Locator {
            text,
            root: toml::de::DeTable::parse(text).ok(),
        }
    }

    /// The line of `path` (table keys, then optionally an array index).
    fn line(&self, path: &[&str], index: Option<usize>) -> Option<usize> {
        let root = self.root.as_ref()?;
        let mut table = root.get_ref();
        let mut span = root.span();
        for (i, key) in path.iter().enumerate() {
            let (k, v) = table.iter().find(|(k, _)| k.get_ref() == key)?;
            span = k.span();
            match v.get_ref() {
                toml::de::DeValue::Table(t) if i + 1 < path.len() => table = t,
                toml::de::DeValue::Array(a) if i + 1 == path.len() => {
                    if let Some(el) = index.and_then(|n| a.get(n)) {
                        span = el.span();
                    }
                }
                _ if i + 1 < path.len() => return None,
                _ => {}
            }
        }
        let end = span.start.min(self.text.len());
        Some(
            self.text.as_bytes()[..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1,
        )
    }

    fn error(&self, path: &[&str], index: Option<usize>, message: String) -> ConfigError {
        match self.line(path, index) {
            Some(line) => ConfigError::At { line, message },
            None => ConfigError::Invalid(message),
        }
    }
}

/// The checks serde cannot make. Returns every problem found.
pub fn validate(config: &Config, text: &str) -> Vec<ConfigError> {
    let loc = Locator::new(text);
    let mut errors = Vec::new();
    if config.sources.is_empty() {
        errors.push(ConfigError::Invalid(
            "no [sources.NAME] table: a pipeline needs at least one source".into(),
        ));
    }
    if config.sinks.is_empty() {
        errors.push(ConfigError::Invalid(
            "no [sinks.NAME] table: a pipeline needs at least one sink".into(),
        ));
    }
    if config.workers == Some(0) {
        errors.push(loc.error(&["workers"], None, "workers: must be at least 1".into()));
    }
    let mut listeners: HashMap<String, String> = HashMap::new();
    for (name, source) in &config.sources {
        let key = |k: &'static str| ["sources", name.as_str(), k];
        if source.decode().max_line_bytes == 0 {
            errors.push(loc.error(
                &key("max_line_bytes"),
                None,
                format!("sources.{name}.max_line_bytes: must be at least 1"),
            ));
        }
        match source {
            SourceConfig::File(f) => {
                if f.include.is_empty() {
                    errors.push(loc.error(
                        &key("include"),
                        None,
                        format!("sources.{name}.include: at least one pattern is needed"),
                    ));
                }
                for (i, pat) in f.include.iter().chain(&f.exclude).enumerate() {
                    if let Some(e) = glob_problem(pat) {
                        let (k, i) = if i < f.include.len() {
                            ("include", i)
                        } else {
                            ("exclude", i - f.include.len())
                        };
                        errors.push(loc.error(
                            &key(k),
                            Some(i),
                            format!("sources.{name}.{k} `{pat}`: {e}"),
                        ));
                    }
                }
            }
            SourceConfig::Socket(s) => {
                let addr = &s.address;
                let listener = match s.mode {
                    SocketMode::Unix => format!("unix:{addr}"),
                    SocketMode::Tcp => format!("tcp:{addr}"),
                    SocketMode::Udp => format!("udp:{addr}"),
                };
                if s.mode != SocketMode::Unix && addr.parse::<std::net::SocketAddr>().is_err() {
                    errors.push(loc.error(
                        &key("address"),
                        None,
                        format!("sources.{name}.address `{addr}`: not an IP address and port"),
                    ));
                }
                if s.mode == SocketMode::Unix
                    && let Some(parent) = Path::new(addr).parent()
                    && !parent.as_os_str().is_empty()
                    && !parent.is_dir()
                {
                    errors.push(loc.error(
                        &key("address"),
                        None,
                        format!(
                            "sources.{name}.address `{addr}`: folder {} does not exist",
                            parent.display()
                        ),
                    ));
                }
                if s.max_connections == 0 {
                    errors.push(loc.error(
                        &key("max_connections"),
                        None,
                        format!("sources.{name}.max_connections: must be at least 1"),
                    ));
                }
                if let Some(other) = listeners.insert(listener, format!("sources.{name}")) {
                    errors.push(loc.error(
                        &key("address"),
                        None,
                        format!("sources.{name}.address `{addr}`: already used by {other}"),
                    ));
                }
            }
            SourceConfig::Http(h) => {
                for (k, message) in h.problems() {
                    // A key of a sub-table (`tls.crt_file`) is found by its parts.
                    let path: Vec<&str> = ["sources", name.as_str()]
                        .into_iter()
                        .chain(k.split('.'))
                        .collect();
                    errors.push(loc.error(&path, None, format!("sources.{name}.{k}: {message}")));
                }
                if let Some(other) =
                    listeners.insert(format!("tcp:{}", h.address), format!("sources.{name}"))
                {
                    errors.push(loc.error(
                        &key("address"),
                        None,
                        format!(
                            "sources.{name}.address `{}`: already used by {other}",
                            h.address
                        ),
                    ));
                }
            }
            SourceConfig::Stdin(_) => {}
            SourceConfig::Kafka(k) => {
                for (k_, empty) in [
                    ("bootstrap_servers", k.bootstrap_servers.trim().is_empty()),
                    ("topics", k.topics.is_empty()),
                    ("group_id", k.group_id.trim().is_empty()),
                ] {
                    if empty {
                        errors.push(loc.error(
                            &key(k_),
                            None,
                            format!("sources.{name}.{k_}: must not be empty"),
                        ));
                    }
                }
                // A job's state is owned by one input partition; across
                // topics, the same partition number would not go to the
                // same member.
                if k.changelog && k.topics.len() > 1 {
                    errors.push(loc.error(
                        &key("topics"),
                        None,
                        format!(
                            "sources.{name}.topics: a source with a changelog reads one topic (use one source per topic, or set changelog = false for a single instance)"
                        ),
                    ));
                }
            }
        }
    }
    let stdin_sources = config
        .sources
        .values()
        .filter(|s| matches!(s, SourceConfig::Stdin(_)))
        .count();
    if stdin_sources > 1 {
        errors.push(ConfigError::Invalid(
            "more than one stdin source: standard input can be read once".into(),
        ));
    }
    for (name, sink) in &config.sinks {
        // The prometheus sink takes no inputs: only its own keys count.
        let mut problems = match sink {
            SinkConfig::Prometheus(_) => Vec::new(),
            _ => sink.common().problems(),
        };
        problems.extend(sink.problems());
        for p in problems {
            errors.push(loc.error(
                &["sinks", name.as_str(), p.key],
                p.index,
                format!("sinks.{name}.{}{}", p.key, p.message),
            ));
        }
        if let SinkConfig::Prometheus(p) = sink
            && let Some(other) =
                listeners.insert(format!("tcp:{}", p.address), format!("sinks.{name}"))
        {
            errors.push(loc.error(
                &["sinks", name.as_str(), "address"],
                None,
                format!(
                    "sinks.{name}.address `{}`: already used by {other}",
                    p.address
                ),
            ));
        }
    }
    if let Err((rule, k, e)) = config.alerts.rules() {
        errors.push(loc.error(
            &["alerts", "rules", rule.as_str(), k],
            None,
            format!("alerts.rules.{rule}.{k}: {e}"),
        ));
    }
    errors
}

/// Why a glob pattern cannot work, if it cannot.
fn glob_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() {
        return Some("empty pattern".into());
    }
    if let Err(e) = globset::Glob::new(pattern) {
        return Some(e.to_string());
    }
    // The fixed part before the first wildcard must be readable.
    let base: PathBuf = Path::new(pattern)
        .components()
        .take_while(|c| {
            !c.as_os_str()
                .to_string_lossy()
                .contains(['*', '?', '[', '{'])
        })
        .collect();
    let mut dir = base.as_path();
    while !dir.as_os_str().is_empty() && !dir.exists() {
        dir = dir.parent().unwrap_or(Path::new(""));
    }
    if !dir.as_os_str().is_empty() && std::fs::read_dir(dir).is_err() && dir.is_dir() {
        return Some(format!("folder {} cannot be read", dir.display()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputStream;

    fn errors(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => vec![],
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn the_issue_example_parses() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
data_dir = "{d}/state"

[sources.journal]
type = "socket"
mode = "tcp"
address = "127.0.0.1:7070"
cluster = "picl"

[sources.dumps]
type = "file"
include = ["{d}/dump/**/eventlog"]
read_from = "beginning"

[sinks.out]
type = "file"
path = "{d}/records.jsonl"
inputs = ["transitions", "jobs", "alerts", "anomalies"]
"#,
            d = dir.path().display()
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.sources.len(), 2);
        assert_eq!(c.sources["journal"].decode().cluster, "picl");
        assert_eq!(c.sources["dumps"].decode().cluster, "default");
        assert_eq!(c.sinks["out"].common().inputs.len(), 4);
        let bits = c.sinks["out"].common().stream_bits();
        assert!(bits & OutputStream::Jobs.bit() != 0 && bits & OutputStream::Events.bit() == 0);
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = errors(
            "[sources.a]\ntype = \"stdin\"\n\n[sinks.b]\ntype = \"stdout\"\ninputs = [\"jobz\"]\n",
        );
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("line 6:") && e[0].contains("jobz"),
            "{e:?}"
        );

        let e = errors("[sources.a]\ntype = \"stdin\"\nbogus = 1\n");
        assert!(e[0].contains("bogus") && e[0].contains("line 3"), "{e:?}");

        let e = errors("[sources.a]\ntype = \"carrier-pigeon\"\n");
        assert!(e[0].contains("carrier-pigeon"), "{e:?}");

        let e = errors(
            "[sources.a]\ntype = \"socket\"\naddress = \"127.0.0.1:7000\"\n\
             [sources.b]\ntype = \"socket\"\naddress = \"127.0.0.1:7000\"\n\
             [sinks.c]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n",
        );
        assert!(
            e.iter()
                .any(|m| m.contains("line 6") && m.contains("already used by sources.a")),
            "{e:?}"
        );

        let e = errors("[sinks.c]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n");
        assert!(e.iter().any(|m| m.contains("no [sources.NAME]")), "{e:?}");

        let e = errors(
            "[sources.a]\ntype = \"stdin\"\nformat = \"xml\"\n[sinks.c]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n",
        );
        // Inside a table tagged by `type`, the key's own line.
        assert!(
            e[0].contains("sources.a: format: unknown format `xml`") && e[0].contains("line 3"),
            "{e:?}"
        );

        let e = errors(
            "[sources.a]\ntype = \"stdin\"\n[sinks.c]\ntype = \"http\"\ninputs = [\"jobs\"]\n\
             uri = \"http://127.0.0.1:1/\"\nbatch_max_records = \"many\"\n",
        );
        assert!(
            e[0].starts_with("line 7: sinks.c.batch_max_records: invalid type"),
            "{e:?}"
        );
    }

    #[test]
    fn stream_names_round_trip() {
        for s in OutputStream::ALL {
            assert_eq!(OutputStream::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn blackhole_sink_takes_inputs_and_nothing_else() {
        let ok = "[sources.a]\ntype = \"stdin\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = [\"transitions\", \"jobs\"]\n";
        assert!(errors(ok).is_empty(), "{:?}", errors(ok));
        let e =
            errors("[sources.a]\ntype = \"stdin\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = []\n");
        assert!(e.iter().any(|m| m.contains("sinks.b.inputs")), "{e:?}");
        let e = errors(
            "[sources.a]\ntype = \"stdin\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\npath = \"x\"\n",
        );
        assert!(!e.is_empty());
    }
}
