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
//!
//! It never pages for the past: late alerts (a backlog being caught up)
//! are held and left out as [`super::pager`] says, counted in
//! `fluxpipe_alerts_not_paged_total`; the `alerts` stream keeps them.

use super::http::{client, error_chain, request_headers};
use super::pager::{Alert, Pager, Past, Verdict};
use super::{SinkContext, SinkRx, count_sent};
use crate::component::Problem;
use crate::output::{AlertRecord, OutputStream, rfc3339};
use crate::telemetry::metric;
use anyhow::Context;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

crate::sinks::config::sink_config! {
    /// `type = "alertmanager"`: alerts to Alertmanager's API v2.
    AlertmanagerSinkConfig {
        /// Alertmanager's base URL, e.g. `http://127.0.0.1:9093`.
        url: String,
        /// Seconds between re-sends of every firing alert.
        #[serde(deserialize_with = "crate::component::seconds", default = "default_resend_interval")]
        resend_interval_secs: f64,
        /// Seconds a resolved alert keeps being re-sent.
        #[serde(deserialize_with = "crate::component::seconds", default = "default_resolved_resend")]
        resolved_resend_secs: f64,
        /// Extra request headers (authentication, say).
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// Seconds behind the wall clock from which an alert is from the
        /// past (a backlog caught up): held, not paged if it clears.
        #[serde(deserialize_with = "crate::component::seconds", default = "super::pager::default_past_after")]
        past_after_secs: f64,
        /// Seconds a late alert is held for its resolution to come.
        #[serde(deserialize_with = "crate::component::seconds", default = "super::pager::default_settle")]
        settle_secs: f64,
        /// Send alerts from the past too.
        #[serde(default)]
        page_past: bool,
        /// fluxpipe's API as the receivers reach it (a proxy, a DNS
        /// name): the base of each alert's `generatorURL`. Default: the
        /// pipeline's `[api] address`.
        #[serde(default)]
        external_url: Option<String>,
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
            // An unknown name is said once, by the keys every sink has.
            if input != OutputStream::Alerts.as_str() && OutputStream::parse(input).is_some() {
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
        out.extend(super::pager::problems(
            self.past_after_secs,
            self.settle_secs,
        ));
        out
    }
}

const BACKOFF_START: Duration = Duration::from_secs(1);
/// How long the last attempt at shutdown may take.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One alert as Alertmanager will see it.
#[derive(Debug, Clone)]
struct Tracked {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    starts_at: String,
    /// Set once resolved: the time it ended, and when we learned it.
    resolved: Option<(String, Instant)>,
    delivered: bool,
    /// A late firing held until its cluster settles (its resolution may
    /// yet come).
    held: bool,
    /// Where the receiver's link leads (empty without an API).
    generator_url: String,
}

/// Where an alert's subject is shown: the job's or the cluster's nodes'
/// answer of the query API, or the status page.
fn generator_url(base: &str, labels: &BTreeMap<String, String>) -> String {
    let base = base.trim_end_matches('/');
    let label = |k: &str| labels.get(k).map(String::as_str);
    let mut url = match reqwest::Url::parse(base) {
        Ok(u) => u,
        Err(_) => return String::new(),
    };
    match (label("jobid"), label("node"), label("flux_cluster")) {
        (Some(job), _, cluster) => {
            url.set_path(&format!("/api/v1/jobs/{job}"));
            if let Some(c) = cluster {
                url.query_pairs_mut().append_pair("cluster", c);
            }
        }
        (None, Some(_), Some(cluster)) => {
            url.set_path("/api/v1/nodes");
            url.query_pairs_mut().append_pair("cluster", cluster);
        }
        _ => url.set_path("/"),
    }
    url.to_string()
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
            "generatorURL": self.generator_url,
        })
    }
}

/// What taking a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Kept, to be sent (or held, if late).
    Kept,
    /// From the past: not to be paged.
    NotPaged,
}

/// The alerts the sink holds, by identity (their labels).
#[derive(Debug, Default)]
struct Book {
    alerts: HashMap<String, Tracked>,
    /// What is paged, held, left out.
    pager: Pager,
    /// The base of `generatorURL`s (none: empty ones).
    api_url: Option<String>,
}

