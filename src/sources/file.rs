//! `type = "file"`: eventlogs, journals and R documents on disk, tailed.
//!
//! Every `poll_interval_ms` the fixed folder in front of each `include`
//! pattern is walked and the files that match (and match no `exclude`) are
//! looked at. A tree so big that walking it takes more than a tenth of the
//! poll interval is walked less often (every ten walk-durations: a 15,000
//! file dump tree, ~200 ms to walk, every ~2 s); in between, every poll
//! stats the files already tracked, so appends are seen as fast as ever and
//! only new files, renames and replacements wait for the next walk.
//! Symbolic links to files are read; links to folders are not walked. What a file is comes from its path ([`decode::classify_path`]):
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
//! barrier ([`crate::pipeline::coordinator`]): between two lines the source
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
//! Backpressure: a file's lines are handed on in batches (an [`Outbox`],
//! up to 64 records, and whatever is held when a turn on the file ends),
//! waiting while the pipeline is full. A file's position moves past a line
//! only once its batch is handed on; at shutdown what is held is dropped
//! and read again at the next start.

mod config;
pub mod rotation;

pub use config::{FileSourceConfig, ReadFrom};

use super::lines::{LineReader, READ_BYTES};
use super::{Outbox, SourceContext};
pub(crate) use rotation::{classify, is_compressed_log};
use rotation::{Rotation, feed_of};
#[cfg(test)]
use rotation::rotation_of;
use crate::decode::{Body, EventStream, Origin, PathKind, Record};
use crate::flux::jobid::JobId;
use crate::flux::object::JsonObject;
use anyhow::{Context, Result, anyhow};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
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

const CHECKPOINT_VERSION: u32 = 1;

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
async fn hand_on(
    ctx: &SourceContext,
    out: &mut Outbox,
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

/// Device and inode.
type FileId = (u64, u64);

/// What a stat says, enough to tell that a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    id: FileId,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stat {
    fn of(m: &std::fs::Metadata) -> Self {
        Stat {
            id: (m.dev(), m.ino()),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// A file the walk found.
#[derive(Debug)]
struct Found {
    path: PathBuf,
    stat: Stat,
    kind: FoundKind,
}

#[derive(Debug)]
enum FoundKind {
    /// Read line by line. `fp` is `None` while its first line is incomplete
    /// (or it cannot be read).
    Lines { origin: Origin, fp: Option<u64> },
    /// An R document; `content` only when it changed since the last walk.
    Doc {
        stream: EventStream,
        id: Option<JobId>,
        /// A jobspec, not an R.
        jobspec: bool,
        content: Option<Vec<u8>>,
    },
}

/// The blocking half: walks, stats and fingerprints. Moved to a blocking
/// thread for each walk.
struct Scanner {
    roots: Vec<PathBuf>,
    include: GlobSet,
    exclude: GlobSet,
    /// Patterns without wildcards: the user named these files.
    literal: HashSet<PathBuf>,
    /// `stream` is configured: files whose path says nothing are read too.
    read_other: bool,
    max_doc: usize,
    /// Last stat and fingerprint of every path, so an unchanged file is not
    /// opened again.
    cache: HashMap<PathBuf, (Stat, Option<u64>)>,
    /// Paths already warned about (one warning each, not one per walk).
    warned: HashSet<PathBuf>,
    /// The source's name, for the report of skipped files.
    source: Arc<str>,
    /// The matched files skipped have been reported (by the first walk).
    reported: bool,
    /// The `include` patterns, for the warning when they match nothing.
    patterns: Vec<String>,
    /// When that warning was last given (again every [`NOTHING_AGAIN`]
    /// while nothing matches).
    nothing_warned: Option<std::time::Instant>,
}

/// How often "matches no file" is said again while it stays true.
const NOTHING_AGAIN: Duration = Duration::from_secs(600);

fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '[', '{'])
}

/// The fixed folder (or file) in front of a pattern's first wildcard.
fn base_of(pattern: &str) -> PathBuf {
    Path::new(pattern)
        .components()
        .take_while(|c| !has_wildcard(&c.as_os_str().to_string_lossy()))
        .collect()
}

/// How many files the `include` patterns match now (`fluxpipe validate`).
pub fn files_matching(config: &FileSourceConfig) -> Result<usize> {
    Ok(Scanner::new(config, true, 0)?.walk().len())
}

fn glob_set(patterns: &[String]) -> Result<GlobSet> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .with_context(|| format!("bad pattern `{p}`"))?;
        b.add(glob);
    }
    Ok(b.build()?)
}

