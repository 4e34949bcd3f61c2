//! `type = "file"`: JSON Lines appended to a file. SIGHUP reopens the file,
//! so logrotate can move it away.
//!
//! Exactly once across crashes ([`crate::checkpoint::offsets`]): at start the file is
//! cut back to the offset the restored checkpoint saved (what lies beyond
//! is the output of records after it, which come again); without one, only
//! a torn last line (a crash mid-write) is cut off. A file replaced since
//! the checkpoint (rotated) is left alone: what came after the checkpoint
//! may then repeat in the new file.
//!
//! A write that fails (a full disk, a quota) does not end the sink: the
//! error is counted and logged at once, the file is cut back to its last
//! flush (no torn line is left), and the records since are written again,
//! with backoff, until it works; records wait in the sink's buffer
//! meanwhile. Once the pipeline shuts down, [`SHUTDOWN_GRACE`] bounds the
//! tries; what is still not written is given up (the next run writes it).

use super::lines::{FILE_LINGER, Lines, Next};
use super::retry::{Retry, SHUTDOWN_GRACE};
use super::{SinkContext, SinkRx};
use crate::checkpoint::offsets::SinkOffset;
use crate::component::Problem;
use crate::telemetry::metric;
use anyhow::Context;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::fs::{File, OpenOptions};
use tokio::signal::unix::{SignalKind, signal};

crate::sinks::config::sink_config! {
    /// `type = "file"`: JSON Lines appended to a file, reopened on SIGHUP.
    FileSinkConfig {
        path: PathBuf,
    }
}

impl super::SinkSpec for FileSinkConfig {
    /// The file must be creatable: the sink creates missing folders, so
    /// the nearest existing one must be a folder it can write in.
    fn problems(&self) -> Vec<Problem> {
        let path = &self.path;
        let mut existing = path.parent().unwrap_or(Path::new(""));
        while !existing.as_os_str().is_empty() && !existing.exists() {
            existing = existing.parent().unwrap_or(Path::new(""));
        }
        let shown = if existing.as_os_str().is_empty() {
            Path::new(".")
        } else {
            existing
        };
        let writable = shown
            .metadata()
            .map(|m| m.is_dir() && !m.permissions().readonly())
            .unwrap_or(false);
        if !writable {
            vec![Problem::new(
                "path",
                format!(
                    " `{}`: cannot be created in {}",
                    path.display(),
                    shown.display()
                ),
            )]
        } else if path.is_dir() {
            vec![Problem::new(
                "path",
                format!(" `{}`: is a folder", path.display()),
            )]
        } else {
            Vec::new()
        }
    }
}

/// Bytes read at a time when looking back for the last newline.
const TAIL_BLOCK: u64 = 64 * 1024;

/// The pause between tries to reopen the file after SIGHUP.
const REOPEN_RETRY: Duration = Duration::from_secs(5);

/// The file at `path` opened for appending (made if missing) and what it
/// is now.
async fn open_with_meta(path: &Path) -> anyhow::Result<(File, std::fs::Metadata)> {
    let file = open(path).await?;
    let meta = file
        .metadata()
        .await
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok((file, meta))
}

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
    /// Its length once cut back.
    len: u64,
    /// Bytes cut off.
    cut: u64,
    /// Whether the file is the one the checkpoint saw.
    same_file: bool,
}

/// Cut the file back to the checkpoint's offset, or else a torn last line
/// off (blocking I/O).
fn resume(path: &Path, saved: Option<SinkOffset>) -> std::io::Result<Resumed> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let meta = file.metadata()?;
    let len = meta.len();
    let same_file =
        saved.is_some_and(|s| s.dev == meta.dev() && s.ino == meta.ino() && s.offset <= len);
    let keep = match saved {
        Some(s) if same_file => s.offset,
        _ => last_newline_end(&mut file, len)?,
    };
    if keep < len {
        file.set_len(keep)?;
        file.sync_data()?;
    }
    Ok(Resumed {
        dev: meta.dev(),
        ino: meta.ino(),
        len: keep,
        cut: len - keep,
        same_file,
    })
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

