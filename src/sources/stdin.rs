//! `type = "stdin"`: lines from standard input until it ends.

use super::SourceContext;
use super::lines::{LineReader, READ_BYTES};
use tokio::io::BufReader;

pub async fn run(ctx: SourceContext) -> anyhow::Result<()> {
    let mut reader = LineReader::new(
        BufReader::with_capacity(READ_BYTES, tokio::io::stdin()),
        ctx.decode.max_line_bytes,
    );
    let origin = ctx.default_origin();
    let mut lineno = 0u64;
    loop {
        let line = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            line = reader.next(true) => line?,
        };
        let Some(line) = line else { break };
        lineno += 1;
        if ctx
            .line(line, &origin, &|| format!("stdin:{lineno}"))
            .await
            .is_err()
        {
            break;
        }
    }
    Ok(())
}
