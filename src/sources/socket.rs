//! `type = "socket"`: newline-delimited lines over TCP or a Unix stream
//! socket (many connections at once, each its own task), or UDP datagrams.
//!
//! Backpressure: a connection hands each line to the pipeline and waits
//! until it is taken before it reads on, so while the pipeline is full the
//! socket is not read and the client feels TCP flow control. Each
//! connection is its own task, so one that floods or stalls holds back only
//! itself (and its share of the shared queues).
//!
//! Limits, so idle or hostile clients cannot shut out the others: beyond
//! `max_connections`, or beyond `max_connections_per_peer` from one IP
//! address, a connection is closed at once and counted (not left waiting
//! in the accept backlog, where it would wait behind idle ones); a
//! connection that stops part way through a line for `read_timeout_secs`
//! is closed (the part goes to `dead_letter`); one that sends nothing for
//! `idle_timeout_secs` is closed if that is set (off by default: a
//! forwarder on a quiet cluster may send nothing for hours, and TCP would
//! lose its next line).
//!
//! For UDP, the datagrams the kernel dropped for lack of buffer space (the
//! socket's `drops` in `/proc/net/udp`) are exported.
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
use crate::telemetry::metric;
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

/// How often a UDP socket's drops are read from the kernel.
const UDP_DROPS_EVERY: Duration = Duration::from_secs(1);

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
        /// Most concurrent connections (tcp, unix); more are closed at once.
        #[serde(default = "default_max_connections")]
        max_connections: usize,
        /// Most concurrent connections from one IP address (tcp).
        #[serde(default = "default_max_connections_per_peer")]
        max_connections_per_peer: usize,
        /// Seconds a connection may stop part way through a line.
        #[serde(deserialize_with = "crate::component::seconds", default = "default_read_timeout")]
        read_timeout_secs: f64,
        /// Seconds a connection may send nothing at all; 0: no limit.
        #[serde(deserialize_with = "crate::component::seconds", default)]
        idle_timeout_secs: f64,
    }
}

fn default_max_connections() -> usize {
    256
}

fn default_max_connections_per_peer() -> usize {
    32
}

fn default_read_timeout() -> f64 {
    60.0
}

/// How each connection is bounded.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_connections: usize,
    per_peer: usize,
    read_timeout: Duration,
    idle_timeout: Option<Duration>,
}

impl Limits {
    /// How often a connection's progress is looked at: a quarter of the
    /// shortest timeout, so one passes at most a quarter late.
    fn look_every(&self) -> Duration {
        let shortest = match self.idle_timeout {
            Some(idle) => idle.min(self.read_timeout),
            None => self.read_timeout,
        };
        (shortest / 4).max(Duration::from_millis(10))
    }

    /// The timeout that has passed, if one has, for a connection quiet
    /// for `quiet` with part of a line held (`mid_line`) or none.
    fn passed(&self, mid_line: bool, quiet: Duration) -> Option<&'static str> {
        if mid_line {
            (quiet >= self.read_timeout).then_some("read_timeout_secs")
        } else {
            self.idle_timeout
                .filter(|t| quiet >= *t)
                .map(|_| "idle_timeout_secs")
        }
    }

    fn of(config: &SocketSourceConfig) -> Self {
        let secs = |s: f64| Duration::from_secs_f64(s.clamp(0.001, 1e9));
        Limits {
            max_connections: config.max_connections.max(1),
            per_peer: config.max_connections_per_peer.max(1),
            read_timeout: secs(config.read_timeout_secs),
            idle_timeout: (config.idle_timeout_secs > 0.0).then(|| secs(config.idle_timeout_secs)),
        }
    }
}

