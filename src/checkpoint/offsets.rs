//! Where the `file` sinks stand at each checkpoint: what makes their output
//! exactly once across a crash, as Flink's file sink commits.
//!
//! A checkpoint's barrier is aligned: each shard, having applied every
//! record before it and handed its outputs on, waits until every shard has,
//! so that for a moment every output of a record before the barrier is in
//! the sinks' queues and none of a record after it. The coordinator notes
//! then how many records each file sink has been given (its cut); the sink
//! notes the byte offset of its file once it has written exactly that many.
//! That offset goes in the checkpoint. On restart the sink cuts its file
//! back to it: what lies beyond is the output of records after the
//! barrier, which the restored state produces again.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// No cut asked for.
const NONE: u64 = u64::MAX;

/// A file sink's place in its file, and the cut of the round under way.
#[derive(Debug)]
pub struct Mark {
    dev: AtomicU64,
    ino: AtomicU64,
    /// Bytes of the file, those written through the sink's buffer included.
    written: AtomicU64,
    /// Records taken from the sink's queue since the pipeline started.
    taken: AtomicU64,
    /// The sink has opened its file.
    ready: AtomicBool,
    /// The sink has stopped (an error): it writes nothing more.
    stopped: AtomicBool,
    /// The record count of the cut asked for, and the place it fell at.
    cut_at: AtomicU64,
    cut: Mutex<Option<SinkOffset>>,
}

impl Default for Mark {
    fn default() -> Self {
        Mark {
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            written: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            cut_at: AtomicU64::new(NONE),
            cut: Mutex::new(None),
        }
    }
}

impl Mark {
    /// A (re)opened file whose length is `len`.
    pub fn reset(&self, dev: u64, ino: u64, len: u64) {
        self.dev.store(dev, SeqCst);
        self.ino.store(ino, SeqCst);
        self.written.store(len, SeqCst);
        self.ready.store(true, SeqCst);
        self.check_cut();
    }

    /// One more record taken from the queue; `bytes` of it written.
    pub fn wrote(&self, bytes: u64) {
        self.written.fetch_add(bytes, SeqCst);
        let taken = self.taken.fetch_add(1, SeqCst) + 1;
        // Only the record that reaches the cut takes the lock. A round
        // asking for a cut after this load sees `taken` already counted
        // (sequentially consistent), so it places the cut itself.
        if self.cut_at.load(SeqCst) == taken {
            self.check_cut();
        }
    }

    /// Note the place if the sink stands at the cut asked for.
    fn check_cut(&self) {
        if let Ok(mut cut) = self.cut.lock() {
            self.place_cut(&mut cut);
        }
    }

    /// With the cut's lock held, so that a round asking for a new cut never
    /// gets the place of the cut asked for before it.
    fn place_cut(&self, cut: &mut Option<SinkOffset>) {
        let at = self.cut_at.load(SeqCst);
        if cut.is_none() && at != NONE && self.ready.load(SeqCst) && self.taken.load(SeqCst) == at {
            *cut = Some(self.saved());
        }
    }

    /// Ask for the place after the first `records` records (no record past
    /// them exists yet: the shards are held at the barrier).
    fn ask_cut(&self, records: u64) {
        if let Ok(mut cut) = self.cut.lock() {
            *cut = None;
            self.cut_at.store(records, SeqCst);
            self.place_cut(&mut cut);
        }
    }

    /// The place of the cut asked for, once the sink has reached it.
    fn cut(&self) -> Option<SinkOffset> {
        self.cut.lock().ok().and_then(|c| *c)
    }

    fn saved(&self) -> SinkOffset {
        SinkOffset {
            dev: self.dev.load(SeqCst),
            ino: self.ino.load(SeqCst),
            offset: self.written.load(SeqCst),
        }
    }
}

/// What a checkpoint keeps of a file sink: its file and the offset to cut
/// it back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkOffset {
    pub dev: u64,
    pub ino: u64,
    pub offset: u64,
}

impl SinkOffset {
    pub fn parse(text: &str) -> Option<SinkOffset> {
        serde_json::from_str(text).ok()
    }

    fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The marks of every file sink, and what the checkpoint restored said of
/// them.
#[derive(Debug, Clone, Default)]
pub struct SinkOffsets {
    marks: Arc<Mutex<BTreeMap<String, Arc<Mark>>>>,
    restored: Arc<BTreeMap<String, String>>,
    /// The pipeline's only output lost its reader (`fluxpipe run | head`):
    /// what is left is given up on purpose, no checkpoint is wanted.
    reader_gone: Arc<AtomicBool>,
}

/// A round's cut could not be placed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("file sink {0} has not written up to the barrier")]
pub struct NotReached(pub String);

impl SinkOffsets {
    pub fn restored(saved: BTreeMap<String, String>) -> Self {
        SinkOffsets {
            marks: Arc::default(),
            restored: Arc::new(saved),
            reader_gone: Arc::default(),
        }
    }

    /// The pipeline's only output lost its reader: the pipeline stops.
    pub fn reader_gone(&self) {
        self.reader_gone.store(true, SeqCst);
    }

    /// Whether it has (a checkpoint that fails then is no surprise).
    pub fn is_reader_gone(&self) -> bool {
        self.reader_gone.load(SeqCst)
    }

    /// Where the checkpoint restored left sink `name`.
    pub fn restored_for(&self, name: &str) -> Option<SinkOffset> {
        self.restored.get(name).and_then(|s| SinkOffset::parse(s))
    }

