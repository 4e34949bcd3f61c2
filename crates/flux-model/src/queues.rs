//! An instance's queues as its `[queues]` table configures them (RFC 33):
//! which queue is virtual (a `parent` names the queue it is scheduled as
//! part of) and which properties select a queue's nodes (`requires`).
//!
//! Flux's eventlogs do not carry this table; the forwarder sends it. The
//! rules here are job-list's and `flux resource`'s:
//! - asking for queue N takes the jobs of N and of the virtual queues whose
//!   parent is N (one level; asking for a virtual queue takes only its own);
//! - a virtual queue's nodes are its parent's; a queue with no `requires`
//!   holds every node; with several, a node must have them all.

use crate::idset::IdSet;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use thiserror::Error;

/// Most queues one instance's table may name: a table beyond it is a
/// feed's mistake (or malice), refused whole.
pub const MAX_QUEUES: usize = 1024;
/// Most properties one queue may require.
pub const MAX_REQUIRES: usize = 64;
/// Longest queue or property name taken.
pub const MAX_NAME: usize = 256;

/// One queue's entry, cut to what fluxpipe reads of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The queue a virtual queue is scheduled as part of.
    // Every field always written: checkpoints encode structs by position.
    #[serde(default)]
    pub parent: Option<String>,
    /// Properties a node must have (all of them) to be in the queue.
    #[serde(default)]
    pub requires: Vec<String>,
}

/// An instance's `[queues]` table; empty when it configures none (one
/// anonymous queue).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueueConfig {
    queues: BTreeMap<String, QueueEntry>,
}

/// Why a `[queues]` table was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueConfigError {
    #[error("`queues` is not a table")]
    NotTable,
    #[error("queue `{0}`: its entry is not a table")]
    Entry(String),
    #[error("queue `{0}`: `parent` is not a string")]
    ParentType(String),
    #[error("queue `{0}`: parent `{1}` is not a configured queue")]
    UnknownParent(String, String),
    #[error("queue `{0}`: parent `{1}` is itself a virtual queue")]
    NestedParent(String, String),
    #[error("queue `{0}`: `requires` is not an array of property names")]
    Requires(String),
    #[error("a virtual queue `{0}` has `requires` of its own")]
    VirtualRequires(String),
    #[error("more than {MAX_QUEUES} queues, or a name longer than {MAX_NAME} bytes")]
    TooBig,
}

