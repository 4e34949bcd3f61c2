//! Every metric fluxpipe exports, named once: the constants the code
//! records and reads them by, and the kind, unit and help text `/metrics`
//! describes them with.

use metrics::Unit;

/// What a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

macro_rules! catalog {
    ($($id:ident = $name:literal, $kind:ident, $unit:expr, $help:literal;)*) => {
        $(pub const $id: &str = $name;)*
        /// Name, kind, unit and help of each.
        pub const ALL: &[(&str, Kind, Option<Unit>, &str)] = &[$(($name, Kind::$kind, $unit, $help)),*];
    };
}

catalog! {
FLUXPIPE_TAPS_OPEN = "fluxpipe_taps_open", Gauge, None, "Readers of fluxpipe tap now.";
FLUXPIPE_TAP_RECORDS_DROPPED_TOTAL = "fluxpipe_tap_records_dropped_total", Counter, None, "Records a tap reader had no room for.";
FLUXPIPE_BUILD_INFO = "fluxpipe_build_info", Gauge, None, "Always 1; the version and commit fluxpipe was built from.";
FLUX_JOBS = "flux_jobs", Gauge, None, "Active jobs per RFC 21 state.";
FLUX_JOB_TRANSITIONS_TOTAL = "flux_job_transitions_total", Counter, None, "Job state transitions.";
FLUX_JOBS_INACTIVE_TOTAL = "flux_jobs_inactive_total", Counter, None, "Jobs that became INACTIVE, by result.";
FLUX_JOB_EXCEPTIONS_TOTAL = "flux_job_exceptions_total", Counter, None, "Job exceptions, by type and severity.";
FLUX_JOB_QUEUE_WAIT_SECONDS = "flux_job_queue_wait_seconds", Histogram, Some(Unit::Seconds), "Time from submit to RUN.";
FLUX_JOB_RUN_SECONDS = "flux_job_run_seconds", Histogram, Some(Unit::Seconds), "Time from RUN to CLEANUP.";
FLUX_JOB_STATE_SECONDS = "flux_job_state_seconds", Histogram, Some(Unit::Seconds), "Time spent in each state.";
FLUX_RESOURCE_EVENTS_TOTAL = "flux_resource_events_total", Counter, None, "Resource events applied, by name.";
FLUXPIPE_EVENTS_RECEIVED_TOTAL = "fluxpipe_events_received_total", Counter, None, "Lines received, per source.";
FLUXPIPE_EVENTS_INVALID_TOTAL = "fluxpipe_events_invalid_total", Counter, None, "Lines that could not be decoded, per source.";
FLUXPIPE_EVENTS_DUPLICATE_TOTAL = "fluxpipe_events_duplicate_total", Counter, None, "Events skipped as repeats.";
FLUXPIPE_RECORDS_SENT_TOTAL = "fluxpipe_records_sent_total", Counter, None, "Records delivered, per sink.";
FLUXPIPE_RECORDS_DROPPED_TOTAL = "fluxpipe_records_dropped_total", Counter, None, "Records dropped, per sink and reason.";
FLUXPIPE_SINK_ERRORS_TOTAL = "fluxpipe_sink_errors_total", Counter, None, "Delivery errors, per sink.";
FLUXPIPE_JOBS_TRACKED = "fluxpipe_jobs_tracked", Gauge, None, "Jobs whose state is held in memory.";
FLUXPIPE_JOBS_EVICTED_TOTAL = "fluxpipe_jobs_evicted_total", Counter, None, "Jobs whose state was dropped, by reason.";
FLUXPIPE_ANOMALIES_TOTAL = "fluxpipe_anomalies_total", Counter, None, "Rule violations found, by stream and kind.";
FLUX_JOBS_STUCK = "flux_jobs_stuck", Gauge, None, "Jobs for which a job alert rule fires now, by rule.";
FLUXPIPE_ALERTS_TOTAL = "fluxpipe_alerts_total", Counter, None, "Alerts fired and resolved, by rule and status.";
FLUXPIPE_FINISHED_JOB_REPEATS_TOTAL = "fluxpipe_finished_job_repeats_total", Counter, None, "Records of jobs that ended and were dropped (a backlog sent again), recognised and skipped.";
FLUXPIPE_FINISHED_JOBS_REMEMBERED = "fluxpipe_finished_jobs_remembered", Gauge, None, "Jobs remembered by id after they ended and were dropped (operators.max_finished_jobs).";
FLUXPIPE_JOBS_REFUSED_TOTAL = "fluxpipe_jobs_refused_total", Counter, None, "Records of jobs not yet held, refused at operators.max_jobs.";
FLUXPIPE_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS = "fluxpipe_checkpoint_last_success_timestamp_seconds", Gauge, Some(Unit::Seconds), "When the last checkpoint was written (Unix time).";
FLUXPIPE_CHECKPOINT_DURATION_SECONDS = "fluxpipe_checkpoint_duration_seconds", Histogram, Some(Unit::Seconds), "Time to take one checkpoint: barrier, state, sinks, file.";
FLUXPIPE_CHECKPOINT_BYTES = "fluxpipe_checkpoint_bytes", Gauge, Some(Unit::Bytes), "Size of the last checkpoint file.";
FLUXPIPE_CHECKPOINT_FAILURES_TOTAL = "fluxpipe_checkpoint_failures_total", Counter, None, "Checkpoints abandoned or not written.";
FLUXPIPE_SOURCE_LAG_BYTES = "fluxpipe_source_lag_bytes", Gauge, Some(Unit::Bytes), "Bytes of the tailed files not read yet, per file source.";
FLUXPIPE_KAFKA_CONSUMER_LAG = "fluxpipe_kafka_consumer_lag", Gauge, None, "Messages behind the end of each assigned partition, per Kafka source.";
FLUXPIPE_KAFKA_PARTITIONS_OWNED = "fluxpipe_kafka_partitions_owned", Gauge, None, "Input partitions this member has taken over, per Kafka source.";
FLUXPIPE_KAFKA_PARTITIONS_TAKEN_OVER_TOTAL = "fluxpipe_kafka_partitions_taken_over_total", Counter, None, "Partitions taken over, by where their state came from (checkpoint, changelog).";
FLUXPIPE_CHANGELOG_RECORDS_TOTAL = "fluxpipe_changelog_records_total", Counter, None, "State changes and offset markers written to a Kafka source's changelog topic.";
FLUXPIPE_DEAD_LETTERS_SUPPRESSED_TOTAL = "fluxpipe_dead_letters_suppressed_total", Counter, None, "Undecodable lines not written to dead_letter (past dead_letters_per_sec), per source.";
FLUXPIPE_HTTP_REQUESTS_TOTAL = "fluxpipe_http_requests_total", Counter, None, "Requests answered by an http source, by status code.";
FLUXPIPE_HTTP_REQUEST_DURATION_SECONDS = "fluxpipe_http_request_duration_seconds", Histogram, Some(Unit::Seconds), "Time to answer a request of an http source.";
FLUXPIPE_HTTP_TLS_HANDSHAKE_FAILURES_TOTAL = "fluxpipe_http_tls_handshake_failures_total", Counter, None, "TLS handshakes that failed, per http source.";
FLUXPIPE_ALERTS_NOT_PAGED_TOTAL = "fluxpipe_alerts_not_paged_total", Counter, None, "Alerts from the past (fired and cleared while a backlog was caught up) kept in the alerts stream and not sent, per sink.";
FLUXPIPE_FEED_LAST_SEEN_TIMESTAMP_SECONDS = "fluxpipe_feed_last_seen_timestamp_seconds", Gauge, Some(Unit::Seconds), "When each feed (a source, for its cluster) last sent a line or a heartbeat (Unix time; the start of fluxpipe until it first did).";
FLUXPIPE_SOCKET_CONNECTIONS = "fluxpipe_socket_connections", Gauge, None, "Open connections of a socket source.";
FLUXPIPE_SOCKET_CONNECTIONS_TOTAL = "fluxpipe_socket_connections_total", Counter, None, "Connections accepted by a socket source.";
FLUXPIPE_SOCKET_TIMEOUTS_TOTAL = "fluxpipe_socket_timeouts_total", Counter, None, "Connections of a socket source closed by a timeout, by which.";
FLUXPIPE_SOURCE_CONNECTIONS_REFUSED_TOTAL = "fluxpipe_source_connections_refused_total", Counter, None, "Connections closed at once: the source had its most open.";
FLUXPIPE_SOURCE_ERRORS_TOTAL = "fluxpipe_source_errors_total", Counter, None, "Source I/O errors.";
FLUXPIPE_UDP_RECEIVE_DROPS_TOTAL = "fluxpipe_udp_receive_drops_total", Counter, None, "Datagrams the kernel dropped for a UDP socket source (its receive buffer was full).";
}

