//! The streaming pipeline: configuration, wiring of sources, operators and
//! sinks, and shutdown.

pub mod changelog;
pub mod checkpoint;
pub mod config;
pub mod coordinator;
pub mod topology;
