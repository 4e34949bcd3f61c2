//! `type = "stdout"`: JSON Lines on standard output.

use super::SinkRx;
use super::lines::{Lines, Next};
use std::time::Duration;

pub async fn run(_name: &str, mut rx: SinkRx) -> anyhow::Result<()> {
    let mut lines = Lines::new(tokio::io::stdout(), Duration::ZERO);
    loop {
        match lines.next(&mut rx).await {
            Next::Records => lines.write(&rx).await?,
            Next::Flush => lines.flush(&rx).await?,
            Next::Closed => break,
        }
    }
    lines.flush(&rx).await?;
    Ok(())
}
