//! `type = "stdout"`: JSON Lines on standard output.

use super::{SinkContext, SinkRx};
use super::lines::{Lines, Next};
use std::time::Duration;

crate::channels::fanout::sink_config! {
    /// `type = "stdout"`: JSON Lines on standard output.
    StdoutSinkConfig {}
}

impl super::SinkSpec for StdoutSinkConfig {}

pub async fn run(
    _name: &str,
    _config: StdoutSinkConfig,
    mut rx: SinkRx,
    _ctx: &SinkContext,
) -> anyhow::Result<()> {
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
