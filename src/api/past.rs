//! What the pipeline's job archive (its `database` sink, if it has one)
//! says of the past, for the API and the status page:
//!
//! - `GET /api/v1/usage?hours=24&cluster=C`: per cluster, the jobs that
//!   finished in the last `hours` (at most a year), as `fluxpipe report
//!   jobs --by cluster` gives them: `{"since", "until", "clusters": [...]}`.
//! - `GET /api/v1/node_history?cluster=C&host=H&limit=N`: a node's newest
//!   state changes (drains, undrains, outages), oldest first, as
//!   `fluxpipe history --nodes` gives them: `{"events": [...]}`.
//!
//! Both answer 404 when the pipeline has no `database` sink, and 503 while
//! the archive cannot be read (not made yet, the server away).

use crate::archive::report::{GroupBy, Report};
use crate::archive::{Access, Archive, ArchiveError, EventQuery, ReportQuery};
use crate::keyed::alerts::wall_now;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query as Params, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// Longest window `usage` takes, in hours.
const MAX_HOURS: f64 = 24.0 * 366.0;
/// Most node changes `node_history` gives.
const MAX_EVENTS: usize = 1000;

/// The archive, opened for reading at its first use (a SQLite file the
/// sink has not made yet is tried again at the next question).
#[derive(Clone, Default)]
pub struct ArchiveReader {
    url: Option<String>,
    archive: Arc<OnceCell<Archive>>,
}

/// Why the archive gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PastError {
    #[error("this pipeline has no `database` sink")]
    NoArchive,
    #[error("the archive cannot be read now: {0}")]
    Archive(#[from] ArchiveError),
}

impl ArchiveReader {
    pub fn new(url: Option<String>) -> Self {
        ArchiveReader {
            url,
            archive: Arc::default(),
        }
    }

    /// Whether the pipeline has an archive.
    pub fn configured(&self) -> bool {
        self.url.is_some()
    }

    async fn archive(&self) -> Result<&Archive, PastError> {
        let url = self.url.as_deref().ok_or(PastError::NoArchive)?;
        Ok(self
            .archive
            .get_or_try_init(|| Archive::connect(url, Access::Read))
            .await?)
    }

    /// Per cluster, the jobs that finished in the last `hours` (`cluster`:
    /// that one only), as report rows; and the window.
    pub async fn usage(
        &self,
        hours: f64,
        cluster: Option<String>,
    ) -> Result<(f64, f64, Vec<Map<String, Value>>), PastError> {
        let archive = self.archive().await?;
        let until = wall_now();
        let since = until - hours.clamp(0.0, MAX_HOURS) * 3600.0;
        let query = ReportQuery {
            cluster,
            since: Some(since),
            until: Some(until),
            ..ReportQuery::default()
        };
        let mut report = Report::new(vec![GroupBy::Cluster], jiff::tz::TimeZone::UTC);
        archive.finished_jobs(&query, |j| report.add(&j)).await?;
        Ok((since, until, report.rows(|_| None)))
    }

    /// A node's newest `limit` state changes, oldest first.
    pub async fn node_history(
        &self,
        cluster: &str,
        host: &str,
        limit: usize,
    ) -> Result<Vec<Value>, PastError> {
        let archive = self.archive().await?;
        let query = EventQuery {
            cluster: Some(cluster.to_string()),
            host: Some(host.to_string()),
            limit: limit.min(MAX_EVENTS),
            ..EventQuery::default()
        };
        Ok(archive
            .node_events(&query)
            .await?
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }
}

/// The routes.
pub fn routes(reader: ArchiveReader) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/usage", get(usage))
        .route("/api/v1/node_history", get(node_history))
        .with_state(reader)
}

fn failed(e: PastError) -> Response {
    let status = match e {
        PastError::NoArchive => StatusCode::NOT_FOUND,
        PastError::Archive(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(json!({ "error": e.to_string() }))).into_response()
}

fn bad(e: QueryRejection) -> Response {
    let text = e.body_text();
    (StatusCode::BAD_REQUEST, Json(json!({ "error": text }))).into_response()
}

#[derive(Debug, Deserialize)]
struct UsageParams {
    hours: Option<f64>,
    cluster: Option<String>,
}

async fn usage(
    State(reader): State<ArchiveReader>,
    params: Result<Params<UsageParams>, QueryRejection>,
) -> Response {
    let Params(p) = match params {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    let hours = p
        .hours
        .filter(|h| h.is_finite() && *h > 0.0)
        .unwrap_or(24.0);
    match reader.usage(hours, p.cluster).await {
        Ok((since, until, rows)) => Json(json!({
            "since": since,
            "until": until,
            "clusters": rows,
        }))
        .into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Debug, Deserialize)]
struct NodeHistoryParams {
    cluster: String,
    host: String,
    limit: Option<usize>,
}

async fn node_history(
    State(reader): State<ArchiveReader>,
    params: Result<Params<NodeHistoryParams>, QueryRejection>,
) -> Response {
    let Params(p) = match params {
        Ok(p) => p,
        Err(e) => return bad(e),
    };
    match reader
        .node_history(&p.cluster, &p.host, p.limit.unwrap_or(100))
        .await
    {
        Ok(events) => Json(json!({ "events": events })).into_response(),
        Err(e) => failed(e),
    }
}
