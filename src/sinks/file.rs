//! `type = "file"`: JSON Lines appended to a file. SIGHUP reopens the file,
//! so logrotate can move it away.
//!
//! Exactly once across crashes ([`super::offsets`]): at start a torn last
//! line (a crash mid-write) is cut off, and the lines past the offset the
//! restored checkpoint saved are read; records with their `record_id`s
//! are not written again when the replay after the checkpoint brings them.
//! A file replaced since the checkpoint (rotated) cannot be checked: what
//! came after the checkpoint may then repeat in the new file.

use super::SinkRx;
use super::lines::{FILE_LINGER, Lines, Next};
use super::offsets::{self, Saved, SinkOffsets};
use crate::pipeline::config::FileSinkConfig;
use anyhow::Context;
use std::collections::HashSet;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use tokio::fs::{File, OpenOptions};
use tokio::io::BufWriter;
use tokio::signal::unix::{SignalKind, signal};

/// Bytes read at a time when looking back for the last newline.
const TAIL_BLOCK: u64 = 64 * 1024;

async fn open(path: &Path) -> anyhow::Result<File> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        tokio::fs::create_dir_all(parent)
            .await
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    Ok(file)
}

/// What was found in the file at start.
struct Resumed {
    dev: u64,
    ino: u64,
    /// Its length once a torn last line is cut off.
    len: u64,
    torn: u64,
    /// `record_id`s of the lines past the checkpoint's offset.
    written: HashSet<Box<[u8]>>,
    /// Whether the file is the one the checkpoint saw.
    same_file: bool,
}

/// Cut a torn last line off, and read the ids of the lines written after
/// the checkpoint `saved` (blocking I/O).
fn resume(path: &Path, saved: Option<Saved>) -> std::io::Result<Resumed> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let meta = file.metadata()?;
    let len = meta.len();
    let whole = last_newline_end(&mut file, len)?;
    if whole < len {
        file.set_len(whole)?;
        file.sync_data()?;
    }
    let mut out = Resumed {
        dev: meta.dev(),
        ino: meta.ino(),
        len: whole,
        torn: len - whole,
        written: HashSet::new(),
        same_file: false,
    };
    let Some(saved) = saved else {
        return Ok(out);
    };
    out.same_file = saved.dev == out.dev && saved.ino == out.ino && saved.offset <= whole;
    if !out.same_file {
        return Ok(out);
    }
    file.seek(SeekFrom::Start(saved.offset))?;
    let mut reader = std::io::BufReader::new(file.take(whole - saved.offset));
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        if let Some(id) = offsets::record_id(&line) {
            out.written.insert(id.into());
        }
    }
    Ok(out)
}

/// The length of the file up to and including its last newline (0 if it
/// has none).
fn last_newline_end(file: &mut std::fs::File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut block = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(TAIL_BLOCK);
        block.resize((end - start) as usize, 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block)?;
        if let Some(i) = memchr::memrchr(b'\n', &block) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

async fn resume_blocking(path: PathBuf, saved: Option<Saved>) -> anyhow::Result<Resumed> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || resume(&path, saved))
        .await
        .context("the file sink's start task failed")?
        .with_context(|| format!("cannot read back {shown}"))
}

pub async fn run(
    name: &str,
    config: FileSinkConfig,
    mut rx: SinkRx,
    offsets: &SinkOffsets,
) -> anyhow::Result<()> {
    let path = config.path;
    let file = open(&path).await?;
    let saved = offsets.restored_for(name);
    let resumed = resume_blocking(path.clone(), saved).await?;
    if resumed.torn > 0 {
        tracing::warn!(sink = name, path = %path.display(), bytes = resumed.torn, "cut off a torn last line (a crash mid-write)");
    }
    if saved.is_some() && !resumed.same_file {
        tracing::warn!(sink = name, path = %path.display(), "the file is not the one the checkpoint saw (rotated?): records since the checkpoint may repeat");
    }
    let mark = offsets.register(name);
    mark.reset(resumed.dev, resumed.ino, resumed.len);
    let skip = resumed.written;
    let mut lines = Lines::new(file, FILE_LINGER).exactly_once(mark.clone(), skip);
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    loop {
        tokio::select! {
            next = lines.next(&mut rx) => match next {
                // A record counts as delivered once flushed to the file.
                Next::Records => lines.write(&rx).await?,
                Next::Flush => lines.flush(&rx).await?,
                Next::Closed => break,
            },
            _ = hup.recv() => {
                lines.flush(&rx).await?;
                let file = open(&path).await?;
                let meta = file.metadata().await.with_context(|| format!("cannot read {}", path.display()))?;
                mark.reset(meta.dev(), meta.ino(), meta.len());
                lines.out = BufWriter::new(file);
                tracing::info!(sink = name, path = %path.display(), "reopened on SIGHUP");
            }
        }
    }
    lines.flush(&rx).await?;
    lines.out.get_mut().sync_data().await.ok();
    if lines.skipped() > 0 {
        tracing::info!(
            sink = name,
            skipped = lines.skipped(),
            "records already written before the restart were not written again"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_torn_last_line_is_cut_and_lines_past_the_offset_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let before = "{\"record_id\":\"aaaa\"}\n";
        let after = "{\"record_id\":\"bbbb\"}\n{\"kind\":\"no id\"}\n{\"record_id\":\"cccc\"}\n";
        let mut f = std::fs::File::create(&path).unwrap();
        write!(f, "{before}{after}{{\"record_id\":\"dd").unwrap();
        drop(f);
        let meta = std::fs::metadata(&path).unwrap();
        let saved = Saved {
            dev: meta.dev(),
            ino: meta.ino(),
            offset: before.len() as u64,
        };
        let r = resume(&path, Some(saved)).unwrap();
        assert_eq!(r.torn, 16);
        assert_eq!(r.len, (before.len() + after.len()) as u64);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{before}{after}")
        );
        let mut ids: Vec<&[u8]> = r.written.iter().map(|b| &**b).collect();
        ids.sort();
        assert_eq!(ids, [&b"bbbb"[..], b"cccc"]);
        assert!(r.same_file);
        // Another file (rotated): nothing is skipped.
        let other = Saved {
            ino: saved.ino + 1,
            ..saved
        };
        let r = resume(&path, Some(other)).unwrap();
        assert!(!r.same_file && r.written.is_empty());
    }

    #[test]
    fn a_file_without_a_newline_is_cut_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "x".repeat(200_000)).unwrap();
        let r = resume(&path, None).unwrap();
        assert_eq!((r.len, r.torn), (0, 200_000));
    }
}
