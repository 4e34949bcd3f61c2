//! A sink's dealings with a destination that fails (a database away, a
//! full disk): every attempt is retried with backoff (100 ms doubling to
//! 30 s); an outage is logged when it starts and when it ends, a fault at
//! every try; each failure is counted in `fluxpipe_sink_errors_total`.
//! Once the pipeline shuts down, one deadline ([`SHUTDOWN_GRACE`]) bounds
//! all that is left, counted from the shutdown itself, not from the
//! channel closing (which waits for the last checkpoint round, itself
//! waiting for this sink).

use super::SinkRx;
use crate::telemetry::metric;
use std::time::Duration;
use tokio::time::Instant;

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a sink keeps trying, once the pipeline is shutting down,
/// before it gives up on what it has not delivered.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A failure, as the retry logs it.
pub trait Failure: std::fmt::Display {
    /// Something that passes by itself (a destination away or full),
    /// logged once, rather than a fault someone must mend, logged at every
    /// try. Both are retried.
    fn is_outage(&self) -> bool;
}

impl Failure for std::io::Error {
    fn is_outage(&self) -> bool {
        true
    }
}

/// The retry state of one sink.
pub struct Retry<'a> {
    name: &'a str,
    /// What the sink waits for, in words ("the database answers").
    waiting_for: &'static str,
    backoff: Duration,
    failures: u32,
    deadline: Option<Instant>,
    shutdown: &'a tokio_util::sync::CancellationToken,
}

/// What became of an attempt.
pub enum Tried<T> {
    Done(T),
    /// Shutting down, and the grace is over.
    GaveUp,
}

impl<'a> Retry<'a> {
    pub fn new(
        name: &'a str,
        shutdown: &'a tokio_util::sync::CancellationToken,
        waiting_for: &'static str,
    ) -> Self {
        Retry {
            name,
            waiting_for,
            backoff: BACKOFF_START,
            failures: 0,
            deadline: None,
            shutdown,
        }
    }

    /// The shutdown deadline, set when the pipeline is first seen shutting
    /// down (or the channel closed).
    pub fn deadline(&mut self, rx: &SinkRx) -> Option<Instant> {
        if self.deadline.is_none() && (rx.is_closed() || self.shutdown.is_cancelled()) {
            self.deadline = Some(Instant::now() + SHUTDOWN_GRACE);
        }
        self.deadline
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// `what` succeeded: an outage, if there was one, is over.
    pub fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            tracing::info!(sink = %self.name, tries = self.failures + 1, "{what} succeeded: {} again", self.waiting_for);
        }
        self.failures = 0;
        self.backoff = BACKOFF_START;
    }

    /// `what` failed with `e`: counted, logged, and waited out (the
    /// backoff). False once the shutdown's grace is over: give up.
    pub async fn failed(&mut self, what: &str, e: &impl Failure, rx: &SinkRx) -> bool {
        metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => self.name.to_string())
            .increment(1);
        self.failures += 1;
        if !e.is_outage() {
            tracing::error!(sink = %self.name, tries = self.failures, "{what} failed, retrying (records wait): {e}");
        } else if self.failures == 1 {
            tracing::warn!(sink = %self.name, "{what} failed, retrying until {}: {e}", self.waiting_for);
        } else {
            tracing::debug!(sink = %self.name, tries = self.failures, "{what} failed: {e}");
        }
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        // Looked at every second: a shutdown's deadline cuts it short.
        let wake = Instant::now() + pause;
        loop {
            let now = Instant::now();
            let until = self.deadline(rx).map_or(wake, |at| wake.min(at));
            if now >= until {
                break;
            }
            tokio::time::sleep_until(until.min(now + Duration::from_secs(1))).await;
        }
        self.deadline(rx).is_none_or(|at| Instant::now() < at)
    }

    /// Run `attempt` until it succeeds, or until the shutdown deadline.
    pub async fn until_done<T, E, F, Fut>(
        &mut self,
        what: &str,
        rx: &SinkRx,
        mut attempt: F,
    ) -> Tried<T>
    where
        E: Failure,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        loop {
            let result = match self.deadline(rx) {
                Some(at) => match tokio::time::timeout_at(at, attempt()).await {
                    Ok(r) => r,
                    Err(_) => return Tried::GaveUp,
                },
                None => attempt().await,
            };
            match result {
                Ok(v) => {
                    self.succeeded(what);
                    return Tried::Done(v);
                }
                Err(e) => {
                    if !self.failed(what, &e, rx).await {
                        return Tried::GaveUp;
                    }
                }
            }
        }
    }
}
