//! `type = "prometheus"`: serves `/metrics` (Prometheus text format, or
//! OpenMetrics when the scraper's `Accept` prefers it),
//! `/healthz` (the process is alive) and `/readyz` (the pipeline is running
//! and not shutting down). It takes no output streams: it exports the
//! metrics the pipeline records.

use super::{SinkContext, SinkRx};
use crate::exposition::{self, Format};
use crate::pipeline::config::PrometheusSinkConfig;
use crate::telemetry;
use anyhow::Context;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

pub async fn run(
    name: &str,
    config: PrometheusSinkConfig,
    mut rx: SinkRx,
    ctx: SinkContext,
) -> anyhow::Result<()> {
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
