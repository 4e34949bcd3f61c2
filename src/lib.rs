//! fluxpipe: a streaming processor for the eventlogs of Flux.
//!
//! - [`flux`]: the Flux model (pure Rust, no I/O).
//! - [`decode`]: lines and paths → keyed records, shared by every input.
//! - [`state`]: keyed state over all jobs and ranks.
//! - [`pipeline`], [`sources`], [`operators`], [`sinks`], [`output`]: the
//!   streaming pipeline (`fluxpipe run`).
//! - [`cli`]: the subcommands.

pub mod alerts;
pub mod cli;
pub mod decode;
pub mod exposition;
pub mod flux;
pub mod operators;
pub mod output;
pub mod pipeline;
pub mod sinks;
pub mod sources;
pub mod state;
pub mod telemetry;
pub mod workload;
