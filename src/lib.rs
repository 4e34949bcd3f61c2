//! fluxpipe: a streaming processor for the eventlogs of Flux.
//!
//! - [`flux`]: the Flux model (pure Rust, no I/O).
//! - [`decode`]: lines and paths → keyed records, shared by every input.
//! - [`keyed`]: keyed state over all jobs and ranks, the alert rules, and
//!   the per-record processor replay and the pipeline share.
//! - [`pipeline`], [`sources`], [`operators`], [`sinks`], [`output`],
//!   [`channels`], [`checkpoint`]: the streaming pipeline (`fluxpipe run`);
//!   [`api`]: its HTTP server.
//! - [`archive`]: the job archive in SQL (the `database` sink, `fluxpipe
//!   history`).
//! - [`cli`]: the subcommands; [`accounts`]: the host's user accounts.

pub mod accounts;
pub mod api;
pub mod archive;
pub mod channels;
pub mod cli;
pub mod component;
pub mod decode;
pub use flux_model as flux;
pub mod checkpoint;
pub mod keyed;
pub mod operators;
pub mod output;
pub mod pipeline;
pub mod sinks;
pub mod sources;
pub mod telemetry;
/// Synthetic Flux traffic for `fluxpipe generate`, the benchmark and tests:
/// not part of the library's surface.
#[doc(hidden)]
pub mod workload;
