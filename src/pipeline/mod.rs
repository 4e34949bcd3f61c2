//! The top of the house: the pipeline's configuration (the list of
//! component types) and the topology, the only place that wires sources,
//! operators, sinks and the checkpoint coordinator together.

pub mod config;
pub mod preflight;
pub mod topology;
