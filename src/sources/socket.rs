//! `type = "socket"`: newline-delimited lines over TCP or a Unix stream
//! socket (many connections at once, each its own task), or UDP datagrams.
//!
//! Backpressure: a connection hands each line to the pipeline and waits
//! until it is taken before it reads on, so while the pipeline is full the
//! socket is not read and the client feels TCP flow control. Each
//! connection is its own task, so one that floods or stalls holds back only
//! itself (and its share of the shared queues).
//!
//! `max_connections` is a pool of permits taken *before* `accept`: a client
//! beyond the limit waits in the kernel's accept backlog until one of the
//! served connections ends.
//!
//! A line cut short by the client closing its connection was never
//! terminated, so it is not a line: it is sent to `dead_letter` with the
//! error "connection closed mid-line" and counted. Every terminated line
//! before it is delivered.
//!
//! Shutdown: stop accepting, stop reading (a line already read is still
//! handed on), wait for the connection tasks, remove the Unix socket file.

use super::config::source_config;
use super::lines::{Line, LineReader, READ_BYTES, split_bounded};
use super::{SourceContext, SourceSpec};
use crate::component::{Claim, Problem, Resource, SocketMode};
use anyhow::Context;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, UdpSocket, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

/// Largest UDP payload (IPv6 jumbograms aside).
const MAX_DATAGRAM: usize = 64 * 1024;

/// Pause after a failed `accept` (out of file descriptors, say), so a
/// persistent error does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

source_config! {
    /// `type = "socket"`: newline-delimited TCP or Unix stream, or UDP datagrams.
    SocketSourceConfig {
        #[serde(default)]
        mode: SocketMode,
        /// `host:port` (tcp, udp) or a socket path (unix).
        address: String,
        /// Most concurrent connections (tcp, unix); more wait in the backlog.
        #[serde(default = "default_max_connections")]
        max_connections: usize,
    }
}

fn default_max_connections() -> usize {
    256
}

impl SourceSpec for SocketSourceConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let addr = &self.address;
        match self.mode {
            SocketMode::Tcp | SocketMode::Udp => {
                if addr.parse::<std::net::SocketAddr>().is_err() {
                    out.push(Problem::new(
                        "address",
                        format!(" `{addr}`: not an IP address and port"),
                    ));
                }
            }
            SocketMode::Unix => {
                if let Some(parent) = Path::new(addr).parent()
                    && !parent.as_os_str().is_empty()
                    && !parent.is_dir()
                {
                    out.push(Problem::new(
                        "address",
                        format!(" `{addr}`: folder {} does not exist", parent.display()),
                    ));
                }
            }
        }
        if self.max_connections == 0 {
            out.push(Problem::new("max_connections", ": must be at least 1"));
        }
        out
    }

    fn claims(&self) -> Vec<Claim> {
        let addr = self.address.clone();
        let resource = match self.mode {
            SocketMode::Tcp => Resource::Tcp(addr),
            SocketMode::Udp => Resource::Udp(addr),
            SocketMode::Unix => Resource::Unix(addr),
        };
        vec![Claim::new("address", resource)]
    }
}

/// Serve the socket until shutdown; no positions.
pub async fn run(config: SocketSourceConfig, ctx: SourceContext) -> anyhow::Result<Option<String>> {
    listen(config, ctx).await.map(|()| None)
}

async fn listen(config: SocketSourceConfig, ctx: SourceContext) -> anyhow::Result<()> {
    match config.mode {
        SocketMode::Tcp => {
            let listener = TcpListener::bind(&config.address)
                .await
                .with_context(|| format!("cannot listen on tcp {}", config.address))?;
            tracing::info!(source = %ctx.name, address = %config.address, "listening (tcp)");
            serve(Listener::Tcp(listener), config.max_connections, &ctx).await;
            Ok(())
        }
        SocketMode::Unix => {
            let path = PathBuf::from(&config.address);
            let listener = bind_unix(&path)?;
            tracing::info!(source = %ctx.name, path = %path.display(), "listening (unix)");
            serve(
                Listener::Unix(listener, path.clone()),
                config.max_connections,
                &ctx,
            )
            .await;
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(source = %ctx.name, path = %path.display(), "cannot remove socket file: {e}");
            }
            Ok(())
        }
        SocketMode::Udp => {
            let socket = UdpSocket::bind(&config.address)
                .await
                .with_context(|| format!("cannot bind udp {}", config.address))?;
            tracing::info!(source = %ctx.name, address = %config.address, "listening (udp)");
            udp(socket, &ctx).await;
            Ok(())
        }
    }
}

/// Bind a Unix socket at `path`, first removing a socket file nobody
/// listens on any more. A live socket or a file of another kind is left
/// alone and refused.
fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "cannot listen on {}: it exists and is not a socket",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "cannot listen on {}: another process is listening there",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on unix {}", path.display()))
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Counts a source's open connections in `fluxpipe_socket_connections`
/// for as long as it lives.
pub(super) struct OpenConnection {
    gauge: metrics::Gauge,
}

