//! `type = "stdout"`: JSON Lines on standard output.

use super::lines::{Lines, Next};
use super::{SinkContext, SinkRx};
use std::time::Duration;

crate::sinks::config::sink_config! {
    /// `type = "stdout"`: JSON Lines on standard output.
    StdoutSinkConfig {}
}

impl super::SinkSpec for StdoutSinkConfig {}

pub async fn run(
    name: &str,
    _config: StdoutSinkConfig,
    mut rx: SinkRx,
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    let mut lines = Lines::new(tokio::io::stdout(), Duration::ZERO);
    match write_all(&mut lines, &mut rx).await {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe && ctx.sinks == 1 => {
            // `fluxpipe run | head`: the reader is gone, and this sink's
            // end is the pipeline's: a stop, not a failure. What was not
            // read is given up: no final checkpoint, so the next run
            // writes it again.
            tracing::info!(sink = name, "standard output closed: stopping");
            ctx.offsets.reader_gone();
            ctx.shutdown.cancel();
            let left = rx.give_up_rest(lines.abandon()).await;
            Err(super::OutputClosed { left }.into())
        }
        other => Ok(other?),
    }
}

async fn write_all<W>(lines: &mut Lines<W>, rx: &mut SinkRx) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    loop {
        match lines.next(rx).await {
            Next::Records => lines.write(rx).await?,
            Next::Flush => lines.flush(rx).await?,
            Next::Closed => break,
        }
    }
    lines.flush(rx).await
}
