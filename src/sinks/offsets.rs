//! Where the `file` sinks stand, for checkpoints: what makes their output
//! exactly once across a crash.
//!
//! Each file sink publishes the file it appends to and how many bytes it
//! has written to it. A checkpoint notes that offset just before its
//! barrier goes into the shards: every line past it that the restored
//! state will produce again is the output of a record after the barrier,
//! so it lies past the offset. On restart the sink reads the lines past
//! the saved offset (cutting a torn last line first) and skips records
//! with the same `record_id` when they come again. Lines past the offset
//! that do not come again (output of records before the barrier) stay.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A file sink's place in its file.
#[derive(Debug, Default)]
pub struct Mark {
    dev: AtomicU64,
    ino: AtomicU64,
    written: AtomicU64,
}

impl Mark {
    /// A (re)opened file whose length is `len`.
    pub fn reset(&self, dev: u64, ino: u64, len: u64) {
        self.dev.store(dev, Ordering::Relaxed);
        self.ino.store(ino, Ordering::Relaxed);
        self.written.store(len, Ordering::Release);
    }

    /// `n` more bytes appended (written to the buffer, if not yet flushed).
    pub fn wrote(&self, n: u64) {
        self.written.fetch_add(n, Ordering::Release);
    }

    fn saved(&self) -> Saved {
        Saved {
            dev: self.dev.load(Ordering::Relaxed),
            ino: self.ino.load(Ordering::Relaxed),
            offset: self.written.load(Ordering::Acquire),
        }
    }
}

/// What a checkpoint keeps of a file sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    pub dev: u64,
    pub ino: u64,
    pub offset: u64,
}

impl Saved {
    pub fn parse(text: &str) -> Option<Saved> {
        serde_json::from_str(text).ok()
    }
}

/// The marks of every file sink, and what the checkpoint restored said of
/// them.
#[derive(Debug, Clone, Default)]
pub struct SinkOffsets {
    marks: Arc<Mutex<BTreeMap<String, Arc<Mark>>>>,
    restored: Arc<BTreeMap<String, String>>,
}

impl SinkOffsets {
    pub fn restored(saved: BTreeMap<String, String>) -> Self {
        SinkOffsets {
            marks: Arc::default(),
            restored: Arc::new(saved),
        }
    }

    /// Where the checkpoint restored left sink `name`.
    pub fn restored_for(&self, name: &str) -> Option<Saved> {
        self.restored.get(name).and_then(|s| Saved::parse(s))
    }

    /// The mark a sink publishes its place through.
    pub fn register(&self, name: &str) -> Arc<Mark> {
        let mark = Arc::new(Mark::default());
        if let Ok(mut marks) = self.marks.lock() {
            marks.insert(name.to_string(), mark.clone());
        }
        mark
    }

    /// Every sink's place now, for a checkpoint (a sink not yet started
    /// keeps what was restored).
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        let mut out = (*self.restored).clone();
        if let Ok(marks) = self.marks.lock() {
            for (name, mark) in marks.iter() {
                if let Ok(text) = serde_json::to_string(&mark.saved()) {
                    out.insert(name.clone(), text);
                }
            }
        }
        out
    }
}

/// The `record_id` of an output line, found without parsing it.
pub fn record_id(line: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"record_id\":\"";
    let at = memchr::memmem::find(line, KEY)? + KEY.len();
    let rest = &line[at..];
    let end = memchr::memchr(b'"', rest)?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_has_the_marks_and_keeps_what_is_not_running() {
        let mut restored = BTreeMap::new();
        restored.insert(
            "old".to_string(),
            r#"{"dev":1,"ino":2,"offset":3}"#.to_string(),
        );
        let offsets = SinkOffsets::restored(restored);
        assert_eq!(
            offsets.restored_for("old"),
            Some(Saved {
                dev: 1,
                ino: 2,
                offset: 3
            })
        );
        let mark = offsets.register("out");
        mark.reset(7, 8, 100);
        mark.wrote(20);
        let snap = offsets.snapshot();
        assert_eq!(
            Saved::parse(&snap["out"]),
            Some(Saved {
                dev: 7,
                ino: 8,
                offset: 120
            })
        );
        assert!(snap.contains_key("old"));
    }

    #[test]
    fn record_ids_are_found_in_lines() {
        let line = br#"{"cluster":"c","id":5,"kind":"transition","record_id":"11f45e7ec9e1a890","to":"DEPEND"}"#;
        assert_eq!(record_id(line), Some(&b"11f45e7ec9e1a890"[..]));
        assert_eq!(record_id(br#"{"kind":"x"}"#), None);
        assert_eq!(record_id(br#"{"record_id":"unterminated"#), None);
    }
}
