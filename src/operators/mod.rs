//! The keyed operators: shard tasks, each driving a
//! [`crate::keyed::processor::Processor`] over its part of the keys and
//! emitting output records; the router ([`crate::channels::router`])
//! deals records out to them.

mod answer;
pub mod feed_watch;
pub mod shard;
