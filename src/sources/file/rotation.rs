//! Feeds and rotation: the files of one folder whose names differ only by
//! a rotation suffix are one feed, written in turn by one writer
//! (`journal.jsonl.2`, `.1`, then the live `journal.jsonl`), read oldest
//! first. Pure naming: the file source and `fluxpipe replay` order their
//! files by it.

use crate::decode::{self, PathKind};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::path::{Path, PathBuf};

/// Paths in the order their feeds are read: feed by feed (by the live
/// file's path, so a folder's files keep their sorted order), each feed's
/// files oldest first.
pub fn in_read_order(paths: &mut [PathBuf]) {
    paths.sort_by_cached_key(|p| feed_of(p));
}

/// Where rotation put a file among the files of its feed; the order is
/// oldest first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rotation {
    /// `NAME.N`, logrotate's default: `.2` is older than `.1`. When a feed
    /// also has dated files, the numbered ones are taken as the older
    /// (left from before `dateext` was turned on).
    Numbered(Reverse<u64>),
    /// `NAME-20261124` (`dateext`), `NAME-2026-11-24`, `NAME-1700000000`,
    /// `NAME.20261124`: a date or time, its groups of digits compared as
    /// numbers, older first.
    Dated(Vec<u64>),
    /// No rotation suffix: the file written now.
    Live,
}

/// Most digits of a numbered suffix (`.1` to `.999999`); longer runs of
/// digits are dates or times.
const MAX_NUMBER_DIGITS: usize = 6;

/// Fewest digits of a dated suffix (`%Y%m%d`).
const MIN_DATE_DIGITS: usize = 8;

/// Extensions of compressed files, which are not read.
const COMPRESSED: [&str; 6] = ["gz", "bz2", "xz", "zst", "lz4", "zip"];

/// A file name split into its feed's name (the live file's) and where
/// rotation put it: `journal.jsonl.2` is (`journal.jsonl`, `.2`). With
/// logrotate's `extension .jsonl` the suffix comes before the extension:
/// `journal.2.jsonl` and `journal-20261124.jsonl` are of `journal.jsonl`.
pub(crate) fn rotation_of(name: &str) -> (Cow<'_, str>, Rotation) {
    if let Some(stem) = name.strip_suffix(LINES_EXTENSION) {
        let (base, rotation) = suffix_rotation(stem);
        if rotation != Rotation::Live {
            return (Cow::Owned(format!("{base}{LINES_EXTENSION}")), rotation);
        }
    }
    let (base, rotation) = suffix_rotation(name);
    (Cow::Borrowed(base), rotation)
}

/// The extension of journal captures, which rotation may keep last.
const LINES_EXTENSION: &str = ".jsonl";

/// A name split at a rotation suffix at its end.
fn suffix_rotation(name: &str) -> (&str, Rotation) {
    if let Some((base, digits)) = name.rsplit_once('.')
        && !base.is_empty()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        // Longer than u64: no rotation made it.
        && let Ok(n) = digits.parse::<u64>()
    {
        if digits.len() <= MAX_NUMBER_DIGITS {
            return (base, Rotation::Numbered(Reverse(n)));
        }
        if digits.len() >= MIN_DATE_DIGITS {
            return (base, Rotation::Dated(vec![n]));
        }
    }
    // A date after `-` or `_`: the leftmost start that makes one takes all
    // of it (`-2026-11-24`, not `-24`).
    for (i, c) in name.char_indices().skip(1) {
        if matches!(c, '-' | '_')
            && let Some(groups) = date_groups(&name[i + 1..])
        {
            return (&name[..i], Rotation::Dated(groups));
        }
    }
    (name, Rotation::Live)
}

/// `s` as groups of digits joined by `-` or `_`, with at least
/// [`MIN_DATE_DIGITS`] digits in all.
fn date_groups(s: &str) -> Option<Vec<u64>> {
    let mut digits = 0;
    let groups = s
        .split(['-', '_'])
        .map(|g| {
            digits += g.len();
            let number = !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit());
            number.then(|| g.parse::<u64>().ok()).flatten()
        })
        .collect::<Option<Vec<u64>>>()?;
    (digits >= MIN_DATE_DIGITS).then_some(groups)
}

/// The feed of a path (the path of its live file) and where rotation put
/// it. A name that is not UTF-8 is a feed of its own.
pub(crate) fn feed_of(path: &Path) -> (PathBuf, Rotation) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return (path.to_path_buf(), Rotation::Live);
    };
    let (live, rotation) = rotation_of(name);
    (path.with_file_name(&*live), rotation)
}

/// [`decode::classify_path`], with a rotated name read as its live name:
/// `journal.jsonl.1` is a journal, `job.X.eventlog-20261124` an eventlog.
/// (R documents are not rotated.)
pub(crate) fn classify(path: &Path) -> PathKind {
    let kind = decode::classify_path(path);
    if !matches!(kind, PathKind::Other) {
        return kind;
    }
    let (live, rotation) = feed_of(path);
    if rotation == Rotation::Live {
        return kind;
    }
    match decode::classify_path(&live) {
        k @ (PathKind::Eventlog(_) | PathKind::Lines) => k,
        _ => PathKind::Other,
    }
}

/// A compressed copy of a file that would be read: `journal.jsonl.2.gz`.
pub(crate) fn is_compressed_log(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| COMPRESSED.contains(&e))
        && matches!(
            classify(&path.with_extension("")),
            PathKind::Eventlog(_) | PathKind::Lines
        )
}
