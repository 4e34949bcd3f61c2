//! The subcommands of `fluxpipe`.

mod ask;
#[doc(hidden)]
pub mod bench;
pub mod format;
pub mod generate;
pub mod history;
pub mod id;
pub mod jobs;
mod listing;
pub mod replay;
pub mod report;
pub mod resource;
pub mod run;
pub mod tap;
pub mod top;
