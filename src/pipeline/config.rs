//! Pipeline configuration: TOML in the style of Vector, with named
//! `[sources.NAME]` and `[sinks.NAME]` tables, each with a `type`.
//!
//! Parsing rejects unknown keys and types (serde); `validate` then checks
//! what serde cannot: sink inputs name real output streams, no two
//! listeners share an address, paths can be read or written. Every error
//! names the key and the line.

use crate::api::ApiConfig;
use crate::component::{Claim, Problem, Resource};
use crate::keyed::alerts::Clock;
use crate::keyed::alerts::rule::{Rule, RuleError, RuleKind, default_cluster_rules, default_rules};
use crate::sinks::SinkConfig;
use crate::sources::{SourceConfig, SourceSpec};
use serde::Deserialize;
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
    /// The HTTP server (`/metrics`, `/healthz`, `/readyz`); none without
    /// this table.
    #[serde(default)]
    pub api: Option<ApiConfig>,
    /// `fluxpipe run --adopt-checkpoint`: restore a checkpoint written for
    /// other sources.
    #[serde(skip)]
    pub adopt_checkpoint: bool,
}

impl Config {
    /// What each source reads (name → identity), as checkpoints keep it.
    pub fn source_identities(&self) -> BTreeMap<String, String> {
        self.sources
            .iter()
            .map(|(name, s)| (name.clone(), s.identity()))
            .collect()
    }
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
    // As Vector: what starts, listens, restores and stops is said; the
    // libraries only warn.
    "warn,fluxpipe=info".into()
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
    #[serde(
        deserialize_with = "crate::component::seconds",
        default = "default_inactive_grace"
    )]
    pub inactive_grace_secs: f64,
    /// Seconds a job that never got a `submit` (only exec events, say) is
    /// kept waiting for it before it is dropped with an anomaly.
    #[serde(
        deserialize_with = "crate::component::seconds",
        default = "default_orphan_ttl"
    )]
    pub orphan_ttl_secs: f64,
    /// Most jobs held at once (all workers together). Records of a job not
    /// yet held are refused beyond it (counted in
    /// `fluxpipe_jobs_refused_total` and logged): a flood of submits for
    /// jobs that never end cannot take all memory, and the jobs already
    /// held keep being followed.
    #[serde(default = "default_max_jobs")]
    pub max_jobs: usize,
    /// Most jobs remembered (by id, ~20 bytes each, all workers together)
    /// after they ended and were dropped, so a backlog sent again (a
    /// journal consumer started over) is recognised and skipped rather
    /// than making them again. The oldest are forgotten first. 0: none.
    #[serde(default = "default_max_finished_jobs")]
    pub max_finished_jobs: usize,
    /// Seconds an event may be dated ahead of this host's clock; beyond
    /// it (or before 1970) the event is refused as a `bad-timestamp`
    /// anomaly: one made-up date would move a cluster's event clock by
    /// years and fire every timed alert.
    #[serde(
        deserialize_with = "crate::component::seconds",
        default = "default_max_clock_skew"
    )]
    pub max_clock_skew_secs: f64,
    /// Most clusters followed; records naming another are refused and
    /// counted (100,000 made-up cluster names must not take all memory
    /// and every series).
    #[serde(default = "default_max_clusters")]
    pub max_clusters: usize,
    /// Most ranks (nodes) all clusters' resource states hold together;
    /// ranks beyond it are refused as `unknown-rank` anomalies.
    #[serde(default = "default_max_ranks")]
    pub max_ranks: usize,
}

fn default_max_clusters() -> usize {
    1000
}

fn default_max_ranks() -> usize {
    // Twice the largest instance an idset may name (131072).
    262_144
}

fn default_max_finished_jobs() -> usize {
    1_000_000
}