impl Scanner {
    fn new(config: &FileSourceConfig, read_other: bool, max_doc: usize) -> Result<Self> {
        let mut roots: Vec<PathBuf> = config.include.iter().map(|p| base_of(p)).collect();
        roots.sort();
        roots.dedup();
        // A root inside another root is walked by that one already (the
        // empty root, the current folder, holds every relative root).
        let all = roots.clone();
        let inside = |r: &PathBuf, o: &PathBuf| {
            if o.as_os_str().is_empty() {
                r.is_relative()
            } else {
                r.starts_with(o)
            }
        };
        roots.retain(|r| !all.iter().any(|o| o != r && inside(r, o)));
        Ok(Scanner {
            roots,
            include: glob_set(&config.include)?,
            exclude: glob_set(&config.exclude)?,
            literal: config
                .include
                .iter()
                .filter(|p| !has_wildcard(p))
                .map(PathBuf::from)
                .collect(),
            read_other,
            max_doc,
            cache: HashMap::new(),
            warned: HashSet::new(),
            source: Arc::from(""),
            reported: false,
            patterns: config.include.clone(),
            nothing_warned: None,
        })
    }

    fn warn_once(&mut self, path: &Path, what: &str, e: &dyn std::fmt::Display) {
        if self.warned.len() > 10_000 {
            self.warned.clear();
        }
        if self.warned.insert(path.to_path_buf()) {
            tracing::warn!(path = %path.display(), "{what}: {e}");
        }
    }

    /// Every matching path, sorted.
    fn walk(&mut self) -> BTreeSet<PathBuf> {
        let mut paths = BTreeSet::new();
        for root in self.roots.clone() {
            let here = root.as_os_str().is_empty();
            let start = if here { Path::new(".") } else { root.as_path() };
            // Not following links spares a stat per entry (readdir tells
            // the type); links to files are taken below, links to folders
            // are not walked.
            for entry in walkdir::WalkDir::new(start) {
                let entry = match entry {
                    Ok(e) => e,
                    Err(e) => {
                        let not_found = e
                            .io_error()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound);
                        if !not_found {
                            let p = e.path().unwrap_or(start).to_path_buf();
                            self.warn_once(&p, "cannot walk", &e);
                        }
                        continue;
                    }
                };
                let file_type = entry.file_type();
                if !(file_type.is_file() || (file_type.is_symlink() && entry.path().is_file())) {
                    continue;
                }
                let path = if here {
                    entry.path().strip_prefix(".").unwrap_or(entry.path())
                } else {
                    entry.path()
                };
                if self.include.is_match(path) && !self.exclude.is_match(path) {
                    paths.insert(path.to_path_buf());
                }
            }
        }
        paths
    }

    /// Between walks: stat known files, fingerprint those that changed, and
    /// return the stats of those that still begin the same. Anything else
    /// (gone, replaced, rewritten) waits for the next walk.
    fn check(&mut self, known: Vec<(u64, PathBuf)>) -> Vec<(u64, Stat)> {
        let mut out = Vec::with_capacity(known.len());
        for (fp, path) in known {
            let Ok(m) = std::fs::metadata(&path) else {
                continue;
            };
            let stat = Stat::of(&m);
            let same = match self.cache.get(&path) {
                Some((s, Some(cached))) if *s == stat => *cached == fp,
                _ => match fingerprint(&path) {
                    Ok(now) => {
                        self.cache.insert(path, (stat, now));
                        now == Some(fp)
                    }
                    Err(_) => false,
                },
            };
            if same {
                out.push((fp, stat));
            }
        }
        out
    }

    /// Walk, stat, and fingerprint what changed.
    fn scan(&mut self) -> Vec<Found> {
        let paths = self.walk();
        let mut found = Vec::with_capacity(paths.len());
        let mut cache = HashMap::with_capacity(paths.len());
        let mut skipped = Skipped::default();
        for path in paths {
            let kind = match classify(&path) {
                PathKind::Eventlog(origin) => Some(origin),
                PathKind::Lines => Some(Origin::default()),
                PathKind::Other if self.read_other || self.literal.contains(&path) => {
                    Some(Origin::default())
                }
                PathKind::Other => {
                    if !self.reported {
                        skipped.add(path);
                    }
                    continue;
                }
                PathKind::JobR(_) | PathKind::JobSpec(_) | PathKind::ResourceR => None,
            };
            let stat = match std::fs::metadata(&path) {
                Ok(m) => Stat::of(&m),
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        self.warn_once(&path, "cannot stat", &e);
                    }
                    continue;
                }
            };
            let previous = self.cache.remove(&path);
            let unchanged = previous.filter(|(s, _)| *s == stat);
            let kind = match kind {
                Some(origin) => {
                    let fp = match unchanged {
                        Some((_, fp)) => fp,
                        None => match fingerprint(&path) {
                            Ok(fp) => fp,
                            Err(e) => {
                                self.warn_once(&path, "cannot read", &e);
                                None
                            }
                        },
                    };
                    cache.insert(path.clone(), (stat, fp));
                    FoundKind::Lines { origin, fp }
                }
                None => {
                    let (stream, id, jobspec) = match classify(&path) {
                        PathKind::JobR(id) => (EventStream::Job, Some(id), false),
                        PathKind::JobSpec(id) => (EventStream::Job, Some(id), true),
                        _ => (EventStream::Resource, None, false),
                    };
                    let content = if unchanged.is_some() {
                        None
                    } else {
                        match read_prefix(&path, self.max_doc + 1) {
                            Ok(c) => Some(c),
                            Err(e) => {
                                self.warn_once(&path, "cannot read", &e);
                                None
                            }
                        }
                    };
                    cache.insert(path.clone(), (stat, None));
                    FoundKind::Doc {
                        stream,
                        id,
                        jobspec,
                        content,
                    }
                }
            };
            found.push(Found { path, stat, kind });
        }
        self.cache = cache;
        if !self.reported {
            self.reported = true;
            skipped.report(&self.source);
            tracing::info!(source = %self.source, files = found.len(), "reading files");
        }
        self.say_if_nothing(found.is_empty());
        found
    }
}

