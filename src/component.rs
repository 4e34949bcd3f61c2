//! What every component's config can say about itself: the problems with
//! its own keys, found without starting it. The pipeline's validation asks
//! each component rather than knowing every type's rules.

/// Something wrong with one key of a component's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key at fault (`path`, `tls.crt_file`).
    pub key: &'static str,
    /// The element at fault, when the key holds a list.
    pub index: Option<usize>,
    /// What follows the key's full name in the message: `: why`, or
    /// `` `value`: why``.
    pub message: String,
}

impl Problem {
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        Problem {
            key,
            index: None,
            message: message.into(),
        }
    }

    /// The same, about the `index`-th element of a list.
    pub fn at(key: &'static str, index: usize, message: impl Into<String>) -> Self {
        Problem {
            key,
            index: Some(index),
            message: message.into(),
        }
    }
}

/// How a socket source or sink talks: a TCP stream, UDP datagrams (sources
/// only) or a Unix stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketMode {
    #[default]
    Tcp,
    Udp,
    Unix,
}
