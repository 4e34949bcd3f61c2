//! The checkpoint file: operator state and source positions, taken at one
//! barrier, in one file in `data_dir`.
//!
//! Layout: a magic line, the format version (u32), the payload length
//! (u64), the payload's XXH3-64 (u64), all little-endian; then the payload:
//! a MessagePack [`Head`] followed by the shards' states in parts, each a
//! length-prefixed MessagePack [`SavedState`] of at most [`PART_JOBS`]
//! jobs. Shards encode their own state (in parallel, without copying it,
//! each on its share of the cores, a run of parts per thread) into scratch
//! files in `data_dir` ([`Spill`]), which are copied into the checkpoint
//! and removed: a million jobs' encoded state (~230 MB) never
//! sits in memory beside the state itself. Restore decodes the parts on
//! every core and deals each one's entries out again by key as it comes
//! (whole to a shard that owns all of it), so the number of workers may
//! change between runs.
//!
//! The file is replaced atomically and durably (temporary file, fsync,
//! rename, fsync of the folder; the `atomic-write-file` crate), so a crash
//! leaves the old checkpoint or the new one, never a mix. The checksum
//! catches what the disk itself garbles; a file that fails any check is an
//! error, never read as empty.

use crate::flux::resource::ResourceState;
use crate::keyed::Owner;
use crate::keyed::alerts::EventClock;
use crate::keyed::alerts::engine::Engine;
use crate::keyed::finished::FinishedJobs;
use crate::keyed::job_table::JobTable;
use crate::keyed::processor::Processor;
use crate::keyed::saved::SavedState;
use foldhash::HashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "checkpoint.bin";
const MAGIC: &[u8; 20] = b"fluxpipe checkpoint\n";
/// Bumped whenever the payload's layout changes incompatibly.
/// 3: a job's absent exec log and protocol are nil (2: their empty value),
/// and a shard's state may come in several parts.
pub const VERSION: u32 = 3;
/// The oldest version this fluxpipe still reads.
pub const OLDEST_READ: u32 = 2;
/// Versions beyond [`VERSION`] that a newer fluxpipe could have written;
/// a version further ahead is damage.
const MAX_VERSIONS_AHEAD: u32 = 64;
const HEADER_LEN: usize = MAGIC.len() + 4 + 8 + 8;
/// Where the checksum sits in the header.
const SUM_AT: u64 = (MAGIC.len() + 4 + 8) as u64;
/// Scratch files of shards' states begin with this (see [`spill_path`]).
const SPILL_PREFIX: &str = "checkpoint.bin.shard";

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a fluxpipe checkpoint")]
    NotACheckpoint { path: PathBuf },
    #[error(
        "{path} has format version {found}; this fluxpipe reads versions {OLDEST_READ} to {VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("{path} is corrupt: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("cannot encode the state: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// What the payload begins with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Head {
    /// Checkpoints taken since the data folder was new.
    pub seq: u64,
    /// Unix time it was written.
    pub written_at: f64,
    /// Each source's positions, in the source's own JSON form.
    pub sources: BTreeMap<String, String>,
    /// Where each file sink stood at the barrier ([`crate::checkpoint::offsets`]).
    /// Last, with a default: checkpoints written before it read as before.
    #[serde(default)]
    pub sinks: BTreeMap<String, String>,
    /// What each source of the config that wrote it reads (its type, and
    /// its file patterns or Kafka topics and group): a config reading
    /// something else is not given this state ([`mismatch`]). Last, with a
    /// default: older checkpoints have none and are not checked.
    #[serde(default)]
    pub identities: BTreeMap<String, String>,
    /// The feed watch's alerts that had fired (`feed_silent`,
    /// `instance_down`): they stay fired across the restart. Last, with a
    /// default, as the keys above.
    #[serde(default)]
    pub watch: Vec<crate::keyed::alerts::watch::SavedWatchAlert>,
}

/// Why a checkpoint whose sources read `saved` does not belong to a
/// pipeline whose sources read `now` (source name → identity), or `None`
/// if it does: a source of both names that reads something else, or no
/// source in common. Sources added or removed beside ones that match are
/// the same pipeline changed.
pub fn mismatch(
    saved: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Option<String> {
    if saved.is_empty() {
        return None;
    }
    let changed: Vec<String> = saved
        .iter()
        .filter_map(|(name, was)| match now.get(name) {
            Some(is) if is != was => Some(format!("source {name} read {was}, now {is}")),
            _ => None,
        })
        .collect();
    if !changed.is_empty() {
        return Some(changed.join("; "));
    }
    if !saved.keys().any(|name| now.contains_key(name)) {
        let list = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(n, i)| format!("{n} ({i})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Some(format!(
            "it was written for the sources {}; this config has {}",
            list(saved),
            if now.is_empty() {
                "none".to_string()
            } else {
                list(now)
            }
        ));
    }
    None
}

/// One shard's state, borrowed for encoding. It is saved in parts of at
/// most [`PART_JOBS`] jobs, each in [`SavedState`]'s layout (the first
/// with everything but jobs): restore decodes parts side by side whatever
/// the number of shards, and holds one part's bytes per thread at a time.
pub struct ShardStateRef<'a> {
    pub jobs: &'a JobTable,
    pub resources: &'a HashMap<String, ResourceState>,
    /// The nodes' conditions and those kept in `jobs`' entries.
    pub alerts: &'a Engine,
    pub clock: &'a EventClock,
    pub resource_owners: &'a HashMap<String, Owner>,
    pub finished: &'a FinishedJobs,
}

/// The most jobs in one part of a shard's saved state.
pub const PART_JOBS: usize = 1 << 16;

/// A state of fewer jobs than this is encoded whole on the shard's thread:
/// below it, starting another thread costs more than it saves.
const MIN_PART_JOBS: usize = 8192;

