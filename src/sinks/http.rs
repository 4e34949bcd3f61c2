//! `type = "http"`: records POSTed as JSON arrays to a webhook.
//!
//! A batch is sent when it holds `batch_max_records` records, or
//! `batch_timeout_ms` after its first record arrived, whichever comes
//! first. One batch is in flight at a time, so while the endpoint is slow
//! or down the sink's buffer fills and `when_full` applies.
//!
//! A 2xx answer delivers the batch. A 5xx or 429 answer, or no answer at
//! all (connection refused, reset, timeout), is retried with exponential
//! backoff (100 ms doubling to 10 s, or the server's `Retry-After` when it
//! asks for longer) for up to `retry_max_secs`; then the batch is dropped,
//! logged and counted in `fluxpipe_sink_errors_total` and
//! `fluxpipe_records_dropped_total`. Any other answer (a 4xx: the request
//! itself is wrong) drops the batch at once, counted the same way.
//!
//! TLS is rustls with the `ring` provider and the platform's trust store;
//! no OpenSSL.
//!
//! At shutdown the batch being built is sent at once; retries of a batch
//! in hand are cut to [`SHUTDOWN_GRACE`] after the channel closed.
//!
//! A webhook pages people, so records of the `alerts` stream go as
//! [`super::pager`] says: late ones (a backlog being caught up) are held
//! out of the batches and left out if they clear meanwhile; what still
//! fires once the backlog is read goes in a later batch. Held records
//! are done with for checkpoints at once: a restart announces what still
//! fires again. `page_past = true` sends every record as it comes.

use super::pager::{Alert, Pager, Past, Verdict};
use super::{SinkContext, SinkRx};
use crate::component::Problem;
use crate::output::{OutputRecord, OutputStream};
use crate::telemetry::metric;
use anyhow::Context;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

crate::sinks::config::sink_config! {
    /// `type = "http"`: JSON arrays POSTed to a webhook.
    HttpSinkConfig {
        uri: String,
        /// Most records in one POST.
        #[serde(default = "default_batch_records")]
        batch_max_records: usize,
        /// Longest wait before a partial batch is sent, in milliseconds.
        #[serde(default = "default_batch_timeout")]
        batch_timeout_ms: u64,
        /// Extra request headers.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// Seconds to keep retrying one batch before it is dropped and counted.
        #[serde(deserialize_with = "crate::component::seconds", default = "default_retry_max")]
        retry_max_secs: f64,
        /// Seconds behind the wall clock from which an alert record is
        /// from the past (a backlog caught up): held, not paged if it
        /// clears.
        #[serde(deserialize_with = "crate::component::seconds", default = "super::pager::default_past_after")]
        past_after_secs: f64,
        /// Seconds a late alert is held for its resolution to come.
        #[serde(deserialize_with = "crate::component::seconds", default = "super::pager::default_settle")]
        settle_secs: f64,
        /// Send alert records from the past too.
        #[serde(default)]
        page_past: bool,
    }
}

fn default_batch_records() -> usize {
    500
}

fn default_batch_timeout() -> u64 {
    1000
}

fn default_retry_max() -> f64 {
    300.0
}

impl super::SinkSpec for HttpSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let uri = &self.uri;
        if !(uri.starts_with("http://") || uri.starts_with("https://")) {
            out.push(Problem::new(
                "uri",
                format!(" `{uri}`: must start with http:// or https://"),
            ));
        }
        if self.batch_max_records == 0 {
            out.push(Problem::new("batch_max_records", ": must be at least 1"));
        }
        out.extend(super::pager::problems(
            self.past_after_secs,
            self.settle_secs,
        ));
        out
    }
}

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Longest one request may take, answer included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a batch still failing at shutdown keeps being retried.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What became of one attempt.
enum Attempt {
    Delivered,
    /// Worth trying again; with the delay the server asked for, if any.
    Retry(String, Option<Duration>),
    /// Not worth trying again.
    Rejected(String),
}

struct Sender {
    name: String,
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    retry_max: Duration,
    /// The pipeline's shutdown: once it begins, what is left is tried
    /// for [`SHUTDOWN_GRACE`] more at most, all batches together.
    shutdown: tokio_util::sync::CancellationToken,
    stop_deadline: std::sync::OnceLock<Instant>,
}

