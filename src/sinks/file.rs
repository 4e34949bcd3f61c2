//! `type = "file"`: JSON Lines appended to a file. SIGHUP reopens the file,
//! so logrotate can move it away.

use super::SinkRx;
use super::stdout::FLUSH_EVERY;
use crate::pipeline::config::FileSinkConfig;
use anyhow::Context;
use std::path::Path;
use std::time::Instant;
use tokio::fs::{File, OpenOptions};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::signal::unix::{SignalKind, signal};

async fn open(path: &Path) -> anyhow::Result<BufWriter<File>> {
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
    Ok(BufWriter::new(file))
}

pub async fn run(name: &str, config: FileSinkConfig, mut rx: SinkRx) -> anyhow::Result<()> {
    let path = config.path;
    let mut out = open(&path).await?;
    let mut unflushed = 0u64;
    let mut flushed_at = Instant::now();
    let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    loop {
        tokio::select! {
            rec = rx.recv() => {
                let Some(rec) = rec else { break };
                out.write_all(rec.line.as_bytes()).await?;
                out.write_all(b"\n").await?;
                unflushed += 1;
                // A record counts as delivered once it is in the file.
                if rx.is_empty() || flushed_at.elapsed() >= FLUSH_EVERY {
                    out.flush().await?;
                    rx.delivered(std::mem::take(&mut unflushed));
                    flushed_at = Instant::now();
                }
            }
            _ = hup.recv() => {
                out.flush().await?;
                rx.delivered(std::mem::take(&mut unflushed));
                out = open(&path).await?;
                tracing::info!(sink = name, path = %path.display(), "reopened on SIGHUP");
            }
        }
    }
    out.flush().await?;
    rx.delivered(unflushed);
    out.get_mut().sync_data().await.ok();
    Ok(())
}
