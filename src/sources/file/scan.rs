//! The blocking half of the `file` source: walking the folders, matching
//! the patterns, and stat-ing and fingerprinting what matched.

use super::*;

/// Device and inode.
pub(super) type FileId = (u64, u64);

/// What a stat says, enough to tell that a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stat {
    pub(super) id: FileId,
    pub(super) len: u64,
    pub(super) mtime: (i64, i64),
    pub(super) ctime: (i64, i64),
}

impl Stat {
    pub(super) fn of(m: &std::fs::Metadata) -> Self {
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
pub(super) struct Found {
    pub(super) path: PathBuf,
    pub(super) stat: Stat,
    pub(super) kind: FoundKind,
}

#[derive(Debug)]
pub(super) enum FoundKind {
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
pub(super) struct Scanner {
    pub(super) roots: Vec<PathBuf>,
    pub(super) include: GlobSet,
    pub(super) exclude: GlobSet,
    /// Patterns without wildcards: the user named these files.
    pub(super) literal: HashSet<PathBuf>,
    /// `stream` is configured: files whose path says nothing are read too.
    pub(super) read_other: bool,
    pub(super) max_doc: usize,
    /// Last stat and fingerprint of every path, so an unchanged file is not
    /// opened again.
    pub(super) cache: HashMap<PathBuf, (Stat, Option<u64>)>,
    /// Paths already warned about (one warning each, not one per walk).
    pub(super) warned: HashSet<PathBuf>,
    /// The source's name, for the report of skipped files.
    pub(super) source: Arc<str>,
    /// The matched files skipped have been reported (by the first walk).
    pub(super) reported: bool,
    /// The `include` patterns, for the warning when they match nothing.
    pub(super) patterns: Vec<String>,
    /// When that warning was last given (again every [`NOTHING_AGAIN`]
    /// while nothing matches).
    pub(super) nothing_warned: Option<std::time::Instant>,
}

/// How often "matches no file" is said again while it stays true.
pub(super) const NOTHING_AGAIN: Duration = Duration::from_secs(600);

pub(super) fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '[', '{'])
}

/// The fixed folder (or file) in front of a pattern's first wildcard.
pub(super) fn base_of(pattern: &str) -> PathBuf {
    Path::new(pattern)
        .components()
        .take_while(|c| !has_wildcard(&c.as_os_str().to_string_lossy()))
        .collect()
}

/// How many files the `include` patterns match now (`fluxpipe validate`).
pub fn files_matching(config: &FileSourceConfig) -> Result<usize> {
    Ok(Scanner::new(config, true, 0)?.walk().len())
}

pub(super) fn glob_set(patterns: &[String]) -> Result<GlobSet> {
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
    pub(super) fn new(config: &FileSourceConfig, read_other: bool, max_doc: usize) -> Result<Self> {
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

    pub(super) fn warn_once(&mut self, path: &Path, what: &str, e: &dyn std::fmt::Display) {
        if self.warned.len() > 10_000 {
            self.warned.clear();
        }
        if self.warned.insert(path.to_path_buf()) {
            tracing::warn!(path = %path.display(), "{what}: {e}");
        }
    }

    /// Every matching path, sorted.
    pub(super) fn walk(&mut self) -> BTreeSet<PathBuf> {
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
    pub(super) fn check(&mut self, known: Vec<(u64, PathBuf)>) -> Vec<(u64, Stat)> {
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
    pub(super) fn scan(&mut self) -> Vec<Found> {
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
    pub(super) fn say_if_nothing(&mut self, nothing: bool) {
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
pub(super) struct Skipped {
    /// Compressed rotated files: (how many, the first few).
    pub(super) compressed: (usize, Vec<PathBuf>),
    /// Not an eventlog, a journal or an R document.
    pub(super) other: (usize, Vec<PathBuf>),
}

impl Skipped {
    /// Paths named in the report, per reason.
    const EXAMPLES: usize = 5;

    pub(super) fn add(&mut self, path: PathBuf) {
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

    pub(super) fn report(&self, source: &str) {
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
