//! `type = "file"`: eventlogs, journals and R documents on disk, tailed.
//!
//! Every `poll_interval_ms` the fixed folder in front of each `include`
//! pattern is walked and the files that match (and match no `exclude`) are
//! looked at. A tree so big that walking it takes more than a tenth of the
//! poll interval is walked less often (every ten walk-durations: a 15,000
//! file dump tree, ~200 ms to walk, every ~2 s); in between, every poll
//! stats the files already tracked, so appends are seen as fast as ever and
//! only new files, renames and replacements wait for the next walk.
//! Symbolic links to files are read; links to folders are not walked. What a file is comes from its path ([`crate::decode::classify_path`]):
//! eventlogs and `*.jsonl` journals are tailed line by line; a job's `R` or
//! the instance's `resource/R` is read whole as one JSON document and sent
//! again only when its content changes; anything else (jobspecs, output
//! eventlogs) is skipped, unless the source sets `stream` or a pattern
//! names the file exactly.
//!
//! **Identity.** A tailed file is known by a fingerprint of its beginning:
//! a 64-bit FNV-1a hash of its first line (newline included), or of its
//! first [`FINGERPRINT_BYTES`] bytes when the first line is longer. A Flux
//! eventlog starts with a timestamped event, so the first line is unique per
//! log, survives renames, copies (`rsync` replaces files with new inodes)
//! and re-created dump trees. A file whose first line is not complete yet
//! is not read until it is (its lines could not be emitted anyway). Device
//! and inode only break ties: the same fingerprint at two paths is one file
//! seen twice (hard link, or a copy: read once, warned about); a path whose
//! inode is unchanged but whose beginning changed was rewritten in place.
//!
//! **Rewrites in place.** A file truncated and written again keeps its
//! inode and its open descriptors, and may be rewritten at any moment,
//! between any check and any read. So bytes read from a tailed file are
//! handed on only if, *after* they were read, the file still begins as its
//! fingerprint says (one positioned read of its beginning per read that
//! returned bytes; an idle file costs nothing more). Otherwise they belong to
//! the new content and are dropped with the old entry: the new content is
//! read from its start when the next walk finds it under its own
//! fingerprint. A file caught with no whole first line (truncated, or in the
//! middle of a rewrite) is not read on either: it is read again from the
//! start once its beginning is whole and still the same. Between walks,
//! the stat of a known file is checked every poll and its beginning only
//! when the stat changed; a file that grew but begins otherwise waits for
//! the walk.
//!
//! **Feeds.** Files whose names differ only by a rotation suffix are one
//! feed, written in turn by one writer ([`rotation`]): `journal.jsonl`,
//! `journal.jsonl.1` and `journal.jsonl.2` (logrotate's numbers: `.2` is the
//! older), `journal.jsonl-20261124` (`dateext`: older dates first). A
//! rotated name is read as its live name says (`journal.jsonl.1` is a
//! journal), so a pattern `journal.jsonl*` reads the rotated files too;
//! compressed ones (`.gz`, ...) cannot be read, and the first walk names the
//! matched files it skips and why. A feed's files are read one at a time,
//! oldest first (as Vector's `oldest_first`): a newer one only once every
//! older one is read to its end, because a job's later events are in the
//! newer file and are refused before its `submit` (a fresh start over
//! rotated journals, a restart while a rotated file is unread). Files of
//! different feeds take turns, [`Tuning::lines_per_turn`] lines each.
//!
//! **Rotation.** When a tracked file's path disappears or holds another file
//! (rename + create), the old file is read on through the descriptor already
//! open until it has been quiet at its end for a grace period, then retired;
//! the new file is a new fingerprint, read from its start (after the old
//! one: the same feed). A renamed file that still matches a pattern is simply
//! followed to its new path. A copy (copytruncate) begins like the file did:
//! once the file is truncated the fingerprint is followed to the copy, and
//! read on there from the same position.
//!
//! **Truncation.** A file shorter than what was read of it waits for the
//! next check or walk: if another file now holds what was read (the copy of
//! copytruncate), reading goes on in that one; if the file still begins
//! the same, it is read again from the start (logged): truncated in place,
//! or replaced by a shorter file with the same first line. A file replaced
//! by one with another first line is a new file, read from its start. (A
//! file rewritten in place with the same first line and at least as long as
//! what was read of it cannot be told from an append: it is read on.)
//!
//! **Positions.** The source's positions are, per fingerprint, the offset
//! just past the last line handed on and the number of lines before it
//! (for dead-letter locations), and, per R path, a hash of the document
//! last sent. They are saved in the pipeline's checkpoint, taken at a
//! barrier ([`crate::checkpoint::coordinator`]): between two lines the source
//! hands them over when asked, and its final ones when it stops. Positions
//! of files that disappeared are kept for a day (a dump tree that is
//! deleted and dumped again is not read twice). Positions that cannot be
//! read are an error naming the source: it does not silently start over.
//!
//! **Open files.** A file is open while it is being read; a file quiet for
//! [`Tuning::idle_close`] is closed and reopened (by path, checked against
//! its inode, and what is read through it against its fingerprint as
//! always) when a check or walk sees it grow. At most [`Tuning::max_open`] are
//! open; the oldest-opened is closed to make room.
//!
//! Backpressure: a file's lines are handed on in batches (a [`RecordBuffer`],
//! up to 64 records, and whatever is held when a turn on the file ends),
//! waiting while the pipeline is full. A file's position moves past a line
//! only once its batch is handed on; at shutdown what is held is dropped
//! and read again at the next start.

