//! What every component's config can say about itself, found without
//! starting it: the problems with its own keys, and what it claims that
//! no other component may (addresses, standard input). The pipeline's
//! validation asks each component rather than knowing every type's rules.

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

/// What only one component of a pipeline can hold: a listening address or
/// socket path, or standard input. Each component says which it claims
/// (and under which key), so the pipeline can refuse two claims of one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    Tcp(String),
    Udp(String),
    Unix(String),
    Stdin,
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Tcp(a) | Resource::Udp(a) | Resource::Unix(a) => f.write_str(a),
            Resource::Stdin => f.write_str("standard input"),
        }
    }
}

/// One claim: the key that makes it (`address`), and what it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub key: &'static str,
    pub resource: Resource,
}

impl Claim {
    pub fn new(key: &'static str, resource: Resource) -> Self {
        Claim { key, resource }
    }
}

/// A duration key (`*_secs`, an alert rule's `for`) as a config writes it:
/// seconds as a number (`90`, `1.5`), or a duration string (`"90s"`,
/// `"10m"`, `"1h30m"`, `"7d"`, or `"90"`). One syntax wherever a duration
/// goes.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum DurationText {
    Seconds(f64),
    Text(String),
}

impl DurationText {
    /// In seconds, or why not.
    pub fn seconds(&self) -> Result<f64, crate::keyed::alerts::rule::RuleError> {
        match self {
            // `inf` (TOML's) is a duration too: "never", where a key allows it.
            DurationText::Seconds(s) if *s >= 0.0 => Ok(*s),
            DurationText::Seconds(s) => Err(crate::keyed::alerts::rule::RuleError::Duration(
                s.to_string(),
            )),
            DurationText::Text(t) => crate::keyed::alerts::rule::parse_duration(t),
        }
    }

    /// As written, for messages.
    pub fn text(&self) -> String {
        match self {
            DurationText::Seconds(s) => format!("{s}s"),
            DurationText::Text(t) => t.trim().to_string(),
        }
    }
}

/// serde's `deserialize_with` for a `*_secs` key: a number of seconds, or
/// a duration string.
pub fn seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    use serde::Deserialize;
    let given = DurationText::deserialize(d)?;
    given.seconds().map_err(serde::de::Error::custom)
}
