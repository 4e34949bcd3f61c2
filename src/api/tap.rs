//! `GET /api/v1/tap?stream=transitions,alerts`: the records of the chosen
//! output streams as they are made, as JSON Lines in one long answer
//! (`fluxpipe tap` reads it), until the client goes or the pipeline stops.
//! Filters `cluster`, `job` (any id encoding) and `node` (host name,
//! `rankN` or rank). Records a slow reader has no room for are dropped for
//! it, never waited for, and a line `{"kind":"tap_dropped","dropped":N}`
//! says how many. At most [`MAX_TAPS`] at once (then `429`).

use crate::channels::tap::{MAX_TAPS, Tap, TapFilter, Taps};
use crate::flux::jobid::JobId;
use crate::output::{OutputStream, StreamSet};
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use tokio_util::sync::CancellationToken;

/// Records gathered into one chunk of the answer, at most.
const CHUNK_RECORDS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    stream: String,
    cluster: Option<String>,
    job: Option<String>,
    node: Option<String>,
}

pub fn routes(taps: Taps, stop: CancellationToken) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/tap", get(tap))
        .with_state((taps, stop))
}

fn refuse(status: StatusCode, why: String) -> Response {
    (status, Json(json!({ "error": why }))).into_response()
}

async fn tap(
    State((taps, stop)): State<(Taps, CancellationToken)>,
    params: Result<Query<Params>, QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(p) => p,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} (the keys are stream, cluster, job, node)",
                    e.body_text()
                ),
            );
        }
    };
    let mut streams = StreamSet::EMPTY;
    for name in params.stream.split(',').filter(|s| !s.is_empty()) {
        match OutputStream::parse(name) {
            Some(s) => streams.insert(s),
            None => {
                let known: Vec<&str> = OutputStream::ALL.iter().map(|s| s.as_str()).collect();
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("no stream {name:?} (the streams are {})", known.join(", ")),
                );
            }
        }
    }
    if streams.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "name a stream".to_string());
    }
    let job = match params.job.as_deref().map(JobId::parse).transpose() {
        Ok(j) => j,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("job: {e}")),
    };
    let filter = TapFilter {
        cluster: params.cluster,
        job,
        node: params.node,
    };
    let Some(tap) = taps.open(streams) else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_TAPS} taps are open already"),
        );
    };
    let chunks =
        futures_util::stream::unfold((tap, filter, stop), |(mut tap, filter, stop)| async move {
            let chunk = next_chunk(&mut tap, &filter, &stop).await?;
            Some((Ok::<_, Infallible>(chunk), (tap, filter, stop)))
        });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// The next lines for the reader: what is queued for it that passes the
/// filter, after a notice of what was dropped. `None`: the end.
async fn next_chunk(tap: &mut Tap, filter: &TapFilter, stop: &CancellationToken) -> Option<String> {
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return None,
            r = tap.recv() => r?,
        };
        let mut text = String::new();
        let dropped = tap.take_dropped();
        if dropped > 0 {
            text.push_str(&json!({"kind": "tap_dropped", "dropped": dropped}).to_string());
            text.push('\n');
        }
        let mut record = Some(first);
        let mut taken = 0;
        while let Some(r) = record.take() {
            let line = r.line();
            let wanted = filter.is_empty() || filter.matches(&r);
            if wanted {
                text.push_str(line);
                text.push('\n');
            }
            taken += 1;
            if taken < CHUNK_RECORDS {
                record = tap.try_recv();
            }
        }
        if !text.is_empty() {
            return Some(text);
        }
    }
}
