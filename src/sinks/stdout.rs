//! `type = "stdout"`: JSON Lines on standard output.

use super::{SinkRx, count_sent};
use tokio::io::{AsyncWriteExt, BufWriter};

pub async fn run(name: &str, mut rx: SinkRx) -> anyhow::Result<()> {
    let mut out = BufWriter::new(tokio::io::stdout());
    while let Some(rec) = rx.recv().await {
        out.write_all(rec.line.as_bytes()).await?;
        out.write_all(b"\n").await?;
        count_sent(name, 1);
        // Flush when nothing else is waiting, so a quiet feed is not held back.
        if rx.is_empty() {
            out.flush().await?;
        }
    }
    out.flush().await?;
    Ok(())
}