fn default_max_clock_skew() -> f64 {
    crate::keyed::processor::DEFAULT_MAX_CLOCK_SKEW_SECS
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
            max_finished_jobs: default_max_finished_jobs(),
            max_clock_skew_secs: default_max_clock_skew(),
            max_clusters: default_max_clusters(),
            max_ranks: default_max_ranks(),
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
    #[serde(
        deserialize_with = "crate::component::seconds",
        default = "default_checkpoint_interval"
    )]
    pub interval_secs: f64,
    /// Longest one checkpoint may take (sources reaching the barrier,
    /// shards saving, sinks delivering) before it is abandoned.
    #[serde(
        deserialize_with = "crate::component::seconds",
        default = "default_checkpoint_timeout"
    )]
    pub timeout_secs: f64,
    /// Restore a checkpoint whose sources read something else, as
    /// `--adopt-checkpoint` does: for a service whose command line is not
    /// at hand, after a planned change of a source.
    #[serde(default)]
    pub adopt_mismatched: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            interval_secs: default_checkpoint_interval(),
            timeout_secs: default_checkpoint_timeout(),
            adopt_mismatched: false,
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
    /// How long the condition must hold (`90s`, `10m`, `24h`, `7d`, or
    /// seconds).
    #[serde(rename = "for")]
    pub hold: crate::component::DurationText,
    #[serde(default = "default_severity")]
    pub severity: String,
    /// Job rules: only the jobs of this queue, or of these.
    #[serde(default)]
    pub queue: Option<OneOrMany>,
    /// `feed_silent`: only the feeds of this source, or of these.
    #[serde(default)]
    pub sources: Option<OneOrMany>,
    /// `false` turns the rule off: how a built-in `feed_silent` or
    /// `instance_down` rule is turned off (a rule of the same kind stands
    /// in its place).
    #[serde(default = "default_enabled")]
    pub enabled: bool,
}

fn default_enabled() -> bool {
    true
}

/// A string, or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

fn default_severity() -> String {
    "warning".into()
}

