//! RFC 18 events: one JSON object per eventlog line.
//!
//! An event has a `timestamp` (seconds since the epoch, > 0), a `name`, an
//! optional `context` object, and possibly other keys, which are carried
//! untouched rather than rejected.

use super::object::JsonObject;
use compact_str::CompactString;
use serde::Serialize;
use serde_json::{Map, Value};
use std::borrow::Cow;
use thiserror::Error;

/// An event's `context`: kept as the JSON text it was read as. The model
/// reads a key or two of a few events; building a map for every event (and
/// dropping it) was most of the cost of decoding and applying one.
pub type Context = JsonObject;

/// One RFC 18 event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub timestamp: f64,
    /// Inline (event names are short): no allocation made on a source's
    /// thread and freed on a shard's for every event.
    pub name: CompactString,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Context>,
    /// Keys beyond the three RFC 18 names: carried, never rejected. Boxed
    /// and absent when there are none (nearly always): an event crosses
    /// from a source's thread to a shard's, and is copied at its size.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Box<Map<String, Value>>>,
}

/// Why a JSON value is not an RFC 18 event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventError {
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("event is not a JSON object")]
    NotObject,
    #[error("event has no timestamp")]
    MissingTimestamp,
    #[error("event timestamp is not a positive finite number")]
    BadTimestamp,
    #[error("event has no name")]
    MissingName,
    #[error("event name is not a non-empty string")]
    BadName,
    #[error("event context is not a JSON object")]
    BadContext,
}

/// Why a context key could not be read as the type an RFC requires.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ContextError {
    #[error("missing context key `{0}`")]
    Missing(&'static str),
    #[error("context key `{key}` is not {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
}

impl Event {
    /// An event with no context, for tests and generators.
    pub fn new(timestamp: f64, name: impl Into<CompactString>) -> Self {
        Event {
            timestamp,
            name: name.into(),
            context: None,
            extra: None,
        }
    }

    /// The same event with `context` set (an object; anything else is dropped).
    pub fn with_context(mut self, context: Value) -> Self {
        if let Value::Object(map) = context {
            self.context = Some(JsonObject::from_map(&map));
        }
        self
    }

