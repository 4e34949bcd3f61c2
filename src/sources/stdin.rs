//! `type = "stdin"`: lines from standard input until it ends.

use super::config::source_config;
use super::lines::{LineReader, READ_BYTES};
use super::{SourceContext, SourceSpec};
use crate::component::{Claim, Resource};
use tokio::io::BufReader;

source_config! {
    /// `type = "stdin"`.
    StdinSourceConfig {}
}

impl SourceSpec for StdinSourceConfig {
    /// Standard input can be read once.
    fn claims(&self) -> Vec<Claim> {
        vec![Claim::new("type", Resource::Stdin)]
    }
}

/// Read standard input to its end (or shutdown); no positions.
pub async fn run(_config: StdinSourceConfig, ctx: SourceContext) -> anyhow::Result<Option<String>> {
    read(ctx).await.map(|()| None)
}

async fn read(ctx: SourceContext) -> anyhow::Result<()> {
    let mut reader = LineReader::new(
        BufReader::with_capacity(READ_BYTES, tokio::io::stdin()),
        ctx.decode.max_line_bytes,
    );
    let origin = ctx.default_origin();
    let mut lineno = 0u64;
    let mut out = ctx.record_buffer();
    let read = loop {
        let ready = reader.line_ready();
        // What is held goes on before waiting for input.
        if !ready && ctx.flush(&mut out).await.is_err() {
            break Ok(());
        }
        let line = if ready && !ctx.shutdown.is_cancelled() {
            // Buffered: taken without waiting, so without racing shutdown
            // (a `select!` per line cost more than splitting the line).
            reader.next(true).await
        } else {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => break Ok(()),
                line = reader.next(true) => line,
            }
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        lineno += 1;
        if ctx
            .hold_line(&mut out, line, &origin, &|| format!("stdin:{lineno}"))
            .await
            .is_err()
        {
            break Ok(());
        }
    };
    // What was read is handed on, whatever ended the reading.
    let _ = ctx.flush(&mut out).await;
    Ok(read?)
}
