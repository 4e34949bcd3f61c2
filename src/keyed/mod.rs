//! Keyed state and the processor that drives it, with no I/O and no async:
//! the keys ([`key`]), the state of every job and rank ([`state`]), the
//! alert rules and the engine that times them ([`alerts`]), and the
//! per-record core both `fluxpipe replay` and the pipeline's shards drive
//! ([`processor`]), with how long it holds what ended ([`expiry`]).

pub mod alerts;
pub mod expiry;
pub mod finished;
pub mod job_table;
pub mod key;
pub mod listing;
pub mod owners;
pub mod processor;
pub mod query;
pub mod restore;
pub mod saved;
pub mod state;

pub use key::{JobKey, Owner};