impl Scanner {
    /// A source reading nothing says so, naming its patterns: at once,
    /// then now and then while it lasts.
    fn say_if_nothing(&mut self, nothing: bool) {
        if !nothing {
            self.nothing_warned = None;
            return;
        }
        if self
            .nothing_warned
            .is_some_and(|at| at.elapsed() < NOTHING_AGAIN)
        {
            return;
        }
        self.nothing_warned = Some(std::time::Instant::now());
        tracing::warn!(
            source = %self.source,
            include = ?self.patterns,
            "no file to read matches include (yet): waiting for one"
        );
    }
}

/// Matched files the first walk skips, by reason, for one report at start
/// (later walks skip new ones quietly).
#[derive(Default)]
struct Skipped {
    /// Compressed rotated files: (how many, the first few).
    compressed: (usize, Vec<PathBuf>),
    /// Not an eventlog, a journal or an R document.
    other: (usize, Vec<PathBuf>),
}

impl Skipped {
    /// Paths named in the report, per reason.
    const EXAMPLES: usize = 5;

    fn add(&mut self, path: PathBuf) {
        let (n, examples) = if is_compressed_log(&path) {
            &mut self.compressed
        } else {
            &mut self.other
        };
        *n += 1;
        if examples.len() < Self::EXAMPLES {
            examples.push(path);
        }
    }

    fn report(&self, source: &str) {
        let list = |(n, examples): &(usize, Vec<PathBuf>)| {
            let mut s: Vec<String> = examples.iter().map(|p| p.display().to_string()).collect();
            if *n > examples.len() {
                s.push(format!("and {} more", n - examples.len()));
            }
            s.join(", ")
        };
        // Compressed journals hold data that is not read: a warning.
        if self.compressed.0 > 0 {
            tracing::warn!(
                source,
                "{} matched files not read: compressed (fluxpipe reads no compressed files; \
                 logrotate's `delaycompress` keeps the newest rotated file plain): {}",
                self.compressed.0,
                list(&self.compressed)
            );
        }
        if self.other.0 > 0 {
            tracing::info!(
                source,
                "{} matched files not read: not an eventlog, a journal (`*.jsonl`, rotated \
                 ones too) or an R document (a source with `stream` set reads them): {}",
                self.other.0,
                list(&self.other)
            );
        }
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn read_prefix(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max as u64)
        .read_to_end(&mut out)?;
    Ok(out)
}

/// The fingerprint of a file's beginning, or `None` while its first line is
/// incomplete and shorter than [`FINGERPRINT_BYTES`].
fn fingerprint(path: &Path) -> std::io::Result<Option<u64>> {
    Ok(fingerprint_of(&read_prefix(path, FINGERPRINT_BYTES)?))
}

/// The fingerprint of `head`, a file's first (at most [`FINGERPRINT_BYTES`])
/// bytes; `None` while its first line is incomplete and shorter than that.
fn fingerprint_of(head: &[u8]) -> Option<u64> {
    let head = &head[..head.len().min(FINGERPRINT_BYTES)];
    match head.iter().position(|b| *b == b'\n') {
        Some(i) => Some(fnv1a(&head[..=i])),
        None if head.len() == FINGERPRINT_BYTES => Some(fnv1a(head)),
        None => None,
    }
}

/// `buf.len()` bytes at `offset`, fewer only at the end of the file.
fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// How an open file begins now, against the fingerprint it is tracked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// As the fingerprint says.
    Same,
    /// A whole first line (or [`FINGERPRINT_BYTES`]) that is another one:
    /// rewritten in place.
    Other,
    /// Not even a whole first line: truncated, perhaps being rewritten.
    Short,
}

