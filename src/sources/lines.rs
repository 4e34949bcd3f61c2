//! Reading newline-delimited input with a bound on line length: an
//! over-long line is reported once (with its first bytes) and skipped to
//! its end, without buffering it, and reading goes on.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// A buffered reader whose buffered bytes can be looked at between reads:
/// what lets a line wholly in the buffer be returned in place, uncopied.
pub trait Buffered {
    /// The bytes read and not yet consumed.
    fn buffer(&self) -> &[u8];
}

impl<S: tokio::io::AsyncRead> Buffered for tokio::io::BufReader<S> {
    fn buffer(&self) -> &[u8] {
        tokio::io::BufReader::buffer(self)
    }
}

impl Buffered for &[u8] {
    fn buffer(&self) -> &[u8] {
        self
    }
}

/// Most bytes read from an input at once. Standard input and files are
/// read on tokio's blocking pool, a round trip between threads per read:
/// at the default 8 KiB that was one trip per ~60 journal lines.
pub const READ_BYTES: usize = 64 * 1024;

/// One item read, borrowed from the reader until its next read: the
/// reader's buffer is reused, not a new one allocated for every line.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Line<'a> {
    /// A complete line, without its `\n` (and `\r`).
    Full(&'a [u8]),
    /// A line longer than the limit: its first `max` bytes and its length.
    TooLong { prefix: &'a [u8], len: usize },
}

/// The lines of a buffer held whole (a datagram, a request body): split at
/// `\n`, a final `\n` and each line's `\r` left out, lines longer than
/// `max` reported with their first bytes. An empty buffer has no lines.
pub fn split_bounded(data: &[u8], max: usize) -> impl Iterator<Item = Line<'_>> {
    let max = max.max(1);
    let data = data.strip_suffix(b"\n").unwrap_or(data);
    let pieces = (!data.is_empty()).then(|| data.split(|b| *b == b'\n'));
    pieces.into_iter().flatten().map(move |piece| {
        if piece.len() > max {
            Line::TooLong {
                prefix: &piece[..max],
                len: piece.len(),
            }
        } else {
            Line::Full(piece.strip_suffix(b"\r").unwrap_or(piece))
        }
    })
}

/// Bounded line reader over any async buffered reader. A line cut short by
/// the end of input is kept and completed by later reads (a file being
/// appended to), unless the caller says the input is over.
pub struct LineReader<R> {
    inner: R,
    line: Assembly,
}

/// The line being read, apart from the input it is read from: what the
/// async [`LineReader`] and the blocking [`BlockingLineReader`] share.
struct Assembly {
    max: usize,
    /// The current line's bytes (at most `max`) and its full length so far.
    buf: Vec<u8>,
    len: usize,
    /// `buf` holds the line last returned: cleared when reading resumes.
    returned: bool,
    /// Bytes of the inner buffer lent out as the line last returned:
    /// consumed when reading resumes.
    lent: usize,
    /// Offset just past the last complete line returned.
    line_end: u64,
}

/// What one buffered chunk of input did to the line being read.
enum Step {
    /// The whole line (`body` bytes, then its newline) lies at the start of
    /// the chunk: lent in place, not copied.
    Lent { body: usize },
    /// `consume` bytes were taken into the line; `done` if it is complete.
    Took { consume: usize, done: bool },
}

impl Assembly {
    fn new(max: usize, offset: u64) -> Self {
        Assembly {
            max: max.max(1),
            buf: Vec::new(),
            len: 0,
            returned: false,
            lent: 0,
            line_end: offset,
        }
    }

    /// Before reading on: forget the line returned last; the bytes it
    /// borrowed from the input's buffer, to consume now.
    fn resume(&mut self) -> usize {
        if std::mem::take(&mut self.returned) {
            self.buf.clear();
        }
        std::mem::take(&mut self.lent)
    }

    /// A chunk of input (not empty).
    fn step(&mut self, chunk: &[u8]) -> Step {
        let (take, done) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let body = if done { take - 1 } else { take };
        if done && self.len == 0 {
            self.lent = take;
            self.line_end += take as u64;
            return Step::Lent { body };
        }
        if self.len < self.max {
            let room = self.max - self.len;
            self.buf.extend_from_slice(&chunk[..body.min(room)]);
        }
        self.len += body;
        if done {
            self.line_end += self.len as u64 + 1;
        }
        Step::Took {
            consume: take,
            done,
        }
    }