/// A rule's problem: its name, the key at fault, what is wrong.
pub type RuleProblem = (String, &'static str, RuleError);

impl AlertsConfig {
    /// Every rule the config names (turned off or not), or the first
    /// problem: (rule name, key, error).
    fn configured(&self) -> Result<Vec<(Rule, bool)>, RuleProblem> {
        let Some(rules) = &self.rules else {
            return Ok(Vec::new());
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
                let rule = Rule::new(name, kind, &r.hold.text(), &r.severity)
                    .map_err(|e| (name.clone(), "for", e))?;
                let queues = r.queue.clone().map(OneOrMany::into_vec).unwrap_or_default();
                let sources = r
                    .sources
                    .clone()
                    .map(OneOrMany::into_vec)
                    .unwrap_or_default();
                let rule = rule
                    .for_queues(queues)
                    .map_err(|e| (name.clone(), "queue", e))?
                    .for_sources(sources)
                    .map_err(|e| (name.clone(), "sources", e))?;
                Ok((rule, r.enabled))
            })
            .collect()
    }

    /// The job and node rules in force (the keyed alert engine's), or the
    /// first problem: (rule name, key, error).
    pub fn rules(&self) -> Result<Vec<Rule>, RuleProblem> {
        if self.rules.is_none() {
            return Ok(default_rules());
        }
        Ok(self
            .configured()?
            .into_iter()
            .filter(|(r, on)| *on && !r.kind.is_cluster())
            .map(|(r, _)| r)
            .collect())
    }

    /// The feed and instance rules in force (the feed watch's): the
    /// built-in ones unless a rule of their kind is configured, and those
    /// configured and not turned off.
    pub fn cluster_rules(&self) -> Result<Vec<Rule>, RuleProblem> {
        let configured = self.configured()?;
        let mut out: Vec<Rule> = default_cluster_rules()
            .into_iter()
            .filter(|d| !configured.iter().any(|(r, _)| r.kind == d.kind))
            .collect();
        out.extend(
            configured
                .into_iter()
                .filter(|(r, on)| *on && r.kind.is_cluster())
                .map(|(r, _)| r),
        );
        Ok(out)
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

/// Parse TOML text into a config and validate it. Every error is
/// reported, not only the first: a key of the wrong type is noted, its
/// line set aside, and the rest read again (at most [`MAX_ERRORS`] times);
/// what is then read is validated too.
pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut rest = text.to_string();
    // Keys whose lines were set aside: a "missing field" for one of them
    // is the same error again.
    let mut set_aside: Vec<String> = Vec::new();
    // Tables set aside whole (their header was at fault), and tables with
    // an unknown key (a typo, whose "missing field" is the same mistake).
    let mut tables_aside: Vec<String> = Vec::new();
    let mut typo_tables: Vec<String> = Vec::new();
    let config = loop {
        match toml::from_str::<Config>(&rest) {
            Ok(config) => break Some(config),
            Err(e) => {
                let error = typed_table_error(&rest).unwrap_or_else(|| match e.span() {
                    Some(span) => {
                        let line = line_of(&rest, span.start);
                        ConfigError::At {
                            line,
                            message: named(key_path_at(&rest, line), e.message()),
                        }
                    }
                    None => ConfigError::Parse(e.to_string()),
                });
                let repeat = set_aside
                    .iter()
                    .any(|k| error.to_string().contains(&format!("missing field `{k}`")));
                // A line set aside may break the text itself (a value over
                // several lines): then what is left cannot be read on.
                let broke = !errors.is_empty() && toml::from_str::<toml::Table>(&rest).is_err();
                if broke || repeat {
                    break None;
                }
                let line = match &error {
                    ConfigError::At { line, .. } => Some(*line),
                    _ => None,
                };
                let header = line.and_then(|l| header_at(&rest, l));
                let text = error.to_string();
                // A key misspelt makes its table miss the right one: one
                // mistake, said once.
                let follow_on = text.contains("missing field")
                    && header.as_ref().is_some_and(|h| typo_tables.contains(h));
                if text.contains("unknown field")
                    && let Some(l) = line
                {
                    typo_tables.push(table_at(&rest, l));
                }
                if !follow_on {
                    errors.push(in_plain_words(error));
                }
                match (line, header) {
                    // A table at fault is set aside whole: its keys would
                    // otherwise land in the table before it.
                    (Some(line), Some(table)) if errors.len() < MAX_ERRORS => {
                        set_table_aside(&mut rest, line);
                        tables_aside.push(table);
                    }
                    (Some(line), None) if errors.len() < MAX_ERRORS => {
                        if let Some(key) = set_line_aside(&mut rest, line) {
                            set_aside.push(key);
                        }
                    }
                    _ => break None,
                }
            }
        }
    };
    if let Some(config) = &config {
        // What a table set aside would have given is not missing.
        let aside = |section: &str| {
            tables_aside
                .iter()
                .any(|t| t.starts_with(&format!("{section}.")))
        };
        errors.extend(validate(config, &rest).into_iter().filter(|e| {
            let text = e.to_string();
            !(aside("sources") && text.contains("no [sources.NAME] table")
                || aside("sinks") && text.contains("no [sinks.NAME] table"))
        }));
    }
    match config {
        Some(config) if errors.is_empty() => Ok(config),
        _ => Err(errors),
    }
}

/// The table whose header is line `line` (1-based) of `text`, if it is one.
fn header_at(text: &str, line: usize) -> Option<String> {
    let t = text.lines().nth(line.checked_sub(1)?)?.trim();
    let name = t.strip_prefix('[').filter(|n| !n.starts_with('['))?;
    Some(name.split(']').next().unwrap_or("").trim().to_string())
}

/// The table line `line` (1-based) of `text` is in (empty: the top level).
fn table_at(text: &str, line: usize) -> String {
    (1..=line)
        .rev()
        .find_map(|l| header_at(text, l))
        .unwrap_or_default()
}

/// Comment out the table whose header is line `line` (1-based) of `text`,
/// its keys with it (up to the next header).
fn set_table_aside(text: &mut String, line: usize) {
    let mut out = String::with_capacity(text.len() + 16);
    let mut inside = false;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            inside = true;
        } else if inside && l.trim_start().starts_with('[') {
            inside = false;
        }
        if inside {
            out.push('#');
        }
        out.push_str(l);
    }
    *text = out;
}

