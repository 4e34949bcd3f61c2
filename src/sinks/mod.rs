//! Sinks: where output records go. Each sink runs as its own task behind a
//! bounded channel; the fan-out ([`crate::channels::fanout`]) sends each
//! record to the sinks that asked for its stream.
//!
//! Each sink type is one file here that owns its config (a struct made
//! with [`crate::sinks::config::sink_config`], and its [`SinkSpec`])
//! and its `run`; a new sink is that file, its `pub mod` line and one line
//! in the list below.
//! (`/metrics` is not a sink: it is the pipeline's server, [`crate::api`].)

pub mod config;
pub mod lines;
pub mod pager;
pub mod retry;

// The sink types: a module each, and a line in `sink_types!` below.
// Plain `mod` lines, so that rustfmt sees every file.
pub mod alertmanager;
pub mod blackhole;
pub mod database;
pub mod file;
pub mod http;
pub mod kafka;
pub mod socket;
pub mod stdout;

use crate::channels::fanout::SinkRx;
pub use crate::channels::fanout::count_sent;
use crate::component::Problem;
use config::SinkCommon;

/// What the pipeline asks of every sink type's config, besides the keys
/// every sink has (`common()`, made by
/// [`crate::sinks::config::sink_config`]).
pub trait SinkSpec {
    /// What is wrong with its own keys.
    fn problems(&self) -> Vec<Problem> {
        Vec::new()
    }
}

/// The sink types: `type = "NAME"` → module and config. Makes the
/// `[sinks.NAME]` config enum and the calls into each type.
macro_rules! sink_types {
    ($($variant:ident => $module:ident :: $config:ident,)*) => {

        /// `[sinks.NAME]`.
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
        pub enum SinkConfig {
            $($variant($module::$config),)*
        }

        impl SinkConfig {
            /// Every `type = "NAME"`.
            pub const TYPES: &[&str] = &[$(stringify!($module)),*];

            /// The keys every sink has.
            pub fn common(&self) -> SinkCommon<'_> {
                match self {
                    $(SinkConfig::$variant(c) => c.common(),)*
                }
            }

            /// The error a table of sink type `kind` gives when read as
            /// that type (`None` for an unknown type).
            pub fn table_error<'de, D: serde::Deserializer<'de>>(
                kind: &str,
                de: D,
            ) -> Option<D::Error> {
                $(if kind == stringify!($module) {
                    return <$module::$config as serde::Deserialize>::deserialize(de).err();
                })*
                None
            }

            /// What is wrong with this sink's own keys.
            pub fn problems(&self) -> Vec<Problem> {
                match self {
                    $(SinkConfig::$variant(c) => c.problems(),)*
                }
            }
        }

        /// Run one sink until every sender is gone and its buffer is
        /// delivered.
        pub async fn run(
            name: String,
            config: SinkConfig,
            rx: SinkRx,
            ctx: SinkContext,
        ) -> anyhow::Result<()> {
            match config {
                $(SinkConfig::$variant(c) => $module::run(&name, c, rx, &ctx).await,)*
            }
        }
    };
}

sink_types! {
    Stdout => stdout::StdoutSinkConfig,
    Blackhole => blackhole::BlackholeSinkConfig,
    File => file::FileSinkConfig,
    Socket => socket::SocketSinkConfig,
    Http => http::HttpSinkConfig,
    Alertmanager => alertmanager::AlertmanagerSinkConfig,
    Kafka => kafka::KafkaSinkConfig,
    Database => database::DatabaseSinkConfig,
}

/// The reader of a sink's output went away (`fluxpipe run | head`): the
/// pipeline stops, as a reader's end asks, and that is not a failure.
#[derive(Debug, thiserror::Error)]
#[error("the output's reader went away ({left} records not written)")]
pub struct OutputClosed {
    pub left: u64,
}

/// What sinks may need beyond their records.
#[derive(Debug, Clone, Default)]
pub struct SinkContext {
    /// Where the file sinks stand, for checkpoints.
    pub offsets: crate::checkpoint::offsets::SinkOffsets,
    /// The pipeline's shutdown, for a sink whose end ends the pipeline (a
    /// closed standard output when it is the only sink).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// How many sinks the pipeline has.
    pub sinks: usize,
    /// Where the pipeline's API answers (`http://ADDRESS`), if it has one:
    /// what alerts link back to.
    pub api_url: Option<String>,
}
