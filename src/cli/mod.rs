//! The subcommands of `fluxpipe`.

pub mod id;
pub mod replay;
pub mod run;