impl SourceSpec for SocketSourceConfig {
    fn heartbeats(&self) -> bool {
        true
    }

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
        if self.max_connections_per_peer == 0 {
            out.push(Problem::new(
                "max_connections_per_peer",
                ": must be at least 1",
            ));
        }
        if self.read_timeout_secs.is_nan() || self.read_timeout_secs <= 0.0 {
            out.push(Problem::new("read_timeout_secs", ": must be more than 0"));
        }
        if self.idle_timeout_secs.is_nan() || self.idle_timeout_secs < 0.0 {
            out.push(Problem::new(
                "idle_timeout_secs",
                ": must be 0 (none) or more",
            ));
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
            serve(Listener::Tcp(listener), Limits::of(&config), &ctx).await;
            Ok(())
        }
        SocketMode::Unix => {
            let path = PathBuf::from(&config.address);
            let listener = bind_unix(&path)?;
            tracing::info!(source = %ctx.name, path = %path.display(), "listening (unix)");
            serve(
                Listener::Unix(listener, path.clone()),
                Limits::of(&config),
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
        let gauge =
            metrics::gauge!(metric::FLUXPIPE_SOCKET_CONNECTIONS, "source" => source.to_string());
        gauge.increment(1.0);
        metrics::counter!(metric::FLUXPIPE_SOCKET_CONNECTIONS_TOTAL, "source" => source.to_string())
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
async fn serve(listener: Listener, limits: Limits, ctx: &SourceContext) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Peers::default();
    let tasks = TaskTracker::new();
    let mut refused = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            a = accept(&listener) => a,
        };
        let (conn, label, ip) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(source = %ctx.name, "accept failed: {e}");
                metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => ctx.name.to_string())
                    .increment(1);
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        // Beyond a limit the connection is dropped at once (closed): a
        // client waiting in the backlog behind idle ones would never know.
        let admitted = match permits.clone().try_acquire_owned() {
            Err(_) => Err("max_connections"),
            Ok(permit) => match peers.admit(ip, limits.per_peer) {
                Some(peer) => Ok((permit, peer)),
                None => Err("max_connections_per_peer"),
            },
        };
        let (permit, peer) = match admitted {
            Ok(a) => a,
            Err(limit) => {
                refused += 1;
                metrics::counter!(metric::FLUXPIPE_SOURCE_CONNECTIONS_REFUSED_TOTAL, "source" => ctx.name.to_string())
                    .increment(1);
                // The first, then every power of two: a flood stays readable.
                if refused.is_power_of_two() {
                    tracing::warn!(source = %ctx.name, peer = %label, refused, "connection refused: {limit} reached");
                }
                continue;
            }
        };
        let held = Held {
            _permit: permit,
            _peer: peer,
        };
        match conn {
            Conn::Tcp(stream) => {
                tasks.spawn(connection(stream, label, ctx.clone(), limits, held));
            }
            Conn::Unix(stream) => {
                tasks.spawn(connection(stream, label, ctx.clone(), limits, held));
            }
        }
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

/// Open connections per IP address.
#[derive(Debug, Default, Clone)]
struct Peers(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

impl Peers {
    /// A place for one more connection from `ip` (none: a Unix socket),
    /// if it has fewer than `limit`.
    fn admit(&self, ip: Option<std::net::IpAddr>, limit: usize) -> Option<PeerSlot> {
        let Some(ip) = ip else {
            return Some(PeerSlot(None));
        };
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot(Some((self.clone(), ip))))
    }
}

/// One connection's place in its peer's count, given back when dropped.
struct PeerSlot(Option<(Peers, std::net::IpAddr)>);

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some((peers, ip)) = self.0.take() {
            let mut open = peers.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        }
    }
}

