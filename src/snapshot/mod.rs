//! The state backend: the keyed state written down and read back. A
//! checkpoint file (positions and every shard's state, one file per
//! round) and the Kafka changelog's keys and values (one per job or
//! cluster, compacted by the broker). Below the pipeline: the coordinator
//! writes them, the shards and sources read them.

pub mod changelog;
pub mod checkpoint;
pub mod lock;