/// Compare an open file's beginning with `fp` (one positioned read).
fn check_head(file: &std::fs::File, fp: u64) -> std::io::Result<Head> {
    let mut head = [0u8; FINGERPRINT_BYTES];
    let n = read_full_at(file, &mut head, 0)?;
    Ok(match fingerprint_of(&head[..n]) {
        Some(now) if now == fp => Head::Same,
        Some(_) => Head::Other,
        None => Head::Short,
    })
}

/// Offset just past the last newline, and the number of lines before it:
/// where `read_from = "end"` starts.
fn end_of_last_line(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut offset, mut end, mut lines) = (0u64, 0u64, 0u64);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((end, lines));
        }
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                lines += 1;
                end = offset + i as u64 + 1;
            }
        }
        offset += n as u64;
    }
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

// ---- checkpoints ----------------------------------------------------------

/// The positions, in the JSON form kept in a checkpoint.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointFile {
    version: u32,
    /// Tailed files, by fingerprint.
    files: Vec<FileEntry>,
    /// R documents, by path.
    documents: Vec<DocEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    /// 16 hex digits.
    fingerprint: String,
    /// Where the file was last seen (for people; files are matched by
    /// fingerprint).
    path: PathBuf,
    /// Offset just past the last line handed on.
    position: u64,
    /// Lines before `position`.
    lines: u64,
    /// Unix time the file was last seen missing, if it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gone_at: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DocEntry {
    path: PathBuf,
    /// 16 hex digits: FNV-1a of the document last sent.
    hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gone_at: Option<u64>,
}

/// Positions as saved in a checkpoint; none saved: nothing read yet.
fn parse_positions(text: Option<&str>) -> Result<CheckpointFile> {
    let Some(text) = text else {
        return Ok(CheckpointFile {
            version: CHECKPOINT_VERSION,
            ..Default::default()
        });
    };
    let corrupt = |why: String| {
        anyhow!("corrupt: {why}; start with --reset-state to read every file again from the start")
    };
    let file: CheckpointFile = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    if file.version != CHECKPOINT_VERSION {
        return Err(corrupt(format!(
            "version {} (this fluxpipe writes version {CHECKPOINT_VERSION})",
            file.version
        )));
    }
    for f in &file.files {
        parse_hex(&f.fingerprint)
            .ok_or_else(|| corrupt(format!("bad fingerprint `{}`", f.fingerprint)))?;
    }
    for d in &file.documents {
        parse_hex(&d.hash).ok_or_else(|| corrupt(format!("bad hash `{}`", d.hash)))?;
    }
    Ok(file)
}

fn parse_hex(s: &str) -> Option<u64> {
    (s.len() == 16)
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}

// ---- the async half -------------------------------------------------------

type Reader = LineReader<Tail>;

/// Why bytes read from a tailed file were thrown away: when they were read,
/// the file no longer began as its fingerprint says ([`Head::Other`] or
/// [`Head::Short`]), so they are not the rest of the file that was tracked.
#[derive(Debug)]
struct Changed(Head);

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Head::Short => f.write_str("truncated below its first line"),
            _ => f.write_str("rewritten in place with another first line"),
        }
    }
}

impl std::error::Error for Changed {}

