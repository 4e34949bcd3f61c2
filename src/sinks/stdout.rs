//! `type = "stdout"`: JSON Lines on standard output.

use super::SinkRx;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufWriter};

/// Longest a written record waits in the buffer under steady load.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

pub async fn run(_name: &str, mut rx: SinkRx) -> anyhow::Result<()> {
    let mut out = BufWriter::new(tokio::io::stdout());
    let mut unflushed = 0u64;
    let mut flushed_at = Instant::now();
    while let Some(rec) = rx.recv().await {
        out.write_all(rec.line.as_bytes()).await?;
        out.write_all(b"\n").await?;
        unflushed += 1;
        // Flush when nothing else is waiting, so a quiet feed is not held
        // back, and now and then under load; a record counts as delivered
        // once flushed.
        if rx.is_empty() || flushed_at.elapsed() >= FLUSH_EVERY {
            out.flush().await?;
            rx.delivered(std::mem::take(&mut unflushed));
            flushed_at = Instant::now();
        }
    }
    out.flush().await?;
    rx.delivered(unflushed);
    Ok(())
}
