//! The streaming pipeline: configuration, wiring of sources, operators and
//! sinks, and shutdown.

pub mod config;
pub mod topology;
