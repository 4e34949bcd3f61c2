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
//!
//! TLS is optional (`[sources.NAME.tls]`: `crt_file`, `key_file`, and
//! `ca_file` to require client certificates signed by that CA): rustls
//! with the `ring` provider. The handshake runs in the connection's own
//! task, on its first read or write, so a slow or silent client holds only
//! its own place among `max_connections`, never the accept loop; one that
//! fails or takes longer than `request_timeout_secs` is logged with its
//! peer and counted in `fluxpipe_http_tls_handshake_failures_total`.

use super::config::source_config;
use super::lines::split_bounded;
use super::socket::OpenConnection;
use super::{SourceContext, SourceSpec};
use crate::channels::router::{Closed, Tally};
use crate::component::{Claim, Problem, Resource};
use crate::telemetry::metric;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
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

impl Acknowledgements {
    /// What an answer vouches for, by this name.
    fn as_str(self) -> &'static str {
        match self {
            Acknowledgements::Checkpoint => "checkpoint",
            Acknowledgements::Received => "received",
        }
    }
}

/// `[sources.NAME.auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpAuth {
    /// A file holding the bearer token clients must send
    /// (`Authorization: Bearer TOKEN`); surrounding whitespace is ignored.
    pub token_file: PathBuf,
}

/// `[sources.NAME.tls]`: HTTPS instead of plain HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTls {
    /// The server's certificate chain (PEM), its own certificate first.
    pub crt_file: PathBuf,
    /// The private key of that certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CA certificates (PEM): when set, a client must present a
    /// certificate signed by one of them (mutual TLS).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// Why a `tls` table cannot make a server: the key at fault and what is
/// wrong with its file.
#[derive(Debug, thiserror::Error)]
#[error("{}{problem}", at(path.as_deref()))]
pub struct TlsError {
    /// `tls.crt_file`, `tls.key_file`, `tls.ca_file`, or `tls`.
    pub key: &'static str,
    path: Option<PathBuf>,
    problem: TlsProblem,
}

fn at(path: Option<&Path>) -> String {
    path.map(|p| format!("{}: ", p.display()))
        .unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
enum TlsProblem {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("not valid PEM: {0}")]
    Pem(String),
    #[error("holds no PEM {0}")]
    Missing(&'static str),
    #[error("the private key does not match the certificate of crt_file")]
    Mismatch,
    #[error("a certificate in it is not valid X.509 ({0:?})")]
    Certificate(rustls::CertificateError),
    #[error("{0}")]
    Rustls(rustls::Error),
    #[error("{0}")]
    Verifier(rustls::server::VerifierBuilderError),
}

impl TlsError {
    fn of(key: &'static str, path: &Path, problem: TlsProblem) -> Self {
        TlsError {
            key,
            path: Some(path.to_path_buf()),
            problem,
        }
    }
}

impl HttpTls {
    /// The rustls server this table describes: every file read and parsed,
    /// so that a mistake shows when the config is loaded, named by its key.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::{self, PemObject};
        // Named rather than the process-wide default, which
        // `ServerConfig::builder` panics without when the crate features
        // do not single one out.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = read_certificates("tls.crt_file", &self.crt_file)?;
        for cert in &certs {
            // Parsed now, so that a bad certificate is blamed on crt_file
            // rather than on the key it is compared with below.
            rustls::server::ParsedCertificate::try_from(cert).map_err(|e| {
                TlsError::of("tls.crt_file", &self.crt_file, certificate_problem(e))
            })?;
        }
        let key_pem = read_file("tls.key_file", &self.key_file)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            let problem = match e {
                pem::Error::NoItemsFound => TlsProblem::Missing("PRIVATE KEY"),
                e => TlsProblem::Pem(pem_error(e)),
            };
            TlsError::of("tls.key_file", &self.key_file, problem)
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError {
                key: "tls",
                path: None,
                problem: TlsProblem::Rustls(e),
            })?;
        let builder = match &self.ca_file {
            None => builder.with_no_client_auth(),
            Some(ca_file) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in read_certificates("tls.ca_file", ca_file)? {
                    roots.add(cert).map_err(|e| {
                        TlsError::of("tls.ca_file", ca_file, certificate_problem(e))
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| TlsError::of("tls.ca_file", ca_file, TlsProblem::Verifier(e)))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            let problem = match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    TlsProblem::Mismatch
                }
                e => TlsProblem::Rustls(e),
            };
            TlsError::of("tls.key_file", &self.key_file, problem)
        })?;
        // Only HTTP/1.1 is served; saying so spares a client that offers h2
        // a wrong guess.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// rustls says "invalid peer certificate" of any certificate it cannot