mod config;
mod fingerprint;
mod positions;
pub mod rotation;
mod scan;
mod tail;

use crate::telemetry::metric;
use fingerprint::*;
use positions::*;
pub use scan::files_matching;
use scan::*;
use tail::*;

pub use config::{FileSourceConfig, ReadFrom};

use super::lines::{LineReader, READ_BYTES};
use super::{RecordBuffer, SourceContext};
use crate::decode::{EventStream, Origin, PathKind, Record};
use crate::flux::jobid::JobId;
use anyhow::{Context, Result, anyhow};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
#[cfg(test)]
use rotation::rotation_of;
use rotation::{Rotation, feed_of};
pub(crate) use rotation::{classify, is_compressed_log};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, ready};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufRead, AsyncRead, ReadBuf};

/// Most bytes of a file's beginning that its fingerprint covers.
pub const FINGERPRINT_BYTES: usize = 4096;

/// Internal limits; [`run`] uses the defaults, tests shorten them.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Most files open at once.
    pub max_open: usize,
    /// A file with no new line for this long is closed.
    pub idle_close: Duration,
    /// A file renamed away or deleted while open is read until it has been
    /// quiet at its end this long.
    pub rotate_grace: Duration,
    /// Lines read from one file before the next gets its turn.
    pub lines_per_turn: usize,
    /// How long the checkpoint of a file that disappeared is kept.
    pub forget_after: Duration,
    /// The full walk is repeated no sooner than this many times its own
    /// duration (so walking a huge tree takes at most about 1/factor of a
    /// core); known files are still looked at every poll in between.
    pub walk_cost_factor: u32,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            max_open: 128,
            idle_close: Duration::from_secs(30),
            rotate_grace: Duration::from_secs(2),
            lines_per_turn: 1024,
            forget_after: Duration::from_secs(24 * 3600),
            walk_cost_factor: 10,
        }
    }
}

///
/// Returns the final positions.
pub async fn run(config: FileSourceConfig, ctx: SourceContext) -> Result<Option<String>> {
    run_tuned(config, ctx, Tuning::default()).await.map(Some)
}

/// [`run`] with explicit limits.
pub async fn run_tuned(
    config: FileSourceConfig,
    ctx: SourceContext,
    tuning: Tuning,
) -> Result<String> {
    let loaded = parse_positions(ctx.checkpoint.restored())
        .with_context(|| format!("source {}: the positions in the checkpoint", ctx.name))?;
    let mut scanner = Scanner::new(
        &config,
        ctx.decode.stream.is_some(),
        ctx.decode.max_line_bytes,
    )?;
    scanner.source = ctx.name.clone();
    let poll = Duration::from_millis(config.poll_interval_ms.max(1));
    let mut src = FileSource::new(ctx.clone(), tuning, config.read_from, scanner, loaded);

    let mut first = true;
    let mut last_scan: Option<Instant> = None;
    let mut last_walk: Option<Instant> = None;
    let mut walk_every = poll;
    loop {
        if ctx.shutdown.is_cancelled() {
            break;
        }
        src.checkpoint_round().await;
        if last_walk.is_none_or(|t| t.elapsed() >= walk_every) {
            let started = Instant::now();
            (last_walk, last_scan) = (Some(started), Some(started));
            let found = src.scan().await?;
            // A big tree is walked less often, so walking takes at most
            // about a tenth of the time; known files are still looked at
            // every poll.
            walk_every = poll.max(started.elapsed() * src.tuning.walk_cost_factor.max(1));
            if src.reconcile(found, first).await.is_err() {
                break;
            }
            first = false;
        } else if last_scan.is_none_or(|t| t.elapsed() >= poll) {
            last_scan = Some(Instant::now());
            src.check_known().await?;
        }
        let more = match src.read_pass().await {
            Ok(more) => more,
            Err(Stop) => break,
        };
        src.housekeeping();
        if !more {
            let wait = poll.saturating_sub(last_scan.map_or(poll, |t| t.elapsed()));
            let wait = wait.min(walk_every.saturating_sub(last_walk.map_or(poll, |t| t.elapsed())));
            // Woken by a checkpoint round too: sources at rest answer at once.
            let mut link = src.ctx.checkpoint.clone();
            tokio::select! {
                _ = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
                _ = link.requested() => {}
                _ = ctx.shutdown.cancelled() => break,
            }
        }
    }
    Ok(src.positions())
}

