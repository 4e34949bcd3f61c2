//! A few optional strings in one allocation behind one pointer.
//!
//! A job keeps six short texts (its name, queue, project, bank, nodelist
//! and user name): as `Option<CompactString>` they take 24 bytes each, 144
//! in every job whether set or not. Packed here they take 8, plus one
//! allocation of their bytes (none while all are unset). Reading one walks
//! the few before it; setting one writes them all again, which happens a
//! few times in a job's life.
//!
//! Each text is a length tag and its bytes: tag 0 is no text, 1 to 254 a
//! text of (tag − 1) bytes, 255 a text whose length follows in 4 bytes.
//!
//! The bytes are only ever written from `&str`s, whole (or cut at a
//! character's boundary), so each text reads back as a `&str` without
//! being checked again: a check cost more than the rest of a read.

use std::fmt;
use thin_vec::ThinVec;

/// `N` optional strings, set and read by index.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Texts<const N: usize>(
    /// Written by [`Texts::new`] alone: the encoding of `N` `&str`s.
    ThinVec<u8>,
);

/// The tag of a text whose length follows it.
const LONG: u8 = u8::MAX;

impl<const N: usize> Texts<N> {
    /// Texts with these values.
    pub fn new(values: [Option<&str>; N]) -> Self {
        let values = values.map(|v| v.map(fitted));
        if values.iter().all(Option::is_none) {
            // No text, no allocation.
            return Texts(ThinVec::new());
        }
        let size: usize = values.iter().map(|v| encoded_len(*v)).sum();
        // Sized once, then written a piece at a time.
        let mut bytes = ThinVec::new();
        bytes.resize(size, 0);
        let mut rest: &mut [u8] = &mut bytes;
        for v in values {
            rest = match v {
                None => put(rest, &[0]),
                Some(s) => {
                    let rest = match u8::try_from(s.len() + 1) {
                        Ok(tag) if tag < LONG => put(rest, &[tag]),
                        _ => {
                            let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
                            put(put(rest, &[LONG]), &len.to_le_bytes())
                        }
                    };
                    put(rest, s.as_bytes())
                }
            };
        }
        Texts(bytes)
    }

    /// The text at `index`, if set (and `None` past `N`).
    pub fn get(&self, index: usize) -> Option<&str> {
        let mut rest: &[u8] = &self.0;
        for _ in 0..index.min(N) {
            rest = split_text(rest)?.1;
        }
        if index >= N {
            return None;
        }
        split_text(rest)?.0
    }

    /// Every text, in order.
    pub fn all(&self) -> [Option<&str>; N] {
        let mut out = [None; N];
        let mut rest: &[u8] = &self.0;
        for slot in &mut out {
            let Some((text, after)) = split_text(rest) else {
                break;
            };
            *slot = text;
            rest = after;
        }
        out
    }

    /// Set the text at `index` (nothing past `N`).
    pub fn set(&mut self, index: usize, value: Option<&str>) {
        if index >= N || self.get(index) == value {
            return;
        }
        let mut all = self.all();
        all[index] = value;
        *self = Texts::new(all);
    }
}

/// `piece` written at the start of `out`; the rest of `out`. `out` is
/// sized for every piece by `encoded_len`: a piece that did not fit would
/// be cut, never written past the end.
fn put<'a>(out: &'a mut [u8], piece: &[u8]) -> &'a mut [u8] {
    let n = piece.len().min(out.len());
    let (head, rest) = out.split_at_mut(n);
    head.copy_from_slice(&piece[..n]);
    rest
}

