//! The Flux model: events, job ids, idsets, hostlists and the state
//! machines of RFC 21, 32, 44 and 50. Pure Rust: no I/O, no async.

pub mod allocation;
pub mod anomaly;
pub mod event;
pub mod exec;
pub mod fsd;
pub mod hostlist;
pub mod idset;
pub mod job;
pub mod jobid;
pub mod jobspec;
pub mod object;
pub mod packed;
pub mod queues;
pub mod resource;
pub mod texts;
pub mod user;

pub use anomaly::{Anomaly, AnomalyKind, Stream};
pub use event::Event;