impl OpenConnection {
    pub(super) fn new(source: &str) -> Self {
        let gauge = metrics::gauge!("fluxpipe_socket_connections", "source" => source.to_string());
        gauge.increment(1.0);
        metrics::counter!("fluxpipe_socket_connections_total", "source" => source.to_string())
            .increment(1);
        OpenConnection { gauge }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Accept connections until shutdown, each served by its own task; then
/// wait for those tasks.
async fn serve(listener: Listener, max_connections: usize, ctx: &SourceContext) {
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let tasks = TaskTracker::new();
    loop {
        // The permit first: beyond the limit, clients wait in the backlog.
        let permit = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            a = accept(&listener) => a,
        };
        match accepted {
            Ok((Conn::Tcp(stream), label)) => {
                tasks.spawn(connection(stream, label, ctx.clone(), permit));
            }
            Ok((Conn::Unix(stream), label)) => {
                tasks.spawn(connection(stream, label, ctx.clone(), permit));
            }
            Err(e) => {
                tracing::warn!(source = %ctx.name, "accept failed: {e}");
                metrics::counter!("fluxpipe_source_errors_total", "source" => ctx.name.to_string())
                    .increment(1);
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// One accepted connection and the label its lines are located by.
async fn accept(listener: &Listener) -> io::Result<(Conn, String)> {
    match listener {
        Listener::Tcp(l) => {
            let (stream, peer) = l.accept().await?;
            Ok((Conn::Tcp(stream), format!("tcp://{peer}")))
        }
        Listener::Unix(l, path) => {
            let (stream, _) = l.accept().await?;
            Ok((Conn::Unix(stream), format!("unix:{}", path.display())))
        }
    }
}

/// Read one connection's lines until it closes or shutdown.
async fn connection<S: AsyncRead + Unpin>(
    stream: S,
    label: String,
    ctx: SourceContext,
    _permit: OwnedSemaphorePermit,
) {
    let _open = OpenConnection::new(&ctx.name);
    tracing::info!(source = %ctx.name, peer = %label, "connection opened");
    let origin = ctx.default_origin();
    let mut reader = LineReader::new(
        BufReader::with_capacity(READ_BYTES, stream),
        ctx.decode.max_line_bytes,
    );
    let mut lineno = 0u64;
    let mut out = ctx.outbox();
    loop {
        // What is held goes on before waiting for the peer.
        if !reader.line_ready() && ctx.flush(&mut out).await.is_err() {
            break;
        }
        // Reading is cancel-safe: what was read of a line stays in the
        // reader. At shutdown a line not yet complete is left unread.
        let next = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            next = reader.next(false) => next,
        };
        let line = match next {
            Ok(Some(line)) => line,
            Ok(None) => {
                closed_mid_line(&mut reader, &ctx, &label, lineno + 1).await;
                break;
            }
            Err(e) => {
                tracing::debug!(source = %ctx.name, peer = %label, "read failed: {e}");
                closed_mid_line(&mut reader, &ctx, &label, lineno + 1).await;
                break;
            }
        };
        lineno += 1;
        if ctx
            .hold_line(&mut out, line, &origin, &|| format!("{label}:{lineno}"))
            .await
            .is_err()
        {
            break;
        }
    }
    // What was read is handed on.
    let _ = ctx.flush(&mut out).await;
    tracing::info!(source = %ctx.name, peer = %label, lines = lineno, "connection closed");
}

/// At the end of a connection: an unterminated last line is not delivered
/// but sent to `dead_letter` and counted.
async fn closed_mid_line<S: AsyncRead + Unpin>(
    reader: &mut LineReader<BufReader<S>>,
    ctx: &SourceContext,
    label: &str,
    lineno: u64,
) {
    if reader.pending() == 0 {
        return;
    }
    let len = reader.pending();
    // The input is over: this returns the held bytes (at most max_line_bytes).
    let bytes = match reader.next(true).await {
        Ok(Some(Line::Full(bytes))) => bytes.to_vec(),
        Ok(Some(Line::TooLong { prefix, .. })) => prefix.to_vec(),
        _ => Vec::new(),
    };
    ctx.dead_letter(
        &format!("{label}:{lineno}"),
        &format!("connection closed mid-line ({len} bytes without a newline)"),
        &bytes,
    )
    .await;
}

/// Receive datagrams until shutdown. A datagram holds one line or several
/// separated by newlines; each is bounded by `max_line_bytes`.
async fn udp(socket: UdpSocket, ctx: &SourceContext) {
    let origin = ctx.default_origin();
    let max = ctx.decode.max_line_bytes.max(1);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut lineno = 0u64;
    let mut out = ctx.outbox();
    loop {
        let received = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            r = socket.recv_from(&mut buf) => r,
        };
        let (n, peer) = match received {
            Ok(r) => r,
            Err(e) => {
                // ICMP errors and the like: the socket is still usable.
                tracing::debug!(source = %ctx.name, "udp receive failed: {e}");
                continue;
            }
        };
        for line in split_bounded(&buf[..n], max) {
            lineno += 1;
            if ctx
                .hold_line(&mut out, line, &origin, &|| {
                    format!("udp://{peer}:{lineno}")
                })
                .await
                .is_err()
            {
                return;
            }
        }
        // A datagram's lines go on together.
        if ctx.flush(&mut out).await.is_err() {
            return;
        }
    }
}
