//! `type = "http"`: batches of lines `POST`ed by a feeder (the forwarder),
//! answered only once they are **safe**: at-least-once delivery across a
//! restart of either side, which a TCP stream cannot give (a line written
//! into a connection whose reader has died is gone, and the writer learns
//! it one write later, if at all).
//!
//! Safe means, per `acknowledgements`:
//! - `"checkpoint"` (the default): every record of the batch is applied to
//!   the state, its outputs are delivered, and a checkpoint that holds it
//!   is on disk. What a crash cannot take back. The source asks for a
//!   checkpoint as soon as it has a batch waiting, so a feeder waits about
//!   one checkpoint's time (milliseconds for a small state).
//! - `"received"`: handed to the operators. A crash before the next
//!   checkpoint loses it; for feeders that can afford that.
//!
//! How a batch is known to be in a checkpoint: the source takes part in
//! checkpoint rounds like the file source, at rest between two batches (a
//! gate: batches are handed on under its shared side, a round's report
//! takes it whole). A batch handed on after round N's report is behind
//! round N+1's barrier, so it is safe once any round after N is written.
//!
//! Answers: `200` with counts (records applied, repeats skipped, invalid
//! lines with their line numbers and errors); `400` a body that cannot be
//! decompressed; `401` a missing or wrong bearer token; `413` a body over
//! `max_body_bytes` (compressed or not); `415` an unknown
//! `Content-Encoding`; `429` the pipeline did not take the batch within
//! `request_timeout_secs` (full); `503` stopping, or no checkpoint came in
//! time. `429` and `503` carry `Retry-After`, and nothing is acknowledged
//! that a restart could lose: the feeder sends the batch again, and what
//! was applied of it is skipped as repeats.
//!
//! Connections beyond `max_connections` are closed at once and counted,
//! not queued.

use super::SourceContext;
use super::lines::split_bounded;
use super::socket::OpenConnection;
use crate::operators::{Closed, Tally};
use crate::pipeline::config::source_config;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, RwLock, Semaphore};
use tokio::time::Instant;

/// Errors listed in an answer; beyond these only their count.
const LISTED_ERRORS: usize = 100;

/// Pause after a failed `accept` (out of file descriptors, say).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How long a stop waits for open requests before closing their
/// connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// When a client should try again after `429` or `503`, in seconds.
const RETRY_AFTER_SECS: &str = "1";

/// When a batch is acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acknowledgements {
    /// Applied and in a checkpoint on disk.
    #[default]
    Checkpoint,
    /// Handed to the operators.
    Received,
}

/// `[sources.NAME.auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpAuth {
    /// A file holding the bearer token clients must send
    /// (`Authorization: Bearer TOKEN`); surrounding whitespace is ignored.
    pub token_file: PathBuf,
}

source_config! {
    /// `type = "http"`: batches of lines by `POST`, acknowledged when safe.
    HttpSourceConfig {
        /// `host:port` to listen on.
        address: String,
        /// The path batches are posted to.
        #[serde(default = "default_path")]
        path: String,
        #[serde(default)]
        acknowledgements: Acknowledgements,
        /// Largest body accepted, compressed and decompressed alike.
        #[serde(default = "default_max_body")]
        max_body_bytes: usize,
        /// Most connections at once; more are closed at once.
        #[serde(default = "default_max_connections")]
        max_connections: usize,
        /// Longest a request may take: reading its body, handing it on and
        /// waiting for its acknowledgement.
        #[serde(default = "default_request_timeout")]
        request_timeout_secs: f64,
        #[serde(default)]
        auth: Option<HttpAuth>,
    }
}

fn default_path() -> String {
    "/".into()
}

fn default_max_body() -> usize {
    16 * 1024 * 1024
}

fn default_max_connections() -> usize {
    64
}

fn default_request_timeout() -> f64 {
    60.0
}