/// The full name of the key set on line `line` (1-based) of `text`:
/// its table's name and its own (`workers`, `operators.max_jobs`).
fn key_path_at(text: &str, line: usize) -> Option<String> {
    let mut table = String::new();
    for (i, l) in text.lines().enumerate().take(line) {
        let t = l.trim();
        if let Some(name) = t.strip_prefix('[').filter(|n| !n.starts_with('[')) {
            table = name.split(']').next().unwrap_or("").trim().to_string();
        } else if i + 1 == line {
            let key = t.split_once('=')?.0.trim().trim_matches('"');
            if key.is_empty() || key.starts_with('#') {
                return None;
            }
            return Some(if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            });
        }
    }
    None
}

/// A message that names its key, unless it does already.
fn named(key: Option<String>, message: &str) -> String {
    match key {
        Some(k) if !message.contains(&k) => format!("{k}: {message}"),
        _ => message.to_string(),
    }
}

/// Most errors reported for one file.
const MAX_ERRORS: usize = 20;

/// Comment out line `line` (1-based) of `text`; the key it set, if any.
fn set_line_aside(text: &mut String, line: usize) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 1);
    let mut key = None;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            key = l
                .split_once('=')
                .map(|(k, _)| k.trim().trim_matches('"').to_string());
            out.push('#');
        }
        out.push_str(l);
    }
    *text = out;
    key
}

