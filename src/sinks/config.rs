//! What every sink's config has: the streams it takes (`inputs`), what
//! it does when its buffer is full (`when_full`) and how many records it
//! buffers (`buffer`), declared once ([`sink_config`]) beside each sink
//! type's own keys, as the sources' common keys are in
//! [`crate::sources::config`].

use crate::channels::fanout::{Subscription, WhenFull};
use crate::component::Problem;
use crate::output::{OutputStream, StreamSet};

/// The keys every sink has: its inputs and its channel's behaviour.
#[derive(Debug, Clone, Copy)]
pub struct SinkCommon<'a> {
    pub inputs: &'a [String],
    pub when_full: WhenFull,
    pub buffer: usize,
}

impl SinkCommon<'_> {
    /// The subscribed streams (unknown names are refused by validation
    /// before this is used).
    pub fn streams(&self) -> StreamSet {
        self.inputs
            .iter()
            .filter_map(|i| OutputStream::parse(i))
            .collect()
    }

    /// What the fan-out needs to feed the sink.
    pub fn subscription(&self) -> Subscription {
        Subscription {
            streams: self.streams(),
            when_full: self.when_full,
            buffer: self.buffer,
        }
    }

    /// What is wrong with the keys every sink has.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.inputs.is_empty() {
            out.push(Problem::new(
                "inputs",
                ": at least one output stream is needed",
            ));
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if OutputStream::parse(input).is_none() {
                let known: Vec<&str> = OutputStream::ALL.iter().map(|o| o.as_str()).collect();
                out.push(Problem::at(
                    "inputs",
                    i,
                    format!(
                        ": unknown input `{input}`; expected one of {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        if self.buffer == 0 {
            out.push(Problem::new("buffer", ": must be at least 1"));
        }
        out
    }
}

pub fn default_buffer() -> usize {
    1024
}

/// Declares a sink's config struct with its own keys plus the keys every
/// sink has (serde's `flatten` cannot be combined with
/// `deny_unknown_fields`, and unknown keys must be refused).
macro_rules! sink_config {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// Output streams to receive.
            pub inputs: Vec<String>,
            /// What to do when the buffer is full.
            #[serde(default)]
            pub when_full: $crate::channels::fanout::WhenFull,
            /// Records buffered before `when_full` applies.
            #[serde(default = "crate::sinks::config::default_buffer")]
            pub buffer: usize,
        }

        impl $name {
            pub fn common(&self) -> $crate::sinks::config::SinkCommon<'_> {
                $crate::sinks::config::SinkCommon {
                    inputs: &self.inputs,
                    when_full: self.when_full,
                    buffer: self.buffer,
                }
            }
        }
    };
}
pub(crate) use sink_config;
