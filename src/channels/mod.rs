//! The channels between components: the router from sources to the
//! shards ([`router`]), the fan-out from the shards to the sinks
//! ([`fanout`]), with the acknowledgements that travel back, when
//! each feed was last heard ([`feeds`]), and
//! questions to the shards from the query API ([`query`]). Sources,
//! operators and sinks import these, never each other; only the topology
//! ([`crate::pipeline::topology`]) wires them together.

pub mod fanout;
pub mod feeds;
pub mod query;
pub mod router;
pub mod tap;