impl Sender {
    fn new(
        name: &str,
        config: &HttpSinkConfig,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<Self> {
        let url = reqwest::Url::parse(&config.uri)
            .with_context(|| format!("uri `{}` is not a valid URL", config.uri))?;
        let headers = request_headers(&config.headers)?;
        let client = client()?;
        Ok(Sender {
            name: name.to_string(),
            client,
            url,
            headers,
            retry_max: Duration::from_secs_f64(config.retry_max_secs.clamp(0.0, 1e9)),
            shutdown,
            stop_deadline: std::sync::OnceLock::new(),
        })
    }

    async fn attempt(&self, body: &[u8]) -> Attempt {
        let sent = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body.to_vec())
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(error_chain(&e), None),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Read the body so the connection can be reused, and keep its start
        // for the log.
        let text = response.text().await.unwrap_or_default();
        let detail = || {
            let mut t: String = text.chars().take(200).collect();
            if t.is_empty() {
                t = "(empty body)".into();
            }
            format!("HTTP {status}: {t}")
        };
        if status.is_success() {
            Attempt::Delivered
        } else if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            Attempt::Retry(detail(), retry_after)
        } else {
            Attempt::Rejected(detail())
        }
    }

    /// Deliver one batch, retrying as configured; a batch that cannot be
    /// delivered is dropped and counted. `records` came from the channel
    /// now; `released` were held (the pager's) and are done with already.
    async fn deliver(&self, records: usize, released: usize, body: &[u8], rx: &SinkRx) {
        let all = records + released;
        let mut deadline = Instant::now() + self.retry_max;
        let mut shortened = false;
        let mut backoff = BACKOFF_START;
        let mut tries = 0u32;
        loop {
            if !shortened && (rx.is_closed() || self.shutdown.is_cancelled()) {
                shortened = true;
                deadline = deadline.min(self.stop_deadline());
            }
            if shortened && Instant::now() >= deadline {
                // The stop's one grace is over: what is left is not tried.
                self.drop_batch(all, tries, "the stop's grace is over", "stopping");
                rx.given_up(records as u64);
                return;
            }
            tries += 1;
            let attempt = if shortened {
                tokio::time::timeout_at(deadline, self.attempt(body))
                    .await
                    .unwrap_or_else(|_| {
                        Attempt::Retry("no answer within the stop's grace".into(), None)
                    })
            } else {
                self.attempt(body).await
            };
            let (error, asked) = match attempt {
                Attempt::Delivered => {
                    rx.delivered(records as u64);
                    super::count_sent(&self.name, released as u64);
                    return;
                }
                Attempt::Rejected(e) => {
                    self.drop_batch(all, tries, &e, "rejected");
                    rx.given_up(records as u64);
                    return;
                }
                Attempt::Retry(e, asked) => (e, asked),
            };
            if !shortened && (rx.is_closed() || self.shutdown.is_cancelled()) {
                shortened = true;
                deadline = deadline.min(self.stop_deadline());
            }
            let now = Instant::now();
            if now >= deadline {
                self.drop_batch(all, tries, &error, "retries exhausted");
                rx.given_up(records as u64);
                return;
            }
            // Tried until the deadline: the last pause ends on it.
            let pause = asked
                .map_or(backoff, |a| a.max(backoff))
                .min(deadline - now);
            backoff = (backoff * 2).min(BACKOFF_MAX);
            tracing::debug!(sink = %self.name, url = %self.url, tries, retry_in = ?pause, "POST failed: {error}");
            // A stop cuts the pause short: its grace has started.
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.shutdown.cancelled(), if !shortened => {}
            }
        }
    }

    /// When the stop's grace ends: one deadline for every batch left,
    /// counted from when the stop was first seen (not per batch).
    fn stop_deadline(&self) -> Instant {
        *self
            .stop_deadline
            .get_or_init(|| Instant::now() + SHUTDOWN_GRACE)
    }

    fn drop_batch(&self, records: usize, tries: u32, error: &str, why: &str) {
        metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => self.name.clone())
            .increment(1);
        metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => self.name.clone(), "reason" => "undeliverable")
            .increment(records as u64);
        tracing::error!(sink = %self.name, url = %self.url, records, tries, "batch dropped ({why}): {error}");
    }
}

/// An HTTP client for the sinks. It wants a TLS provider even for
/// http:// URLs: ring, not the default aws-lc (whose build needs cmake).
/// Installing fails only when a provider is already installed, which is
/// as good.
pub(super) fn client() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .context("cannot build the HTTP client")
}