/// The source stops: shutdown, or the pipeline is gone.
struct Stop;

/// Hand on the records of the lines `held` stands for, then move the
/// file's position past them; at shutdown they stay unread.
async fn commit_lines(
    ctx: &SourceContext,
    out: &mut RecordBuffer,
    held: &mut Option<(u64, u64)>,
    position: &mut u64,
    lines: &mut u64,
) -> Result<(), Stop> {
    let Some((to, count)) = held.take() else {
        return Ok(());
    };
    tokio::select! {
        biased;
        sent = ctx.flush(out) => sent.map_err(|_| Stop)?,
        _ = ctx.shutdown.cancelled() => return Err(Stop),
    }
    (*position, *lines) = (to, count);
    Ok(())
}

/// A file that shrank and still begins the same is read again from its
/// start.
fn read_again(source: &str, t: &mut Tracked) {
    tracing::warn!(source, path = %t.path.display(), position = t.position, "file shrank below the read position: reading it again from the start");
    t.shrunk = false;
    t.position = 0;
    t.lines = 0;
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A tailed file.
struct Tracked {
    path: PathBuf,
    id: FileId,
    origin: Origin,
    /// Offset just past the last line handed on.
    position: u64,
    /// Lines before `position`.
    lines: u64,
    /// Length at the last walk.
    seen_len: u64,
    /// Seen at `path` by the last walk.
    findable: bool,
    reader: Option<Reader>,
    /// Last line read (or opened).
    last_active: Instant,
    /// The last read reached the end.
    at_eof: bool,
    /// To be retired.
    done: bool,
    /// Found shorter than what was read of it (truncated, or copied and
    /// truncated): not read until a check or walk tells which.
    shrunk: bool,
    /// Could not be opened or read (other than gone): it does not hold up
    /// the newer files of its feed.
    unreadable: bool,
}

impl Tracked {
    /// Bytes read so far, including a held unfinished line.
    fn consumed(&self) -> u64 {
        match &self.reader {
            Some(r) => r.position() + r.pending() as u64,
            None => self.position,
        }
    }

    /// Something may be there to read.
    fn wants_read(&self) -> bool {
        !self.done
            && !self.shrunk
            && if self.findable {
                self.seen_len != self.consumed() || (self.reader.is_some() && !self.at_eof)
            } else {
                self.reader.is_some()
            }
    }

    /// Read to its end, as far as is known: the newer files of its feed may
    /// be read.
    fn at_end(&self) -> bool {
        if self.done || self.unreadable {
            return true;
        }
        if self.shrunk {
            return false;
        }
        let eof = self.reader.is_none() || self.at_eof;
        eof && (!self.findable || self.consumed() >= self.seen_len)
    }
}

/// A checkpoint of a file not (or no longer) tracked.
struct FileCheckpoint {
    path: PathBuf,
    position: u64,
    lines: u64,
    gone_at: Option<u64>,
}

/// An R document last sent.
struct Doc {
    hash: u64,
    gone_at: Option<u64>,
}

struct FileSource {
    ctx: SourceContext,
    tuning: Tuning,
    read_from: ReadFrom,
    scanner: Option<Scanner>,
    tracked: HashMap<u64, Tracked>,
    saved: HashMap<u64, FileCheckpoint>,
    docs: HashMap<PathBuf, Doc>,
    /// Fingerprints in the order their files were opened (may hold stale
    /// entries; `open_count` is exact).
    open: VecDeque<u64>,
    open_count: usize,
    duplicates: HashSet<PathBuf>,
    /// The tracked files by feed, each feed oldest first, the feeds in
    /// path order; rebuilt by each walk (which alone adds files and moves
    /// them), so it may name files retired since.
    feeds: Vec<Vec<u64>>,
}

impl FileSource {
    fn new(
        ctx: SourceContext,
        tuning: Tuning,
        read_from: ReadFrom,
        scanner: Scanner,
        loaded: CheckpointFile,
    ) -> Self {
        let saved = loaded
            .files
            .into_iter()
            .filter_map(|f| {
                let fp = parse_hex(&f.fingerprint)?;
                Some((
                    fp,
                    FileCheckpoint {
                        path: f.path,
                        position: f.position,
                        lines: f.lines,
                        gone_at: f.gone_at,
                    },
                ))
            })
            .collect();
        let docs = loaded
            .documents
            .into_iter()
            .filter_map(|d| {
                let hash = parse_hex(&d.hash)?;
                Some((
                    d.path,
                    Doc {
                        hash,
                        gone_at: d.gone_at,
                    },
                ))
            })
            .collect();
        FileSource {
            ctx,
            tuning,
            read_from,
            scanner: Some(scanner),
            tracked: HashMap::new(),
            saved,
            docs,
            open: VecDeque::new(),
            open_count: 0,
            duplicates: HashSet::new(),
            feeds: Vec::new(),
        }
    }

    /// Group the tracked files by feed, oldest first: by rotation, a file
    /// renamed away before the one now at its path, then by path.
    fn index_feeds(&mut self) {
        let mut feeds: BTreeMap<PathBuf, Vec<(Rotation, bool, &Path, u64)>> = BTreeMap::new();
        for (fp, t) in self.tracked.iter().filter(|(_, t)| !t.done) {
            let (feed, rotation) = feed_of(&t.path);
            feeds
                .entry(feed)
                .or_default()
                .push((rotation, t.findable, &t.path, *fp));
        }
        self.feeds = feeds
            .into_values()
            .map(|mut files| {
                files.sort();
                files.into_iter().map(|(.., fp)| fp).collect()
            })
            .collect();
    }

    async fn scan(&mut self) -> Result<Vec<Found>> {
        let mut scanner = self.scanner.take().context("scanner lost")?;
        let (scanner, found) = tokio::task::spawn_blocking(move || {
            let found = scanner.scan();
            (scanner, found)
        })
        .await
        .context("file walk failed")?;
        self.scanner = Some(scanner);
        Ok(found)
    }

    /// Between walks: see which known files grew (or shrank).
    async fn check_known(&mut self) -> Result<()> {
        // Each feed newest first: a rotated file is looked at after the
        // newer one, so when the newer one has new lines, the rotated one's
        // length includes all its writer gave it before moving on. (A walk
        // stats in path order, which puts the live name first too.)
        let tracked = &self.tracked;
        let known: Vec<(u64, PathBuf)> = self
            .feeds
            .iter()
            .flat_map(|feed| feed.iter().rev())
            .filter_map(|fp| {
                let t = tracked.get(fp).filter(|t| t.findable)?;
                Some((*fp, t.path.clone()))
            })
            .collect();
        let mut scanner = self.scanner.take().context("scanner lost")?;
        let (scanner, stats) = tokio::task::spawn_blocking(move || {
            let stats = scanner.check(known);
            (scanner, stats)
        })
        .await
        .context("file check failed")?;
        self.scanner = Some(scanner);
        for (fp, stat) in stats {
            if let Some(t) = self.tracked.get_mut(&fp)
                && t.id == stat.id
            {
                t.seen_len = stat.len;
                if t.shrunk {
                    // The same file begins the same after it shrank: it
                    // was truncated in place (and written again), not
                    // copied away.
                    read_again(&self.ctx.name, t);
                }
            }
        }
        Ok(())
    }

    /// Match what the walk found with what is tracked: new files, renamed
    /// files, files gone or replaced; send changed R documents.
    async fn reconcile(&mut self, found: Vec<Found>, first: bool) -> Result<(), Stop> {
        let now_unix = unix_now();
        let mut by_fp: BTreeMap<u64, Vec<&Found>> = BTreeMap::new();
        let mut ids_at: HashMap<&Path, FileId> = HashMap::new();
        for f in &found {
            if let FoundKind::Lines { fp, .. } = &f.kind {
                ids_at.insert(&f.path, f.stat.id);
                if let Some(fp) = fp {
                    by_fp.entry(*fp).or_default().push(f);
                }
            }
        }
        for t in self.tracked.values_mut() {
            t.findable = false;
        }
        for (&fp, paths) in &by_fp {
            let chosen: &Found = if let Some(t) = self.tracked.get_mut(&fp) {
                // It shrank: another file that begins the same and holds
                // what was read is a copy (copytruncate), to read on in.
                let copy = t
                    .shrunk
                    .then(|| {
                        paths
                            .iter()
                            .find(|f| f.stat.id != t.id && f.stat.len >= t.position)
                    })
                    .flatten();
                let c = copy
                    .or_else(|| paths.iter().find(|f| f.path == t.path))
                    .or_else(|| paths.iter().find(|f| f.stat.id == t.id))
                    .unwrap_or(&paths[0]);
                if t.shrunk {
                    if c.stat.id != t.id && c.stat.len >= t.position {
                        tracing::info!(source = %self.ctx.name, from = %t.path.display(), to = %c.path.display(), position = t.position, "file copied and truncated: reading on in the copy");
                        t.shrunk = false;
                    } else {
                        read_again(&self.ctx.name, t);
                    }
                }
                if c.path != t.path {
                    tracing::info!(source = %self.ctx.name, from = %t.path.display(), to = %c.path.display(), "file renamed: following it");
                    t.path = c.path.clone();
                }
                if c.stat.id != t.id {
                    // Replaced by a file with the same beginning (a copy):
                    // go on from the same offset in the new file.
                    if t.reader.take().is_some() {
                        self.open_count -= 1;
                    }
                    t.id = c.stat.id;
                }
                t.findable = true;
                t.seen_len = c.stat.len;
                c
            } else {
                let c = paths[0];
                let t = self.new_tracked(c, fp, first).await;
                self.tracked.insert(fp, t);
                c
            };
            for other in paths.iter().filter(|f| f.path != chosen.path) {
                if self.duplicates.len() > 10_000 {
                    self.duplicates.clear();
                }
                if self.duplicates.insert(other.path.clone()) {
                    // Within a feed, a copy being made (copytruncate).
                    if feed_of(&other.path).0 == feed_of(&chosen.path).0 {
                        tracing::debug!(source = %self.ctx.name, path = %other.path.display(), same_as = %chosen.path.display(), "rotated copy of a file: read once");
                    } else {
                        tracing::warn!(source = %self.ctx.name, path = %other.path.display(), same_as = %chosen.path.display(), "file begins like another file: read only once");
                    }
                }
            }
        }
        for t in self.tracked.values_mut().filter(|t| !t.findable) {
            // The same inode at the same path but another beginning: it was
            // rewritten in place, and the open descriptor would read the new
            // content as the old file's. Otherwise it was renamed away or
            // deleted: finish it through the open descriptor, if any.
            let rewritten = ids_at.get(t.path.as_path()) == Some(&t.id);
            if rewritten || t.reader.is_none() {
                if rewritten {
                    tracing::info!(source = %self.ctx.name, path = %t.path.display(), "file rewritten in place: reading it as a new file");
                }
                t.done = true;
            }
        }
        if first {
            for s in self.saved.values_mut() {
                s.gone_at.get_or_insert(now_unix);
            }
        }
        self.retire_done(now_unix);
        self.index_feeds();

        // R documents.
        let mut seen_docs = HashSet::new();
        for f in &found {
            let FoundKind::Doc {
                stream,
                id,
                jobspec,
                content,
            } = &f.kind
            else {
                continue;
            };
            seen_docs.insert(f.path.as_path());
            // An empty R is being written: wait for its content.
            let Some(content) = content.as_ref().filter(|c| !c.is_empty()) else {
                continue;
            };
            let hash = fnv1a(content);
            if self.docs.get(&f.path).is_some_and(|d| d.hash == hash) {
                continue;
            }
            self.send_doc(f, (*stream, *id, *jobspec), content).await?;
            self.docs.insert(
                f.path.clone(),
                Doc {
                    hash,
                    gone_at: None,
                },
            );
        }
        for (path, d) in self.docs.iter_mut() {
            if seen_docs.contains(path.as_path()) {
                d.gone_at = None;
            } else if d.gone_at.is_none() {
                d.gone_at = Some(now_unix);
            }
        }
        Ok(())
    }

    /// Send one whole-file document: an R, or (`jobspec`) a jobspec.
    async fn send_doc(
        &mut self,
        f: &Found,
        (stream, id, jobspec): (EventStream, Option<JobId>, bool),
        content: &[u8],
    ) -> Result<(), Stop> {
        let ctx = &self.ctx;
        let location = format!("{}:1", f.path.display());
        let what = if jobspec { "jobspec" } else { "R document" };
        if content.len() > ctx.decode.max_line_bytes {
            let error = format!(
                "{what} of {} bytes is longer than max_line_bytes ({})",
                f.stat.len, ctx.decode.max_line_bytes
            );
            let prefix = &content[..ctx.decode.max_line_bytes];
            ctx.dead_letter(&location, &error, prefix).await;
            return Ok(());
        }
        metrics::counter!(metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL, "source" => ctx.name.to_string())
            .increment(1);
        match crate::decode::document_file(content, jobspec) {
            Ok(body) => {
                let record = Record {
                    cluster: None,
                    stream,
                    id,
                    body,
                };
                ctx.record(record).await.map_err(|_| Stop)
            }
            Err(e) => {
                ctx.dead_letter(&location, &e.to_string(), content).await;
                Ok(())
            }
        }
    }

    async fn new_tracked(&mut self, f: &Found, fp: u64, first: bool) -> Tracked {
        let FoundKind::Lines { origin, .. } = &f.kind else {
            unreachable!("only line files are tracked")
        };
        let (mut position, mut lines) = (0, 0);
        if let Some(s) = self.saved.remove(&fp) {
            if s.position > f.stat.len {
                tracing::warn!(source = %self.ctx.name, path = %f.path.display(), checkpoint = s.position, len = f.stat.len, "file is shorter than its checkpoint: reading it again from the start");
            } else {
                (position, lines) = (s.position, s.lines);
            }
            if s.path != f.path {
                tracing::info!(source = %self.ctx.name, from = %s.path.display(), to = %f.path.display(), "file moved since its checkpoint");
            }
        } else if first && self.read_from == ReadFrom::End {
            let path = f.path.clone();
            match tokio::task::spawn_blocking(move || end_of_last_line(&path)).await {
                Ok(Ok(end)) => (position, lines) = end,
                Ok(Err(e)) => {
                    tracing::warn!(source = %self.ctx.name, path = %f.path.display(), "cannot read: {e}")
                }
                Err(e) => tracing::warn!(source = %self.ctx.name, "{e}"),
            }
        }
        Tracked {
            path: f.path.clone(),
            id: f.stat.id,
            origin: self.ctx.origin_with(origin.clone()),
            position,
            lines,
            seen_len: f.stat.len,
            findable: true,
            reader: None,
            last_active: Instant::now(),
            at_eof: false,
            done: false,
            shrunk: false,
            unreadable: false,
        }
    }

    fn retire_done(&mut self, now_unix: u64) {
        let done: Vec<u64> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.done)
            .map(|(fp, _)| *fp)
            .collect();
        for fp in done {
            let Some(t) = self.tracked.remove(&fp) else {
                continue;
            };
            if t.reader.is_some() {
                self.open_count -= 1;
            }
            tracing::debug!(source = %self.ctx.name, path = %t.path.display(), "file gone");
            self.saved.insert(
                fp,
                FileCheckpoint {
                    path: t.path,
                    position: t.position,
                    lines: t.lines,
                    gone_at: Some(now_unix),
                },
            );
        }
    }

    /// Read every file with something new, one turn per feed: in a feed
    /// the oldest file not at its end, and the next ones as each one
    /// ends. `true` when some file has more than its turn allowed.
    async fn read_pass(&mut self) -> Result<bool, Stop> {
        let mut more = false;
        for feed in 0..self.feeds.len() {
            let files = self.feeds[feed].len();
            for i in 0..files {
                let fp = self.feeds[feed][i];
                let Some(t) = self.tracked.get(&fp) else {
                    continue;
                };
                // A rotated file still open is read at its end once more
                // before a newer file: its writer may not have let go of
                // it when it was last looked at.
                let recheck = || {
                    t.reader.is_some()
                        && t.at_end()
                        && self.feeds[feed][i + 1..]
                            .iter()
                            .any(|n| self.tracked.get(n).is_some_and(Tracked::wants_read))
                };
                if t.wants_read() || recheck() {
                    if self.ctx.shutdown.is_cancelled() {
                        return Err(Stop);
                    }
                    self.checkpoint_round().await;
                    if self.read_file(fp).await? {
                        more = true;
                        break;
                    }
                }
                // The newer files wait for this one.
                if !self.tracked.get(&fp).is_none_or(Tracked::at_end) {
                    break;
                }
            }
        }
        Ok(more)
    }

    /// Close the oldest-opened findable files until one more may open.
    fn make_room(&mut self) {
        if self.open.len() > 2 * self.open_count + 64 {
            let tracked = &self.tracked;
            let mut seen = HashSet::new();
            self.open.retain(|fp| {
                tracked.get(fp).is_some_and(|t| t.reader.is_some()) && seen.insert(*fp)
            });
        }
        let mut tries = self.open.len();
        while self.open_count >= self.tuning.max_open.max(1) && tries > 0 {
            tries -= 1;
            let Some(fp) = self.open.pop_front() else {
                break;
            };
            if let Some(t) = self.tracked.get_mut(&fp)
                && t.reader.is_some()
            {
                if t.findable {
                    t.reader = None;
                    self.open_count -= 1;
                } else {
                    // Renamed away: its descriptor is the only way to it.
                    self.open.push_back(fp);
                }
            }
        }
    }

    /// Open a tracked file at its position, if its path still holds it.
    async fn open(&mut self, fp: u64) -> bool {
        self.make_room();
        let max = self.ctx.decode.max_line_bytes;
        let Some(t) = self.tracked.get_mut(&fp) else {
            return false;
        };
        let (path, id) = (t.path.clone(), t.id);
        let opened = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path)?;
            let m = file.metadata()?;
            // Replaced since the walk: the next walk sorts it out. (Its
            // beginning is checked after every read, see [`Tail`].)
            Ok(((m.dev(), m.ino()) == id).then_some(file))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match opened {
            Ok(Some(file)) => {
                let tail = Tail::new(file, fp, t.position);
                t.reader = Some(LineReader::starting_at(tail, max, t.position));
                t.last_active = Instant::now();
                t.at_eof = false;
                t.unreadable = false;
                self.open_count += 1;
                self.open.push_back(fp);
                true
            }
            Ok(None) => false,
            Err(e) => {
                // Gone: the next walk finds where (renamed) or that it is
                // gone. Anything else may last: it does not hold up its feed.
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(source = %self.ctx.name, path = %t.path.display(), "cannot open: {e}");
                    t.unreadable = true;
                }
                if !t.findable {
                    t.done = true;
                }
                false
            }
        }
    }

    /// Read one file for one turn; `true` if it has more.
    async fn read_file(&mut self, fp: u64) -> Result<bool, Stop> {
        if self.tracked.get(&fp).is_some_and(|t| t.reader.is_none()) && !self.open(fp).await {
            return Ok(false);
        }
        let budget = self.tuning.lines_per_turn.max(1);
        let ctx = &self.ctx;
        let Some(t) = self.tracked.get_mut(&fp) else {
            return Ok(false);
        };
        let Tracked {
            path,
            origin,
            position,
            lines,
            reader: reader_slot,
            last_active,
            at_eof,
            findable,
            done,
            shrunk,
            unreadable,
            ..
        } = t;
        let Some(reader) = reader_slot.as_mut() else {
            return Ok(false);
        };

        // A file shorter than what was read of it was truncated or replaced.
        let len = match reader.get_ref().len().await {
            Ok(len) => len,
            Err(e) => {
                tracing::warn!(source = %ctx.name, path = %path.display(), "cannot stat: {e}");
                *reader_slot = None;
                *unreadable = true;
                self.open_count -= 1;
                return Ok(false);
            }
        };
        if len < reader.position() + reader.pending() as u64 {
            *reader_slot = None;
            self.open_count -= 1;
            if *findable {
                // Truncated in place, or copied and truncated (then the
                // copy holds the rest): the next check or walk tells which.
                tracing::debug!(source = %ctx.name, path = %path.display(), len, position = *position, "file shrank below the read position");
                *shrunk = true;
                return Ok(false);
            }
            *done = true;
            return Ok(false);
        }

        let mut n = 0;
        // Lines are handed on in batches; the position moves past a line
        // once it is handed on. `held`: where it will be then.
        let mut out = ctx.record_buffer();
        let mut held: Option<(u64, u64)> = None;
        let mut next_lineno = *lines;
        loop {
            if n >= budget {
                commit_lines(ctx, &mut out, &mut held, position, lines).await?;
                return Ok(true);
            }
            let line = match reader.next(false).await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    commit_lines(ctx, &mut out, &mut held, position, lines).await?;
                    *at_eof = true;
                    return Ok(false);
                }
                Err(e) => {
                    commit_lines(ctx, &mut out, &mut held, position, lines).await?;
                    *reader_slot = None;
                    self.open_count -= 1;
                    match e.get_ref().and_then(|e| e.downcast_ref::<Changed>()) {
                        // Same inode, another beginning: what was just read
                        // is the new content, not the rest of this file.
                        // The old entry goes; the next walk finds the new
                        // content under its own fingerprint and reads it
                        // from the start.
                        Some(Changed(Head::Other)) => {
                            tracing::info!(source = %ctx.name, path = %path.display(), "file rewritten in place: reading it as a new file");
                            *done = true;
                        }
                        // Truncated below its first line (or caught in the
                        // middle of a rewrite): read again from the start
                        // once a check or walk sees its beginning whole and
                        // the same again; if a copy holds it (copytruncate),
                        // read on there; if it begins otherwise, the walk
                        // reads it as a new file.
                        Some(Changed(_)) if *findable => {
                            tracing::debug!(source = %ctx.name, path = %path.display(), position = *position, "file truncated below its first line");
                            *shrunk = true;
                        }
                        Some(Changed(_)) => *done = true,
                        None => {
                            tracing::warn!(source = %ctx.name, path = %path.display(), "cannot read: {e}");
                            *unreadable = true;
                        }
                    }
                    return Ok(false);
                }
            };
            next_lineno += 1;
            let lineno = next_lineno;
            let here: &Path = path;
            let location = || format!("{}:{lineno}", here.display());
            let all_handed_on = tokio::select! {
                biased;
                sent = ctx.hold_line(&mut out, line, origin, &location) => sent.map_err(|_| Stop)?,
                // Shutdown while the pipeline is full: the lines not handed
                // on are not counted as read, so a restart sends them again.
                _ = ctx.shutdown.cancelled() => return Err(Stop),
            };
            if all_handed_on {
                (*position, *lines) = (reader.position(), lineno);
                held = None;
            } else {
                held = Some((reader.position(), lineno));
            }
            *last_active = Instant::now();
            *at_eof = false;
            n += 1;
        }
    }

    /// Close idle files; retire files renamed away once quiet at their end;
    /// publish how far behind the files' ends reading is.
    fn housekeeping(&mut self) {
        let behind: u64 = self
            .tracked
            .values()
            .filter(|t| !t.done)
            .map(|t| t.seen_len.saturating_sub(t.position))
            .sum();
        metrics::gauge!(metric::FLUXPIPE_SOURCE_LAG_BYTES, "source" => self.ctx.name.to_string())
            .set(behind as f64);
        let mut closed = 0;
        for t in self.tracked.values_mut() {
            if t.reader.is_none() {
                continue;
            }
            let quiet = t.last_active.elapsed();
            if !t.findable {
                if t.at_eof && quiet >= self.tuning.rotate_grace {
                    t.done = true;
                }
            } else if quiet >= self.tuning.idle_close && t.at_eof {
                t.reader = None;
                closed += 1;
            }
        }
        self.open_count -= closed;
        self.retire_done(unix_now());
    }

    /// Take part in a checkpoint round if one is asked for: hand over the
    /// positions of what was handed on, and wait for the barrier.
    async fn checkpoint_round(&mut self) {
        if let Some(seq) = self.ctx.checkpoint.pending() {
            let positions = self.positions();
            self.ctx
                .checkpoint
                .report(&self.ctx.name, seq, positions)
                .await;
        }
    }

    /// The positions, as saved in a checkpoint.
    fn positions(&mut self) -> String {
        let forget = self.tuning.forget_after.as_secs();
        let now = unix_now();
        let keep = |gone: Option<u64>| gone.is_none_or(|g| now.saturating_sub(g) < forget);
        self.saved.retain(|_, s| keep(s.gone_at));
        self.docs.retain(|_, d| keep(d.gone_at));
        let mut files: Vec<FileEntry> = self
            .tracked
            .iter()
            .map(|(fp, t)| FileEntry {
                fingerprint: format!("{fp:016x}"),
                path: t.path.clone(),
                position: t.position,
                lines: t.lines,
                gone_at: None,
            })
            .chain(self.saved.iter().map(|(fp, s)| FileEntry {
                fingerprint: format!("{fp:016x}"),
                path: s.path.clone(),
                position: s.position,
                lines: s.lines,
                gone_at: s.gone_at,
            }))
            .collect();
        files.sort_by(|a, b| (&a.path, &a.fingerprint).cmp(&(&b.path, &b.fingerprint)));
        let mut documents: Vec<DocEntry> = self
            .docs
            .iter()
            .map(|(path, d)| DocEntry {
                path: path.clone(),
                hash: format!("{:016x}", d.hash),
                gone_at: d.gone_at,
            })
            .collect();
        documents.sort_by(|a, b| a.path.cmp(&b.path));
        let file = CheckpointFile {
            version: CHECKPOINT_VERSION,
            files,
            documents,
        };
        serde_json::to_string(&file).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