impl HttpSourceConfig {
    /// What is wrong with this source's keys, as (key, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.address.parse::<SocketAddr>().is_err() {
            out.push((
                "address",
                format!("`{}` is not an IP address and port", self.address),
            ));
        }
        if !self.path.starts_with('/') {
            out.push(("path", format!("`{}` must start with /", self.path)));
        }
        if self.max_body_bytes == 0 {
            out.push(("max_body_bytes", "must be at least 1".into()));
        }
        if self.max_connections == 0 {
            out.push(("max_connections", "must be at least 1".into()));
        }
        if !(self.request_timeout_secs > 0.0 && self.request_timeout_secs <= 86_400.0) {
            out.push((
                "request_timeout_secs",
                "must be more than 0 and at most a day".into(),
            ));
        }
        if let Some(auth) = &self.auth
            && let Err(e) = read_token(&auth.token_file)
        {
            out.push(("auth", e));
        }
        out
    }

    /// Whether this source takes part in checkpoint rounds.
    pub fn has_positions(&self) -> bool {
        self.acknowledgements == Acknowledgements::Checkpoint
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.request_timeout_secs.clamp(0.001, 86_400.0))
    }
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token_file {}: {e}", path.display()))?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(format!("token_file {} is empty", path.display()));
    }
    Ok(token)
}

/// What a `200` says of a batch.
#[derive(Debug, Default, Serialize)]
struct Answer {
    /// Lines in the body (blank ones included).
    lines: u64,
    /// Records decoded from them and handed on.
    records: u64,
    /// Records applied to the state (known only once a checkpoint holds
    /// them: `null` with `acknowledgements = "received"`).
    applied: Option<u64>,
    /// Records that repeated what was already applied, skipped (`null`
    /// when not known). A repeated batch is not all repeats: events that
    /// change nothing when applied again (annotations, R) count as applied.
    repeats: Option<u64>,
    /// Records refused (`operators.max_jobs` reached; `null` when not known).
    refused: Option<u64>,
    /// Lines that could not be decoded (sent to `dead_letter`).
    invalid: u64,
    /// The first of them: 1-based line number and error.
    errors: Vec<LineError>,
    /// What the answer vouches for: `checkpoint` or `received`.
    acknowledged: &'static str,
}

#[derive(Debug, Serialize)]
struct LineError {
    line: u64,
    error: String,
}

struct Shared {
    ctx: SourceContext,
    config: HttpSourceConfig,
    token: Option<String>,
    /// The last checkpoint round this source reported to: batches are
    /// handed on under its shared side, a round's report holds it whole.
    gate: RwLock<u64>,
    /// Lines received per open connection, for its closing log line.
    peers: Mutex<HashMap<SocketAddr, u64>>,
    requests: AtomicU64,
}

pub async fn run(config: HttpSourceConfig, ctx: SourceContext) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let token = match &config.auth {
        Some(auth) => Some(read_token(&auth.token_file).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let listener = TcpListener::bind(&config.address)
        .await
        .with_context(|| format!("cannot listen on {}", config.address))?;
    tracing::info!(
        source = %ctx.name,
        address = %config.address,
        path = %config.path,
        acknowledgements = ?config.acknowledgements,
        "listening (http)"
    );
    let shared = Arc::new(Shared {
        token,
        gate: RwLock::new(ctx.checkpoint.written()),
        peers: Mutex::default(),
        requests: AtomicU64::new(0),
        config: config.clone(),
        ctx: ctx.clone(),
    });
    let rounds = config
        .has_positions()
        .then(|| tokio::spawn(take_part_in_rounds(shared.clone())));
    let app = axum::Router::new()
        .route(&config.path, axum::routing::post(batch))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: POST batches of lines to the configured path\n",
            )
        })
        .with_state(shared.clone());
    let listener = Limited {
        inner: listener,
        permits: Arc::new(Semaphore::new(config.max_connections.max(1))),
        shared: shared.clone(),
    };
    let shutdown = ctx.shutdown.clone();
    let graceful = shutdown.clone();
    let server = axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(async move { graceful.cancelled().await })
        .into_future();
    // Requests waiting for a checkpoint are answered 503 at once when
    // stopping; a client that never finishes its request must not hold
    // the stop up: after a grace, its connection is dropped.
    let served = tokio::select! {
        served = server => served,
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(source = %ctx.name, "connections still open {SHUTDOWN_GRACE:?} after the stop began: closed");
            Ok(())
        }
    };
    if let Some(rounds) = rounds {
        rounds.abort();
    }
    served.with_context(|| format!("http server on {} failed", config.address))
}