/// parse; here the certificate is the operator's own.
fn certificate_problem(e: rustls::Error) -> TlsProblem {
    match e {
        rustls::Error::InvalidCertificate(e) => TlsProblem::Certificate(e),
        e => TlsProblem::Rustls(e),
    }
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::of(key, path, TlsProblem::Read(e)))
}

/// Every certificate of a PEM file; at least one.
fn read_certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = read_file(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::of(key, path, TlsProblem::Pem(pem_error(e))))?;
    if certs.is_empty() {
        return Err(TlsError::of(key, path, TlsProblem::Missing("CERTIFICATE")));
    }
    Ok(certs)
}

/// A PEM error on one line (its own `Display` shows some lines as bytes).
fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { end_marker } => {
            format!(
                "a `{}` section has no END line",
                String::from_utf8_lossy(&end_marker).trim()
            )
        }
        Error::IllegalSectionStart { line } => {
            format!("bad BEGIN line `{}`", String::from_utf8_lossy(&line).trim())
        }
        e => e.to_string(),
    }
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
        #[serde(deserialize_with = "crate::component::seconds", default = "default_request_timeout")]
        request_timeout_secs: f64,
        #[serde(default)]
        auth: Option<HttpAuth>,
        /// HTTPS: certificate, key and, for client certificates, a CA.
        #[serde(default)]
        tls: Option<HttpTls>,
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

impl SourceSpec for HttpSourceConfig {
    fn heartbeats(&self) -> bool {
        true
    }

    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.address.parse::<SocketAddr>().is_err() {
            out.push(Problem::new(
                "address",
                format!(" `{}`: not an IP address and port", self.address),
            ));
        }
        if !self.path.starts_with('/') {
            out.push(Problem::new(
                "path",
                format!(" `{}`: must start with /", self.path),
            ));
        }
        if self.max_body_bytes == 0 {
            out.push(Problem::new("max_body_bytes", ": must be at least 1"));
        }
        if self.max_connections == 0 {
            out.push(Problem::new("max_connections", ": must be at least 1"));
        }
        if !(self.request_timeout_secs > 0.0 && self.request_timeout_secs <= 86_400.0) {
            out.push(Problem::new(
                "request_timeout_secs",
                ": must be more than 0 and at most a day",
            ));
        }
        if let Some(auth) = &self.auth
            && let Err(e) = read_token(&auth.token_file)
        {
            out.push(Problem::new("auth", format!(": {e}")));
        }
        if let Some(tls) = &self.tls
            && let Err(e) = tls.server_config()
        {
            out.push(Problem::new(e.key, format!(": {e}")));
        }
        out
    }

    fn claims(&self) -> Vec<Claim> {
        vec![Claim::new("address", Resource::Tcp(self.address.clone()))]
    }

    /// It takes part in checkpoint rounds when it acknowledges at them.
    fn has_positions(&self) -> bool {
        self.acknowledgements == Acknowledgements::Checkpoint
    }
}

