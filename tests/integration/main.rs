//! The integration tests, in one test binary (a binary per file would
//! link the whole of fluxpipe once per file): each module runs the real
//! `fluxpipe` binary, or the real pipeline, against real files, sockets,
//! Kafka, HTTP, PostgreSQL and flux-core's answers on loopback.
//! `tests/cost.rs`, the cost gate, is a binary of its own: it counts its
//! process's allocations.

#[path = "../common/mod.rs"]
mod common;

mod alerts;
mod backlog_resent;
mod bad_input;
mod bench;
mod cli_id;
mod cli_meta;
mod container;
mod crash_recovery;
mod database;
mod debian_package;
mod disk_full;
mod end_to_end;
mod file_rotation;
mod file_source;
mod generate;
mod hostile_feeds;
mod http_source;
mod kafka;
mod metrics;
mod net_io;
mod pipelines;
mod query_api;
mod readme_configs;
mod readme_tour;
mod replay_corpus;
mod replay_rules;
mod run_loudness;
mod run_pipeline;
mod tap;
mod udp_drops;