/// An open tailed file, read by positioned reads on a blocking thread.
///
/// A file rewritten in place (same inode: truncated, then written again)
/// can be rewritten at any moment, between a check of its fingerprint and a
/// read as well as during a read. So the check comes after the read: every
/// read that returns bytes is followed, in the same blocking call, by a read
/// of the file's beginning, and the bytes are handed on only if the file
/// still begins as its fingerprint says. Had a rewrite begun before the read,
/// the beginning would be another (or incomplete) by then, and the read
/// fails with [`Changed`] instead. An idle file costs nothing more: a read
/// at the end returns no bytes and checks nothing.
struct Tail {
    file: Arc<std::fs::File>,
    fp: u64,
    /// Offset of the next read.
    offset: u64,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    used: usize,
    job: Option<tokio::task::JoinHandle<std::io::Result<Vec<u8>>>>,
}

impl Tail {
    fn new(file: std::fs::File, fp: u64, offset: u64) -> Self {
        Tail {
            file: Arc::new(file),
            fp,
            offset,
            buf: Vec::new(),
            used: 0,
            job: None,
        }
    }

    async fn len(&self) -> std::io::Result<u64> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.metadata().map(|m| m.len()))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// Read a chunk at `offset`, then check that the file still begins as `fp`.
fn read_checked(
    file: &std::fs::File,
    offset: u64,
    fp: u64,
    mut buf: Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    buf.resize(READ_BYTES, 0);
    let n = loop {
        match file.read_at(&mut buf, offset) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    if n == 0 {
        // At the end: an idle file keeps no buffer.
        return Ok(Vec::new());
    }
    buf.truncate(n);
    match check_head(file, fp)? {
        Head::Same => Ok(buf),
        head => Err(std::io::Error::other(Changed(head))),
    }
}

impl AsyncBufRead for Tail {
    fn poll_fill_buf(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.used >= this.buf.len() {
            if this.job.is_none() {
                let (file, offset, fp) = (this.file.clone(), this.offset, this.fp);
                let buf = std::mem::take(&mut this.buf);
                this.used = 0;
                this.job = Some(tokio::task::spawn_blocking(move || {
                    read_checked(&file, offset, fp, buf)
                }));
            }
            let job = this.job.as_mut().expect("a read is under way");
            let done = ready!(Pin::new(job).poll(cx));
            this.job = None;
            let chunk = done.map_err(std::io::Error::other)??;
            this.offset += chunk.len() as u64;
            this.buf = chunk;
            this.used = 0;
        }
        Poll::Ready(Ok(&this.buf[this.used..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.used = (this.used + amt).min(this.buf.len());
    }
}

impl super::lines::Buffered for Tail {
    fn buffer(&self) -> &[u8] {
        self.buf.get(self.used..).unwrap_or(&[])
    }
}

impl AsyncRead for Tail {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let chunk = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = chunk.len().min(out.remaining());
        out.put_slice(&chunk[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
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
struct Saved {
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
    saved: HashMap<u64, Saved>,
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
                    Saved {
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
        metrics::counter!("fluxpipe_events_received_total", "source" => ctx.name.to_string())
            .increment(1);
        if jobspec {
            // Read whatever it is: what cannot be read is an anomaly of the
            // job's, and the job keeps its record.
            let record = Record {
                cluster: None,
                stream,
                id,
                body: crate::decode::job_spec(&String::from_utf8_lossy(content)),
            };
            return ctx.record(record).await.map_err(|_| Stop);
        }
        match serde_json::from_slice::<serde_json::Value>(content) {
            Ok(value) => {
                // Not an object: read as `{}`, which has no expiration or
                // ranks (an instance's R says so, as an anomaly).
                let record = Record {
                    cluster: None,
                    stream,
                    id,
                    body: Body::R(JsonObject::from_value(&value).unwrap_or_default()),
                };
                ctx.record(record).await.map_err(|_| Stop)
            }
            Err(e) => {
                ctx.dead_letter(&location, &format!("R is not valid JSON: {e}"), content)
                    .await;
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
                Saved {
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
        let mut out = ctx.outbox();
        let mut held: Option<(u64, u64)> = None;
        let mut next_lineno = *lines;
        loop {
            if n >= budget {
                hand_on(ctx, &mut out, &mut held, position, lines).await?;
                return Ok(true);
            }
            let line = match reader.next(false).await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    hand_on(ctx, &mut out, &mut held, position, lines).await?;
                    *at_eof = true;
                    return Ok(false);
                }
                Err(e) => {
                    hand_on(ctx, &mut out, &mut held, position, lines).await?;
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
        metrics::gauge!("fluxpipe_source_lag_bytes", "source" => self.ctx.name.to_string())
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