impl Book {
    /// Take one alert record from the `alerts` stream, at `now` (wall
    /// clock, seconds) and `at` (the sink's clock).
    fn take(&mut self, record: &AlertRecord, now: f64, at: Instant) -> Taken {
        let alert = Alert::of(record);
        let verdict = self.pager.take(&alert, now, at);
        if verdict == Verdict::NotPaged {
            self.alerts.remove(&alert.identity);
            return Taken::NotPaged;
        }
        let labels = record.labels.clone();
        let resolved = alert.resolved.then(|| {
            let ends = record.ends_at.clone();
            (ends.unwrap_or_else(|| rfc3339(now)), at)
        });
        let generator_url = self
            .api_url
            .as_deref()
            .map(|base| generator_url(base, &labels))
            .unwrap_or_default();
        self.alerts.insert(
            alert.identity,
            Tracked {
                annotations: record.annotations.clone(),
                labels,
                starts_at: record.starts_at.clone(),
                resolved,
                delivered: false,
                held: verdict == Verdict::Hold,
                generator_url,
            },
        );
        Taken::Kept
    }

    /// Let go of late alerts held long enough: still firing, they are sent.
    fn release(&mut self, at: Instant) {
        for id in self.pager.release(at) {
            if let Some(a) = self.alerts.get_mut(&id) {
                a.held = false;
            }
        }
    }

    /// When the next held alert is let go.
    fn next_release(&self) -> Option<Instant> {
        self.pager.next_release()
    }

    /// Forget resolved alerts re-sent long enough.
    fn expire(&mut self, keep: Duration) {
        self.alerts.retain(|_, a| {
            a.resolved
                .as_ref()
                .is_none_or(|(_, at)| at.elapsed() < keep)
        });
    }

    /// Whether an alert not held waits to be delivered.
    fn undelivered(&self) -> bool {
        self.alerts.values().any(|a| !a.delivered && !a.held)
    }

    /// Alerts not yet delivered (held ones included).
    fn undelivered_count(&self) -> u64 {
        self.alerts.values().filter(|a| !a.delivered).count() as u64
    }

    /// The request body: every alert, or only the undelivered ones; never
    /// those held.
    fn body(&self, all: bool, ahead: Duration) -> (usize, Vec<u8>) {
        let batch: Vec<Value> = self
            .alerts
            .values()
            .filter(|a| !a.held && (all || !a.delivered))
            .map(|a| a.payload(ahead))
            .collect();
        (batch.len(), Value::Array(batch).to_string().into_bytes())
    }

    /// What [`Self::body`] held is delivered.
    fn mark_delivered(&mut self) {
        for a in self.alerts.values_mut().filter(|a| !a.held) {
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
        metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => self.name.clone())
            .increment(1);
        tracing::warn!(sink = %self.name, url = %self.url, "{what}: {e}");
    }
}