impl QueueConfig {
    /// Read a `[queues]` table (JSON), checked as flux-core checks it: a
    /// parent must be a configured, non-virtual queue, and a virtual queue
    /// requires nothing of its own. Keys other than these two are ignored.
    pub fn from_value(v: &Value) -> Result<Self, QueueConfigError> {
        let table = v.as_object().ok_or(QueueConfigError::NotTable)?;
        if table.len() > MAX_QUEUES || table.keys().any(|k| k.len() > MAX_NAME) {
            return Err(QueueConfigError::TooBig);
        }
        let mut queues = BTreeMap::new();
        for (name, entry) in table {
            let entry = entry
                .as_object()
                .ok_or_else(|| QueueConfigError::Entry(name.clone()))?;
            let parent = match entry.get("parent") {
                None | Some(Value::Null) => None,
                Some(Value::String(p)) if p.len() <= MAX_NAME => Some(p.clone()),
                Some(_) => return Err(QueueConfigError::ParentType(name.clone())),
            };
            let requires = match entry.get("requires") {
                None => Vec::new(),
                Some(Value::Array(a)) if a.len() <= MAX_REQUIRES => a
                    .iter()
                    .map(|p| match p.as_str() {
                        Some(p) if !p.is_empty() && p.len() <= MAX_NAME => Ok(p.to_string()),
                        _ => Err(QueueConfigError::Requires(name.clone())),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(QueueConfigError::Requires(name.clone())),
            };
            if parent.is_some() && !requires.is_empty() {
                return Err(QueueConfigError::VirtualRequires(name.clone()));
            }
            queues.insert(name.clone(), QueueEntry { parent, requires });
        }
        for (name, entry) in &queues {
            if let Some(p) = &entry.parent {
                match queues.get(p) {
                    None => return Err(QueueConfigError::UnknownParent(name.clone(), p.clone())),
                    Some(e) if e.parent.is_some() => {
                        return Err(QueueConfigError::NestedParent(name.clone(), p.clone()));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(QueueConfig { queues })
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// The configured queues, by name, with their entries.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &QueueEntry)> {
        self.queues.iter().map(|(n, e)| (n.as_str(), e))
    }

    pub fn contains(&self, queue: &str) -> bool {
        self.queues.contains_key(queue)
    }

    /// The parent of a virtual queue; `None` for any other name.
    pub fn parent_of(&self, queue: &str) -> Option<&str> {
        self.queues.get(queue)?.parent.as_deref()
    }

    /// Whether asking for queue `asked` takes a job of queue `job_queue`:
    /// its own queue, or the parent of its (virtual) queue.
    pub fn takes(&self, asked: &str, job_queue: &str) -> bool {
        asked == job_queue || self.parent_of(job_queue) == Some(asked)
    }

    /// The names a job's queue must be one of for asking `asked` to take
    /// it: `asked` and the virtual queues whose parent it is.
    pub fn expand<'a>(&'a self, asked: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        std::iter::once(asked).chain(
            self.queues
                .iter()
                .filter(move |(_, e)| e.parent.as_deref() == Some(asked))
                .map(|(n, _)| n.as_str()),
        )
    }

    /// The properties that select a queue's nodes: its own, or its
    /// parent's for a virtual queue. `None`: no such queue.
    pub fn requires(&self, queue: &str) -> Option<&[String]> {
        let entry = self.queues.get(queue)?;
        match &entry.parent {
            Some(p) => self.queues.get(p).map(|e| e.requires.as_slice()),
            None => Some(&entry.requires),
        }
    }

    /// The ranks of `all` in a queue, given the instance's properties (name
    /// → ranks). A required `^NAME` (RFC 31) takes the nodes without it.
    /// `None`: no such queue.
    pub fn ranks(
        &self,
        queue: &str,
        all: &IdSet,
        properties: &BTreeMap<String, IdSet>,
    ) -> Option<IdSet> {
        let mut out = all.clone();
        for p in self.requires(queue)? {
            out = match p.strip_prefix('^') {
                Some(not) => {
                    if let Some(has) = properties.get(not) {
                        out.subtract(has);
                    }
                    out
                }
                None => match properties.get(p) {
                    Some(has) => out.intersection(has),
                    None => IdSet::new(),
                },
            };
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn config(v: Value) -> QueueConfig {
        QueueConfig::from_value(&v).unwrap()
    }

    fn set(s: &str) -> IdSet {
        IdSet::parse(s).unwrap()
    }

    #[test]
    fn the_manual_example_reads_and_resolves() {
        // flux-config-queues(5)'s example, with an instance-local property.
        let q = config(json!({
            "debug": {"requires": ["debug"], "policy": {"limits": {"duration": "30m"}}},
            "batch": {"requires": ["+batch"]},
            "expedite": {"parent": "batch", "policy": {"limits": {"duration": "1h"}}},
        }));
        assert_eq!(q.parent_of("expedite"), Some("batch"));
        assert_eq!(q.parent_of("batch"), None);
        assert!(q.takes("batch", "expedite"));
        assert!(q.takes("batch", "batch"));
        assert!(!q.takes("expedite", "batch"), "one level, downward only");
        assert!(!q.takes("debug", "expedite"));
        assert_eq!(q.expand("batch").collect::<Vec<_>>(), ["batch", "expedite"]);
        assert_eq!(q.expand("expedite").collect::<Vec<_>>(), ["expedite"]);
        let props = BTreeMap::from([
            ("debug".to_string(), set("0-1")),
            ("+batch".to_string(), set("2-7")),
        ]);
        let all = set("0-7");
        assert_eq!(q.ranks("debug", &all, &props), Some(set("0-1")));
        assert_eq!(q.ranks("batch", &all, &props), Some(set("2-7")));
        assert_eq!(q.ranks("expedite", &all, &props), Some(set("2-7")));
        assert_eq!(q.ranks("nosuch", &all, &props), None);
    }

    #[test]
    fn requires_are_anded_and_negations_are_honoured() {
        let q = config(json!({
            "a": {},
            "b": {"requires": ["x", "y"]},
            "c": {"requires": ["^x"]},
            "d": {"requires": ["missing"]},
        }));
        let props = BTreeMap::from([("x".to_string(), set("0-3")), ("y".to_string(), set("2-5"))]);
        let all = set("0-7");
        assert_eq!(q.ranks("a", &all, &props), Some(all.clone()));
        assert_eq!(q.ranks("b", &all, &props), Some(set("2-3")));
        assert_eq!(q.ranks("c", &all, &props), Some(set("4-7")));
        assert_eq!(q.ranks("d", &all, &props), Some(IdSet::new()));
    }

    #[test]
    fn what_flux_core_refuses_is_refused() {
        let bad = [
            (json!([]), QueueConfigError::NotTable),
            (json!({"a": 1}), QueueConfigError::Entry("a".into())),
            (
                json!({"a": {"parent": 1}}),
                QueueConfigError::ParentType("a".into()),
            ),
            (
                json!({"a": {"parent": "b"}}),
                QueueConfigError::UnknownParent("a".into(), "b".into()),
            ),
            (
                json!({"a": {}, "b": {"parent": "a"}, "c": {"parent": "b"}}),
                QueueConfigError::NestedParent("c".into(), "b".into()),
            ),
            (
                json!({"a": {"requires": "x"}}),
                QueueConfigError::Requires("a".into()),
            ),
            (
                json!({"a": {"requires": [""]}}),
                QueueConfigError::Requires("a".into()),
            ),
            (
                json!({"a": {}, "b": {"parent": "a", "requires": ["x"]}}),
                QueueConfigError::VirtualRequires("b".into()),
            ),
        ];
        for (v, want) in bad {
            assert_eq!(QueueConfig::from_value(&v), Err(want), "{v}");
        }
        let many: serde_json::Map<String, Value> = (0..=MAX_QUEUES)
            .map(|i| (format!("q{i}"), json!({})))
            .collect();
        assert_eq!(
            QueueConfig::from_value(&Value::Object(many)),
            Err(QueueConfigError::TooBig)
        );
    }

    #[test]
    fn an_empty_table_is_the_anonymous_queue() {
        let q = config(json!({}));
        assert!(q.is_empty());
        assert!(q.takes("a", "a"));
        assert!(!q.takes("a", "b"));
        assert_eq!(q.requires("a"), None);
    }

    proptest! {
        #[test]
        fn reading_never_panics_and_saving_round_trips(
            names in prop::collection::vec("[a-c+^]{0,2}", 0..6),
            parents in prop::collection::vec(prop::option::of("[a-c]{1}"), 0..6),
            requires in prop::collection::vec(prop::collection::vec("[\\^+]?[x-z]{0,1}", 0..3), 0..6),
        ) {
            let mut table = serde_json::Map::new();
            for (i, n) in names.iter().enumerate() {
                let mut e = serde_json::Map::new();
                if let Some(Some(p)) = parents.get(i) {
                    e.insert("parent".into(), json!(p));
                }
                if let Some(r) = requires.get(i) {
                    e.insert("requires".into(), json!(r));
                }
                table.insert(n.clone(), Value::Object(e));
            }
            if let Ok(q) = QueueConfig::from_value(&Value::Object(table)) {
                let text = serde_json::to_value(&q).unwrap();
                prop_assert_eq!(QueueConfig::from_value(&text), Ok(q.clone()));
                let saved = rmp_serde::to_vec(&q).unwrap();
                prop_assert_eq!(rmp_serde::from_slice::<QueueConfig>(&saved).unwrap(), q.clone());
                for (n, _) in q.iter() {
                    // A queue always takes its own jobs; its nodes resolve.
                    prop_assert!(q.takes(n, n));
                    prop_assert!(q.ranks(n, &set("0-3"), &BTreeMap::new()).is_some());
                }
            }
        }
    }
}
