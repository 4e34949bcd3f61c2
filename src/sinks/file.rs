//! `type = "file"`: JSON Lines appended to a file. SIGHUP reopens the file,
//! so logrotate can move it away.

use super::SinkRx;
use super::lines::{FILE_LINGER, Lines, Next};
use crate::pipeline::config::FileSinkConfig;
use anyhow::Context;
use std::path::Path;
use tokio::fs::{File, OpenOptions};
use tokio::io::BufWriter;
use tokio::signal::unix::{SignalKind, signal};

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

pub async fn run(name: &str, config: FileSinkConfig, mut rx: SinkRx) -> anyhow::Result<()> {
    let path = config.path;
    let mut lines = Lines::new(open(&path).await?, FILE_LINGER);
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
                lines.out = BufWriter::new(open(&path).await?);
                tracing::info!(sink = name, path = %path.display(), "reopened on SIGHUP");
            }
        }
    }
    lines.flush(&rx).await?;
    lines.out.get_mut().sync_data().await.ok();
    Ok(())
}