/// Answer checkpoint rounds: at rest between batches, report, and note the
/// round reported to.
async fn take_part_in_rounds(shared: Arc<Shared>) {
    let mut link = shared.ctx.checkpoint.clone();
    loop {
        let seq = tokio::select! {
            _ = shared.ctx.shutdown.cancelled() => return,
            seq = link.requested() => seq,
        };
        let mut gate = shared.gate.write().await;
        link.report(&shared.ctx.name, seq, "{}".into()).await;
        *gate = seq;
    }
}

/// One `POST`ed batch.
async fn batch(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let response = answer(&shared, peer, &headers, body, started).await;
    let code = response.status().as_u16().to_string();
    metrics::counter!("fluxpipe_http_requests_total", "source" => shared.ctx.name.to_string(), "code" => code)
        .increment(1);
    metrics::histogram!("fluxpipe_http_request_duration_seconds", "source" => shared.ctx.name.to_string())
        .record(started.elapsed().as_secs_f64());
    response
}

async fn answer(
    shared: &Shared,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Body,
    started: Instant,
) -> Response {
    let ctx = &shared.ctx;
    if ctx.shutdown.is_cancelled() {
        return retry_later(StatusCode::SERVICE_UNAVAILABLE, "fluxpipe is stopping");
    }
    if let Some(token) = &shared.token
        && !bearer_matches(headers, token)
    {
        let mut r = plain(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    }
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => false,
        Some("gzip") | Some("x-gzip") => true,
        Some(other) => {
            return plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("Content-Encoding `{other}` is not supported: send gzip or nothing"),
            );
        }
    };
    let deadline = started + shared.config.timeout();
    let max = shared.config.max_body_bytes;
    let limited = http_body_util::Limited::new(body, max);
    let bytes = match tokio::time::timeout_at(deadline, limited.collect()).await {
        Err(_) => {
            return plain(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within request_timeout_secs",
            );
        }
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return too_large(max);
            }
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            );
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let body: Vec<u8> = if gzip {
        let mut out = Vec::new();
        let decoder = flate2::read::MultiGzDecoder::new(&bytes[..]);
        match decoder.take(max as u64 + 1).read_to_end(&mut out) {
            Ok(n) if n > max => return too_large(max),
            Ok(_) => out,
            Err(e) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    &format!("the body is not valid gzip: {e}"),
                );
            }
        }
    } else {
        bytes.to_vec()
    };

    let n = shared.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let tally = Arc::new(Tally::default());
    let mut out = ctx.tallied_outbox(tally.clone());
    let origin = ctx.default_origin();
    let max_line = ctx.decode.max_line_bytes;
    let mut answer = Answer {
        acknowledged: match shared.config.acknowledgements {
            Acknowledgements::Checkpoint => "checkpoint",
            Acknowledgements::Received => "received",
        },
        ..Answer::default()
    };
    let label = format!("http://{peer}/{n}");
    // Handed on under the gate's shared side: a round's report comes
    // between batches, never in the middle of one.
    let hand_on = async {
        let gate = shared.gate.read().await;
        let mut noted = Vec::new();
        for line in split_bounded(&body, max_line) {
            answer.lines += 1;
            let lineno = answer.lines;
            noted.clear();
            ctx.hold_line_noting(
                &mut out,
                line,
                &origin,
                &|| format!("{label}:{lineno}"),
                Some(&mut noted),
            )
            .await?;
            if !noted.is_empty() {
                answer.invalid += 1;
                for error in noted.drain(..) {
                    if answer.errors.len() < LISTED_ERRORS {
                        answer.errors.push(LineError {
                            line: lineno,
                            error,
                        });
                    }
                }
            }
        }
        ctx.flush(&mut out).await?;
        Ok::<u64, Closed>(*gate)
    };
    let reported = match tokio::time::timeout_at(deadline, hand_on).await {
        Ok(Ok(seq)) => seq,
        Ok(Err(Closed)) => {
            return retry_later(StatusCode::SERVICE_UNAVAILABLE, "fluxpipe is stopping");
        }
        Err(_) => {
            return retry_later(
                StatusCode::TOO_MANY_REQUESTS,
                "the pipeline is full: the batch was not taken within request_timeout_secs",
            );
        }
    };
    if let Ok(mut peers) = shared.peers.lock()
        && let Some(lines) = peers.get_mut(&peer)
    {
        *lines += answer.lines;
    }
    if shared.config.acknowledgements == Acknowledgements::Checkpoint {
        ctx.checkpoint.hurry();
        tokio::select! {
            written = ctx.checkpoint.written_after(reported) => if !written {
                return retry_later(StatusCode::SERVICE_UNAVAILABLE, "fluxpipe is stopping");
            },
            _ = ctx.shutdown.cancelled() => {
                return retry_later(StatusCode::SERVICE_UNAVAILABLE, "fluxpipe is stopping before a checkpoint held the batch");
            }
            _ = tokio::time::sleep_until(deadline) => {
                return retry_later(StatusCode::SERVICE_UNAVAILABLE, "no checkpoint held the batch within request_timeout_secs");
            }
        }
    }
    answer.records = tally.sent();
    if shared.config.acknowledgements == Acknowledgements::Checkpoint {
        // Behind a barrier: the shards have counted every record.
        let (applied, repeats, refused) = tally.counts();
        answer.applied = Some(applied);
        answer.repeats = Some(repeats);
        answer.refused = Some(refused);
    }
    tracing::debug!(
        source = %ctx.name,
        %peer,
        lines = answer.lines,
        records = answer.records,
        invalid = answer.invalid,
        "batch acknowledged"
    );
    let mut r = (
        StatusCode::OK,
        serde_json::to_string(&answer).unwrap_or_default() + "\n",
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    // Compared in full whatever the first difference: no timing hint.
    scheme.eq_ignore_ascii_case("bearer") && {
        let (a, b) = (given.trim().as_bytes(), token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

fn plain(code: StatusCode, message: &str) -> Response {
    (code, format!("{message}\n")).into_response()
}

fn retry_later(code: StatusCode, message: &str) -> Response {
    let mut r = plain(code, message);
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(RETRY_AFTER_SECS),
    );
    r
}

fn too_large(max: usize) -> Response {
    plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the body is over max_body_bytes ({max}): send smaller batches"),
    )
}

/// The listener: connections beyond the limit are closed at once (and
/// counted) rather than left waiting in the backlog.
struct Limited {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    shared: Arc<Shared>,
}

impl axum::serve::Listener for Limited {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let name = &self.shared.ctx.name;
        loop {
            let (stream, peer) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(source = %name, "accept failed: {e}");
                    metrics::counter!("fluxpipe_source_errors_total", "source" => name.to_string())
                        .increment(1);
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                metrics::counter!("fluxpipe_source_connections_refused_total", "source" => name.to_string())
                    .increment(1);
                tracing::warn!(source = %name, %peer, limit = self.shared.config.max_connections, "connection refused: max_connections reached");
                continue;
            };
            tracing::info!(source = %name, %peer, "connection opened");
            if let Ok(mut peers) = self.shared.peers.lock() {
                peers.insert(peer, 0);
            }
            let shutdown = self.shared.ctx.shutdown.clone();
            let conn = Connection {
                stream,
                closing: Box::pin(async move {
                    shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                }),
                peer,
                shared: self.shared.clone(),
                _permit: permit,
                _open: OpenConnection::new(name),
            };
            return (conn, peer);
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The client's address, as the handler sees it.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Limited>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Limited>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// An accepted connection, holding its place among `max_connections`.
struct Connection {
    stream: TcpStream,
    /// Ready a grace after the stop began: from then on the connection
    /// reads as closed, so a client that never finishes a request cannot
    /// keep the server's task (and the pipeline's queues) alive.
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    peer: SocketAddr,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
    _open: OpenConnection,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let lines = self
            .shared
            .peers
            .lock()
            .ok()
            .and_then(|mut p| p.remove(&self.peer))
            .unwrap_or(0);
        tracing::info!(source = %self.shared.ctx.name, peer = %self.peer, lines, "connection closed");
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_is_matched_whole() {
        let mut h = HeaderMap::new();
        assert!(!bearer_matches(&h, "s3cret"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(bearer_matches(&h, "s3cret"));
        assert!(!bearer_matches(&h, "s3cre"));
        assert!(!bearer_matches(&h, "s3cret2"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  s3cret "),
        );
        assert!(bearer_matches(&h, "s3cret"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!bearer_matches(&h, "s3cret"));
    }
}