/// serde's words for types, in words a sysadmin reads ("expected a whole
/// number", not "expected usize").
fn in_plain_words(error: ConfigError) -> ConfigError {
    let plain = |m: String| {
        let mut m = m;
        for (rust, words) in [
            ("expected usize", "expected a whole number"),
            ("expected u64", "expected a whole number"),
            ("expected u32", "expected a whole number"),
            ("expected u16", "expected a whole number"),
            ("expected u8", "expected a whole number"),
            ("expected i64", "expected a whole number"),
            ("expected i32", "expected a whole number"),
            ("expected f64", "expected a number"),
            ("expected f32", "expected a number"),
            ("expected a sequence", "expected a list"),
            ("expected a map", "expected a table"),
            ("invalid type: ", "wrong type: "),
            ("invalid value: integer", "out of range: integer"),
        ] {
            m = m.replace(rust, words);
        }
        m
    };
    match error {
        ConfigError::At { line, message } => ConfigError::At {
            line,
            message: plain(message),
        },
        ConfigError::Parse(m) => ConfigError::Parse(plain(m)),
        ConfigError::Invalid(m) => ConfigError::Invalid(plain(m)),
        other => other,
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
            if (&*section, kind.as_str()) == ("sinks", "prometheus") {
                return Some(ConfigError::At {
                    line: line_of(text, span.start),
                    message: format!(
                        "sinks.{}: the prometheus sink is now the pipeline's own server: \
                         move its address (and per_user_jobs) to an [api] table",
                        name.get_ref()
                    ),
                });
            }
            let result = match &*section {
                "sources" => SourceConfig::table_error(&kind, de),
                "sinks" => SinkConfig::table_error(&kind, de),
                _ => None,
            };
            if let Some(e) = result {
                let at = e.span().map_or(span.start, |s| s.start).min(text.len());
                let line = line_of(text, at);
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

/// The 1-based line of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
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
        Some(line_of(self.text, span.start))
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
    if config.sinks.is_empty() && config.api.is_none() {
        errors.push(ConfigError::Invalid(
            "no [sinks.NAME] table and no [api]: a pipeline needs at least one sink, or the server to show its metrics".into(),
        ));
    }
    if config.workers == Some(0) {
        errors.push(loc.error(&["workers"], None, "workers: must be at least 1".into()));
    }
    if config.operators.max_clock_skew_secs.is_nan() || config.operators.max_clock_skew_secs < 0.0 {
        errors.push(loc.error(
            &["operators", "max_clock_skew_secs"],
            None,
            "operators.max_clock_skew_secs: must be 0 or more seconds (inf: no limit)".into(),
        ));
    }
    // What each component claims that no other may, and who claimed it.
    // A component is named by its table's path (`sources.in`, `api`).
    let mut claimed: HashMap<Resource, String> = HashMap::new();
    let mut claim = |table: &[&str], c: Claim, errors: &mut Vec<ConfigError>| {
        let owner = table.join(".");
        match claimed.get(&c.resource) {
            Some(_) if c.resource == Resource::Stdin => errors.push(ConfigError::Invalid(
                "more than one stdin source: standard input can be read once".into(),
            )),
            Some(other) => errors.push(loc.error(
                &[table, &[c.key]].concat(),
                None,
                format!(
                    "{owner}.{} `{}`: already used by {other}",
                    c.key, c.resource
                ),
            )),
            None => {
                claimed.insert(c.resource, owner);
            }
        }
    };
    let report = |table: &[&str], p: Problem, errors: &mut Vec<ConfigError>| {
        // A key of a sub-table (`tls.crt_file`) is found by its parts.
        let path: Vec<&str> = table.iter().copied().chain(p.key.split('.')).collect();
        let message = format!("{}.{}{}", table.join("."), p.key, p.message);
        errors.push(loc.error(&path, p.index, message));
    };
    if let Some(api) = &config.api {
        for p in api.problems() {
            report(&["api"], p, &mut errors);
        }
        for c in api.claims() {
            claim(&["api"], c, &mut errors);
        }
    }
    for (name, source) in &config.sources {
        let table = ["sources", name.as_str()];
        for p in source.problems() {
            report(&table, p, &mut errors);
        }
        for c in source.claims() {
            claim(&table, c, &mut errors);
        }
    }
    for (name, sink) in &config.sinks {
        let table = ["sinks", name.as_str()];
        for p in sink.common().problems().into_iter().chain(sink.problems()) {
            report(&table, p, &mut errors);
        }
    }
    match config.alerts.cluster_rules() {
        Err((rule, k, e)) => errors.push(loc.error(
            &["alerts", "rules", rule.as_str(), k],
            None,
            format!("alerts.rules.{rule}.{k}: {e}"),
        )),
        Ok(rules) => {
            for rule in rules {
                for source in rule.sources.iter() {
                    if !config.sources.contains_key(source) {
                        let name = rule.name.as_str();
                        errors.push(loc.error(
                            &["alerts", "rules", name, "sources"],
                            None,
                            format!("alerts.rules.{name}.sources: no source is named `{source}`"),
                        ));
                    }
                }
            }
        }
    }
    errors
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
        let streams = c.sinks["out"].common().streams();
        assert!(streams.contains(OutputStream::Jobs) && !streams.contains(OutputStream::Events));
    }

    #[test]
    fn every_error_of_a_file_comes_at_once_in_plain_words() {
        let e = errors(
            "workers = \"two\"\n[sources.a]\ntype = \"socket\"\naddress = \"127.0.0.1:7000\"\n\
             max_connections = -1\n[sinks.c]\ntype = \"file\"\npath = \"/tmp/x\"\n\
             inputs = [\"jobz\"]\nbuffer = \"big\"\n",
        );
        assert_eq!(e.len(), 4, "{e:#?}");
        for (line, words) in [
            (1, "expected a whole number"),
            (5, "max_connections"),
            (10, "expected a whole number"),
            (9, "jobz"),
        ] {
            assert!(
                e.iter()
                    .any(|m| m.starts_with(&format!("line {line}:")) && m.contains(words)),
                "line {line}: {words}: {e:#?}"
            );
        }
        assert!(e.iter().all(|m| !m.contains("usize")), "{e:#?}");
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
            e[0].starts_with("line 7: sinks.c.batch_max_records: wrong type"),
            "{e:?}"
        );
    }

    #[test]
    fn the_api_server_is_a_table_of_the_pipeline_not_a_sink() {
        // A metrics-only pipeline: a source and the server, no sink.
        let ok = "[sources.a]\ntype = \"stdin\"\n[api]\naddress = \"127.0.0.1:9464\"\n";
        assert!(errors(ok).is_empty(), "{:?}", errors(ok));
        assert_eq!(parse(ok).unwrap().api.unwrap().address, "127.0.0.1:9464");

        let e = errors("[sources.a]\ntype = \"stdin\"\n");
        assert!(
            e.iter()
                .any(|m| m.contains("no [sinks.NAME] table and no [api]")),
            "{e:?}"
        );

        // It claims its address like any listener.
        let e = errors(
            "[api]\naddress = \"127.0.0.1:7000\"\n\
             [sources.b]\ntype = \"socket\"\naddress = \"127.0.0.1:7000\"\n",
        );
        assert!(
            e.iter().any(|m| m.contains("line 5")
                && m.contains("sources.b.address `127.0.0.1:7000`: already used by api")),
            "{e:?}"
        );
        let e = errors("[sources.a]\ntype = \"stdin\"\n[api]\naddress = \"nowhere\"\n");
        assert!(
            e.iter()
                .any(|m| m.contains("line 4: api.address `nowhere`")),
            "{e:?}"
        );

        // The sink it used to be is refused with what to do instead.
        let e = errors(
            "[sources.a]\ntype = \"stdin\"\n[sinks.metrics]\ntype = \"prometheus\"\naddress = \"127.0.0.1:1\"\n",
        );
        assert!(
            e[0].starts_with("line 3: sinks.metrics: the prometheus sink is now")
                && e[0].contains("[api]"),
            "{e:?}"
        );
    }

    #[test]
    fn two_stdin_sources_are_refused() {
        let e = errors("[sources.a]\ntype = \"stdin\"\n[sources.b]\ntype = \"stdin\"\n[api]\n");
        assert!(
            e.iter()
                .any(|m| m.contains("standard input can be read once")),
            "{e:?}"
        );
    }

    #[test]
    fn a_database_sink_takes_job_updates_only_beside_jobs() {
        let sink = |inputs: &str| {
            format!(
                "[sources.a]\ntype = \"stdin\"\n[sinks.db]\ntype = \"database\"\nurl = \"sqlite:///tmp/x.db\"\ninputs = [{inputs}]\n"
            )
        };
        let e = errors(&sink("\"job_updates\""));
        assert!(
            e.iter()
                .any(|m| m.contains("sinks.db.inputs") && m.contains("needs `jobs`")),
            "{e:?}"
        );
        assert!(errors(&sink("\"jobs\", \"job_updates\"")).is_empty());
        let e = errors(&sink("\"jobs\", \"alerts\""));
        assert!(e.iter().any(|m| m.contains("not `alerts`")), "{e:?}");
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

    /// A typo in a table's key is one error, not three: no "missing
    /// field" for the key it misses, no "unknown field `type`" from the
    /// table's keys landing elsewhere, no "no [sources.NAME] table".
    #[test]
    fn a_typo_is_one_error_with_no_follow_on() {
        let e = errors(
            "[sources.flux]\ntype = \"http\"\nadress = \"127.0.0.1:7070\"\n\
             [sinks.b]\ntype = \"blackhole\"\ninputs = [\"jobz\"]\n",
        );
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].contains("unknown field `adress`"), "{e:?}");
        assert!(e[1].contains("jobz"), "{e:?}");
    }

    #[test]
    fn every_key_is_named_and_every_duration_takes_one_syntax() {
        let e = errors(
            "workers = \"two\"\n[operators]\nmax_jobs = \"many\"\n[sources.a]\ntype = \"stdin\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n",
        );
        assert!(e.iter().any(|m| m.contains("line 1: workers: ")), "{e:?}");
        assert!(
            e.iter().any(|m| m.contains("line 3: operators.max_jobs: ")),
            "{e:?}"
        );
        let durations = "[checkpoint]\ninterval_secs = \"10s\"\ntimeout_secs = 90\n[operators]\ninactive_grace_secs = \"1h30m\"\n[sources.a]\ntype = \"stdin\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = [\"alerts\"]\n[alerts.rules.r]\nkind = \"node_drained\"\nfor = 600\n";
        let c = parse(durations).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(c.checkpoint.interval_secs, 10.0);
        assert_eq!(c.checkpoint.timeout_secs, 90.0);
        assert_eq!(c.operators.inactive_grace_secs, 5400.0);
        let rules = c.alerts.rules().unwrap_or_default();
        assert_eq!(rules[0].hold_secs, 600.0);
        let e = errors(&durations.replace("\"10s\"", "\"soon\""));
        assert!(
            e.iter()
                .any(|m| m.contains("interval_secs") && m.contains("not a duration")),
            "{e:?}"
        );
    }

    #[test]
    fn the_watch_rules_stay_on_unless_a_rule_of_their_kind_says_otherwise() {
        let base = "[sources.a]\ntype = \"http\"\naddress = \"127.0.0.1:7070\"\n[sinks.b]\ntype = \"blackhole\"\ninputs = [\"alerts\"]\n";
        let names = |text: &str| -> Vec<String> {
            let config = parse(text).unwrap_or_else(|e| panic!("{e:?}"));
            let rules = config.alerts.cluster_rules().unwrap_or_default();
            rules.iter().map(|r| r.name.clone()).collect()
        };
        assert_eq!(names(base), ["feed_silent", "instance_down"]);
        // Job rules of a site's own do not take the watchman away.
        let own = format!(
            "{base}[alerts.rules.stuck]\nkind = \"job_state\"\nstate = \"SCHED\"\nfor = \"1h\"\n"
        );
        assert_eq!(names(&own), ["feed_silent", "instance_down"]);
        let config = parse(&own).unwrap_or_else(|e| panic!("{e:?}"));
        let engine = config.alerts.rules().unwrap_or_default();
        assert_eq!(engine.len(), 1, "the engine gets the job rule only");
        // A rule of the kind stands in for the built-in one; `enabled =
        // false` turns it off.
        let quiet = format!(
            "{base}[alerts.rules.quiet]\nkind = \"feed_silent\"\nfor = \"1h\"\nsources = \"a\"\n[alerts.rules.off]\nkind = \"instance_down\"\nfor = \"1m\"\nenabled = false\n"
        );
        assert_eq!(names(&quiet), ["quiet"]);
        // `sources` names sources, and only feed_silent takes it.
        let e = errors(&format!(
            "{base}[alerts.rules.x]\nkind = \"feed_silent\"\nfor = \"1h\"\nsources = [\"nope\"]\n"
        ));
        assert!(
            e.iter()
                .any(|m| m.contains("alerts.rules.x.sources") && m.contains("`nope`")),
            "{e:?}"
        );
        let e = errors(&format!(
            "{base}[alerts.rules.x]\nkind = \"node_drained\"\nfor = \"1h\"\nsources = \"a\"\n"
        ));
        assert!(
            e.iter().any(|m| m.contains("alerts.rules.x.sources")),
            "{e:?}"
        );
    }
}