    /// The mark of sink `name` (made before the sink starts, so that no
    /// round misses it).
    pub fn mark(&self, name: &str) -> Arc<Mark> {
        let Ok(mut marks) = self.marks.lock() else {
            return Arc::default();
        };
        marks.entry(name.to_string()).or_default().clone()
    }

    /// At the aligned barrier: ask each file sink for its place after the
    /// records it has been given (`queued(name)`).
    pub fn ask_cuts(&self, queued: impl Fn(&str) -> Option<u64>) {
        if let Ok(marks) = self.marks.lock() {
            for (name, mark) in marks.iter() {
                if let Some(n) = queued(name) {
                    mark.ask_cut(n);
                }
            }
        }
    }

    /// Every file sink's cut, once the sinks are done with the records
    /// before it. A sink that has not opened its file yet and was given
    /// nothing keeps what was restored; with nothing restored, the round
    /// waits until it has opened it: a checkpoint that named no place would
    /// leave what this run writes uncut after a crash, to be written again.
    pub fn cuts(&self) -> Result<BTreeMap<String, String>, NotReached> {
        let mut out = (*self.restored).clone();
        if let Ok(marks) = self.marks.lock() {
            for (name, mark) in marks.iter() {
                match mark.cut() {
                    Some(cut) => {
                        out.insert(name.clone(), cut.text());
                    }
                    None if !mark.ready.load(SeqCst)
                        && mark.cut_at.load(SeqCst) == 0
                        && self.restored.contains_key(name) => {}
                    // Stopped: it writes nothing more, and holds no
                    // checkpoint back (what it was given is dropped and
                    // counted; a restart writes it).
                    None if mark.stopped.load(SeqCst) => {}
                    None => return Err(NotReached(name.clone())),
                }
            }
        }
        Ok(out)
    }

    /// Sink `name` has stopped after an error.
    pub fn stopped(&self, name: &str) {
        if let Ok(marks) = self.marks.lock()
            && let Some(mark) = marks.get(name)
        {
            mark.stopped.store(true, SeqCst);
        }
    }

    /// Every file sink's place now (at shutdown, every sink finished).
    pub fn ends(&self) -> BTreeMap<String, String> {
        let mut out = (*self.restored).clone();
        if let Ok(marks) = self.marks.lock() {
            for (name, mark) in marks.iter().filter(|(_, m)| m.ready.load(SeqCst)) {
                out.insert(name.clone(), mark.saved().text());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> SinkOffset {
        SinkOffset {
            dev: 7,
            ino: 8,
            offset,
        }
    }

    #[test]
    fn a_cut_falls_after_exactly_the_records_given() {
        let offsets = SinkOffsets::restored(BTreeMap::new());
        let mark = offsets.mark("out");
        mark.reset(7, 8, 100);
        mark.wrote(10);
        // Three records given at the barrier: one written, two to come.
        offsets.ask_cuts(|_| Some(3));
        assert!(offsets.cuts().is_err());
        mark.wrote(10);
        mark.wrote(10);
        // Records after the barrier do not move the cut.
        mark.wrote(10);
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(130))
        );
        assert_eq!(SinkOffset::parse(&offsets.ends()["out"]), Some(at(140)));
        // The sink already at the cut when asked.
        offsets.ask_cuts(|_| Some(4));
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(140))
        );
    }

    #[test]
    fn a_sink_with_nothing_restored_must_say_where_it_stood() {
        let offsets = SinkOffsets::restored(BTreeMap::new());
        let mark = offsets.mark("out");
        // Given nothing, but its file not opened yet: no checkpoint can say
        // where to cut it back to.
        offsets.ask_cuts(|_| Some(0));
        assert!(offsets.cuts().is_err());
        mark.reset(7, 8, 20);
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(20))
        );
    }

    #[test]
    fn a_sink_that_stopped_holds_no_checkpoint_back() {
        let offsets = SinkOffsets::restored(BTreeMap::new());
        offsets.mark("out");
        offsets.ask_cuts(|_| Some(3));
        assert!(offsets.cuts().is_err());
        offsets.stopped("out");
        assert!(!offsets.cuts().unwrap().contains_key("out"));
    }

    #[test]
    fn a_round_given_up_leaves_no_cut_for_the_next() {
        let offsets = SinkOffsets::restored(BTreeMap::new());
        let mark = offsets.mark("out");
        mark.reset(7, 8, 0);
        // A round asks for the cut after 2 records and is given up on
        // before the sink gets there.
        offsets.ask_cuts(|_| Some(2));
        mark.wrote(10);
        // The next round asks after 3; the sink passing 2 meanwhile places
        // nothing.
        offsets.ask_cuts(|_| Some(3));
        mark.wrote(10);
        assert!(offsets.cuts().is_err());
        mark.wrote(10);
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(30))
        );
    }

    #[test]
    fn a_sink_not_started_keeps_what_was_restored() {
        let mut restored = BTreeMap::new();
        restored.insert("out".to_string(), at(50).text());
        let offsets = SinkOffsets::restored(restored);
        let mark = offsets.mark("out");
        offsets.ask_cuts(|_| Some(0));
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(50))
        );
        // Given records before it started: no cut until it wrote them.
        offsets.ask_cuts(|_| Some(2));
        assert!(offsets.cuts().is_err());
        mark.reset(7, 8, 50);
        mark.wrote(5);
        mark.wrote(5);
        assert_eq!(
            SinkOffset::parse(&offsets.cuts().unwrap()["out"]),
            Some(at(60))
        );
    }
}
