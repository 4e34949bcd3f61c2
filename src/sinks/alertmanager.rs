//! `type = "alertmanager"`: alert records to Alertmanager's API v2
//! (`POST {url}/api/v2/alerts`), the way Prometheus talks to it.
//!
//! Alertmanager knows an alert by its labels. The sink keeps every alert
//! it was given, by labels, and:
//! - sends a new or changed alert at once;
//! - re-sends every firing alert each `resend_interval_secs` with `endsAt`
//!   four intervals ahead, so Alertmanager keeps it open while we live and
//!   resolves it by itself if we die;
//! - sends a resolved alert with its `endsAt` in the past, and keeps
//!   re-sending it for `resolved_resend_secs` (a receiver that missed one
//!   resolution gets the next);
//! - on failure (no answer, 5xx, 429) retries what is undelivered with
//!   backoff (1 s doubling up to the resend interval); a 4xx answer means
//!   the request itself is wrong: logged, counted, not retried.

use crate::telemetry::metric;
use super::http::{client, error_chain, request_headers};
use super::{SinkContext, SinkRx, count_sent};
use crate::component::Problem;
use crate::output::OutputStream;
use std::collections::BTreeMap;
use crate::output::rfc3339;
use anyhow::Context;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

crate::channels::fanout::sink_config! {
    /// `type = "alertmanager"`: alerts to Alertmanager's API v2.
    AlertmanagerSinkConfig {
        /// Alertmanager's base URL, e.g. `http://127.0.0.1:9093`.
        url: String,
        /// Seconds between re-sends of every firing alert.
        #[serde(default = "default_resend_interval")]
        resend_interval_secs: f64,
        /// Seconds a resolved alert keeps being re-sent.
        #[serde(default = "default_resolved_resend")]
        resolved_resend_secs: f64,
        /// Extra request headers (authentication, say).
        #[serde(default)]
        headers: BTreeMap<String, String>,
    }
}

fn default_resend_interval() -> f64 {
    60.0
}

fn default_resolved_resend() -> f64 {
    900.0
}

impl super::SinkSpec for AlertmanagerSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let url = &self.url;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            out.push(Problem::new(
                "url",
                format!(" `{url}`: must start with http:// or https://"),
            ));
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if input != OutputStream::Alerts.as_str() {
                out.push(Problem::at(
                    "inputs",
                    i,
                    format!(": `{input}`: an alertmanager sink takes only `alerts`"),
                ));
            }
        }
        if !self.resend_interval_secs.is_finite() || self.resend_interval_secs < 1.0 {
            out.push(Problem::new("resend_interval_secs", ": must be at least 1"));
        }
        out
    }
}

const BACKOFF_START: Duration = Duration::from_secs(1);
/// How long the last attempt at shutdown may take.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One alert as Alertmanager will see it.
#[derive(Debug, Clone)]
struct Tracked {
    labels: Value,
    annotations: Value,
    starts_at: String,
    /// Set once resolved: the time it ended, and when we learned it.
    resolved: Option<(String, Instant)>,
    delivered: bool,
}

impl Tracked {
    /// The API v2 form. A firing alert ends `ahead` from now unless re-sent.
    fn payload(&self, ahead: Duration) -> Value {
        let ends_at = match &self.resolved {
            Some((ends, _)) => ends.clone(),
            None => rfc3339(crate::keyed::alerts::wall_now() + ahead.as_secs_f64()),
        };
        json!({
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": self.starts_at,
            "endsAt": ends_at,
        })
    }
}

/// Why an alert record could not be taken.
#[derive(Debug, thiserror::Error)]
enum RecordError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not an alert record (no `labels` object or no `status`)")]
    NotAlert,
}

/// The alerts the sink holds, by identity (their labels).
#[derive(Debug, Default)]
struct Book {
    alerts: HashMap<String, Tracked>,
}

impl Book {
    /// Take one alert record from the `alerts` stream.
    fn take(&mut self, line: &str) -> Result<(), RecordError> {
        let v: Value = serde_json::from_str(line)?;
        let labels = v.get("labels").filter(|l| l.is_object());
        let status = v.get("status").and_then(Value::as_str);
        let (Some(labels), Some(status)) = (labels, status) else {
            return Err(RecordError::NotAlert);
        };
        // serde_json's map is sorted, so equal label sets print equal.
        let identity = labels.to_string();
        let starts_at = v
            .get("starts_at")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| rfc3339(crate::keyed::alerts::wall_now()));
        let resolved = match (status, v.get("ends_at").and_then(Value::as_str)) {
            ("resolved", Some(ends)) => Some((ends.to_string(), Instant::now())),
            ("resolved", None) => Some((rfc3339(crate::keyed::alerts::wall_now()), Instant::now())),
            _ => None,
        };
        self.alerts.insert(
            identity,
            Tracked {
                labels: labels.clone(),
                annotations: v
                    .get("annotations")
                    .cloned()
                    .unwrap_or(Value::Object(Map::new())),
                starts_at,
                resolved,
                delivered: false,
            },
        );
        Ok(())
    }

    /// Forget resolved alerts re-sent long enough.
    fn expire(&mut self, keep: Duration) {
        self.alerts.retain(|_, a| {
            a.resolved
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() < keep)
        });
    }

    fn undelivered(&self) -> bool {
        self.alerts.values().any(|a| !a.delivered)
    }

    /// Alerts not yet delivered.
    fn undelivered_count(&self) -> u64 {
        self.alerts.values().filter(|a| !a.delivered).count() as u64
    }

    /// The request body: every alert, or only the undelivered ones.
    fn body(&self, all: bool, ahead: Duration) -> (usize, Vec<u8>) {
        let batch: Vec<Value> = self
            .alerts
            .values()
            .filter(|a| all || !a.delivered)
            .map(|a| a.payload(ahead))
            .collect();
        (batch.len(), Value::Array(batch).to_string().into_bytes())
    }

    fn mark_delivered(&mut self) {
        for a in self.alerts.values_mut() {
            a.delivered = true;
        }
    }
}