/// The manual's key tables (docs/configuration.md) held to the config
/// types: every key of every source and sink type is documented, under
/// its type or among the keys every source or sink has, and nothing is
/// documented that the code does not take.
#[cfg(test)]
mod manual {
    use crate::sinks::SinkConfig;
    use crate::sources::SourceConfig;
    use std::collections::BTreeSet;

    const MANUAL: &str = include_str!("../../docs/configuration.md");

    /// The keys a config type takes, as serde lists them when refusing
    /// an unknown one.
    fn keys_of(error: &str) -> BTreeSet<String> {
        let listed = error
            .split("expected one of ")
            .nth(1)
            .or_else(|| error.split("expected ").nth(1))
            .unwrap_or("");
        // serde: "expected `a`", "expected `a` or `b`", "expected one
        // of `a`, `b`, `c`".
        let listed = listed
            .split('\n')
            .next()
            .unwrap_or("")
            .replace(" or ", ", ");
        listed
            .split(", ")
            .filter_map(|k| k.trim().strip_prefix('`')?.split('`').next())
            .map(str::to_string)
            .collect()
    }

    fn code_keys(section: &str, kind: &str) -> BTreeSet<String> {
        let text = format!("type = \"{kind}\"\nzz_probe = 1\n");
        let error = match section {
            "sources" => toml::from_str::<SourceConfig>(&text).err(),
            _ => toml::from_str::<SinkConfig>(&text).err(),
        };
        let error = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("zz_probe"), "{section} {kind}: {error}");
        keys_of(&error)
    }

    /// The first-column keys of the key tables of `part`.
    fn table_keys(part: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        // Only tables headed `| key |` (not the list of example files).
        let mut in_keys = false;
        for line in part.lines() {
            if line.starts_with("| key |") {
                in_keys = true;
            } else if !line.starts_with('|') {
                in_keys = false;
            }
            if !in_keys {
                continue;
            }
            if let Some(key) = line
                .strip_prefix("| `")
                .and_then(|rest| rest.split('`').next())
            {
                // `tls.crt_file` is a key of the `tls` table.
                out.insert(key.split('.').next().unwrap_or(key).to_string());
            }
        }
        out
    }

    /// The manual's part about sources or sinks, cut at each type.
    fn documented(section: &str) -> (BTreeSet<String>, Vec<(String, BTreeSet<String>)>) {
        let (start, end) = match section {
            "sources" => ("**Sources.**", "**Sinks.**"),
            _ => ("**Sinks.**", "\n## "),
        };
        let part = MANUAL.split(start).nth(1).expect("the part");
        let part = part.split(end).next().expect("its end");
        let mut pieces = part.split("\n`type = \"");
        let common = table_keys(pieces.next().unwrap_or(""));
        let typed = pieces
            .map(|p| {
                let kind = p.split('"').next().unwrap_or("").to_string();
                (kind, table_keys(p))
            })
            .collect();
        (common, typed)
    }

    /// The global keys and those of its tables (`log.level`), in the
    /// manual's first key table, and the code's.
    #[test]
    fn every_global_key_is_in_the_manual() {
        let part = MANUAL
            .split("## Every config key")
            .nth(1)
            .and_then(|p| p.split("**Sources.**").next())
            .expect("the global keys");
        let documented: BTreeSet<String> = part
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .map(str::to_string)
            .collect();
        let probe = |table: &str| {
            let text = if table.is_empty() {
                "zz_probe = 1\n".to_string()
            } else {
                format!("[{table}]\nzz_probe = 1\n")
            };
            let error = toml::from_str::<super::Config>(&text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains("zz_probe"), "[{table}]: {error}");
            keys_of(&error)
        };
        let mut code = BTreeSet::new();
        for key in probe("") {
            let nested = ["log", "operators", "checkpoint", "api"].contains(&key.as_str());
            if nested {
                code.extend(probe(&key).into_iter().map(|k| format!("{key}.{k}")));
            } else if key == "alerts" {
                code.extend(probe("alerts").into_iter().map(|k| match k.as_str() {
                    "rules" => "alerts.rules.NAME".to_string(),
                    _ => format!("alerts.{k}"),
                }));
            } else if key == "sources" || key == "sinks" {
                code.insert(format!("{key}.NAME"));
            } else {
                code.insert(key);
            }
        }
        let missing: Vec<&String> = code.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "not in docs/configuration.md: {missing:?}"
        );
        let unknown: Vec<&String> = documented.difference(&code).collect();
        assert!(unknown.is_empty(), "documented, not taken: {unknown:?}");
    }

    #[test]
    fn every_key_of_every_component_is_in_the_manual() {
        for (section, types) in [
            ("sources", SourceConfig::TYPES),
            ("sinks", SinkConfig::TYPES),
        ] {
            let (common, typed) = documented(section);
            assert!(common.contains("type"), "{section}: {common:?}");
            for kind in types {
                let code = code_keys(section, kind);
                let own: BTreeSet<String> = typed
                    .iter()
                    .filter(|(k, _)| k == kind)
                    .flat_map(|(_, keys)| keys.iter().cloned())
                    .collect();
                let missing: Vec<&String> = code
                    .iter()
                    .filter(|k| !own.contains(*k) && !common.contains(*k))
                    .collect();
                assert!(
                    missing.is_empty(),
                    "{section} type {kind}: keys not in docs/configuration.md: {missing:?}"
                );
                let unknown: Vec<&String> = own.iter().filter(|k| !code.contains(*k)).collect();
                assert!(
                    unknown.is_empty(),
                    "{section} type {kind}: docs/configuration.md documents keys it does not take: {unknown:?}"
                );
            }
            for c in common.iter().filter(|c| *c != "type") {
                for kind in types {
                    assert!(
                        code_keys(section, kind).contains(c),
                        "{section}: `{c}` is said to be every type's, but {kind} does not take it"
                    );
                }
            }
        }
    }
}
