//! A tailed file's identity: the hash of its beginning, and the checks
//! that it still begins so.

use super::*;

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(super) fn read_prefix(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max as u64)
        .read_to_end(&mut out)?;
    Ok(out)
}

/// The fingerprint of a file's beginning, or `None` while its first line is
/// incomplete and shorter than [`FINGERPRINT_BYTES`].
pub(super) fn fingerprint(path: &Path) -> std::io::Result<Option<u64>> {
    Ok(fingerprint_of(&read_prefix(path, FINGERPRINT_BYTES)?))
}

/// The fingerprint of `head`, a file's first (at most [`FINGERPRINT_BYTES`])
/// bytes; `None` while its first line is incomplete and shorter than that.
pub(super) fn fingerprint_of(head: &[u8]) -> Option<u64> {
    let head = &head[..head.len().min(FINGERPRINT_BYTES)];
    match head.iter().position(|b| *b == b'\n') {
        Some(i) => Some(fnv1a(&head[..=i])),
        None if head.len() == FINGERPRINT_BYTES => Some(fnv1a(head)),
        None => None,
    }
}

/// `buf.len()` bytes at `offset`, fewer only at the end of the file.
pub(super) fn read_full_at(
    file: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// How an open file begins now, against the fingerprint it is tracked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Head {
    /// As the fingerprint says.
    Same,
    /// A whole first line (or [`FINGERPRINT_BYTES`]) that is another one:
    /// rewritten in place.
    Other,
    /// Not even a whole first line: truncated, perhaps being rewritten.
    Short,
}

/// Compare an open file's beginning with `fp` (one positioned read).
pub(super) fn check_head(file: &std::fs::File, fp: u64) -> std::io::Result<Head> {
    let mut head = [0u8; FINGERPRINT_BYTES];
    let n = read_full_at(file, &mut head, 0)?;
    Ok(match fingerprint_of(&head[..n]) {
        Some(now) if now == fp => Head::Same,
        Some(_) => Head::Other,
        None => Head::Short,
    })
}

/// Offset just past the last newline, and the number of lines before it:
/// where `read_from = "end"` starts.
pub(super) fn end_of_last_line(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut offset, mut end, mut lines) = (0u64, 0u64, 0u64);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((end, lines));
        }
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                lines += 1;
                end = offset + i as u64 + 1;
            }
        }
        offset += n as u64;
    }
}
