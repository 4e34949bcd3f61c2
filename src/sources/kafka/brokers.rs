//! Whether the Kafka brokers can be reached, said at once: in the log and
//! in `/readyz`. librdkafka retries on its own, and a metadata request
//! that cannot reach a broker waits out its whole timeout, so an
//! unreachable broker would otherwise be silent for that long.

use super::KafkaSourceConfig;
use super::changelog::base_config;
use crate::sources::SourceContext;
use crate::telemetry::metric;
use anyhow::{Context, Result};
use rdkafka::Statistics;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::Arc;
use std::time::Duration;

/// How long one metadata request may take before it counts as a failure:
/// short at first (the log says so at once), longer after (a distant
/// broker behind TLS may be slow to answer).
const PROBE_TIMEOUTS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
];
/// The pause between probes while no broker answers.
const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Wait until a broker answers a metadata request. Not ready, with a
/// warning naming the brokers and the error, while none does. `Ok(false)`:
/// shutdown came first.
pub async fn wait_for_one(config: &KafkaSourceConfig, ctx: &SourceContext) -> Result<bool> {
    let probe: BaseConsumer = base_config(config)
        .create()
        .context("cannot create the Kafka metadata client")?;
    let probe = Arc::new(probe);
    ctx.readiness.block(
        &ctx.name,
        format!(
            "connecting to the Kafka brokers {}",
            config.bootstrap_servers
        ),
    );
    let mut failures = 0u64;
    loop {
        let client = probe.clone();
        let timeout = PROBE_TIMEOUTS[(failures as usize).min(PROBE_TIMEOUTS.len() - 1)];
        let answer = tokio::task::spawn_blocking(move || {
            client.client().fetch_metadata(None, timeout).map(|_| ())
        });
        let answer = tokio::select! {
            _ = ctx.shutdown.cancelled() => return Ok(false),
            a = answer => a?,
        };
        match answer {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(source = %ctx.name, brokers = %config.bootstrap_servers, "Kafka brokers reached");
                }
                ctx.readiness.clear(&ctx.name);
                return Ok(true);
            }
            Err(e) => {
                failures += 1;
                let why = format!(
                    "no Kafka broker of {} answers: {e}",
                    config.bootstrap_servers
                );
                // At once, then rarely: a broker that stays away does not
                // flood the log.
                if failures <= 3 || failures.is_power_of_two() {
                    tracing::warn!(source = %ctx.name, tries = failures, "{why}; trying again");
                }
                metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => ctx.name.to_string())
                    .increment(1);
                ctx.readiness.block(&ctx.name, why);
            }
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(RETRY_PAUSE) => {}
        }
    }
}

/// The consumer's view of its brokers, kept in `/readyz`: not ready when
/// librdkafka says all brokers are down, ready again once its statistics
/// show one up.
pub struct BrokerHealth {
    source: Arc<str>,
    ctx: SourceContext,
    servers: String,
}

impl BrokerHealth {
    pub fn new(ctx: &SourceContext, config: &KafkaSourceConfig) -> Self {
        BrokerHealth {
            source: ctx.name.clone(),
            ctx: ctx.clone(),
            servers: config.bootstrap_servers.clone(),
        }
    }

    /// From `ClientContext::error`.
    pub fn error(&self, error: &rdkafka::error::KafkaError, reason: &str) {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        if let KafkaError::Global(RDKafkaErrorCode::AllBrokersDown) = error {
            let why = format!("all Kafka brokers of {} are down: {reason}", self.servers);
            tracing::warn!(source = %self.source, "{why}");
            self.ctx.readiness.block(&self.source, why);
        } else {
            // As rdkafka's own handler would say it (this one replaces it).
            tracing::warn!(source = %self.source, "Kafka: {error}: {reason}");
        }
    }

    /// From `ClientContext::stats`.
    pub fn stats(&self, stats: &Statistics) {
        if stats.brokers.values().any(|b| b.state == "UP") {
            self.ctx.readiness.clear(&self.source);
        }
    }
}
