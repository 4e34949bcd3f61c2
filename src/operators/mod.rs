//! The keyed operators: shard tasks, each driving a
//! [`crate::keyed::processor::Processor`] over its part of the keys and
//! emitting output records; the router ([`crate::channels::router`])
//! deals records out to them.

pub mod ages;
mod answer;
mod entry_times;
pub mod feed_watch;
pub mod job_metrics;
pub mod shard;
mod shard_metrics;
