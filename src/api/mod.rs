//! The pipeline's HTTP server (`[api]`): `/metrics` (Prometheus text
//! format, or OpenMetrics when the scraper's `Accept` prefers it),
//! `/healthz` (the process is alive), `/readyz` (the pipeline is running
//! and not shutting down) and the query API, `/api/v1/...` ([`query`]). One server per pipeline, on loopback
//! unless configured otherwise; it is part of the pipeline, not a sink:
//! it takes no output streams, it shows what the pipeline measures.

mod auth;
mod page;
pub mod past;
pub mod query;
mod tap;

use crate::channels::fanout::SinkCounters;
use crate::channels::query::Questions;
use crate::channels::tap::Taps;
use crate::component::{Claim, Problem, Resource};
use crate::telemetry::exposition::{self, Format};
use crate::telemetry::{self, NodeBoard, Readiness, StateAges, UserJobs};
use anyhow::Context;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// `[api]`: where the server listens and what `/metrics` shows.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// `host:port`.
    #[serde(default = "default_address")]
    pub address: String,
    /// Export `flux_jobs_by_user{flux_cluster,userid,state}`: one series
    /// per user with active jobs (off: user ids make many series).
    #[serde(default)]
    pub per_user_jobs: bool,
    /// A file holding a secret that the query API and the status page
    /// require (`Authorization: Bearer SECRET`, or HTTP Basic with it as
    /// the password, which a browser asks for). `/metrics`, `/healthz` and
    /// `/readyz` stay open, as probes and scrapers expect.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// Export the per-node series (`flux_node_*`, a few per rank); off,
    /// only the per-cluster node counts: a scrape of a site of many
    /// thousand nodes stays small.
    #[serde(default = "default_node_series")]
    pub node_series: bool,
}

fn default_node_series() -> bool {
    true
}

fn default_address() -> String {
    "127.0.0.1:9464".into()
}

impl ApiConfig {
    /// Its address must be an IP address and port.
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

    pub fn claims(&self) -> Vec<Claim> {
        vec![Claim::new("address", Resource::Tcp(self.address.clone()))]
    }
}

/// What the pipeline shows through the server, besides the recorder's
/// metrics: views its parts keep up to date.
#[derive(Debug, Clone, Default)]
pub struct Views {
    /// Per-node state.
    pub nodes: NodeBoard,
    /// Oldest state-entry times.
    pub ages: StateAges,
    /// Whether the pipeline is running, for `/readyz`.
    pub ready: Readiness,
    /// Active jobs per user, if asked for.
    pub users: UserJobs,
    /// Every sink's queued and done counts, for the buffered-records gauge.
    pub buffers: SinkCounters,
    /// The fan-out's taps (`/api/v1/tap`).
    pub taps: Taps,
}

/// The server, bound: binding first makes a taken address a start-up
/// error, before any source reads.
pub struct Server {
    listener: TcpListener,
    address: String,
    token: Option<auth::Token>,
    /// Export the per-node series.
    node_series: bool,
    /// The pipeline's job archive, for what it says of the past.
    archive: past::ArchiveReader,
}

impl Server {
    pub async fn bind(config: &ApiConfig) -> anyhow::Result<Self> {
        let token = config
            .token_file
            .as_deref()
            .map(auth::Token::read)
            .transpose()?;
        let listener = TcpListener::bind(&config.address)
            .await
            .with_context(|| format!("api: cannot listen on {}", config.address))?;
        Ok(Server {
            listener,
            address: config.address.clone(),
            token,
            node_series: config.node_series,
            archive: past::ArchiveReader::default(),
        })
    }

    /// Answer from the job archive at `url` (a `database` sink's) too.
    pub fn with_archive(mut self, url: Option<String>) -> Self {
        self.archive = past::ArchiveReader::new(url);
        self
    }

    /// Serve until `stop` is cancelled.
    pub async fn serve(
        self,
        views: Views,
        questions: Questions,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let handle = telemetry::prometheus()
            .context("another metrics recorder is installed; cannot export metrics")?;
        let node_series = self.node_series;
        let Views {
            nodes,
            ages,
            ready,
            users,
            buffers,
            taps,
        } = views;
        let app = axum::Router::new()
            .route(
                "/metrics",
                get(move |headers: HeaderMap| {
                    telemetry::collect_process();
                    let mut text = handle.render();
                    text.push_str(&nodes.render(node_series));
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
                    let reasons = ready.reasons();
                    async move {
                        if reasons.is_empty() {
                            (StatusCode::OK, "ready\n".to_string()).into_response()
                        } else {
                            let text = format!("not ready\n{}\n", reasons.join("\n"));
                            (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
                        }
                    }
                }),
            )
            .merge(auth::guard(
                query::routes(questions.clone())
                    .merge(past::routes(self.archive.clone()))
                    .merge(page::routes(questions, Some(handle), self.archive))
                    .merge(tap::routes(taps, stop.clone())),
                self.token,
            ));
        tracing::info!(address = %self.address, "serving the api (/metrics, /healthz, /readyz, /api/v1)");
        axum::serve(self.listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
            .context("api: server failed")
    }
}