/// Threads each of `shards` shards encodes its state on: its share of
/// the cores, at least one.
pub fn encode_threads(shards: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (cores / shards.max(1)).max(1)
}

impl<'a> ShardStateRef<'a> {
    /// A processor's state, to encode.
    pub fn of(processor: &'a Processor) -> Self {
        ShardStateRef {
            jobs: &processor.state().jobs,
            resources: &processor.state().resources,
            alerts: processor.alerts(),
            clock: processor.event_clock(),
            resource_owners: processor.resource_owners(),
            finished: processor.finished(),
        }
    }

    /// The parts, of about equal size: as many as [`PART_JOBS`] makes,
    /// and at least one per encoding thread for a state worth sharing out.
    fn parts(&self, threads: usize) -> Vec<PartRef<'_, 'a>> {
        let len = self.jobs.len();
        let n = len
            .div_ceil(PART_JOBS)
            .max(len.div_ceil(MIN_PART_JOBS).min(threads))
            .max(1);
        (0..n)
            .map(|i| PartRef {
                state: self,
                jobs: i * len / n..(i + 1) * len / n,
                first: i == 0,
            })
            .collect()
    }

    /// `f` over runs of consecutive parts, each run on a thread of its own
    /// (the first on this one); the results in part order. The shard's
    /// input waits while it encodes: a checkpoint of a large state takes
    /// about 1/cores of the time it would on the shard's thread alone.
    fn on_threads<T: Send>(
        &self,
        threads: usize,
        f: impl Fn(usize, &[PartRef<'_, 'a>]) -> T + Sync,
    ) -> Vec<T> {
        let parts = self.parts(threads);
        let threads = threads.min(parts.len()).max(1);
        let run = |w: usize| {
            let (from, to) = (w * parts.len() / threads, (w + 1) * parts.len() / threads);
            f(w, &parts[from..to])
        };
        if threads == 1 {
            return vec![run(0)];
        }
        std::thread::scope(|scope| {
            let others: Vec<_> = (1..threads).map(|w| scope.spawn(move || run(w))).collect();
            let mut out = vec![run(0)];
            for other in others {
                match other.join() {
                    Ok(v) => out.push(v),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            out
        })
    }

    /// Encode in memory on `threads` threads.
    pub fn encode(&self, threads: usize) -> Result<ShardBytes, CheckpointError> {
        let runs = self.on_threads(threads, |_, parts| {
            parts
                .iter()
                .map(rmp_serde::to_vec)
                .collect::<Result<Vec<_>, _>>()
        });
        let mut parts = Vec::new();
        for run in runs {
            parts.extend(run?);
        }
        Ok(ShardBytes::Memory(parts))
    }

    /// Encode on `threads` threads into scratch files at `path` (see
    /// [`spill_path`]) and beside it, one per thread, removed when the
    /// returned [`Spill`] is dropped, or at once if this fails.
    pub fn spill(&self, threads: usize, path: PathBuf) -> Result<ShardBytes, CheckpointError> {
        let files = self.on_threads(threads, |w, parts| {
            spill_parts(parts, thread_path(&path, w))
        });
        Ok(ShardBytes::Spilled(Spill {
            files: files.into_iter().collect::<Result<_, _>>()?,
        }))
    }
}

/// The scratch file of encoding thread `w`: `path` for the first.
fn thread_path(path: &Path, w: usize) -> PathBuf {
    if w == 0 {
        return path.to_path_buf();
    }
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let stem = name.strip_suffix(".part").unwrap_or(&name);
    path.with_file_name(format!("{stem}-{w}.part"))
}

fn spill_parts(parts: &[PartRef<'_, '_>], path: PathBuf) -> Result<SpillFile, CheckpointError> {
    let mut spill = SpillFile {
        path,
        parts: Vec::new(),
    };
    let failed = |source| CheckpointError::Write {
        path: spill.path.clone(),
        source,
    };
    let file = std::fs::File::create(&spill.path).map_err(failed)?;
    let mut w = Counting {
        inner: BufWriter::with_capacity(1 << 20, file),
        count: 0,
    };
    for part in parts {
        let before = w.count;
        rmp_serde::encode::write(&mut w, part)?;
        spill.parts.push(w.count - before);
    }
    w.inner.flush().map_err(failed)?;
    Ok(spill)
}

/// One part of a shard's state, encoding as a [`SavedState`] does.
struct PartRef<'s, 'a> {
    state: &'s ShardStateRef<'a>,
    /// Its jobs, as a range of the job table's order.
    jobs: std::ops::Range<usize>,
    /// The first part carries all but jobs.
    first: bool,
}

impl Serialize for PartRef<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let st = self.state;
        let (skip, take) = (self.jobs.start, self.jobs.len());
        // The rest of the state, in the first part only.
        let rest = if self.first { usize::MAX } else { 0 };
        let mut out = s.serialize_struct("SavedState", 6)?;
        out.serialize_field("jobs", &Seq(st.jobs.iter().skip(skip).take(take)))?;
        out.serialize_field("resources", &Seq(st.resources.iter().take(rest)))?;
        out.serialize_field(
            "alerts",
            &st.alerts.saved_part(st.jobs, self.jobs.clone(), self.first),
        )?;
        let none = EventClock::default();
        out.serialize_field("clock", if self.first { st.clock } else { &none })?;
        out.serialize_field(
            "resource_owners",
            &Seq(st.resource_owners.iter().take(rest)),
        )?;
        out.serialize_field(
            "finished",
            &Seq(st
                .finished
                .iter()
                .take(rest)
                .map(|(c, ids)| (&**c, Seq(ids.iter())))),
        )?;
        out.end()
    }
}

/// Encodes what an iterator gives as a sequence (MessagePack wants the
/// length first: the iterator knows it exactly).
struct Seq<I>(I);