macro_rules! rendered {
    ($($id:ident = $name:literal, $kind:ident, $help:literal;)*) => {
        $(pub const $id: &str = $name;)*
        /// Name, kind and help of each.
        pub const RENDERED: &[(&str, Kind, &str)] = &[$(($name, Kind::$kind, $help)),*];
    };
}

// Series written at scrape time from views the pipeline keeps anyway
// (not through the recorder): their headers come from here too.
rendered! {
FLUX_INSTANCE_UP = "flux_instance_up", Gauge, "0 once the forwarder lost the instance (instance-down) until it restarts, else 1.";
FLUX_NODES = "flux_nodes", Gauge, "Nodes (broker ranks) known.";
FLUX_NODES_ONLINE = "flux_nodes_online", Gauge, "Nodes online.";
FLUX_NODES_OFFLINE = "flux_nodes_offline", Gauge, "Nodes offline.";
FLUX_NODES_LIVENESS_UNKNOWN = "flux_nodes_liveness_unknown", Gauge, "Nodes nothing said were online or offline (state read from a KVS resource eventlog alone).";
FLUX_NODES_DRAINED = "flux_nodes_drained", Gauge, "Nodes drained and running no job (flux resource status: drained).";
FLUX_NODES_DRAINING = "flux_nodes_draining", Gauge, "Nodes drained and still running a job (flux resource status: draining).";
FLUX_NODES_TORPID = "flux_nodes_torpid", Gauge, "Nodes torpid.";
FLUX_QUEUE_NODES = "flux_queue_nodes", Gauge, "Nodes of a queue that is not virtual, by state (all, online, offline, unknown, drained, draining, torpid): the queue's requires over the instance's node properties, +NAME ones included.";
FLUX_NODE_ONLINE = "flux_node_online", Gauge, "1 if the node is online.";
FLUX_NODE_TORPID = "flux_node_torpid", Gauge, "1 if the node is torpid.";
FLUX_NODE_DRAIN_INFO = "flux_node_drain_info", Gauge, "1 while the node is drained, with the reason and state (drained, or draining while a job still runs on it).";
FLUX_NODE_DRAIN_TIMESTAMP_SECONDS = "flux_node_drain_timestamp_seconds", Gauge, "When the node was drained (Unix time), while it is drained.";
FLUX_NODE_DRAINED_SECONDS_TOTAL = "flux_node_drained_seconds_total", Counter, "Seconds the node spent drained, up to the cluster's clock (alerts.clock).";
FLUX_NODE_OFFLINE_SECONDS_TOTAL = "flux_node_offline_seconds_total", Counter, "Seconds the node spent offline, up to the cluster's clock (alerts.clock).";
FLUX_JOB_STATE_OLDEST_ENTRY_TIMESTAMP_SECONDS = "flux_job_state_oldest_entry_timestamp_seconds", Gauge, "When the job that has been longest in the state entered it (Unix time).";
FLUX_JOBS_BY_USER = "flux_jobs_by_user", Gauge, "Active jobs per user and state (per_user_jobs).";
FLUXPIPE_SINK_BUFFERED_RECORDS = "fluxpipe_sink_buffered_records", Gauge, "Records queued for or held by a sink and not yet delivered or given up on.";
}

/// The `# HELP` and `# TYPE` lines of a series of [`RENDERED`].
pub fn header(out: &mut String, name: &str) {
    use std::fmt::Write;
    let Some(&(_, kind, help)) = RENDERED.iter().find(|(n, _, _)| *n == name) else {
        return;
    };
    let kind = match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    };
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}
