//! What every source's config has: the keys that say how its lines are
//! decoded, declared once ([`source_config`]) and read by each source
//! type's own config struct.

use crate::decode::{EventStream, Format};
use crate::flux::jobid::JobId;
use serde::{Deserialize, Deserializer};

/// How a source's lines are read: every source type has these keys.
#[derive(Debug, Clone)]
pub struct DecodeConfig {
    pub cluster: String,
    pub format: Format,
    pub stream: Option<EventStream>,
    pub job_id: Option<JobId>,
    pub max_line_bytes: usize,
    /// Most dead letters a second (0: no limit).
    pub dead_letters_per_sec: u32,
}

/// Declares a source config struct with its own keys plus the decoding keys
/// every source has. (serde's `flatten` cannot be combined with
/// `deny_unknown_fields`, and unknown keys must be refused.)
macro_rules! source_config {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// Default cluster for inputs that do not name one.
            #[serde(default = "crate::sources::config::default_cluster")]
            pub cluster: String,
            /// Line format (`auto` tells them apart per line).
            #[serde(default, deserialize_with = "crate::sources::config::de_format")]
            pub format: $crate::decode::Format,
            /// Stream of plain events whose origin does not say.
            #[serde(default, deserialize_with = "crate::sources::config::de_stream")]
            pub stream: Option<$crate::decode::EventStream>,
            /// Job of plain job or exec events whose origin does not say.
            #[serde(default, deserialize_with = "crate::sources::config::de_jobid")]
            pub job_id: Option<$crate::flux::jobid::JobId>,
            /// Longest line accepted; longer lines go to `dead_letter`.
            #[serde(default = "crate::sources::config::default_max_line")]
            pub max_line_bytes: usize,
            /// Most dead letters written a second; the rest are counted.
            #[serde(default = "crate::sources::config::default_dead_letters_per_sec")]
            pub dead_letters_per_sec: u32,
        }

        impl $name {
            pub fn decode(&self) -> $crate::sources::config::DecodeConfig {
                $crate::sources::config::DecodeConfig {
                    cluster: self.cluster.clone(),
                    format: self.format,
                    stream: self.stream,
                    job_id: self.job_id,
                    max_line_bytes: self.max_line_bytes,
                    dead_letters_per_sec: self.dead_letters_per_sec,
                }
            }
        }
    };
}
pub(crate) use source_config;

impl DecodeConfig {
    /// What is wrong with the decoding keys.
    pub fn problems(&self) -> Vec<crate::component::Problem> {
        if self.max_line_bytes == 0 {
            vec![crate::component::Problem::new(
                "max_line_bytes",
                ": must be at least 1",
            )]
        } else {
            Vec::new()
        }
    }
}

pub(crate) fn default_cluster() -> String {
    "default".into()
}

pub(crate) fn default_max_line() -> usize {
    1024 * 1024
}

pub(crate) fn default_dead_letters_per_sec() -> u32 {
    100
}

pub(crate) fn de_format<'de, D: Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
    let s = String::deserialize(d)?;
    Format::parse(&s).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "format: unknown format `{s}`; expected auto, event, job-journal, resource-journal, exec-protocol or envelope"
        ))
    })
}

pub(crate) fn de_stream<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EventStream>, D::Error> {
    let s = String::deserialize(d)?;
    EventStream::parse(&s).map(Some).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "stream: unknown stream `{s}`; expected job, exec or resource"
        ))
    })
}

pub(crate) fn de_jobid<'de, D: Deserializer<'de>>(d: D) -> Result<Option<JobId>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Num(u64),
        Text(String),
    }
    match Id::deserialize(d)? {
        Id::Num(n) => Ok(Some(JobId(n))),
        Id::Text(s) => JobId::parse(&s)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("job_id: {e}"))),
    }
}
