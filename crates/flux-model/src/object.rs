//! A JSON object kept as text: what the model needs of a few of its keys
//! costs a scan, not a map of every key built and dropped per record.

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::fmt;
use thiserror::Error;

/// The JSON value is not an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("not a JSON object")]
pub struct NotAnObject;

/// A JSON object kept as the text it was read as (an event's context, an
/// R document): copied once, looked into by key (each lookup scans the
/// text), parsed whole only when needed.
#[derive(Clone)]
pub struct JsonObject(Box<RawValue>);

impl JsonObject {
    /// A map as a JSON object.
    pub fn from_map(map: &Map<String, Value>) -> Self {
        // A map of JSON values always serializes.
        JsonObject(serde_json::value::to_raw_value(map).unwrap_or_else(|_| empty_object()))
    }

    /// A JSON text, if it is an object.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Self, NotAnObject> {
        if raw.get().trim_start().starts_with('{') {
            Ok(JsonObject(raw))
        } else {
            Err(NotAnObject)
        }
    }

    /// A JSON value, if it is an object.
    pub fn from_value(value: &Value) -> Result<Self, NotAnObject> {
        match value {
            Value::Object(map) => Ok(JsonObject::from_map(map)),
            _ => Err(NotAnObject),
        }
    }

    /// The object as a JSON value.
    pub fn to_value(&self) -> Value {
        Value::Object(self.to_map())
    }

    /// The JSON text, as read.
    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// The value of a key, as JSON text: the last one when the key is
    /// repeated (as `serde_json::Map` keeps).
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        find(&self.0, key)
    }

    /// Whether the object has no key.
    pub fn is_empty(&self) -> bool {
        let text = self.0.get().trim();
        text.strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .is_some_and(|inner| inner.trim().is_empty())
    }

    /// The object as a map.
    pub fn to_map(&self) -> Map<String, Value> {
        serde_json::from_str(self.0.get()).unwrap_or_default()
    }
}

/// A key of a JSON object's text (the last one when repeated); `None`
/// when absent or when the text is not an object.
pub fn find<'a>(object: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    match scan::find(object.get(), key) {
        // The value's text, as a `RawValue`: checked again, but it is one
        // value, not the object.
        scan::Found::Value(text) => serde_json::from_str(text).ok(),
        scan::Found::Absent => None,
        scan::Found::Unsure => find_by_serde(object, key),
    }
}

/// The same, as the value's JSON text: what reading a number or a string
/// needs, without making it a `RawValue` first.
pub fn find_text<'a>(object: &'a RawValue, key: &str) -> Option<&'a str> {
    match scan::find(object.get(), key) {
        scan::Found::Value(text) => Some(text),
        scan::Found::Absent => None,
        scan::Found::Unsure => find_by_serde(object, key).map(RawValue::get),
    }
}

/// Several keys' value texts in one walk of the object's text (the last
/// of each when repeated).
pub fn find_texts<'a, const N: usize>(
    object: &'a RawValue,
    keys: [&str; N],
) -> [Option<&'a str>; N] {
    match scan::find_all(object.get(), keys) {
        Some(found) => found,
        None => keys.map(|key| find_by_serde(object, key).map(RawValue::get)),
    }
}

fn find_by_serde<'a>(object: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    let mut de = serde_json::Deserializer::from_str(object.get());
    FindKey(key).deserialize(&mut de).ok().flatten()
}

/// Finding a key by walking the object's text. The text is JSON already
/// checked (a `RawValue`), so a walk need not check it again: it only
/// finds where each key and value ends, several times faster than
/// deserializing the object. Keys written with escapes are left to
/// serde_json, which compares them unescaped.
mod scan {
    pub enum Found<'a> {
        Value(&'a str),
        Absent,
        /// Not walked (an escaped key): ask serde_json.
        Unsure,
    }

