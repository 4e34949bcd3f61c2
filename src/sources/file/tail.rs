//! The async half: reading a tailed file, checking after each read that
//! it still begins as its fingerprint says.

use super::*;

pub(super) type Reader = LineReader<Tail>;

/// Why bytes read from a tailed file were thrown away: when they were read,
/// the file no longer began as its fingerprint says ([`Head::Other`] or
/// [`Head::Short`]), so they are not the rest of the file that was tracked.
#[derive(Debug)]
pub(super) struct Changed(pub(super) Head);

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Head::Short => f.write_str("truncated below its first line"),
            _ => f.write_str("rewritten in place with another first line"),
        }
    }
}

impl std::error::Error for Changed {}

/// An open tailed file, read by positioned reads on a blocking thread.
///
/// A file rewritten in place (same inode: truncated, then written again)
/// can be rewritten at any moment, between a check of its fingerprint and a
/// read as well as during a read. So the check comes after the read: every
/// read that returns bytes is followed, in the same blocking call, by a read
/// of the file's beginning, and the bytes are handed on only if the file
/// still begins as its fingerprint says. Had a rewrite begun before the read,
/// the beginning would be another (or incomplete) by then, and the read
/// fails with [`Changed`] instead. An idle file costs nothing more: a read
/// at the end returns no bytes and checks nothing.
pub(super) struct Tail {
    pub(super) file: Arc<std::fs::File>,
    pub(super) fp: u64,
    /// Offset of the next read.
    pub(super) offset: u64,
    pub(super) buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pub(super) used: usize,
    pub(super) job: Option<tokio::task::JoinHandle<std::io::Result<Vec<u8>>>>,
}

impl Tail {
    pub(super) fn new(file: std::fs::File, fp: u64, offset: u64) -> Self {
        Tail {
            file: Arc::new(file),
            fp,
            offset,
            buf: Vec::new(),
            used: 0,
            job: None,
        }
    }

    pub(super) async fn len(&self) -> std::io::Result<u64> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.metadata().map(|m| m.len()))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// Read a chunk at `offset`, then check that the file still begins as `fp`.
pub(super) fn read_checked(
    file: &std::fs::File,
    offset: u64,
    fp: u64,
    mut buf: Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    buf.resize(READ_BYTES, 0);
    let n = loop {
        match file.read_at(&mut buf, offset) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    if n == 0 {
        // At the end: an idle file keeps no buffer.
        return Ok(Vec::new());
    }
    buf.truncate(n);
    match check_head(file, fp)? {
        Head::Same => Ok(buf),
        head => Err(std::io::Error::other(Changed(head))),
    }
}

impl AsyncBufRead for Tail {
    fn poll_fill_buf(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.used >= this.buf.len() {
            if this.job.is_none() {
                let (file, offset, fp) = (this.file.clone(), this.offset, this.fp);
                let buf = std::mem::take(&mut this.buf);
                this.used = 0;
                this.job = Some(tokio::task::spawn_blocking(move || {
                    read_checked(&file, offset, fp, buf)
                }));
            }
            let job = this.job.as_mut().expect("a read is under way");
            let done = ready!(Pin::new(job).poll(cx));
            this.job = None;
            let chunk = done.map_err(std::io::Error::other)??;
            this.offset += chunk.len() as u64;
            this.buf = chunk;
            this.used = 0;
        }
        Poll::Ready(Ok(&this.buf[this.used..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.used = (this.used + amt).min(this.buf.len());
    }
}

impl super::super::lines::Buffered for Tail {
    fn buffer(&self) -> &[u8] {
        self.buf.get(self.used..).unwrap_or(&[])
    }
}

impl AsyncRead for Tail {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let chunk = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = chunk.len().min(out.remaining());
        out.put_slice(&chunk[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}