async fn resume_blocking(path: PathBuf, saved: Option<SinkOffset>) -> anyhow::Result<Resumed> {
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
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    let offsets = &ctx.offsets;
    let path = config.path;
    let file = open(&path).await?;
    let saved = offsets.restored_for(name);
    let resumed = resume_blocking(path.clone(), saved).await?;
    if saved.is_some() && !resumed.same_file {
        tracing::warn!(sink = name, path = %path.display(), "the file is not the one the checkpoint saw (rotated, or cut short): left as it is; records since the checkpoint may repeat");
    }
    if resumed.cut > 0 {
        tracing::info!(sink = name, path = %path.display(), bytes = resumed.cut, "cut the file back to the checkpoint (what follows is written again)");
    }
    let mark = offsets.mark(name);
    mark.reset(resumed.dev, resumed.ino, resumed.len);
    let mut lines = Lines::new(file, FILE_LINGER).marked(mark.clone());
    // The file's length when `lines` began writing to it.
    let mut base = resumed.len;
    let mut retry = Retry::new(name, &ctx.shutdown, "the file can be written");
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    // A reopen that failed (the folder gone, no room for a new file) is
    // tried again at this time; meanwhile the open file is written on.
    let mut reopen_again: Option<tokio::time::Instant> = None;
    loop {
        let due = reopen_again;
        let reopen_now = async move {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let done = tokio::select! {
            next = lines.next(&mut rx) => match next {
                // A record counts as delivered once flushed to the file.
                Next::Records => lines.write(&rx).await.map(|()| false),
                Next::Flush => lines.flush(&rx).await.map(|()| false),
                Next::Closed => lines.flush(&rx).await.map(|()| true),
            },
            _ = hup.recv() => {
                reopen_again = Some(tokio::time::Instant::now());
                Ok(false)
            }
            _ = reopen_now => match lines.flush(&rx).await {
                Ok(()) => {
                    match open_with_meta(&path).await {
                        Ok((file, meta)) => {
                            mark.reset(meta.dev(), meta.ino(), meta.len());
                            base = meta.len();
                            lines.reopen(file);
                            reopen_again = None;
                            tracing::info!(sink = name, path = %path.display(), "reopened on SIGHUP");
                        }
                        Err(e) => {
                            metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => name.to_string()).increment(1);
                            tracing::error!(sink = name, path = %path.display(), "cannot reopen on SIGHUP: {e:#}; writing on to the file open before, trying again in {} s", REOPEN_RETRY.as_secs());
                            reopen_again = Some(tokio::time::Instant::now() + REOPEN_RETRY);
                        }
                    }
                    Ok(false)
                }
                Err(e) => Err(e),
            },
        };
        let closed = match done {
            Ok(closed) => closed,
            Err(e) => {
                let mut failed = e;
                // The file's length at the last flush, kept across tries
                // (each reopens `lines`).
                let good = base + lines.flushed_bytes();
                loop {
                    if !retry.failed("writing", &failed, &rx).await {
                        let left = rx.give_up_rest(lines.abandon()).await;
                        anyhow::bail!(
                            "cannot write {} ({failed}); {left} records not written, given up {} s after the stop",
                            path.display(),
                            SHUTDOWN_GRACE.as_secs()
                        );
                    }
                    match write_again(&path, good, &mut lines, &rx).await {
                        Ok(()) => {
                            base = good;
                            break;
                        }
                        Err(e) => failed = e,
                    }
                }
                retry.succeeded("writing");
                false
            }
        };
        if closed {
            break;
        }
    }
    lines.out.get_mut().sync_data().await.ok();
    Ok(())
}

/// After a failed write: cut the file back to `good` bytes (its length at
/// the last flush: no torn line stays), reopen it and write the records
/// since then again, then flush them.
async fn write_again(
    path: &Path,
    good: u64,
    lines: &mut Lines<File>,
    rx: &SinkRx,
) -> std::io::Result<()> {
    let file = OpenOptions::new().append(true).open(path).await?;
    if file.metadata().await?.len() > good {
        file.set_len(good).await?;
    }
    let cut_back = file.try_clone().await?;
    lines.reopen(file);
    let written = match lines.write_again().await {
        Ok(()) => lines.flush(rx).await,
        Err(e) => Err(e),
    };
    if written.is_err() {
        // Failed again: no torn line waits in the file for the next try.
        let _ = cut_back.set_len(good).await;
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_cut_back_to_the_checkpoint_or_a_torn_line_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let before = "{\"record_id\":\"aaaa\"}\n";
        let after = "{\"record_id\":\"bbbb\"}\n";
        std::fs::write(&path, format!("{before}{after}{{\"record_id\":\"dd")).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let saved = SinkOffset {
            dev: meta.dev(),
            ino: meta.ino(),
            offset: before.len() as u64,
        };
        // Another file (rotated): only the torn line goes.
        let other = SinkOffset {
            ino: saved.ino + 1,
            ..saved
        };
        let r = resume(&path, Some(other)).unwrap();
        assert!(!r.same_file);
        assert_eq!((r.len, r.cut), ((before.len() + after.len()) as u64, 16));
        // The checkpoint's file: back to its offset.
        let r = resume(&path, Some(saved)).unwrap();
        assert!(r.same_file);
        assert_eq!(r.len, before.len() as u64);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
        // An offset past the end (the file was cut short since): left alone.
        let past = SinkOffset {
            offset: 1000,
            ..saved
        };
        let r = resume(&path, Some(past)).unwrap();
        assert!(!r.same_file && r.cut == 0);
    }

    #[test]
    fn a_file_without_a_newline_is_cut_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "x".repeat(200_000)).unwrap();
        let r = resume(&path, None).unwrap();
        assert_eq!((r.len, r.cut), (0, 200_000));
    }
}