    /// The line lent in place, from the input's buffer.
    fn lent<'a>(&self, buffer: &'a [u8], body: usize) -> Line<'a> {
        let line = &buffer[..body];
        finish(&line[..body.min(self.max)], body, self.max)
    }

    /// At the end of the input for now: the unfinished last line if the
    /// input is over, else nothing (it is held for more).
    fn at_end(&mut self, input_over: bool) -> Option<Line<'_>> {
        if self.len == 0 || !input_over {
            return None;
        }
        self.held()
    }

    fn held(&mut self) -> Option<Line<'_>> {
        if self.len == 0 {
            return None;
        }
        self.line_end += self.len as u64;
        Some(self.take())
    }

    fn take(&mut self) -> Line<'_> {
        let len = std::mem::take(&mut self.len);
        self.returned = true;
        finish(&self.buf, len, self.max)
    }
}

impl<R: AsyncBufRead + Buffered + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Self::starting_at(inner, max, 0)
    }

    /// A reader whose input starts at byte `offset` of a file.
    pub fn starting_at(inner: R, max: usize, offset: u64) -> Self {
        LineReader {
            inner,
            line: Assembly::new(max, offset),
        }
    }

    /// Offset just past the last complete line returned: where a restart
    /// resumes without re-reading or skipping.
    pub fn position(&self) -> u64 {
        self.line.line_end
    }

    /// Bytes of an unfinished last line held so far.
    pub fn pending(&self) -> usize {
        self.line.len
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next line, or `None` at the end of the input for now. When
    /// `input_over` (a socket that closed, stdin at EOF), a last line with
    /// no newline is returned; otherwise it is held until its newline comes.
    pub async fn next(&mut self, input_over: bool) -> std::io::Result<Option<Line<'_>>> {
        let lent = self.line.resume();
        if lent > 0 {
            self.inner.consume(lent);
        }
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(self.line.at_end(input_over));
            }
            match self.line.step(chunk) {
                Step::Lent { body } => return Ok(Some(self.line.lent(self.inner.buffer(), body))),
                Step::Took { consume, done } => {
                    self.inner.consume(consume);
                    if done {
                        return Ok(Some(self.line.take()));
                    }
                }
            }
        }
    }

    /// The unfinished last line held so far, given up as it is (a
    /// connection that ends without its newline), without reading more.
    pub fn held(&mut self) -> Option<Line<'_>> {
        self.line.held()
    }
}

/// [`LineReader`] over a blocking reader (`fluxpipe replay`'s files,
/// plain or decompressed), read to its end.
pub struct BlockingLineReader<R> {
    inner: R,
    line: Assembly,
}

impl<R: std::io::BufRead + Buffered> BlockingLineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        BlockingLineReader {
            inner,
            line: Assembly::new(max, 0),
        }
    }

    /// The next line, or `None` at the end of the input; a last line with
    /// no newline is returned too. (Not an `Iterator`: each line borrows
    /// the reader's buffer until the next.)
    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        let lent = self.line.resume();
        if lent > 0 {
            self.inner.consume(lent);
        }
        loop {
            let chunk = match self.inner.fill_buf() {
                Ok(chunk) => chunk,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                return Ok(self.line.at_end(true));
            }
            match self.line.step(chunk) {
                Step::Lent { body } => return Ok(Some(self.line.lent(self.inner.buffer(), body))),
                Step::Took { consume, done } => {
                    self.inner.consume(consume);
                    if done {
                        return Ok(Some(self.line.take()));
                    }
                }
            }
        }
    }
}

impl<R> Buffered for std::io::BufReader<R> {
    fn buffer(&self) -> &[u8] {
        std::io::BufReader::buffer(self)
    }
}

impl<R: Buffered> LineReader<R> {
    /// Whether a whole line is buffered: the next read returns it without
    /// waiting for input.
    pub fn line_ready(&self) -> bool {
        let buffered = self.inner.buffer();
        // The line lent last is still in the buffer until the next read.
        let rest = buffered.get(self.line.lent..).unwrap_or(&[]);
        memchr::memchr(b'\n', rest).is_some()
    }
}

