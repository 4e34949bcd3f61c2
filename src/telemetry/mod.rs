//! The pipeline's metrics: the catalog ([`metric`]), the Prometheus
//! recorder behind the `metrics` macros, the boards rendered at scrape time
//! (per node, oldest state entries, jobs per user), what a shard records,
//! and readiness.
//!
//! Counters, gauges and histograms that only grow or move go through the
//! `metrics` crate. Per-node series are rendered from the current rank
//! state at each scrape instead, so a series that stops being true (a node
//! undrained, a drain reason replaced) disappears rather than sticking at 0.

pub mod ages;
mod entry_times;
pub mod exposition;
pub mod job_metrics;
mod node_board;
mod readiness;
pub mod shard_metrics;
mod state_ages;
mod user_jobs;

pub use node_board::NodeBoard;
pub use readiness::Readiness;
pub use state_ages::StateAges;
pub use user_jobs::UserJobs;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Histogram buckets for durations in seconds: 1 s to a week.
const SECONDS_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
    259200.0, 604800.0,
];

/// Buckets for work that takes milliseconds to seconds: a checkpoint, an
/// HTTP request (which may wait for one).
const SHORT_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The `process_*` series (CPU, memory, file descriptors, start time),
/// read from /proc at each scrape.
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// Install the Prometheus recorder (once per process) and return its handle.
/// `None` if another recorder was installed first.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            // A full name wins over the suffix, whatever the order here.
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(metric::FLUXPIPE_CHECKPOINT_DURATION_SECONDS.into()),
                    SHORT_SECONDS_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(metric::FLUXPIPE_HTTP_REQUEST_DURATION_SECONDS.into()),
                    SHORT_SECONDS_BUCKETS,
                )
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            describe();
            PROCESS
                .get_or_init(metrics_process::Collector::default)
                .describe();
            metrics::gauge!(
                metric::FLUXPIPE_BUILD_INFO,
                "version" => env!("CARGO_PKG_VERSION"),
                "commit" => env!("FLUXPIPE_COMMIT"),
            )
            .set(1.0);
            Some(handle)
        })
        .as_ref()
}

/// Why a sink drops records (`fluxpipe_records_dropped_total{reason}`).
pub const DROP_REASONS: [&str; 4] = ["full", "closed", "undeliverable", "unstorable"];

/// Why records of jobs are refused (`fluxpipe_jobs_refused_total{reason}`).
pub const REFUSAL_REASONS: [&str; 2] = ["max_jobs", "max_clusters"];

/// Serve every counter whose label set is known at the start at 0: a
/// counter that first appears at its first increment is invisible to
/// `increase()` and `rate()`, so a one-off loss would never trip an alert.
pub fn announce_counters(sources: &[&str], sinks: &[&str], rules: &[&str]) {
    use crate::flux::anomaly::{AnomalyKind, Stream};
    for &source in sources {
        for name in [
            metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL,
            metric::FLUXPIPE_EVENTS_INVALID_TOTAL,
            metric::FLUXPIPE_SOURCE_ERRORS_TOTAL,
            metric::FLUXPIPE_DEAD_LETTERS_SUPPRESSED_TOTAL,
        ] {
            metrics::counter!(name, "source" => source.to_string()).increment(0);
        }
    }
    for &sink in sinks {
        for name in [
            metric::FLUXPIPE_RECORDS_SENT_TOTAL,
            metric::FLUXPIPE_SINK_ERRORS_TOTAL,
        ] {
            metrics::counter!(name, "sink" => sink.to_string()).increment(0);
        }
        for reason in DROP_REASONS {
            metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => sink.to_string(), "reason" => reason)
                .increment(0);
        }
    }
    for &rule in rules {
        for status in ["firing", "resolved"] {
            metrics::counter!(metric::FLUXPIPE_ALERTS_TOTAL, "rule" => rule.to_string(), "status" => status)
                .increment(0);
        }
    }
    for stream in Stream::ALL {
        for kind in AnomalyKind::ALL {
            metrics::counter!(metric::FLUXPIPE_ANOMALIES_TOTAL, "stream" => stream.as_str(), "kind" => kind.as_str())
                .increment(0);
        }
    }
    for reason in REFUSAL_REASONS {
        metrics::counter!(metric::FLUXPIPE_JOBS_REFUSED_TOTAL, "reason" => reason).increment(0);
    }
    for why in crate::keyed::expiry::Eviction::ALL {
        metrics::counter!(metric::FLUXPIPE_JOBS_EVICTED_TOTAL, "reason" => why.as_str())
            .increment(0);
    }
    for name in [
        metric::FLUXPIPE_CHECKPOINT_FAILURES_TOTAL,
        metric::FLUXPIPE_EVENTS_DUPLICATE_TOTAL,
        metric::FLUXPIPE_FINISHED_JOB_REPEATS_TOTAL,
        metric::FLUXPIPE_TAP_RECORDS_DROPPED_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
}

