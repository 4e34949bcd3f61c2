//! `type = "socket"`: JSON Lines to a TCP or Unix stream listener.
//!
//! The sink connects when it has something to send and keeps the
//! connection. On a connect or write error it reconnects with exponential
//! backoff (100 ms doubling to 10 s) and writes the records it holds again:
//! delivery is at least once (a batch cut short by an error is written
//! whole on the next connection; fluxpipe's own sources skip events they
//! have applied). Before each write it checks whether the peer has closed
//! the connection, so records are not written into a connection already
//! known to be dead. What was accepted by the kernel on a connection the
//! peer then drops is beyond the reach of a protocol with no
//! acknowledgements.
//!
//! At shutdown (its channel closed) the sink keeps trying to deliver what
//! it holds for [`SHUTDOWN_GRACE`], then drops the rest, counts it and
//! fails.

use super::{SinkContext, SinkRx};
use crate::component::{Problem, SocketMode};
use crate::output::OutputRecord;
use crate::telemetry::metric;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;

crate::sinks::config::sink_config! {
    /// `type = "socket"`: JSON Lines to a TCP or Unix listener, reconnecting.
    SocketSinkConfig {
        #[serde(default)]
        mode: SocketMode,
        address: String,
    }
}

impl super::SinkSpec for SocketSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        if self.mode == SocketMode::Udp {
            vec![Problem::new(
                "mode",
                ": udp is not supported by the socket sink; use tcp or unix",
            )]
        } else {
            Vec::new()
        }
    }
}

/// First pause after a failure; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long records still held at shutdown keep being retried.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Most records written in one go.
const BATCH_RECORDS: usize = 512;
/// Longest a connect may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    async fn open(mode: SocketMode, address: &str) -> io::Result<Conn> {
        let connect = async {
            match mode {
                SocketMode::Unix => UnixStream::connect(address).await.map(Conn::Unix),
                // Refused by validation; treated as tcp if it ever got here.
                SocketMode::Tcp | SocketMode::Udp => {
                    let s = TcpStream::connect(address).await?;
                    s.set_nodelay(true)?;
                    Ok(Conn::Tcp(s))
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }

    /// Whether the peer is still there: it has not closed its end or reset
    /// the connection. Anything it sent us is read and ignored.
    fn alive(&self) -> bool {
        let mut scratch = [0u8; 1024];
        loop {
            let read = match self {
                Conn::Tcp(s) => s.try_read(&mut scratch),
                Conn::Unix(s) => s.try_read(&mut scratch),
            };
            match read {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(bytes).await,
            Conn::Unix(s) => s.write_all(bytes).await,
        }
    }
}

/// Exponential backoff between attempts.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Backoff(BACKOFF_START)
    }

    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        d
    }
}

pub async fn run(
    name: &str,
    config: SocketSinkConfig,
    mut rx: SinkRx,
    _ctx: &SinkContext,
) -> anyhow::Result<()> {
    let target = match config.mode {
        SocketMode::Unix => format!("unix:{}", config.address),
        _ => format!("tcp://{}", config.address),
    };
    let mut conn: Option<Conn> = None;
    let mut batch: Vec<Arc<OutputRecord>> = Vec::with_capacity(BATCH_RECORDS);
    let mut bytes: Vec<u8> = Vec::new();
    let mut backoff = Backoff::new();
    let mut closed_at: Option<Instant> = None;
    loop {
        if batch.is_empty() {
            if rx.recv_many(&mut batch, BATCH_RECORDS).await == 0 {
                return Ok(());
            }
            bytes.clear();
            for rec in &batch {
                bytes.extend_from_slice(rec.line().as_bytes());
                bytes.push(b'\n');
            }
        }
        if conn.as_ref().is_some_and(|c| !c.alive()) {
            tracing::info!(sink = name, %target, "peer closed the connection; reconnecting");
            conn = None;
        }
        let result = match &mut conn {
            Some(c) => c.write_all(&bytes).await,
            None => match Conn::open(config.mode, &config.address).await {
                Ok(mut c) => {
                    tracing::info!(sink = name, %target, "connected");
                    let r = c.write_all(&bytes).await;
                    conn = Some(c);
                    r
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => {
                rx.delivered(batch.len() as u64);
                batch.clear();
                backoff = Backoff::new();
            }
            Err(e) => {
                conn = None;
                metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => name.to_string())
                    .increment(1);
                let pause = backoff.next();
                tracing::warn!(sink = name, %target, held = batch.len(), retry_in = ?pause, "cannot deliver: {e}");
                if closed_at.is_none() && rx.is_closed() {
                    closed_at = Some(Instant::now());
                }
                if let Some(at) = closed_at
                    && at.elapsed() + pause > SHUTDOWN_GRACE
                {
                    let lost = batch.len() + rx.len();
                    metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => name.to_string(), "reason" => "undeliverable")
                        .increment(lost as u64);
                    anyhow::bail!("{lost} records not delivered to {target} at shutdown: {e}");
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}