fn finish(buf: &[u8], len: usize, max: usize) -> Line<'_> {
    if len > max {
        return Line::TooLong { prefix: buf, len };
    }
    Line::Full(buf.strip_suffix(b"\r").unwrap_or(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_buffer_splits_into_bounded_lines() {
        let lines: Vec<Line> = split_bounded(b"a\r\nbcdef\n\nxy\n", 3).collect();
        assert_eq!(
            lines,
            [
                Line::Full(b"a"),
                Line::TooLong {
                    prefix: b"bcd",
                    len: 5
                },
                Line::Full(b""),
                Line::Full(b"xy"),
            ]
        );
        assert_eq!(split_bounded(b"", 3).count(), 0);
        assert_eq!(split_bounded(b"\n", 3).count(), 0);
        assert_eq!(
            split_bounded(b"no newline", 100).collect::<Vec<_>>(),
            [Line::Full(b"no newline")]
        );
    }

    proptest::proptest! {
        #[test]
        fn held_buffers_split_as_their_newlines_say(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300), max in 0usize..40) {
            let lines: Vec<Line> = split_bounded(&data, max).collect();
            let trimmed = data.strip_suffix(b"\n").unwrap_or(&data);
            let want = if trimmed.is_empty() { 0 } else { trimmed.split(|b| *b == b'\n').count() };
            proptest::prop_assert_eq!(lines.len(), want);
            for line in lines {
                match line {
                    Line::Full(l) => proptest::prop_assert!(l.len() <= max.max(1) && !l.contains(&b'\n')),
                    Line::TooLong { prefix, len } => proptest::prop_assert!(prefix.len() == max.max(1) && len > prefix.len()),
                }
            }
        }
    }

    #[derive(Debug, PartialEq)]
    enum Owned {
        Full(Vec<u8>),
        TooLong(Vec<u8>, usize),
    }

    async fn all(input: &[u8], max: usize) -> Vec<Owned> {
        let small = all_with(input, max, 4).await;
        // Lines wholly in the buffer are lent in place: the same lines.
        assert_eq!(small, all_with(input, max, 64).await);
        small
    }

    async fn all_with(input: &[u8], max: usize, capacity: usize) -> Vec<Owned> {
        let mut r = LineReader::new(tokio::io::BufReader::with_capacity(capacity, input), max);
        let mut out = Vec::new();
        while let Some(l) = r.next(true).await.unwrap() {
            out.push(match l {
                Line::Full(b) => Owned::Full(b.to_vec()),
                Line::TooLong { prefix, len } => Owned::TooLong(prefix.to_vec(), len),
            });
        }
        out
    }

    fn all_blocking(input: &[u8], max: usize, capacity: usize) -> Vec<Owned> {
        let inner = std::io::BufReader::with_capacity(capacity, input);
        let mut r = BlockingLineReader::new(inner, max);
        let mut out = Vec::new();
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Full(b) => Owned::Full(b.to_vec()),
                Line::TooLong { prefix, len } => Owned::TooLong(prefix.to_vec(), len),
            });
        }
        out
    }

    proptest::proptest! {
        /// The blocking reader gives the lines the async one gives, lines
        /// lent in place or put together across reads alike.
        #[test]
        fn blocking_and_async_read_the_same_lines(
            data in proptest::collection::vec(proptest::sample::select(b"ab\r\n".to_vec()), 0..200),
            max in 1usize..12,
            capacity in 1usize..16,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let want = runtime.block_on(all_with(&data, max, capacity));
            proptest::prop_assert_eq!(all_blocking(&data, max, capacity), want);
        }
    }

    #[tokio::test]
    async fn splits_lines_and_bounds_them() {
        let out = all(b"ab\r\ncdefghij\n\nxyz", 5).await;
        assert_eq!(
            out,
            vec![
                Owned::Full(b"ab".to_vec()),
                Owned::TooLong(b"cdefg".to_vec(), 8),
                Owned::Full(vec![]),
                Owned::Full(b"xyz".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn position_counts_complete_lines_only() {
        let mut r = LineReader::new(&b"a\nbb\ncc"[..], 10);
        r.next(false).await.unwrap();
        assert_eq!(r.position(), 2);
        r.next(false).await.unwrap();
        assert_eq!(r.position(), 5);
        // "cc" has no newline yet: held, not returned, position unchanged
        assert_eq!(r.next(false).await.unwrap(), None);
        assert_eq!((r.position(), r.pending()), (5, 2));
        assert_eq!(r.next(true).await.unwrap(), Some(Line::Full(b"cc")));
        assert_eq!(r.position(), 7);
    }

    #[tokio::test]
    async fn a_held_part_is_given_up_without_reading_on() {
        let mut r = LineReader::new(&b"a\nbcdef"[..], 3);
        r.next(false).await.unwrap();
        assert_eq!(r.next(false).await.unwrap(), None);
        assert_eq!(
            r.held(),
            Some(Line::TooLong {
                prefix: b"bcd",
                len: 5
            })
        );
        assert_eq!((r.position(), r.pending()), (7, 0));
        assert_eq!(r.held(), None);
    }
}