/// Refresh the `process_*` series; called before each render of /metrics.
pub fn collect_process() {
    if let Some(collector) = PROCESS.get() {
        collector.collect();
    }
}

pub mod metric;

fn describe() {
    use metric::Kind;
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(name, kind, unit, help) in metric::ALL {
        match (kind, unit) {
            (Kind::Counter, Some(u)) => describe_counter!(name, u, help),
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Gauge, Some(u)) => describe_gauge!(name, u, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
            (Kind::Histogram, Some(u)) => describe_histogram!(name, u, help),
            (Kind::Histogram, None) => describe_histogram!(name, help),
        }
    }
}

/// Escape a label value (backslash, quote, newline), as the text format says.
pub(crate) fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry per name, each as Prometheus names it: counters end in
    /// `_total`, others do not.
    #[test]
    fn the_catalog_names_each_metric_once_and_well() {
        let mut seen = std::collections::HashSet::new();
        for &(name, kind, _, help) in metric::ALL {
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.starts_with("flux_") || name.starts_with("fluxpipe_"),
                "{name}"
            );
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}"
            );
            assert_eq!(
                kind == metric::Kind::Counter,
                name.ends_with("_total"),
                "{name}"
            );
            assert!(help.ends_with('.'), "{name}: {help}");
        }
    }

    /// Every series fluxpipe serves is in the manual (docs/metrics.md).
    #[test]
    fn every_metric_is_in_the_manual() {
        let manual = include_str!("../../docs/metrics.md");
        let names = metric::ALL
            .iter()
            .map(|m| m.0)
            .chain(metric::RENDERED.iter().map(|m| m.0));
        let missing: Vec<&str> = names
            .filter(|n| !manual.contains(&format!("`{n}")))
            .collect();
        assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
        let mut seen = std::collections::HashSet::new();
        for &(name, _, help) in metric::RENDERED {
            assert!(seen.insert(name), "{name} twice");
            assert!(metric::ALL.iter().all(|m| m.0 != name), "{name} in both");
            assert!(help.ends_with('.'), "{name}: {help}");
        }
        let mut out = String::new();
        metric::header(&mut out, metric::FLUX_NODE_OFFLINE_SECONDS_TOTAL);
        assert!(
            out.ends_with("# TYPE flux_node_offline_seconds_total counter\n"),
            "{out}"
        );
    }

    /// Metrics are recorded by the catalog's names, never a literal (whose
    /// metric would have no help text, and whose name could drift).
    #[test]
    fn no_metric_is_named_by_a_literal() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        for entry in walkdir::WalkDir::new(src)
            .into_iter()
            .filter_map(Result::ok)
        {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            for kind in ["counter", "gauge", "histogram"] {
                let call = format!("{kind}!(");
                for (at, _) in text.match_indices(&call) {
                    let rest = text[at + call.len()..].trim_start();
                    assert!(
                        !rest.starts_with('"'),
                        "{}: a metric named by a literal: {}",
                        path.display(),
                        &rest[..rest.len().min(60)]
                    );
                }
            }
        }
    }
}
