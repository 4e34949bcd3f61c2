//! fluxpipe: a streaming processor for the eventlogs of Flux.
//!
//! - [`flux`]: the Flux model (pure Rust, no I/O).
//! - [`decode`]: lines and paths → keyed records, shared by every input.
//! - [`state`]: keyed state over all jobs and ranks.
//! - [`cli`]: the subcommands.

pub mod cli;
pub mod decode;
pub mod flux;
pub mod state;