    pub fn find<'a>(text: &'a str, key: &str) -> Found<'a> {
        match find_all(text, [key]) {
            Some([Some(value)]) => Found::Value(value),
            Some([None]) => Found::Absent,
            None => Found::Unsure,
        }
    }

    /// Each key's value in one walk; `None`: not walked (an escaped key).
    pub fn find_all<'a, const N: usize>(
        text: &'a str,
        keys: [&str; N],
    ) -> Option<[Option<&'a str>; N]> {
        let b = text.as_bytes();
        let mut found = [None; N];
        let mut i = ws(b, 0);
        if b.get(i) != Some(&b'{') {
            return Some(found);
        }
        i = ws(b, i + 1);
        if b.get(i) == Some(&b'}') {
            return Some(found);
        }
        loop {
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let (end, escaped) = string_end(b, i + 1)?;
            if escaped {
                return None;
            }
            let name = text.get(i + 1..end)?;
            i = ws(b, end + 1);
            if b.get(i) != Some(&b':') {
                return None;
            }
            let start = ws(b, i + 1);
            let stop = value_end(b, start)?;
            for (slot, key) in found.iter_mut().zip(keys) {
                if name == key {
                    // The last of a repeated key, as a map keeps it.
                    *slot = Some(text.get(start..stop)?);
                }
            }
            i = ws(b, stop);
            match b.get(i) {
                Some(b',') => i = ws(b, i + 1),
                Some(b'}') => return Some(found),
                _ => return None,
            }
        }
    }

    fn ws(b: &[u8], mut i: usize) -> usize {
        while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    }

    /// The index of the quote closing a string whose text starts at `i`,
    /// and whether it has escapes.
    fn string_end(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
        // Byte by byte: keys and values here are short, shorter than what
        // a vectorized search needs to pay for its setup.
        let mut escaped = false;
        loop {
            match b.get(i)? {
                b'"' => return Some((i, escaped)),
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                _ => i += 1,
            }
        }
    }

    /// The index just past the value starting at `i`.
    fn value_end(b: &[u8], i: usize) -> Option<usize> {
        match b.get(i)? {
            b'"' => string_end(b, i + 1).map(|(end, _)| end + 1),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut j = i;
                loop {
                    match b.get(j)? {
                        b'"' => j = string_end(b, j + 1)?.0,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            _ => {
                let mut j = i;
                while !matches!(
                    b.get(j),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    j += 1;
                }
                Some(j)
            }
        }
    }
}

/// `{}`.
impl Default for JsonObject {
    fn default() -> Self {
        JsonObject(empty_object())
    }
}

fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_string()).unwrap_or_else(|_| unreachable!("{{}} is JSON"))
}

/// Equal when they hold the same JSON object, whatever the spacing and key
/// order of their texts.
impl PartialEq for JsonObject {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get() || self.to_map() == other.to_map()
    }
}

impl fmt::Debug for JsonObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl Serialize for JsonObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for JsonObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        JsonObject::from_raw(raw).map_err(serde::de::Error::custom)
    }
}

