//! JSON Lines through a buffered writer, for the sinks that write them
//! (stdout, file): records taken from the queue in batches, flushed when
//! the queue has run dry for a moment and now and then under load.

use super::SinkRx;
use crate::checkpoint::offsets::Mark;
use crate::output::OutputRecord;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};

/// Longest a written record waits in the buffer under steady load.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// How long a caught-up file sink waits for more before it flushes. A
/// flush of a tokio file is a trip to the blocking thread pool: done for
/// every record of a steady trickle, it cost more than the records. Standard
/// output, read live, flushes at once.
pub const FILE_LINGER: Duration = Duration::from_millis(2);

/// Most records taken from the queue at once.
pub const BATCH: usize = 1024;

/// Records written, and not yet flushed, through a buffered writer: the
/// loop of the stdout and file sinks. The records taken since the last
/// flush are kept until it succeeds, so after a failed write (a full disk)
/// they can be written again, the same bytes in the same places, into a
/// file cut back to its last flush ([`Lines::reopen`]).
pub struct Lines<W: AsyncWrite + Unpin> {
    pub out: BufWriter<W>,
    batch: Vec<Arc<OutputRecord>>,
    /// Taken since the last flush, in order.
    pending: Vec<Arc<OutputRecord>>,
    /// How many of `pending` are in `out`'s buffer (or past it).
    written: usize,
    /// How many of `pending` `mark` has counted (a record written again
    /// is not counted again).
    marked: usize,
    /// Bytes written through `out` since it was opened: flushed, and not.
    flushed_bytes: u64,
    buffered_bytes: u64,
    flushed_at: Instant,
    linger: Duration,
    /// Where the records and bytes written are counted (file sinks).
    mark: Option<Arc<Mark>>,
}

impl<W: AsyncWrite + Unpin> Lines<W> {
    /// Lines written to `out`, flushed `linger` after the queue ran dry.
    pub fn new(out: W, linger: Duration) -> Self {
        Lines {
            out: BufWriter::new(out),
            batch: Vec::with_capacity(BATCH),
            pending: Vec::with_capacity(BATCH),
            written: 0,
            marked: 0,
            flushed_bytes: 0,
            buffered_bytes: 0,
            flushed_at: Instant::now(),
            linger,
            mark: None,
        }
    }

    /// Count the records and bytes written in `mark`.
    pub fn marked(mut self, mark: Arc<Mark>) -> Self {
        self.mark = Some(mark);
        self
    }

    /// Write to `out` from now on, its buffer empty: what was in the old
    /// one and not flushed is written again by the next
    /// [`Lines::write_again`].
    pub fn reopen(&mut self, out: W) {
        self.out = BufWriter::new(out);
        self.written = 0;
        self.flushed_bytes = 0;
        self.buffered_bytes = 0;
    }

    /// Bytes flushed through `out` since it was opened.
    pub fn flushed_bytes(&self) -> u64 {
        self.flushed_bytes
    }

    /// Records taken and not flushed.
    pub fn unflushed(&self) -> u64 {
        self.pending.len() as u64
    }

    /// When the buffer must be flushed: a moment after the queue ran dry,
    /// or at once once it has waited `FLUSH_EVERY`.
    pub fn flush_due(&self) -> Option<tokio::time::Instant> {
        (!self.pending.is_empty()).then(|| {
            let every = self.flushed_at + FLUSH_EVERY;
            let linger = Instant::now() + self.linger;
            tokio::time::Instant::from_std(every.min(linger))
        })
    }

    /// Wait for records or for the flush to come due; cancel-safe (it
    /// only waits), so it can race other events in a `select!`.
    pub async fn next(&mut self, rx: &mut SinkRx) -> Next {
        // Flush when nothing else has come for a moment, so a quiet feed
        // is not held back, and now and then under load.
        let due = self.flush_due().filter(|_| rx.is_empty());
        if due.is_some() && self.linger.is_zero() {
            return Next::Flush;
        }
        let n = match due {
            Some(due) => tokio::select! {
                n = rx.recv_many(&mut self.batch, BATCH) => n,
                _ = tokio::time::sleep_until(due) => return Next::Flush,
            },
            None => rx.recv_many(&mut self.batch, BATCH).await,
        };
        if n == 0 { Next::Closed } else { Next::Records }
    }

    /// Write the records taken.
    pub async fn write(&mut self, rx: &SinkRx) -> std::io::Result<()> {
        self.pending.append(&mut self.batch);
        self.write_again().await?;
        if self.flushed_at.elapsed() >= FLUSH_EVERY {
            self.flush(rx).await?;
        }
        Ok(())
    }

    /// Write the records taken and not yet in `out`'s buffer.
    pub async fn write_again(&mut self) -> std::io::Result<()> {
        while let Some(rec) = self.pending.get(self.written) {
            let line = rec.line().as_bytes();
            self.out.write_all(line).await?;
            self.out.write_all(b"\n").await?;
            let bytes = line.len() as u64 + 1;
            self.buffered_bytes += bytes;
            self.written += 1;
            if self.written > self.marked {
                self.marked = self.written;
                if let Some(mark) = &self.mark {
                    mark.wrote(bytes);
                }
            }
        }
        Ok(())
    }

    /// After a failed write or flush, given up: the records taken and not
    /// delivered, no longer counted here.
    pub fn abandon(&mut self) -> u64 {
        let n = (self.pending.len() + self.batch.len()) as u64;
        self.pending.clear();
        self.batch.clear();
        self.written = 0;
        self.marked = 0;
        n
    }

    /// Flush; the records flushed count as delivered.
    pub async fn flush(&mut self, rx: &SinkRx) -> std::io::Result<()> {
        self.out.flush().await?;
        rx.delivered(self.pending.len() as u64);
        self.pending.clear();
        self.written = 0;
        self.marked = 0;
        self.flushed_bytes += std::mem::take(&mut self.buffered_bytes);
        self.flushed_at = Instant::now();
        Ok(())
    }
}

/// What [`Lines::next`] waited for.
pub enum Next {
    Records,
    Flush,
    Closed,
}