/// `Content-Type: application/json` plus the configured headers.
pub(super) fn request_headers(
    extra: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (k, v) in extra {
        let key = HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("headers: `{k}` is not a valid header name"))?;
        let value = HeaderValue::from_str(v)
            .with_context(|| format!("headers.{k}: not a valid header value"))?;
        headers.insert(key, value);
    }
    Ok(headers)
}

/// The message of an error and of its causes.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// The records of a batch to send: those the pager lets through, in
/// order, and the late firings it lets go now.
struct Paging {
    pager: Pager,
    /// Late firings held, by identity.
    held: HashMap<String, Arc<OutputRecord>>,
    not_paged: metrics::Counter,
}

impl Paging {
    /// Sort `batch` (from the channel) into `out`; returns how many of it
    /// were held or left out (done with here).
    fn sort(
        &mut self,
        batch: &mut Vec<Arc<OutputRecord>>,
        out: &mut Vec<Arc<OutputRecord>>,
    ) -> u64 {
        let (wall, at) = (crate::keyed::alerts::wall_now(), Instant::now());
        let mut aside = 0;
        for rec in batch.drain(..) {
            if rec.stream != OutputStream::Alerts {
                out.push(rec);
                continue;
            }
            // A record that is no alert is not ours to judge: it goes.
            let Some(alert) = rec.as_alert().map(Alert::of) else {
                out.push(rec);
                continue;
            };
            let verdict = self.pager.take(&alert, wall, at);
            if alert.resolved {
                // Its firing never went out: left out with it, or
                // replaced by this resolution.
                self.held.remove(&alert.identity);
            }
            match verdict {
                Verdict::Send => out.push(rec),
                Verdict::Hold => {
                    self.held.insert(alert.identity, rec);
                    aside += 1;
                }
                Verdict::NotPaged => {
                    self.not_paged.increment(1);
                    aside += 1;
                }
            }
        }
        aside
    }

    /// The held firings let go as of now, onto `out`.
    fn release(&mut self, out: &mut Vec<Arc<OutputRecord>>) -> usize {
        let before = out.len();
        for id in self.pager.release(Instant::now()) {
            out.extend(self.held.remove(&id));
        }
        out.len() - before
    }
}

pub async fn run(
    name: &str,
    config: HttpSinkConfig,
    mut rx: SinkRx,
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    let sender = Sender::new(name, &config, ctx.shutdown.clone())?;
    let max = config.batch_max_records.max(1);
    let timeout = Duration::from_millis(config.batch_timeout_ms);
    let not_paged =
        metrics::counter!(metric::FLUXPIPE_ALERTS_NOT_PAGED_TOTAL, "sink" => name.to_string());
    let takes_alerts = config
        .inputs
        .iter()
        .any(|i| i == OutputStream::Alerts.as_str());
    let mut paging = (takes_alerts && !config.page_past).then(|| {
        not_paged.increment(0);
        Paging {
            pager: Pager::new(Past::new(config.past_after_secs, config.settle_secs, false)),
            held: HashMap::new(),
            not_paged,
        }
    });
    let mut batch = Vec::with_capacity(max.min(4096));
    let mut out = Vec::with_capacity(max.min(4096));
    let mut body: Vec<u8> = Vec::new();
    loop {
        let release = paging.as_ref().and_then(|p| p.pager.next_release());
        let mut fresh = 0;
        tokio::select! {
            n = rx.recv_batch(&mut batch, max, timeout) => {
                if n == 0 {
                    // Late firings still held are left: a restart would
                    // announce what still fires again.
                    return Ok(());
                }
                fresh = n;
            }
            _ = sleep_until_some(release) => {}
        }
        // Woken to let held firings go, `batch` may hold the start of the
        // next batch (recv_batch is cancel-safe): it waits for the rest.
        if fresh > 0 {
            match paging.as_mut() {
                Some(p) => {
                    let aside = p.sort(&mut batch, &mut out);
                    rx.done_with(aside);
                    fresh -= aside as usize;
                }
                None => out.append(&mut batch),
            }
        }
        let released = paging.as_mut().map_or(0, |p| p.release(&mut out));
        if let Some(p) = &paging {
            rx.set_held(p.held.len() as u64);
        }
        if out.is_empty() {
            continue;
        }
        body.clear();
        body.push(b'[');
        for (i, rec) in out.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(rec.line().as_bytes());
        }
        body.push(b']');
        sender.deliver(fresh, released, &body, &rx).await;
        out.clear();
    }
}

/// Sleep until `at`; for ever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