/// Finds one key of a JSON object, skipping the others' values unparsed.
struct FindKey<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for FindKey<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FindKey<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_it) = map.next_key_seed(KeyIs(self.0))? {
            if is_it {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Whether a map key is the one sought (escaped keys compared unescaped).
struct KeyIs<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn obj(text: &str) -> JsonObject {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn finds_keys_as_a_map_would() {
        let o = obj(r#"{ "a" : 1, "b":{"c":[1,2]}, "a\u0062":"x", "a":2 }"#);
        assert_eq!(
            o.get("a").map(RawValue::get),
            Some("2"),
            "the last of a repeated key"
        );
        assert_eq!(o.get("b").map(RawValue::get), Some(r#"{"c":[1,2]}"#));
        assert_eq!(
            o.get("ab").map(RawValue::get),
            Some(r#""x""#),
            "keys compared unescaped"
        );
        assert!(o.get("c").is_none(), "only the top level");
        let b = o.get("b").unwrap_or_else(|| panic!("b"));
        assert_eq!(find(b, "c").map(RawValue::get), Some("[1,2]"));
        assert!(find(o.get("a").unwrap_or_else(|| panic!("a")), "x").is_none());
    }

    #[test]
    fn only_objects_are_taken() {
        assert!(serde_json::from_str::<JsonObject>("[1]").is_err());
        assert!(serde_json::from_str::<JsonObject>("null").is_err());
        assert!(JsonObject::from_value(&json!(3)).is_err());
        assert!(obj(" { } ").is_empty() && JsonObject::default().is_empty());
        assert!(!obj(r#"{"a":null}"#).is_empty());
    }

    #[test]
    fn equal_when_the_objects_are() {
        assert_eq!(obj(r#"{"a":1, "b":[2]}"#), obj(r#"{"b":[2],"a":1}"#));
        assert_ne!(obj(r#"{"a":1}"#), obj(r#"{"a":2}"#));
        assert_eq!(
            serde_json::to_string(&obj(r#"{"b":1, "a":2}"#)).unwrap_or_default(),
            r#"{"b":1, "a":2}"#,
            "written as read"
        );
    }

    proptest! {
        #[test]
        fn every_key_of_a_map_is_found(m in prop::collection::btree_map("[a-c\"\\\\é]{0,3}", prop_oneof![
            any::<i64>().prop_map(Value::from),
            ".{0,6}".prop_map(Value::from),
            Just(json!({"x": [1, {"y": null}]})),
        ], 0..6)) {
            let map: Map<String, Value> = m.clone().into_iter().collect();
            let o = JsonObject::from_map(&map);
            for (k, v) in &m {
                let found = o.get(k).map(|r| serde_json::from_str::<Value>(r.get()).ok());
                prop_assert_eq!(found, Some(Some(v.clone())));
            }
            prop_assert!(o.get("absent-key").is_none());
            prop_assert_eq!(o.to_map(), map.clone());
            prop_assert_eq!(o.is_empty(), map.is_empty());
        }

        #[test]
        fn the_walk_finds_what_serde_json_finds(
            pairs in prop::collection::vec(("[a-c\"\\\\é]{0,3}", prop_oneof![
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                ".{0,6}".prop_map(Value::from),
                Just(json!({"x": [1, {"y": "]}\\\""}], "z": []})),
                Just(json!([[], {}, "a,b"])),
                Just(Value::Null),
                Just(json!(true)),
            ]), 0..6),
            spaced in any::<bool>(),
        ) {
            // Written by hand: repeated keys kept, spacing either way.
            let sep = if spaced { " \n " } else { "" };
            let body: Vec<String> = pairs
                .iter()
                .map(|(k, v)| format!("{}{sep}:{sep}{v}", Value::from(k.as_str())))
                .collect();
            let text = format!("{{{sep}{}{sep}}}", body.join(&format!("{sep},{sep}")));
            let raw = RawValue::from_string(text.clone()).unwrap_or_else(|e| panic!("{text}: {e}"));
            for key in pairs.iter().map(|(k, _)| k.as_str()).chain(["absent", ""]) {
                let want = find_by_serde(&raw, key).map(RawValue::get);
                prop_assert_eq!(find(&raw, key).map(RawValue::get), want, "{} in {}", key, text);
                prop_assert_eq!(find_text(&raw, key), want, "{} in {}", key, text);
            }
            // Several keys in one walk: each as it is found alone.
            let key = |i: usize| pairs.get(i).map_or("absent", |(k, _)| k.as_str());
            let keys = [key(0), "absent", key(3), key(1), ""];
            let want = keys.map(|k| find_by_serde(&raw, k).map(RawValue::get));
            prop_assert_eq!(find_texts(&raw, keys), want, "{:?} in {}", keys, text);
        }

        #[test]
        fn any_text_never_panics(s in ".{0,40}") {
            if let Ok(o) = serde_json::from_str::<JsonObject>(&s) {
                let _ = (o.get("a"), o.is_empty(), o.to_map());
            }
        }
    }
}