/// The first text of `bytes`, and the bytes after it.
fn split_text(bytes: &[u8]) -> Option<(Option<&str>, &[u8])> {
    let (&tag, after) = bytes.split_first()?;
    let (len, after) = match tag {
        0 => return Some((None, after)),
        LONG => {
            let (len, after) = after.split_first_chunk::<4>()?;
            (u32::from_le_bytes(*len) as usize, after)
        }
        tag => (usize::from(tag - 1), after),
    };
    let (text, after) = after.split_at_checked(len)?;
    // SAFETY: the bytes were written by `Texts::new` alone, each text
    // whole from a `&str` (or cut at a character's boundary by `fitted`),
    // and its tag and length are read back as written, so `text` is
    // exactly the bytes of a `str`.
    Some((Some(unsafe { std::str::from_utf8_unchecked(text) }), after))
}

/// A text as kept: whole, or cut at the last character boundary within
/// 4 GiB (none comes near: lines are capped far below).
fn fitted(s: &str) -> &str {
    if s.len() <= u32::MAX as usize {
        return s;
    }
    let mut len = u32::MAX as usize;
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    &s[..len]
}

/// The bytes one (fitted) value takes.
fn encoded_len(v: Option<&str>) -> usize {
    match v {
        None => 1,
        Some(s) if s.len() + 1 < LONG as usize => 1 + s.len(),
        Some(s) => 5 + s.len(),
    }
}

impl<const N: usize> fmt::Debug for Texts<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.all()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_text_takes_no_allocation_and_eight_bytes() {
        assert_eq!(std::mem::size_of::<Texts<6>>(), 8);
        let t = Texts::<6>::new([None; 6]);
        assert_eq!(t.0.capacity(), 0);
        assert_eq!(t, Texts::default());
        assert_eq!(t.all(), [None; 6]);
    }

    #[test]
    fn empty_short_and_long_texts_read_back() {
        let long = "x".repeat(300);
        let edge = "y".repeat(253);
        let over = "z".repeat(254);
        let t = Texts::<5>::new([Some(""), Some("lmp"), Some(&long), Some(&edge), Some(&over)]);
        let blank = Texts::<3>::new([None, Some(""), None]);
        assert_eq!(blank.all(), [None, Some(""), None]);
        assert_eq!(
            t.all(),
            [
                Some(""),
                Some("lmp"),
                Some(&*long),
                Some(&*edge),
                Some(&*over)
            ]
        );
        assert_eq!(t.get(5), None);
    }

    #[test]
    fn set_changes_one_and_keeps_the_others() {
        let mut t = Texts::<3>::new([Some("a"), None, Some("c")]);
        t.set(1, Some("batch"));
        assert_eq!(t.all(), [Some("a"), Some("batch"), Some("c")]);
        t.set(0, None);
        assert_eq!(t.all(), [None, Some("batch"), Some("c")]);
        t.set(3, Some("ignored"));
        assert_eq!(t.all(), [None, Some("batch"), Some("c")]);
        t.set(1, None);
        t.set(2, None);
        assert_eq!(t, Texts::default());
    }

    fn value() -> impl Strategy<Value = Option<String>> {
        // Any characters, of one to four bytes: short texts and texts
        // about the long tag's edge.
        proptest::option::of(prop_oneof![".{0,8}", ".{60,70}", "[a-z]{250,260}"])
    }

    proptest! {
        /// What is packed reads back, whole and one by one.
        #[test]
        fn texts_round_trip(values in proptest::array::uniform6(value())) {
            let refs = values.each_ref().map(Option::as_deref);
            let t = Texts::<6>::new(refs);
            prop_assert_eq!(t.all(), refs);
            for (i, v) in refs.iter().enumerate() {
                prop_assert_eq!(t.get(i), *v);
            }
        }

        /// Setting one text is packing the values with it changed.
        #[test]
        fn set_is_new_with_one_changed(
            values in proptest::array::uniform6(value()),
            index in 0usize..6,
            new in value(),
        ) {
            let refs = values.each_ref().map(Option::as_deref);
            let mut t = Texts::<6>::new(refs);
            t.set(index, new.as_deref());
            let mut want = refs;
            want[index] = new.as_deref();
            prop_assert_eq!(t, Texts::<6>::new(want));
        }
    }
}
