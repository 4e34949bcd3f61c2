//! Everything a checkpoint is and does. A round starts at the
//! coordinator ([`coordinator`]), which asks every source for its
//! positions through its link ([`link`]), puts a barrier behind them to
//! every shard and waits for the sinks to acknowledge what came before
//! (the file sinks' places: [`offsets`]); then it writes one file, the
//! positions and every shard's state ([`file`]), and the changelog's
//! keys and values for partitioned state ([`changelog`]). The data
//! folder is held by one run at a time ([`lock`]).

pub mod changelog;
pub mod coordinator;
pub mod file;
pub mod link;
pub mod lock;
pub mod offsets;
