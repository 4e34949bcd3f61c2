//! `type = "prometheus"`: serves `/metrics` (Prometheus text format, or
//! OpenMetrics when the scraper's `Accept` prefers it),
//! `/healthz` (the process is alive) and `/readyz` (the pipeline is running
//! and not shutting down). It takes no output streams: it exports the
//! metrics the pipeline records.

use super::{SinkContext, SinkRx};
use crate::exposition::{self, Format};
use crate::channels::fanout::{SinkCommon, WhenFull};
use crate::component::Problem;
use crate::telemetry;
use anyhow::Context;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

/// `type = "prometheus"`: `/metrics`, `/healthz` and `/readyz` over HTTP.
/// It takes no `inputs`: it exports what the pipeline measures.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusSinkConfig {
    #[serde(default = "default_metrics_address")]
    pub address: String,
    /// Export `flux_jobs_by_user{flux_cluster,userid,state}`: one series
    /// per user with active jobs (off: user ids make many series).
    #[serde(default)]
    pub per_user_jobs: bool,
}

fn default_metrics_address() -> String {
    "127.0.0.1:9464".into()
}

impl PrometheusSinkConfig {
    /// It takes no `inputs`: nothing for the fan-out to feed.
    pub fn common(&self) -> SinkCommon<'_> {
        SinkCommon {
            inputs: &[],
            when_full: WhenFull::DropNewest,
            buffer: 1,
        }
    }

    /// Its address must be an IP address and port (the pipeline checks
    /// it against every other listener's).
    pub fn problems(&self) -> Vec<Problem> {
        if self.address.parse::<std::net::SocketAddr>().is_err() {
            vec![Problem::new(
                "address",
                format!(" `{}`: not an IP address and port", self.address),
            )]
        } else {
            Vec::new()
        }
    }
}

pub async fn run(
    name: &str,
    config: PrometheusSinkConfig,
    mut rx: SinkRx,
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    let ctx = ctx.clone();
    let handle = telemetry::prometheus()
        .context("another metrics recorder is installed; cannot export metrics")?;
    let listener = tokio::net::TcpListener::bind(&config.address)
        .await
        .with_context(|| format!("sinks.{name}: cannot listen on {}", config.address))?;
    let nodes = ctx.nodes.clone();
    let ages = ctx.ages.clone();
    let users = ctx.users.clone();
    let buffers = ctx.buffers.clone();
    let ready = ctx.ready.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let mut text = handle.render();
                text.push_str(&nodes.render());
                text.push_str(&ages.render());
                text.push_str(&users.render());
                text.push_str(&buffers.render());
                let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
                let format = exposition::negotiate(accept);
                if format == Format::OpenMetrics {
                    text = exposition::to_openmetrics(&text);
                }
                async move { ([(header::CONTENT_TYPE, format.content_type())], text) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ok = ready.get();
                async move {
                    if ok {
                        (StatusCode::OK, "ready\n").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
                    }
                }
            }),
        );
    tracing::info!(sink = name, address = %config.address, "serving metrics");
    // Serve until the pipeline closes this sink's channel (shutdown).
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            while rx.recv().await.is_some() {
                rx.done_with(1);
            }
        })
        .await
        .with_context(|| format!("sinks.{name}: metrics server failed"))?;
    Ok(())
}