    /// Parse one eventlog line.
    pub fn parse(line: &str) -> Result<Self, EventError> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| EventError::Json(e.to_string()))?;
        Self::from_value(value)
    }

    /// Validate a decoded JSON value as an RFC 18 event.
    pub fn from_value(value: Value) -> Result<Self, EventError> {
        let Value::Object(mut map) = value else {
            return Err(EventError::NotObject);
        };
        let timestamp = match map.remove("timestamp") {
            None => return Err(EventError::MissingTimestamp),
            Some(Value::Number(n)) => n.as_f64().ok_or(EventError::BadTimestamp)?,
            Some(_) => return Err(EventError::BadTimestamp),
        };
        if !(timestamp.is_finite() && timestamp > 0.0) {
            return Err(EventError::BadTimestamp);
        }
        let name = match map.remove("name") {
            None => return Err(EventError::MissingName),
            Some(Value::String(s)) if !s.is_empty() => CompactString::from(s),
            Some(_) => return Err(EventError::BadName),
        };
        let context = match map.remove("context") {
            None => None,
            Some(Value::Object(c)) => Some(JsonObject::from_map(&c)),
            Some(_) => return Err(EventError::BadContext),
        };
        Ok(Event {
            timestamp,
            name,
            context,
            extra: (!map.is_empty()).then(|| Box::new(map)),
        })
    }

    /// The event as one compact eventlog line.
    pub fn to_line(&self) -> String {
        // Serializing a struct of plain JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A context value's JSON text, if present.
    fn text(&self, key: &str) -> Option<&str> {
        self.context
            .as_ref()
            .and_then(|c| super::object::find_text(c.raw(), key))
    }

    /// Several context keys, read in one walk of the context: for events
    /// whose handling reads more than one.
    pub fn values<const N: usize>(&self, keys: [&'static str; N]) -> ContextValues<'_, N> {
        let texts = match &self.context {
            Some(c) => super::object::find_texts(c.raw(), keys),
            None => [None; N],
        };
        ContextValues { keys, texts }
    }

    /// A context value, if present.
    pub fn get(&self, key: &str) -> Option<Value> {
        value(self.text(key))
    }

    /// Whether the context has the key.
    pub fn has(&self, key: &str) -> bool {
        self.text(key).is_some()
    }

    /// A required integer context key (JSON integer; floats with no fraction accepted).
    pub fn int(&self, key: &'static str) -> Result<i64, ContextError> {
        int(key, self.text(key))
    }

    /// A required number context key (integer or float).
    pub fn number(&self, key: &'static str) -> Result<f64, ContextError> {
        number(key, self.text(key))
    }

    /// A required string context key.
    pub fn str(&self, key: &'static str) -> Result<Cow<'_, str>, ContextError> {
        string(key, self.text(key))
    }

    /// A required boolean context key.
    pub fn bool(&self, key: &'static str) -> Result<bool, ContextError> {
        boolean(key, self.text(key))
    }

    /// An optional string context key: `Ok(None)` when absent or null.
    pub fn opt_str(&self, key: &'static str) -> Result<Option<Cow<'_, str>>, ContextError> {
        opt_string(key, self.text(key))
    }

    /// An optional integer context key: `Ok(None)` when absent or null.
    pub fn opt_int(&self, key: &'static str) -> Result<Option<i64>, ContextError> {
        opt_int(key, self.text(key))
    }
}

/// Context values read together ([`Event::values`]), asked for by key as
/// of the event; a key that was not read is missing.
pub struct ContextValues<'a, const N: usize> {
    keys: [&'static str; N],
    texts: [Option<&'a str>; N],
}

impl<'a, const N: usize> ContextValues<'a, N> {
    fn text(&self, key: &'static str) -> Option<&'a str> {
        let i = self.keys.iter().position(|k| *k == key);
        debug_assert!(i.is_some(), "context key `{key}` was not read");
        i.and_then(|i| self.texts[i])
    }

    pub fn has(&self, key: &'static str) -> bool {
        self.text(key).is_some()
    }

    pub fn int(&self, key: &'static str) -> Result<i64, ContextError> {
        int(key, self.text(key))
    }

    pub fn str(&self, key: &'static str) -> Result<Cow<'a, str>, ContextError> {
        string(key, self.text(key))
    }

    pub fn bool(&self, key: &'static str) -> Result<bool, ContextError> {
        boolean(key, self.text(key))
    }

    pub fn opt_str(&self, key: &'static str) -> Result<Option<Cow<'a, str>>, ContextError> {
        opt_string(key, self.text(key))
    }

    pub fn opt_int(&self, key: &'static str) -> Result<Option<i64>, ContextError> {
        opt_int(key, self.text(key))
    }
}

// What each kind of context value is, from its JSON text (`None`: absent).

fn value(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

fn int(key: &'static str, text: Option<&str>) -> Result<i64, ContextError> {
    let text = text.ok_or(ContextError::Missing(key))?;
    raw_int(text).ok_or(ContextError::WrongType {
        key,
        expected: "an integer",
    })
}

fn number(key: &'static str, text: Option<&str>) -> Result<f64, ContextError> {
    match value(text) {
        None => Err(ContextError::Missing(key)),
        Some(Value::Number(n)) => n.as_f64().ok_or(ContextError::WrongType {
            key,
            expected: "a number",
        }),
        Some(_) => Err(ContextError::WrongType {
            key,
            expected: "a number",
        }),
    }
}

fn string<'a>(key: &'static str, text: Option<&'a str>) -> Result<Cow<'a, str>, ContextError> {
    match text {
        None => Err(ContextError::Missing(key)),
        Some(r) => raw_str(r).ok_or(ContextError::WrongType {
            key,
            expected: "a string",
        }),
    }
}

fn boolean(key: &'static str, text: Option<&str>) -> Result<bool, ContextError> {
    match text {
        None => Err(ContextError::Missing(key)),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(_) => Err(ContextError::WrongType {
            key,
            expected: "a boolean",
        }),
    }
}

fn opt_string<'a>(
    key: &'static str,
    text: Option<&'a str>,
) -> Result<Option<Cow<'a, str>>, ContextError> {
    match text {
        None | Some("null") => Ok(None),
        Some(r) => raw_str(r).map(Some).ok_or(ContextError::WrongType {
            key,
            expected: "a string",
        }),
    }
}

fn opt_int(key: &'static str, text: Option<&str>) -> Result<Option<i64>, ContextError> {
    match text {
        None | Some("null") => Ok(None),
        Some(text) => raw_int(text).map(Some).ok_or(ContextError::WrongType {
            key,
            expected: "an integer",
        }),
    }
}

fn raw_int(text: &str) -> Option<i64> {
    if let Ok(i) = text.parse::<i64>() {
        return Some(i);
    }
    serde_json::from_str(text)
        .ok()
        .and_then(|v| value_as_i64(&v))
}

/// A JSON string's text: borrowed when it has no escapes.
fn raw_str(text: &str) -> Option<Cow<'_, str>> {
    match serde_json::from_str::<&str>(text) {
        Ok(s) => Some(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
    }
}

/// An integer from JSON: an integer literal, or a float with no fraction
/// that fits (some writers print `3.0`).
fn value_as_i64(v: &Value) -> Option<i64> {
    let n = v.as_number()?;
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let f = n.as_f64()?;
    if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 {
        Some(f as i64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_rfc18_example() {
        let e = Event::parse(
            r#"{"timestamp":1552593348.073045,"name":"submit","context":{"urgency":16,"userid":5588,"flags":0,"version":1}}"#,
        )
        .unwrap();
        assert_eq!(e.name, "submit");
        assert_eq!(e.int("urgency"), Ok(16));
        assert_eq!(e.int("nope"), Err(ContextError::Missing("nope")));
    }

    #[test]
    fn carries_extra_keys() {
        let line = r#"{"timestamp":1.5,"name":"x","extra":[1,2]}"#;
        let e = Event::parse(line).unwrap();
        let extra = e.extra.as_ref().and_then(|m| m.get("extra"));
        assert_eq!(extra, Some(&serde_json::json!([1, 2])));
        assert_eq!(Event::parse(&e.to_line()).unwrap(), e);
    }

    #[test]
    fn rejects_bad_events() {
        assert_eq!(Event::parse("[1]"), Err(EventError::NotObject));
        assert_eq!(
            Event::parse(r#"{"name":"x"}"#),
            Err(EventError::MissingTimestamp)
        );
        assert_eq!(
            Event::parse(r#"{"timestamp":-1,"name":"x"}"#),
            Err(EventError::BadTimestamp)
        );
        assert_eq!(
            Event::parse(r#"{"timestamp":"1","name":"x"}"#),
            Err(EventError::BadTimestamp)
        );
        assert_eq!(
            Event::parse(r#"{"timestamp":1}"#),
            Err(EventError::MissingName)
        );
        assert_eq!(
            Event::parse(r#"{"timestamp":1,"name":""}"#),
            Err(EventError::BadName)
        );
        assert_eq!(
            Event::parse(r#"{"timestamp":1,"name":"x","context":3}"#),
            Err(EventError::BadContext)
        );
        assert!(matches!(Event::parse("{"), Err(EventError::Json(_))));
    }

    #[test]
    fn integer_like_floats_are_integers() {
        let e = Event::new(1.0, "x").with_context(serde_json::json!({"a": 3.0, "b": 3.5}));
        assert_eq!(e.int("a"), Ok(3));
        assert!(e.int("b").is_err());
    }

    #[test]
    fn values_read_together_read_as_one_by_one() {
        let e = Event::new(1.0, "x").with_context(serde_json::json!({
            "a": 3, "b": "s", "c": true, "d": null, "e": [1]
        }));
        let v = e.values(["a", "b", "c", "d", "e", "z"]);
        assert_eq!(v.int("a"), e.int("a"));
        assert_eq!(v.str("b"), e.str("b"));
        assert_eq!(v.bool("c"), Ok(true));
        assert_eq!(v.bool("c"), e.bool("c"));
        assert_eq!(v.bool("a"), e.bool("a"));
        assert_eq!(v.opt_str("d"), Ok(None));
        assert_eq!(v.opt_int("d"), e.opt_int("d"));
        assert_eq!(v.int("e"), e.int("e"));
        assert!(v.has("e") && !v.has("z"));
        assert_eq!(v.int("z"), Err(ContextError::Missing("z")));
        let bare = Event::new(1.0, "x");
        assert_eq!(bare.values(["a"]).str("a"), Err(ContextError::Missing("a")));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".*") {
            let _ = Event::parse(&s);
        }

        #[test]
        fn integers_are_read_as_a_json_value_reads_them(v in prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            (-1e19f64..1e19).prop_map(|f| Value::from(f.trunc())),
            "[0-9.-]{0,4}".prop_map(Value::from),
            Just(Value::Null),
            Just(serde_json::json!([1])),
        ]) {
            let e = Event::new(1.0, "x").with_context(serde_json::json!({"k": v}));
            let want = value_as_i64(&v);
            prop_assert_eq!(e.int("k").ok(), want);
            let opt = if v.is_null() { Some(None) } else { want.map(Some) };
            prop_assert_eq!(e.opt_int("k").ok(), opt);
            prop_assert_eq!(e.int("absent"), Err(ContextError::Missing("absent")));
        }

        #[test]
        fn round_trips(ts in 1e-6f64..1e12, name in "[a-z.-]{1,12}", n in any::<i64>(), s in ".*") {
            let e = Event::new(ts, name).with_context(serde_json::json!({"n": n, "s": s}));
            prop_assert_eq!(Event::parse(&e.to_line()).unwrap(), e);
        }
    }
}