pub async fn run(
    name: &str,
    config: AlertmanagerSinkConfig,
    mut rx: SinkRx,
    ctx: &SinkContext,
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
    let mut book = Book {
        pager: Pager::new(Past::new(
            config.past_after_secs,
            config.settle_secs,
            config.page_past,
        )),
        api_url: config.external_url.clone().or_else(|| ctx.api_url.clone()),
        ..Book::default()
    };
    let not_paged =
        metrics::counter!(metric::FLUXPIPE_ALERTS_NOT_PAGED_TOTAL, "sink" => name.to_string());
    not_paged.increment(0);
    let mut buf = Vec::new();
    let mut next_full = Instant::now() + resend;
    let mut backoff = BACKOFF_START;
    let mut retry_at: Option<Instant> = None;
    loop {
        let wake = [retry_at, book.next_release()]
            .into_iter()
            .flatten()
            .fold(next_full, Instant::min);
        let mut closed = false;
        tokio::select! {
            n = rx.recv_many(&mut buf, 1024) => {
                closed = n == 0;
                // Alerts firing again after a restart are announced anew
                // from the restored state, so records are done with here.
                rx.done_with(n as u64);
                let (wall, at) = (crate::keyed::alerts::wall_now(), Instant::now());
                for rec in buf.drain(..) {
                    match rec.as_alert().map(|a| book.take(a, wall, at)) {
                        Some(Taken::Kept) => {}
                        Some(Taken::NotPaged) => not_paged.increment(1),
                        None => poster.error("record skipped", "not an alert record"),
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        book.release(now);
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
        let mut book = Book {
            pager: Pager::new(Past {
                page: true,
                ..Past::default()
            }),
            ..Book::default()
        };
        let take = |book: &mut Book, a: &AlertRecord| book.take(a, 1.8e9, Instant::now());
        let firing = AlertRecord::of_job("firing", "f1", 1_704_067_200.0, None);
        let resolved =
            AlertRecord::of_job("resolved", "f1", 1_704_067_200.0, Some(1_704_070_800.0));
        take(&mut book, &firing);
        let (n, body) = book.body(false, Duration::from_secs(60));
        assert_eq!(n, 1);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["startsAt"], "2024-01-01T00:00:00Z");
        assert!(v[0]["endsAt"].as_str().unwrap() > "2025");
        book.mark_delivered();
        assert!(!book.undelivered());
        take(&mut book, &resolved);
        assert_eq!(book.alerts.len(), 1, "same labels");
        let (_, body) = book.body(false, Duration::from_secs(60));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["endsAt"], "2024-01-01T01:00:00Z");
        book.expire(Duration::from_secs(3600));
        assert_eq!(book.alerts.len(), 1);
        book.expire(Duration::ZERO);
        assert!(book.alerts.is_empty());
        assert_eq!(v[0]["generatorURL"], "", "no API, no link");
    }

    #[test]
    fn alerts_link_back_to_what_they_are_about() {
        let base = "http://fluxpipe.example.org:9464/";
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let job = labels(&[("jobid", "ƒ2"), ("flux_cluster", "pi cl")]);
        assert_eq!(
            generator_url(base, &job),
            "http://fluxpipe.example.org:9464/api/v1/jobs/%C6%922?cluster=pi+cl"
        );
        let node = labels(&[("node", "n1"), ("rank", "1"), ("flux_cluster", "c")]);
        assert_eq!(
            generator_url(base, &node),
            "http://fluxpipe.example.org:9464/api/v1/nodes?cluster=c"
        );
        let cluster = labels(&[("flux_cluster", "c"), ("source", "flux")]);
        assert_eq!(
            generator_url(base, &cluster),
            "http://fluxpipe.example.org:9464/"
        );
        assert_eq!(generator_url("not a url", &cluster), "");
    }

    fn alert(status: &str, job: &str, starts: f64, ends: Option<f64>) -> AlertRecord {
        AlertRecord::of_job(status, job, starts, ends)
    }

    /// A backlog two hours old: a job that sat in SCHED and then ran,
    /// and one still in SCHED. Only the one still stuck is paged, once
    /// the backlog's alerts stop coming.
    #[test]
    fn alerts_from_the_past_are_not_paged_and_what_still_fires_is_sent_once() {
        let mut book = Book::default();
        let now = 1.8e9;
        let t0 = Instant::now();
        let (old, ran) = (now - 7200.0, now - 5400.0);
        assert_eq!(
            book.take(&alert("firing", "fA", old, None), now, t0),
            Taken::Kept
        );
        assert_eq!(
            book.take(&alert("firing", "fB", old, None), now, t0),
            Taken::Kept
        );
        // Held: nothing to send yet.
        assert!(!book.undelivered());
        assert_eq!(book.body(true, Duration::from_secs(60)).0, 0);
        // A's resolution comes a little later: both of A's dropped.
        let t1 = t0 + Duration::from_secs(5);
        let resolved = alert("resolved", "fA", old, Some(ran));
        assert_eq!(book.take(&resolved, now + 5.0, t1), Taken::NotPaged);
        // It pushed B's hold on (the backlog still comes).
        book.release(t0 + Duration::from_secs(31));
        assert!(!book.undelivered(), "held while late alerts keep coming");
        assert_eq!(book.next_release(), Some(t1 + Duration::from_secs(30)));
        book.release(t1 + Duration::from_secs(30));
        let (n, body) = book.body(false, Duration::from_secs(60));
        assert_eq!(n, 1);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v[0]["labels"]["jobid"], "fB");
        book.mark_delivered();
        // Sent once; its resolution, late or not, goes out as well.
        let res_b = alert("resolved", "fB", old, Some(now - 3600.0));
        assert_eq!(
            book.take(&res_b, now + 60.0, t1 + Duration::from_secs(31)),
            Taken::Kept
        );
        assert!(book.undelivered());
        // A fresh alert goes out at once.
        let fresh = alert("firing", "fC", now - 10.0, None);
        assert_eq!(book.take(&fresh, now, t1), Taken::Kept);
        assert!(
            book.alerts
                .values()
                .any(|a| a.labels["jobid"] == "fC" && !a.held)
        );
    }
}
