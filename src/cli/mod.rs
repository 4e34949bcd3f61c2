//! The subcommands of `fluxpipe`.

pub mod bench;
pub mod generate;
pub mod id;
pub mod replay;
pub mod run;