impl HttpSourceConfig {
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

/// Serve until shutdown; its positions (checkpoint rounds) are the
/// batches it answered, nothing to save.
pub async fn run(config: HttpSourceConfig, ctx: SourceContext) -> anyhow::Result<Option<String>> {
    serve(config, ctx).await.map(|()| None)
}

async fn serve(config: HttpSourceConfig, ctx: SourceContext) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let token = match &config.auth {
        Some(auth) => Some(read_token(&auth.token_file).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let tls = match &config.tls {
        Some(tls) => {
            let server = tls
                .server_config()
                .map_err(|e| anyhow::anyhow!("sources.{}.{}: {e}", ctx.name, e.key))?;
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
        }
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
        tls = tls.is_some(),
        client_certificates = config.tls.as_ref().is_some_and(|t| t.ca_file.is_some()),
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
        tls,
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
    metrics::counter!(metric::FLUXPIPE_HTTP_REQUESTS_TOTAL, "source" => shared.ctx.name.to_string(), "code" => code)
        .increment(1);
    metrics::histogram!(metric::FLUXPIPE_HTTP_REQUEST_DURATION_SECONDS, "source" => shared.ctx.name.to_string())
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

    if body.iter().all(u8::is_ascii_whitespace) {
        // A heartbeat: the feeder is alive with nothing to send. Answered
        // at once; nothing to apply, so no checkpoint to wait for.
        ctx.heard();
        return heartbeat_answer(shared.config.acknowledgements);
    }
    let n = shared.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let tally = Arc::new(Tally::default());
    let mut out = ctx.tallied_record_buffer(tally.clone());
    let origin = ctx.default_origin();
    let max_line = ctx.decode.max_line_bytes;
    let mut answer = Answer {
        acknowledged: shared.config.acknowledgements.as_str(),
        ..Answer::default()
    };
    let label = format!("http://{peer}/{n}");
    // Handed on under the gate's shared side: a round's report comes
    // between batches, never in the middle of one.
    let handed = async {
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
    let reported = match tokio::time::timeout_at(deadline, handed).await {
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
    json_answer(&answer)
}

fn json_answer(answer: &Answer) -> Response {
    let mut r = (
        StatusCode::OK,
        serde_json::to_string(answer).unwrap_or_default() + "\n",
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The answer to a body with no line to apply: every count 0.
fn heartbeat_answer(acknowledgements: Acknowledgements) -> Response {
    json_answer(&Answer {
        applied: Some(0),
        repeats: Some(0),
        refused: Some(0),
        acknowledged: acknowledgements.as_str(),
        ..Answer::default()
    })
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
    /// Set: every connection starts with a TLS handshake.
    tls: Option<tokio_rustls::TlsAcceptor>,
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
                    metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => name.to_string())
                        .increment(1);
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                metrics::counter!(metric::FLUXPIPE_SOURCE_CONNECTIONS_REFUSED_TOTAL, "source" => name.to_string())
                    .increment(1);
                tracing::warn!(source = %name, %peer, limit = self.shared.config.max_connections, "connection refused: max_connections reached");
                continue;
            };
            tracing::info!(source = %name, %peer, "connection opened");
            if let Ok(mut peers) = self.shared.peers.lock() {
                peers.insert(peer, 0);
            }
            let shutdown = self.shared.ctx.shutdown.clone();
            let link = match &self.tls {
                None => Link::Plain(stream),
                // Only set up here: the handshake's reads and writes happen
                // in the connection's task (see `Connection::poll_io`).
                Some(acceptor) => Link::Handshake {
                    accept: Box::new(acceptor.accept(stream)),
                    deadline: Box::pin(tokio::time::sleep(self.shared.config.timeout())),
                },
            };
            let conn = Connection {
                link,
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

/// What an accepted connection carries its bytes over.
enum Link {
    Plain(TcpStream),
    /// A TLS handshake under way, until `deadline`.
    Handshake {
        accept: Box<tokio_rustls::Accept<TcpStream>>,
        deadline: Pin<Box<tokio::time::Sleep>>,
    },
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The handshake failed (or was cut short): nothing more is read or
    /// written.
    Failed,
}

/// Plain and TLS streams alike, once a connection carries data.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An accepted connection, holding its place among `max_connections`.
struct Connection {
    link: Link,
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

impl Connection {
    /// The stream to read or write, once any TLS handshake is done. The
    /// handshake is driven here, so in this connection's task.
    fn poll_io(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<&mut dyn Io>> {
        if let Link::Handshake { accept, deadline } = &mut self.link {
            let done = match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Ready(done) => done,
                Poll::Pending => match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no handshake within request_timeout_secs",
                    )),
                    Poll::Pending => return Poll::Pending,
                },
            };
            self.link = match done {
                Ok(tls) => Link::Tls(Box::new(tls)),
                Err(e) => {
                    let name = &self.shared.ctx.name;
                    // A client's mistake (or a port scan), not the
                    // source's: info, not a warning.
                    tracing::info!(source = %name, peer = %self.peer, "TLS handshake failed: {e}");
                    metrics::counter!(metric::FLUXPIPE_HTTP_TLS_HANDSHAKE_FAILURES_TOTAL, "source" => name.to_string())
                        .increment(1);
                    Link::Failed
                }
            };
        }
        Poll::Ready(match &mut self.link {
            Link::Plain(stream) => Ok(stream),
            Link::Tls(stream) => Ok(stream.as_mut()),
            Link::Handshake { .. } | Link::Failed => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            )),
        })
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
        let io = ready!(self.poll_io(cx))?;
        Pin::new(io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let io = ready!(self.poll_io(cx))?;
        Pin::new(io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let io = ready!(self.poll_io(cx))?;
        Pin::new(io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Closing a connection still in its handshake (a stop, say) must
        // not wait for the client: drop it.
        if matches!(self.link, Link::Handshake { .. } | Link::Failed) {
            self.link = Link::Failed;
            return Poll::Ready(Ok(()));
        }
        let io = ready!(self.poll_io(cx))?;
        Pin::new(io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let io = ready!(self.poll_io(cx))?;
        Pin::new(io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.link {
            Link::Plain(stream) => stream.is_write_vectored(),
            Link::Tls(stream) => stream.is_write_vectored(),
            Link::Handshake { .. } | Link::Failed => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA, and a server certificate for localhost signed by it, in `dir`:
    /// ca.pem, server.pem, server.key.
    fn write_pki(dir: &Path) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    }

    fn tls(dir: &Path, crt: &str, key: &str, ca: Option<&str>) -> HttpTls {
        HttpTls {
            crt_file: dir.join(crt),
            key_file: dir.join(key),
            ca_file: ca.map(|c| dir.join(c)),
        }
    }

    /// The key blamed and the message, of a `tls` table that must fail.
    fn refused(t: &HttpTls) -> (&'static str, String) {
        let e = t.server_config().map(|_| ()).unwrap_err();
        let message = e.to_string();
        assert!(!message.contains('\n'), "not one line: {message}");
        (e.key, message)
    }

    #[test]
    fn tls_files_are_read_and_parsed_when_the_config_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_pki(d);
        std::fs::write(
            d.join("bad.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(d.join("cut.pem"), "-----BEGIN CERTIFICATE-----\nMIIB\n").unwrap();
        std::fs::write(d.join("text.pem"), "nothing here\n").unwrap();
        // Valid PEM and base64, not a certificate.
        std::fs::write(
            d.join("junk.pem"),
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // Another key: not the certificate's.
        std::fs::write(
            d.join("other.key"),
            rcgen::KeyPair::generate().unwrap().serialize_pem(),
        )
        .unwrap();

        assert!(
            tls(d, "server.pem", "server.key", None)
                .server_config()
                .is_ok()
        );
        assert!(
            tls(d, "server.pem", "server.key", Some("ca.pem"))
                .server_config()
                .is_ok()
        );

        let cases: [(HttpTls, &str, &str); 10] = [
            (
                tls(d, "missing.pem", "server.key", None),
                "tls.crt_file",
                "cannot read it",
            ),
            (
                tls(d, "bad.pem", "server.key", None),
                "tls.crt_file",
                "not valid PEM",
            ),
            (
                tls(d, "cut.pem", "server.key", None),
                "tls.crt_file",
                "not valid PEM: a `CERTIFICATE` section has no END line",
            ),
            (
                tls(d, "text.pem", "server.key", None),
                "tls.crt_file",
                "holds no PEM CERTIFICATE",
            ),
            // A key where the certificate should be.
            (
                tls(d, "server.key", "server.key", None),
                "tls.crt_file",
                "holds no PEM CERTIFICATE",
            ),
            (
                tls(d, "junk.pem", "server.key", None),
                "tls.crt_file",
                "not valid X.509 (BadEncoding)",
            ),
            (
                tls(d, "server.pem", "missing.key", None),
                "tls.key_file",
                "cannot read it",
            ),
            (
                tls(d, "server.pem", "server.pem", None),
                "tls.key_file",
                "holds no PEM PRIVATE KEY",
            ),
            (
                tls(d, "server.pem", "other.key", None),
                "tls.key_file",
                "does not match",
            ),
            (
                tls(d, "server.pem", "server.key", Some("missing.pem")),
                "tls.ca_file",
                "cannot read it",
            ),
        ];
        for (t, want_key, want) in cases {
            let (key, message) = refused(&t);
            assert_eq!(key, want_key, "{t:?}: {message}");
            assert!(message.contains(want), "{t:?}: `{message}` lacks `{want}`");
        }
        let (key, message) = refused(&tls(d, "server.pem", "server.key", Some("junk.pem")));
        assert_eq!(key, "tls.ca_file", "{message}");
    }

    #[test]
    fn a_tls_problem_is_reported_under_its_key_when_the_config_loads() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_pki(d);
        let config = |tls: &str| {
            format!(
                "[sources.in]\ntype = \"http\"\naddress = \"127.0.0.1:0\"\n\n[sources.in.tls]\n{tls}\n\n\
                 [sinks.out]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n"
            )
        };
        let errors = |tls: &str| -> Vec<String> {
            match crate::pipeline::config::parse(&config(tls)) {
                Ok(_) => Vec::new(),
                Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
            }
        };
        let good = format!(
            "crt_file = {:?}\nkey_file = {:?}\nca_file = {:?}",
            d.join("server.pem"),
            d.join("server.key"),
            d.join("ca.pem")
        );
        assert_eq!(errors(&good), Vec::<String>::new());

        let missing = format!(
            "crt_file = {:?}\nkey_file = {:?}",
            d.join("nope.pem"),
            d.join("server.key")
        );
        let got = errors(&missing);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("line 6: sources.in.tls.crt_file: ")
                && got[0].contains("nope.pem: cannot read it"),
            "{got:?}"
        );

        let unknown = good.clone() + "\ncert_file = \"x\"";
        let got = errors(&unknown);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("cert_file"), "{got:?}");
    }

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
