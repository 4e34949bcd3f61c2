//! The top of the house: the pipeline's configuration (the list of
//! component types), the coordinator of checkpoint rounds, and the
//! topology, the only place that wires sources, operators and sinks
//! together.

pub mod config;
pub mod coordinator;
pub mod preflight;
pub mod topology;