struct Poster {
    name: String,
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
}

/// What became of one POST.
enum Outcome {
    Delivered,
    Retry(String),
    Rejected(String),
}

impl Poster {
    async fn post(&self, body: Vec<u8>) -> Outcome {
        let sent = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return Outcome::Retry(error_chain(&e)),
        };
        let status = response.status();
        let text: String = response
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect();
        if status.is_success() {
            Outcome::Delivered
        } else if status.is_server_error() || status.as_u16() == 429 {
            Outcome::Retry(format!("HTTP {status}: {text}"))
        } else {
            Outcome::Rejected(format!("HTTP {status}: {text}"))
        }
    }

    fn error(&self, what: &str, e: &str) {
        metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => self.name.clone()).increment(1);
        tracing::warn!(sink = %self.name, url = %self.url, "{what}: {e}");
    }
}

pub async fn run(
    name: &str,
    config: AlertmanagerSinkConfig,
    mut rx: SinkRx,
    _ctx: &SinkContext,
) -> anyhow::Result<()> {
    let base = config.url.trim_end_matches('/');
    let url = reqwest::Url::parse(&format!("{base}/api/v2/alerts"))
        .with_context(|| format!("url `{}` is not a valid URL", config.url))?;
    let poster = Poster {
        name: name.to_string(),
        client: client()?,
        url,
        headers: request_headers(&config.headers)?,
    };
    let resend = Duration::from_secs_f64(config.resend_interval_secs.clamp(1.0, 86400.0));
    let keep_resolved = Duration::from_secs_f64(config.resolved_resend_secs.clamp(0.0, 1e7));
    let ahead = resend * 4;
    let mut book = Book::default();
    let mut buf = Vec::new();
    let mut next_full = Instant::now() + resend;
    let mut backoff = BACKOFF_START;
    let mut retry_at: Option<Instant> = None;
    loop {
        let wake = match retry_at {
            Some(r) => r.min(next_full),
            None => next_full,
        };
        let mut closed = false;
        tokio::select! {
            n = rx.recv_many(&mut buf, 1024) => {
                closed = n == 0;
                // Alerts firing again after a restart are announced anew
                // from the restored state, so records are done with here.
                rx.done_with(n as u64);
                for rec in buf.drain(..) {
                    if let Err(e) = book.take(rec.line()) {
                        poster.error("alert record skipped", &e.to_string());
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        let full = now >= next_full;
        if full {
            book.expire(keep_resolved);
            next_full = now + resend;
        }
        // New alerts go out at once; failed ones wait for their retry.
        let due = full || (book.undelivered() && retry_at.is_none_or(|r| now >= r));
        if due && !book.alerts.is_empty() {
            let (n, body) = book.body(full, ahead);
            let attempt = if closed {
                tokio::time::timeout(SHUTDOWN_GRACE, poster.post(body))
                    .await
                    .unwrap_or_else(|_| Outcome::Retry("timed out at shutdown".into()))
            } else {
                poster.post(body).await
            };
            match attempt {
                Outcome::Delivered => {
                    book.mark_delivered();
                    count_sent(name, n as u64);
                    retry_at = None;
                    backoff = BACKOFF_START;
                }
                Outcome::Retry(e) => {
                    poster.error("POST failed, will retry", &e);
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(resend);
                }
                Outcome::Rejected(e) => {
                    // Retrying the same request cannot help.
                    poster.error("alerts rejected", &e);
                    book.mark_delivered();
                    retry_at = None;
                }
            }
        }
        rx.set_held(book.undelivered_count());
        if closed {
            if book.undelivered() {
                tracing::error!(sink = %name, "alerts not delivered at shutdown");
            }
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_are_known_by_their_labels() {
        let mut book = Book::default();
        let firing = r#"{"kind":"alert","status":"firing","labels":{"alertname":"a","jobid":"f1"},"annotations":{"summary":"s"},"starts_at":"2024-01-01T00:00:00Z","ends_at":null}"#;
        let resolved = r#"{"kind":"alert","status":"resolved","labels":{"jobid":"f1","alertname":"a"},"starts_at":"2024-01-01T00:00:00Z","ends_at":"2024-01-01T01:00:00Z"}"#;
        book.take(firing).unwrap();
        let (n, body) = book.body(false, Duration::from_secs(60));
        assert_eq!(n, 1);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["startsAt"], "2024-01-01T00:00:00Z");
        assert!(v[0]["endsAt"].as_str().unwrap() > "2025");
        book.mark_delivered();
        assert!(!book.undelivered());
        book.take(resolved).unwrap();
        assert_eq!(book.alerts.len(), 1, "same labels in another order");
        let (_, body) = book.body(false, Duration::from_secs(60));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["endsAt"], "2024-01-01T01:00:00Z");
        book.expire(Duration::from_secs(3600));
        assert_eq!(book.alerts.len(), 1);
        book.expire(Duration::ZERO);
        assert!(book.alerts.is_empty());
        assert!(matches!(book.take("{}"), Err(RecordError::NotAlert)));
        assert!(matches!(book.take("nope"), Err(RecordError::Json(_))));
    }
}
