//! `type = "blackhole"`: takes every record it is given and drops it,
//! counting them; for benchmarks and for trying a pipeline out.

use super::{SinkContext, SinkRx};

crate::sinks::config::sink_config! {
    /// `type = "blackhole"`: counts the records and drops them (benchmarks).
    BlackholeSinkConfig {}
}

impl super::SinkSpec for BlackholeSinkConfig {}

pub async fn run(
    name: &str,
    _config: BlackholeSinkConfig,
    mut rx: SinkRx,
    _ctx: &SinkContext,
) -> anyhow::Result<()> {
    let mut received = 0u64;
    let mut batch = Vec::with_capacity(256);
    while rx.recv_many(&mut batch, 256).await > 0 {
        received += batch.len() as u64;
        rx.delivered(batch.len() as u64);
        batch.clear();
    }
    tracing::info!(sink = name, records = received, "blackhole done");
    Ok(())
}