impl<I: Iterator + Clone> Serialize for Seq<I>
where
    I::Item: Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.clone())
    }
}

/// A shard's encoded state in scratch files, each holding a run of its
/// parts; the files go with it.
#[derive(Debug)]
pub struct Spill {
    files: Vec<SpillFile>,
}

/// One scratch file: parts one after another.
#[derive(Debug)]
struct SpillFile {
    path: PathBuf,
    /// Each part's length.
    parts: Vec<u64>,
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Spill {
    /// Its scratch files.
    #[cfg(test)]
    fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }
}

/// The scratch file for the `n`th state shard `shard` encodes in `dir`:
/// a new name each round, so a round abandoned while its files are still
/// being copied never shares one with the next.
pub fn spill_path(dir: &Path, shard: usize, n: u64) -> PathBuf {
    dir.join(format!("{SPILL_PREFIX}{shard}-{n}.part"))
}

/// Remove scratch files a killed process left in `dir`; returns how many.
pub fn remove_spills(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(SPILL_PREFIX) && name.ends_with(".part")
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// One shard's encoded state, in parts, as the checkpoint writer takes it.
#[derive(Debug)]
pub enum ShardBytes {
    Memory(Vec<Vec<u8>>),
    Spilled(Spill),
}

impl ShardBytes {
    /// The bytes it takes in a checkpoint: each part with its length.
    fn framed_len(&self) -> u64 {
        match self {
            ShardBytes::Memory(parts) => parts.iter().map(|p| 8 + p.len() as u64).sum(),
            ShardBytes::Spilled(s) => s.files.iter().flat_map(|f| &f.parts).map(|n| 8 + n).sum(),
        }
    }

    /// Each part, after its length.
    fn copy_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            ShardBytes::Memory(parts) => {
                for p in parts {
                    w.write_all(&(p.len() as u64).to_le_bytes())?;
                    w.write_all(p)?;
                }
                Ok(())
            }
            ShardBytes::Spilled(s) => {
                for f in &s.files {
                    let mut file = std::fs::File::open(&f.path)?;
                    for &len in &f.parts {
                        w.write_all(&len.to_le_bytes())?;
                        let n = std::io::copy(&mut (&mut file).take(len), w)?;
                        if n != len {
                            return Err(std::io::Error::other(format!(
                                "{} ends {} bytes short of what was encoded",
                                f.path.display(),
                                len - n
                            )));
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl From<Vec<u8>> for ShardBytes {
    fn from(v: Vec<u8>) -> Self {
        ShardBytes::Memory(vec![v])
    }
}

/// A writer or reader that counts what goes through it.
struct Counting<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    /// The encoder writes a byte or a few at a time: forwarded whole and
    /// inlined, each is a store into the buffer, not a call that loops
    /// over `write` and copies with `memcpy`.
    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(buf)?;
        self.count += buf.len() as u64;
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that checksums what goes through it.
struct Summing<T> {
    inner: T,
    sum: xxhash_rust::xxh3::Xxh3,
}

impl<T> Summing<T> {
    fn new(inner: T) -> Self {
        Summing {
            inner,
            sum: xxhash_rust::xxh3::Xxh3::new(),
        }
    }
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A whole checkpoint as read back.
#[derive(Debug, Default)]
pub struct Checkpoint {
    pub head: Head,
    /// The shards' states in the parts they were saved in.
    pub parts: Vec<SavedState>,
}

impl Checkpoint {
    /// Merge the saved parts and deal their entries out to `n` shards by
    /// `shard_of(cluster, job id)`, the router's own function.
    pub fn split(
        self,
        n: usize,
        shard_of: impl Fn(&str, Option<u64>) -> usize,
    ) -> (Head, Vec<SavedState>) {
        let n = n.max(1);
        let shard_of = |cluster: &str, id: Option<u64>| shard_of(cluster, id).min(n - 1);
        // Every shard learns every cluster's clock.
        let mut clock = EventClock::default();
        for s in &self.parts {
            for (c, t) in s.clock.clusters() {
                clock.advance(c, t);
            }
        }
        let mut out: Vec<SavedState> = (0..n)
            .map(|_| SavedState {
                clock: clock.clone(),
                ..SavedState::default()
            })
            .collect();
        // Restarted with as many workers, a part belongs to one shard
        // whole: it is taken as it is, not moved entry by entry.
        let mut dealt = Vec::new();
        let mut whole: Vec<Vec<SavedState>> = (0..n).map(|_| Vec::new()).collect();
        for part in self.parts {
            match part.owner(shard_of) {
                Some(i) => whole[i].push(part),
                None => dealt.push(part),
            }
        }
        for (parts, to) in whole.into_iter().zip(&mut out) {
            to.jobs
                .reserve_exact(parts.iter().map(|p| p.jobs.len()).sum());
            for part in parts {
                to.append(part);
            }
        }
        for part in dealt {
            part.split_into(&mut out, shard_of);
        }
        (self.head, out)
    }
}

/// Write a checkpoint from its head and the shards' encoded states in
/// one pass: the checksum, not known until the end, is written last into
/// its place in the header. Returns the bytes written.
pub fn write_to<W: Write + Seek>(
    w: &mut W,
    head: &Head,
    shards: &[ShardBytes],
) -> Result<usize, CheckpointError> {
    let head = rmp_serde::to_vec(head)?;
    let len = head.len() as u64 + shards.iter().map(ShardBytes::framed_len).sum::<u64>();
    let io = |source| CheckpointError::Write {
        path: PathBuf::from(FILE_NAME),
        source,
    };
    w.write_all(MAGIC).map_err(io)?;
    w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    w.write_all(&len.to_le_bytes()).map_err(io)?;
    w.write_all(&0u64.to_le_bytes()).map_err(io)?;
    let mut body = Summing::new(&mut *w);
    body.write_all(&head).map_err(io)?;
    for s in shards {
        s.copy_to(&mut body).map_err(io)?;
    }
    let sum = body.sum.digest();
    w.seek(SeekFrom::Start(SUM_AT)).map_err(io)?;
    w.write_all(&sum.to_le_bytes()).map_err(io)?;
    w.seek(SeekFrom::End(0)).map_err(io)?;
    Ok(HEADER_LEN + len as usize)
}

/// A payload framed as a checkpoint file (magic, version, length,
/// checksum): what the fuzzer feeds [`decode`] to get past the checksum.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A checkpoint in memory (tests, tools).
pub fn encode(head: &Head, shards: &[ShardBytes]) -> Result<Vec<u8>, CheckpointError> {
    let mut out = std::io::Cursor::new(Vec::new());
    write_to(&mut out, head, shards)?;
    Ok(out.into_inner())
}

/// The payload size from which shards are decoded on several threads.
const PARALLEL_FROM: u64 = 4 << 20;

/// Decode a checkpoint; `path` only names it in errors.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint, CheckpointError> {
    read_from(bytes, bytes.len() as u64, path)
}

/// Where a checkpoint's bytes can be read from any offset, as many times
/// as needed: its shards are decoded side by side.
pub trait Reopen: Sync {
    fn open_at(&self, offset: u64) -> std::io::Result<Box<dyn Read + '_>>;
}

impl Reopen for &[u8] {
    fn open_at(&self, offset: u64) -> std::io::Result<Box<dyn Read + '_>> {
        let at = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        Ok(Box::new(&self[at..]))
    }
}

impl Reopen for PathBuf {
    fn open_at(&self, offset: u64) -> std::io::Result<Box<dyn Read + '_>> {
        let mut f = std::fs::File::open(self)?;
        f.seek(SeekFrom::Start(offset))?;
        Ok(Box::new(f))
    }
}

/// A checkpoint opened: its head read and its parts found, none of them
/// decoded yet (see [`Parts::each`]). A big payload's head is read before
/// its checksum is known: act on it only once `each` has returned `Ok`.
pub struct Opened<S> {
    pub head: Head,
    pub parts: Parts<S>,
}

/// Where an opened checkpoint's parts lie, to decode.
pub struct Parts<S> {
    src: S,
    path: PathBuf,
    /// Where the payload starts, its length and its checksum.
    start: u64,
    len: u64,
    sum: u64,
    /// Each part's offset and length.
    at: Vec<(u64, u64)>,
    /// A big state: its parts are decoded on several threads while one
    /// more checksums the payload. A small one (and the fuzzer's inputs)
    /// was checked whole before its head was read.
    parallel: bool,
    /// The checksum has matched already ([`Parts::check_sum`]): not
    /// worked out again while the parts are decoded.
    checked: bool,
}

/// Decode a checkpoint of `size` bytes: see [`Parts::each`]. The state is
/// only returned once the checksum over all of it has matched.
pub fn read_from<S: Reopen>(src: S, size: u64, path: &Path) -> Result<Checkpoint, CheckpointError> {
    read(src, size, path, PARALLEL_FROM)
}

/// [`read_from`], on several threads from a payload of `parallel_from`
/// bytes.
fn read<S: Reopen>(
    src: S,
    size: u64,
    path: &Path,
    parallel_from: u64,
) -> Result<Checkpoint, CheckpointError> {
    let Opened { head, parts } = open(src, size, path, parallel_from)?;
    let mut states = Vec::with_capacity(parts.at.len());
    parts.each(|state| states.push(state))?;
    Ok(Checkpoint {
        head,
        parts: states,
    })
}

/// Read a checkpoint's header and head and find its parts; decoded on
/// several threads from a payload of `parallel_from` bytes.
pub(crate) fn open<S: Reopen>(
    src: S,
    size: u64,
    path: &Path,
    parallel_from: u64,
) -> Result<Opened<S>, CheckpointError> {
    let not_one = || CheckpointError::NotACheckpoint {
        path: path.to_path_buf(),
    };
    let mut header = [0u8; HEADER_LEN];
    if size < HEADER_LEN as u64 {
        return Err(not_one());
    }
    src.open_at(0)
        .and_then(|mut r| r.read_exact(&mut header))
        .map_err(|source| CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if &header[..MAGIC.len()] != MAGIC {
        return Err(not_one());
    }
    let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().unwrap_or_default());
    let version = u32_at(MAGIC.len());
    // Versions go up one at a time: far from any, the field is damaged
    // (a flipped bit), not the mark of another fluxpipe.
    if version == 0 || version > VERSION + MAX_VERSIONS_AHEAD {
        return Err(CheckpointError::Corrupt {
            path: path.to_path_buf(),
            why: format!(
                "its format version reads {version}, which no fluxpipe writes: the header is damaged"
            ),
        });
    }
    if !(OLDEST_READ..=VERSION).contains(&version) {
        return Err(CheckpointError::Version {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let len = u64_at(MAGIC.len() + 4);
    let present = size - HEADER_LEN as u64;
    let mut parts = Parts {
        src,
        path: path.to_path_buf(),
        start: HEADER_LEN as u64,
        len,
        sum: u64_at(SUM_AT as usize),
        at: Vec::new(),
        parallel: len >= parallel_from,
        checked: false,
    };
    if present != len {
        return Err(parts.corrupt(format!(
            "{present} payload bytes where the header says {len} (truncated?)"
        )));
    }
    if !parts.parallel {
        parts.check_sum()?;
    }
    match parts.locate() {
        Ok(head) => Ok(Opened { head, parts }),
        // A damaged file is reported as such before what its damage did
        // to the decoding.
        Err(e) => {
            if parts.parallel {
                parts.check_sum()?;
            }
            Err(e)
        }
    }
}

impl<S: Reopen> Parts<S> {
    fn corrupt(&self, why: String) -> CheckpointError {
        CheckpointError::Corrupt {
            path: self.path.clone(),
            why,
        }
    }

    fn unreadable(&self, source: std::io::Error) -> CheckpointError {
        CheckpointError::Read {
            path: self.path.clone(),
            source,
        }
    }

    /// The payload's checksum, a megabyte at a time.
    fn summed(&self) -> std::io::Result<u64> {
        let mut r = self.src.open_at(self.start)?.take(self.len);
        let mut sum = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match r.read(&mut buf)? {
                0 => return Ok(sum.digest()),
                n => sum.update(&buf[..n]),
            }
        }
    }

    /// Whether the payload is whole: its checksum matches (then
    /// [`Parts::each`] does not work it out again).
    pub fn check_sum(&mut self) -> Result<(), CheckpointError> {
        if self.summed().map_err(|e| self.unreadable(e))? != self.sum {
            return Err(self.corrupt("checksum mismatch".into()));
        }
        self.checked = true;
        Ok(())
    }

    /// The head, then where each shard's bytes lie.
    fn locate(&mut self) -> Result<Head, CheckpointError> {
        let (start, len) = (self.start, self.len);
        let mut payload = Counting {
            inner: BufReader::with_capacity(
                1 << 20,
                self.src
                    .open_at(start)
                    .map_err(|e| self.unreadable(e))?
                    .take(len),
            ),
            count: 0,
        };
        let head: Head =
            rmp_serde::from_read(&mut payload).map_err(|e| self.corrupt(format!("head: {e}")))?;
        let mut at = payload.count;
        while at < len {
            if len - at < 8 {
                return Err(self.corrupt("a shard's length is cut short".into()));
            }
            let mut n = [0u8; 8];
            self.src
                .open_at(start + at)
                .and_then(|mut r| r.read_exact(&mut n))
                .map_err(|e| self.unreadable(e))?;
            let n = u64::from_le_bytes(n);
            if n > len - at - 8 {
                return Err(self.corrupt("a shard runs past the end".into()));
            }
            self.at.push((start + at + 8, n));
            at += 8 + n;
        }
        Ok(head)
    }

    /// Part `i`, at `offset` for `n` bytes, read whole into `bytes` and
    /// decoded from memory: decoding from a slice takes strings and
    /// markers in place, where decoding from a reader copies every one of
    /// them through a call (a third of the time).
    fn decode(
        &self,
        i: usize,
        (offset, n): (u64, u64),
        bytes: &mut Vec<u8>,
    ) -> Result<SavedState, CheckpointError> {
        bytes.clear();
        bytes.reserve(usize::try_from(n).unwrap_or(0));
        let mut r = self
            .src
            .open_at(offset)
            .map_err(|e| self.unreadable(e))?
            .take(n);
        r.read_to_end(bytes).map_err(|e| self.unreadable(e))?;
        rmp_serde::from_slice(bytes).map_err(|e| self.corrupt(format!("part {i}: {e}")))
    }

    /// Decode the parts, handing each to `take` in order as soon as it
    /// is decoded (its share taken over while the next are decoded). A big
    /// state's parts are decoded on as many threads as there are cores
    /// while one more checksums the payload; each decoder holds the part
    /// it decodes and one decoded part waiting, and one buffer serves all
    /// its parts (a new one per part would fault in fresh pages for each).
    /// Nothing is handed on before the checksum over the whole payload has
    /// matched: what takes a part over may trust it as saved. A damaged
    /// file is reported as such before any error its damage caused.
    pub fn each(self, mut take: impl FnMut(SavedState)) -> Result<(), CheckpointError> {
        let threads = if self.parallel {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, self.at.len().max(1))
        } else {
            1
        };
        let this = &self;
        std::thread::scope(|scope| {
            let mut checksum =
                (this.parallel && !this.checked).then(|| scope.spawn(|| this.summed()));
            // The checksum's answer, waited for once (a small state's was
            // known before its head was read, as is one checked already).
            let mut verify = || -> Result<(), CheckpointError> {
                let Some(summing) = checksum.take() else {
                    return Ok(());
                };
                let digest = summing
                    .join()
                    .map_err(|_| this.corrupt("the checksum failed".into()))?
                    .map_err(|e| this.unreadable(e))?;
                if digest != this.sum {
                    return Err(this.corrupt("checksum mismatch".into()));
                }
                Ok(())
            };
            let decoded = if threads == 1 {
                let mut bytes = Vec::new();
                this.at.iter().enumerate().try_for_each(|(i, &at)| {
                    let part = this.decode(i, at, &mut bytes);
                    verify()?;
                    take(part?);
                    Ok(())
                })
            } else {
                // Part i is thread i % threads's: taken from its channel in
                // turn, the parts come in order.
                let mut rxs = Vec::with_capacity(threads);
                let mut decoders = Vec::with_capacity(threads);
                for t in 0..threads {
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    rxs.push(rx);
                    decoders.push(scope.spawn(move || {
                        let mut bytes = Vec::new();
                        for (i, &at) in this.at.iter().enumerate().skip(t).step_by(threads) {
                            let part = this.decode(i, at, &mut bytes);
                            let failed = part.is_err();
                            if tx.send(part).is_err() || failed {
                                break;
                            }
                        }
                    }));
                }
                let taken = (0..this.at.len()).try_for_each(|i| {
                    let part = rxs
                        .get(i % threads)
                        .and_then(|rx| rx.recv().ok())
                        .ok_or_else(|| this.corrupt("a part's decoder failed".into()));
                    verify()?;
                    take(part??);
                    Ok(())
                });
                // A decoder waiting to hand on a part is let go.
                drop(rxs);
                // Every decoder joined here, so a panic is this error, not
                // the scope's.
                let mut joined = true;
                for d in decoders {
                    joined &= d.join().is_ok();
                }
                taken.and_then(|()| {
                    joined
                        .then_some(())
                        .ok_or_else(|| this.corrupt("a part's decoder failed".into()))
                })
            };
            verify()?;
            decoded
        })
    }
}

/// Read the checkpoint in `dir`; `None` if there is none yet.
pub fn load(dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let path = dir.join(FILE_NAME);
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Read { path, source }),
    };
    read_from(path.clone(), size, &path).map(Some)
}

/// Open the checkpoint in `dir` (its head read, its parts found, see
/// [`Parts::each`]); `None` if there is none yet.
pub fn open_in(dir: &Path) -> Result<Option<Opened<PathBuf>>, CheckpointError> {
    let path = dir.join(FILE_NAME);
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Read { path, source }),
    };
    open(path.clone(), size, &path, PARALLEL_FROM).map(Some)
}

/// Replace the checkpoint in `dir`, atomically and durably; returns its
/// size.
pub fn store(dir: &Path, head: &Head, shards: &[ShardBytes]) -> Result<usize, CheckpointError> {
    let path = dir.join(FILE_NAME);
    let failed = |source| CheckpointError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    let file = atomic_write_file::AtomicWriteFile::open(&path).map_err(failed)?;
    let mut buffered = std::io::BufWriter::with_capacity(1 << 20, file);
    let n = write_to(&mut buffered, head, shards).map_err(|e| match e {
        CheckpointError::Write { source, .. } => failed(source),
        other => other,
    })?;
    let file = buffered.into_inner().map_err(|e| failed(e.into_error()))?;
    file.commit().map_err(failed)?;
    Ok(n)
}

/// Move a checkpoint that will not be used aside (for `--reset-state`),
/// keeping it for a post-mortem rather than deleting it.
pub fn set_aside(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let path = dir.join(FILE_NAME);
    if !path.exists() {
        return Ok(None);
    }
    let aside = dir.join(format!("{FILE_NAME}.reset"));
    std::fs::rename(&path, &aside).map_err(|source| CheckpointError::Write {
        path: aside.clone(),
        source,
    })?;
    Ok(Some(aside))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Body, EventStream, Record};
    use crate::flux::Event;
    use crate::flux::jobid::JobId;
    use crate::keyed::state::State;
    use proptest::prelude::*;

    /// An engine with no conditions, for states without alerts.
    static NO_ALERTS: std::sync::LazyLock<crate::keyed::alerts::engine::Engine> =
        std::sync::LazyLock::new(Default::default);

    fn state_with(n: u64) -> State {
        let mut st = State::new();
        for id in 1..=n {
            let ev = Event::new(100.0 + id as f64, "submit").with_context(
                serde_json::json!({"userid": 5, "urgency": 16, "flags": 0, "version": 1}),
            );
            st.apply(
                "c",
                Record {
                    cluster: None,
                    id: Some(JobId(id)),
                    stream: EventStream::Job,
                    body: Body::Event(ev),
                },
            );
        }
        st
    }

    static NO_CLOCK: std::sync::LazyLock<EventClock> = std::sync::LazyLock::new(Default::default);
    static NO_OWNERS: std::sync::LazyLock<HashMap<String, Owner>> =
        std::sync::LazyLock::new(Default::default);
    static NO_FINISHED: std::sync::LazyLock<FinishedJobs> =
        std::sync::LazyLock::new(Default::default);

    /// A state without alerts, clock or owners, for encoding.
    fn saved(st: &State) -> ShardStateRef<'_> {
        ShardStateRef {
            jobs: &st.jobs,
            resources: &st.resources,
            alerts: &NO_ALERTS,
            clock: &NO_CLOCK,
            resource_owners: &NO_OWNERS,
            finished: &NO_FINISHED,
        }
    }

    fn shard_bytes(st: &State) -> ShardBytes {
        saved(st).encode(1).unwrap()
    }

    fn encoded(st: &State, head: &Head) -> Vec<u8> {
        encode(head, &[shard_bytes(st)]).unwrap()
    }

    #[test]
    fn a_checkpoint_round_trips_and_splits_by_key() {
        let st = state_with(50);
        let head = Head {
            seq: 7,
            written_at: 1.5,
            sources: [("files".to_string(), "{\"a\":1}".to_string())].into(),
            sinks: [("out".to_string(), "{\"offset\":3}".to_string())].into(),
            identities: [(
                "files".to_string(),
                "file include [\"*.jsonl\"]".to_string(),
            )]
            .into(),
            watch: vec![crate::keyed::alerts::watch::SavedWatchAlert {
                rule: "feed_silent".into(),
                cluster: "picl".into(),
                source: Some("files".into()),
                since: 1.7e9,
            }],
        };
        let bytes = encoded(&st, &head);
        let back = decode(&bytes, Path::new("x")).unwrap();
        assert_eq!(back.head, head);
        let (_, shards) = back.split(3, |_, id| id.unwrap_or(0) as usize % 3);
        assert_eq!(shards.iter().map(|s| s.jobs.len()).sum::<usize>(), 50);
        for (i, s) in shards.iter().enumerate() {
            for (k, e) in &s.jobs {
                assert_eq!(k.id.0 as usize % 3, i);
                assert_eq!(e.job, st.jobs[k].job);
            }
        }
    }

    #[test]
    fn shards_saved_by_as_many_workers_come_back_whole_with_every_clock() {
        let st = state_with(10);
        let saved = || {
            let mut saved = Vec::new();
            for i in 0..2u64 {
                let mut part = SavedState::default();
                for (k, e) in st.jobs.iter() {
                    if k.id.0 % 2 == i {
                        part.jobs.push((k.to_key(), Box::new(e.clone())));
                    }
                }
                part.clock.advance(&format!("c{i}"), 10.0 + i as f64);
                saved.push(part);
            }
            saved
        };
        let pick = |_: &str, id: Option<u64>| id.unwrap_or(0) as usize % 2;
        let ck = Checkpoint {
            head: Head::default(),
            parts: saved(),
        };
        let (_, out) = ck.split(2, pick);
        for (i, s) in out.iter().enumerate() {
            assert_eq!(s.jobs.len(), 5);
            assert!(s.jobs.iter().all(|(k, _)| k.id.0 as usize % 2 == i));
            assert_eq!(s.clock.now("c0"), Some(10.0));
            assert_eq!(s.clock.now("c1"), Some(11.0));
        }
        // Part by part, as a restore deals them: each part whole to the
        // shard that owns it, its clock to every shard.
        let mut out: Vec<SavedState> = vec![SavedState::default(), SavedState::default()];
        for (p, part) in saved().into_iter().enumerate() {
            let shares = part.deal(2, pick);
            assert_eq!(shares[p].jobs.len(), 5, "part {p} whole to shard {p}");
            assert!(shares[1 - p].jobs.is_empty());
            for (to, share) in out.iter_mut().zip(shares) {
                for (c, t) in share.clock.clusters() {
                    to.clock.advance(c, t);
                }
                to.append(share);
            }
        }
        for (i, s) in out.iter().enumerate() {
            assert!(s.jobs.iter().all(|(k, _)| k.id.0 as usize % 2 == i));
            assert_eq!(s.clock.now("c0"), Some(10.0));
            assert_eq!(s.clock.now("c1"), Some(11.0));
        }
    }

    #[test]
    fn every_damaged_file_is_an_error_never_an_empty_state() {
        let bytes = encoded(&state_with(5), &Head::default());
        let p = Path::new("ck");
        assert!(matches!(
            decode(b"hello", p),
            Err(CheckpointError::NotACheckpoint { .. })
        ));
        let mut other = bytes.clone();
        other[MAGIC.len()] = VERSION as u8 + 1;
        assert!(matches!(
            decode(&other, p),
            Err(CheckpointError::Version { .. })
        ));
        // A flipped bit in the version: damage, not a newer fluxpipe.
        for flip in [0x80u8, 0] {
            let mut damaged = bytes.clone();
            damaged[MAGIC.len()] ^= flip;
            if flip == 0 {
                damaged[MAGIC.len()] = 0;
            }
            assert!(
                matches!(decode(&damaged, p), Err(CheckpointError::Corrupt { .. })),
                "flip {flip:#x}"
            );
        }
        let mut damaged = bytes.clone();
        damaged[MAGIC.len() + 3] ^= 0x01;
        assert!(matches!(
            decode(&damaged, p),
            Err(CheckpointError::Corrupt { .. })
        ));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1], p),
            Err(CheckpointError::Corrupt { .. })
        ));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 1;
        assert!(matches!(
            decode(&flipped, p),
            Err(CheckpointError::Corrupt { .. })
        ));
    }

    #[test]
    fn store_replaces_and_load_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        for seq in 1..=3 {
            let head = Head {
                seq,
                ..Head::default()
            };
            store(dir.path(), &head, &[shard_bytes(&state_with(seq))]).unwrap();
        }
        let back = load(dir.path()).unwrap().unwrap();
        assert_eq!(back.head.seq, 3);
        assert_eq!(back.parts[0].jobs.len(), 3);
        // Only the one file: nothing accumulates.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_spilled_state_makes_the_same_file_and_leaves_no_scratch_behind() {
        let dir = tempfile::tempdir().unwrap();
        let st = state_with(20);
        let head = Head {
            seq: 2,
            ..Head::default()
        };
        let saved = saved(&st);
        let spill = saved.spill(1, spill_path(dir.path(), 0, 1)).unwrap();
        let ShardBytes::Spilled(files) = &spill else {
            panic!("spilled");
        };
        let scratch: PathBuf = files.paths().next().unwrap().into();
        assert!(scratch.exists());
        let three = state_with(3);
        let other = || shard_bytes(&three);
        let parts = [spill, other()];
        store(dir.path(), &head, &parts).unwrap();
        let in_memory = encode(&head, &[shard_bytes(&st), other()]).unwrap();
        let on_disk = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        assert!(on_disk == in_memory, "the same bytes either way");
        drop(parts);
        assert!(!scratch.exists(), "the scratch file goes with its Spill");
        let back = load(dir.path()).unwrap().unwrap();
        assert_eq!(back.parts.len(), 2);
        assert_eq!(back.parts[0].jobs.len(), 20);
    }

    #[test]
    fn scratch_files_of_a_killed_process_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(spill_path(dir.path(), 1, 9), b"half").unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"kept").unwrap();
        assert_eq!(remove_spills(dir.path()), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_scratch_file_changed_under_the_writer_fails_the_round() {
        let dir = tempfile::tempdir().unwrap();
        let st = state_with(5);
        let spill = saved(&st).spill(1, spill_path(dir.path(), 0, 1)).unwrap();
        let ShardBytes::Spilled(files) = &spill else {
            panic!("spilled");
        };
        std::fs::write(files.paths().next().unwrap(), b"short").unwrap();
        assert!(store(dir.path(), &Head::default(), &[spill]).is_err());
        assert!(
            load(dir.path()).unwrap().is_none(),
            "no checkpoint replaced"
        );
    }

    #[test]
    fn a_state_encoded_on_several_threads_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let n = 3 * MIN_PART_JOBS as u64 + 7;
        let st = state_with(n);
        let saved = saved(&st);
        let ids = |c: &Checkpoint| {
            let mut ids: Vec<u64> = c
                .parts
                .iter()
                .flat_map(|p| p.jobs.iter().map(|(k, _)| k.id.0))
                .collect();
            ids.sort_unstable();
            ids
        };
        let head = Head::default();
        let alone = saved.encode(1).unwrap();
        let in_memory = saved.encode(3).unwrap();
        let spilled = saved.spill(3, spill_path(dir.path(), 0, 1)).unwrap();
        let ShardBytes::Spilled(files) = &spilled else {
            panic!("spilled");
        };
        let scratch: Vec<PathBuf> = files.paths().map(PathBuf::from).collect();
        assert_eq!(scratch.len(), 3, "a file per thread");
        let p = Path::new("p");
        let back = |parts: &[ShardBytes]| {
            let bytes = encode(&head, parts).unwrap();
            read(&bytes[..], bytes.len() as u64, p, u64::MAX).unwrap()
        };
        let (alone, threads) = (back(&[alone]), back(&[in_memory]));
        assert_eq!(alone.parts.len(), 1);
        assert_eq!(threads.parts.len(), 3, "a part per thread");
        assert_eq!(ids(&alone), (1..=n).collect::<Vec<_>>());
        assert_eq!(ids(&threads), ids(&alone));
        store(dir.path(), &head, &[spilled]).unwrap();
        assert!(scratch.iter().all(|f| !f.exists()), "scratch files removed");
        let stored = load(dir.path()).unwrap().unwrap();
        assert_eq!(stored.parts.len(), 3);
        assert_eq!(ids(&stored), ids(&alone));
    }

    #[test]
    fn threads_or_not_the_same_shards_come_back() {
        let (a, b, c) = (state_with(40), state_with(3), State::new());
        let head = Head::default();
        let parts = [shard_bytes(&a), shard_bytes(&b), shard_bytes(&c)];
        let bytes = encode(&head, &parts).unwrap();
        let p = Path::new("p");
        let jobs = |c: &Checkpoint| c.parts.iter().map(|s| s.jobs.len()).collect::<Vec<_>>();
        let on_threads = read(&bytes[..], bytes.len() as u64, p, 0).unwrap();
        let here = read(&bytes[..], bytes.len() as u64, p, u64::MAX).unwrap();
        assert_eq!(jobs(&on_threads), vec![40, 3, 0]);
        assert_eq!(jobs(&on_threads), jobs(&here));
        // A damaged byte anywhere is a checksum mismatch either way.
        let mut flipped = bytes.clone();
        let i = flipped.len() - 5;
        flipped[i] ^= 0x40;
        for from in [0, u64::MAX] {
            assert!(matches!(
                read(&flipped[..], flipped.len() as u64, p, from),
                Err(CheckpointError::Corrupt { why, .. }) if why == "checksum mismatch"
            ));
        }
        // No part is handed on before the checksum has matched.
        let opened = open(&flipped[..], flipped.len() as u64, p, 0).unwrap();
        let mut taken = 0;
        assert!(matches!(
            opened.parts.each(|_| taken += 1),
            Err(CheckpointError::Corrupt { why, .. }) if why == "checksum mismatch"
        ));
        assert_eq!(taken, 0, "nothing taken from a damaged file");
        // In the head too, read before the checksum is known on threads:
        // a head that cannot be decoded is said as damage, by `open`.
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN] ^= 0x40;
        for from in [0, u64::MAX] {
            assert!(matches!(
                open(&flipped[..], flipped.len() as u64, p, from),
                Err(CheckpointError::Corrupt { why, .. }) if why == "checksum mismatch"
            ));
        }
    }

    #[test]
    fn trailing_bytes_inside_a_shard_still_count_in_the_checksum() {
        let ShardBytes::Memory(mut parts) = shard_bytes(&state_with(2)) else {
            panic!("in memory");
        };
        parts[0].extend_from_slice(b"xx");
        let bytes = encode(&Head::default(), &[ShardBytes::Memory(parts)]).unwrap();
        assert_eq!(
            decode(&bytes, Path::new("p")).unwrap().parts[0].jobs.len(),
            2
        );
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            decode(&flipped, Path::new("p")),
            Err(CheckpointError::Corrupt { .. })
        ));
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&VERSION.to_le_bytes());
            bytes.extend_from_slice(&tail);
            let _ = decode(&bytes, Path::new("p"));
            let _ = decode(&tail, Path::new("p"));
        }

        #[test]
        fn a_valid_checksum_over_garbage_never_panics(tail in proptest::collection::vec(any::<u8>(), 1..256)) {
            // Garbage may decode to a head by chance, but never panics.
            let _ = decode(&frame(&tail), Path::new("p"));
        }
    }

    #[test]
    fn a_checkpoint_belongs_to_a_pipeline_reading_the_same() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let saved = m(&[("files", "file a"), ("k", "kafka t")]);
        // Older checkpoints name nothing: not checked.
        assert_eq!(mismatch(&BTreeMap::new(), &m(&[("x", "stdin")])), None);
        assert_eq!(mismatch(&saved, &saved), None);
        // A source added, or one removed beside one that matches.
        assert_eq!(
            mismatch(&saved, &m(&[("files", "file a"), ("s", "stdin")])),
            None
        );
        assert_eq!(mismatch(&saved, &m(&[("k", "kafka t")])), None);
        // A source that reads something else under its old name.
        let why = mismatch(&saved, &m(&[("files", "file b"), ("k", "kafka t")])).unwrap();
        assert!(
            why.contains("source files read file a, now file b"),
            "{why}"
        );
        // Another pipeline altogether.
        let why = mismatch(&saved, &m(&[("stdin", "stdin")])).unwrap();
        assert!(
            why.contains("files (file a), k (kafka t)") && why.contains("stdin (stdin)"),
            "{why}"
        );
        assert!(mismatch(&saved, &BTreeMap::new()).unwrap().contains("none"));
    }
}