/// What a served connection holds until it ends.
struct Held {
    _permit: OwnedSemaphorePermit,
    _peer: PeerSlot,
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// One accepted connection, the label its lines are located by, and its
/// peer's address (TCP).
async fn accept(listener: &Listener) -> io::Result<(Conn, String, Option<std::net::IpAddr>)> {
    match listener {
        Listener::Tcp(l) => {
            let (stream, peer) = l.accept().await?;
            Ok((Conn::Tcp(stream), format!("tcp://{peer}"), Some(peer.ip())))
        }
        Listener::Unix(l, path) => {
            let (stream, _) = l.accept().await?;
            Ok((Conn::Unix(stream), format!("unix:{}", path.display()), None))
        }
    }
}

/// Read one connection's lines until it closes or shutdown.
async fn connection<S: AsyncRead + Unpin>(
    stream: S,
    label: String,
    ctx: SourceContext,
    limits: Limits,
    _held: Held,
) {
    let _open = OpenConnection::new(&ctx.name);
    tracing::info!(source = %ctx.name, peer = %label, "connection opened");
    let origin = ctx.default_origin();
    let mut reader = LineReader::new(
        BufReader::with_capacity(READ_BYTES, stream),
        ctx.decode.max_line_bytes,
    );
    let mut lineno = 0u64;
    let mut out = ctx.record_buffer();
    loop {
        // What is held goes on before waiting for the peer.
        if !reader.line_ready() && ctx.flush(&mut out).await.is_err() {
            break;
        }
        // Reading is cancel-safe: what was read of a line stays in the
        // reader. At shutdown a line not yet complete is left unread.
        // While waiting, a look at the progress now and then: part of a
        // line held with no more for `read_timeout`, or nothing at all for
        // `idle_timeout`, ends the connection.
        let mut progress = None;
        let next = loop {
            if reader.line_ready() {
                break Some(reader.next(false).await);
            }
            let (held, since) =
                *progress.get_or_insert_with(|| (reader.pending(), tokio::time::Instant::now()));
            let timeout = tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => break None,
                next = reader.next(false) => break Some(next),
                _ = tokio::time::sleep(limits.look_every()) => {
                    let now = reader.pending();
                    if now != held {
                        progress = Some((now, tokio::time::Instant::now()));
                        continue;
                    }
                    limits.passed(held > 0, since.elapsed())
                }
            };
            if let Some(why) = timeout {
                metrics::counter!(metric::FLUXPIPE_SOCKET_TIMEOUTS_TOTAL, "source" => ctx.name.to_string(), "timeout" => why)
                    .increment(1);
                tracing::info!(source = %ctx.name, peer = %label, "connection closed: {why} passed");
                closed_mid_line(&mut reader, &ctx, &label, lineno + 1, "stalled mid-line").await;
                break None;
            }
        };
        let Some(next) = next else {
            break;
        };
        let line = match next {
            Ok(Some(line)) => line,
            end => {
                if let Err(e) = end {
                    tracing::debug!(source = %ctx.name, peer = %label, "read failed: {e}");
                }
                closed_mid_line(
                    &mut reader,
                    &ctx,
                    &label,
                    lineno + 1,
                    "connection closed mid-line",
                )
                .await;
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
    why: &str,
) {
    if reader.pending() == 0 {
        return;
    }
    let len = reader.pending();
    // The held bytes (at most max_line_bytes), without waiting for more.
    let bytes = match reader.held() {
        Some(Line::Full(bytes)) => bytes.to_vec(),
        Some(Line::TooLong { prefix, .. }) => prefix.to_vec(),
        None => Vec::new(),
    };
    ctx.dead_letter(
        &format!("{label}:{lineno}"),
        &format!("{why} ({len} bytes without a newline)"),
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
    let mut out = ctx.record_buffer();
    let drops = UdpDrops::of(&socket, &ctx.name);
    let mut look = tokio::time::interval(UDP_DROPS_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let received = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            r = socket.recv_from(&mut buf) => r,
            _ = look.tick() => {
                if let Some(d) = &drops {
                    d.report();
                }
                continue;
            }
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

/// The datagrams the kernel dropped for a UDP socket (its receive buffer
/// was full), as `/proc/net/udp` and `udp6` count them per socket, exported
/// as `fluxpipe_udp_receive_drops_total`.
struct UdpDrops {
    inode: u64,
    counter: metrics::Counter,
}

impl UdpDrops {
    /// None where the socket's inode cannot be known (no `/proc`).
    fn of(socket: &UdpSocket, source: &str) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", socket.as_raw_fd())).ok()?;
        let inode = link
            .to_str()?
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()?;
        let counter = metrics::counter!(metric::FLUXPIPE_UDP_RECEIVE_DROPS_TOTAL, "source" => source.to_string());
        counter.absolute(0);
        Some(UdpDrops { inode, counter })
    }

    fn report(&self) {
        for table in ["/proc/self/net/udp", "/proc/self/net/udp6"] {
            if let Ok(text) = std::fs::read_to_string(table)
                && let Some(n) = udp_drops(&text, self.inode)
            {
                self.counter.absolute(n);
                return;
            }
        }
    }
}

/// The `drops` of the socket with this inode in a `/proc/net/udp` table
/// (its last column; the inode is the tenth).
fn udp_drops(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 13 || fields.get(9)?.parse::<u64>().ok()? != inode {
            return None;
        }
        fields.last()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TABLE: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  75: 00000000:02CB 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2358 2 ffff81082a538c80 0
 111: 0100007F:006F 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2286 2 ffff81042dd35c80 146348
";

    #[test]
    fn a_sockets_drops_are_found_by_its_inode() {
        assert_eq!(udp_drops(TABLE, 2286), Some(146348));
        assert_eq!(udp_drops(TABLE, 2358), Some(0));
        assert_eq!(udp_drops(TABLE, 1), None);
        assert_eq!(udp_drops("", 2286), None);
    }

    #[test]
    fn timeouts_pass_by_what_is_held() {
        let limits = Limits {
            max_connections: 1,
            per_peer: 1,
            read_timeout: Duration::from_secs(60),
            idle_timeout: None,
        };
        assert_eq!(limits.passed(true, Duration::from_secs(59)), None);
        assert_eq!(
            limits.passed(true, Duration::from_secs(60)),
            Some("read_timeout_secs")
        );
        assert_eq!(limits.passed(false, Duration::from_secs(1_000_000)), None);
        let idle = Limits {
            idle_timeout: Some(Duration::from_secs(10)),
            ..limits
        };
        assert_eq!(
            idle.passed(false, Duration::from_secs(10)),
            Some("idle_timeout_secs")
        );
        assert_eq!(idle.look_every(), Duration::from_millis(2500));
    }

    #[test]
    fn a_peer_gets_its_limit_and_its_places_back() {
        let peers = Peers::default();
        let ip = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        let a = peers.admit(ip, 2);
        let b = peers.admit(ip, 2);
        assert!(a.is_some() && b.is_some());
        assert!(peers.admit(ip, 2).is_none());
        assert!(peers.admit(Some([127, 0, 0, 2].into()), 2).is_some());
        drop(a);
        assert!(peers.admit(ip, 2).is_some());
        // Unix sockets have no peer address: no per-peer limit.
        assert!(peers.admit(None, 0).is_some());
    }

    proptest! {
        #[test]
        fn reading_any_table_never_panics(text in ".{0,400}", inode in any::<u64>()) {
            let _ = udp_drops(&text, inode);
        }
    }
}
