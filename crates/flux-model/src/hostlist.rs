//! RFC 29 hostlists (`node[0-3,7],login1`), decoded and encoded the way
//! flux-core's libhostlist does it.
//!
//! The list is kept compressed, as flux-core keeps it: a run of hosts that
//! share a prefix and number width is one item, so `node[0-99999]` is one
//! item and rank→host lookup walks items, not hosts.
//!
//! flux-core facts this follows (learned from its behaviour and oracle):
//! - hosts are separated by `,`, space or tab, except inside brackets;
//! - only the first `[...]` of a host expands; text after `]` is a suffix;
//! - a host with a suffix, or without trailing digits, is a "single" host
//!   that never joins a bracket in the encoding (`foo[0-1]-ib` encodes as
//!   `foo0-ib,foo1-ib`);
//! - a range's zero padding is the length of its first number (`[01-3]` is
//!   `01,02,03`; `[1-03]` is `1,2,3`);
//! - the encoding merges a host into the previous range only when it is the
//!   next number with the same prefix and a compatible padding.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// flux-core refuses a bracket range of more hosts than this.
const MAX_RANGE: u64 = 1 << 20;

/// An ordered list of host names (duplicates allowed).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Hostlist {
    items: Vec<Item>,
    /// Total hosts, cached so `len` is O(1).
    count: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Item {
    /// `prefix` + each number of `lo..=hi` zero-padded to `width`.
    /// `width` is canonical: 0 when no number of the range gets padding.
    Range {
        prefix: String,
        lo: u64,
        hi: u64,
        width: usize,
    },
    /// One host that has no numeric part of its own.
    Single(String),
    /// `prefix[lo-hi]suffix`: each host is a single (flux expands these).
    Expanded {
        prefix: String,
        lo: u64,
        hi: u64,
        width: usize,
        suffix: String,
    },
}

/// Why a string is not a hostlist. Messages name the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("invalid hostlist `{input}`: unbalanced brackets in `{token}`")]
    Brackets { input: String, token: String },
    #[error("invalid hostlist `{input}`: bad range `{range}`: {reason}")]
    Range {
        input: String,
        range: String,
        reason: &'static str,
    },
}

impl Item {
    fn count(&self) -> u64 {
        match self {
            Item::Range { lo, hi, .. } | Item::Expanded { lo, hi, .. } => hi - lo + 1,
            Item::Single(_) => 1,
        }
    }

    /// The `k`-th host; `k < count()`.
    fn host(&self, k: u64) -> String {
        match self {
            Item::Range {
                prefix, lo, width, ..
            } => format!("{prefix}{:0width$}", lo + k),
            Item::Single(name) => name.clone(),
            Item::Expanded {
                prefix,
                lo,
                width,
                suffix,
                ..
            } => format!("{prefix}{:0width$}{suffix}", lo + k),
        }
    }

    /// Offset of `host` in this item, if it is there.
    fn position(&self, host: &str) -> Option<u64> {
        let (prefix, lo, hi, width, suffix) = match self {
            Item::Single(name) => return (name == host).then_some(0),
            Item::Range {
                prefix,
                lo,
                hi,
                width,
            } => (prefix, *lo, *hi, *width, ""),
            Item::Expanded {
                prefix,
                lo,
                hi,
                width,
                suffix,
            } => (prefix, *lo, *hi, *width, suffix.as_str()),
        };
        let digits = host.strip_prefix(prefix.as_str())?.strip_suffix(suffix)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = digits.parse().ok()?;
        // `node01` is not `node1`: the padding must match too.
        (lo <= n && n <= hi && format!("{n:0width$}") == digits).then(|| n - lo)
    }
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// 0 when `width` pads no number from `lo` up, else `width`.
fn canonical_width(lo: u64, width: usize) -> usize {
    if width > digits(lo) { width } else { 0 }
}

/// Whether two ranges (first numbers and canonical widths) can be written
/// with one common width. This is flux-core's padding compatibility: a
/// padded range needs exactly its width; an unpadded one accepts any width
/// up to the digit count of its first number.
fn widths_compatible(a_lo: u64, a_width: usize, b_lo: u64, b_width: usize) -> bool {
    match (a_width, b_width) {
        (0, 0) => true,
        (p, 0) => p <= digits(b_lo),
        (0, q) => q <= digits(a_lo),
        (p, q) => p == q,
    }
}

/// Splits `name` into flux's prefix and trailing number (with its width).
/// `None` when there are no trailing digits or they overflow u64.
fn split_number(name: &str) -> Option<(&str, u64, usize)> {
    let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let num = &name[prefix.len()..];
    if num.is_empty() {
        return None;
    }
    // Overflowing suffixes: flux-core silently drops such a host; we keep
    // it as a plain single name instead.
    let n = num.parse().ok()?;
    Some((prefix, n, num.len()))
}

fn is_sep(b: u8) -> bool {
    matches!(b, b',' | b' ' | b'\t')
}

/// Top-level tokens: separators inside brackets do not split (flux tracks a
/// bracket depth, which `]` can drive negative; we do the same).
fn tokens(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && is_sep(b[i]) {
            i += 1;
        }
        if i >= b.len() {
            return out;
        }
        let start = i;
        let mut depth: i64 = 0;
        while i < b.len() && (depth != 0 || !is_sep(b[i])) {
            match b[i] {
                b'[' => depth += 1,
                b']' => depth -= 1,
                _ => {}
            }
            i += 1;
        }
        // Separators are ASCII, so `start..i` lies on char boundaries.
        out.push(&s[start..i]);
    }
}

/// `prefix[lo-hi]` with `lo` below `hi`, both unpadded and within
/// [`MAX_RANGE`] of each other: a hostlist that is written back as it is.
fn is_one_plain_range(text: &str) -> bool {
    let Some((prefix, range)) = text.strip_suffix(']').and_then(|body| body.split_once('[')) else {
        return false;
    };
    if prefix.is_empty() || prefix.bytes().any(|b| is_sep(b) || b == b']') {
        return false;
    }
    let unpadded = |s: &str| {
        let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits && (s == "0" || !s.starts_with('0')))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    match range
        .split_once('-')
        .map(|(lo, hi)| (unpadded(lo), unpadded(hi)))
    {
        Some((Some(lo), Some(hi))) => lo < hi && hi - lo < MAX_RANGE,
        _ => false,
    }
}

/// One `lo`, `lo-hi` or `lo-` (flux reads `1-` as `1`) inside brackets.
/// Returns (lo, hi, width).
fn parse_range(range: &str, input: &str) -> Result<(u64, u64, usize), HostlistError> {
    let err = |reason| HostlistError::Range {
        input: input.to_owned(),
        range: range.to_owned(),
        reason,
    };
    let number = |s: &str| -> Result<u64, HostlistError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("not a number or range"));
        }
        s.parse().map_err(|_| err("number too large"))
    };
    let (lo_s, hi_s) = match range.split_once('-') {
        Some((a, b)) => (a, Some(b)),
        None => (range, None),
    };
    let lo = number(lo_s)?;
    let hi = match hi_s {
        Some("") | None => lo,
        Some(h) => number(h)?,
    };
    if lo > hi {
        return Err(err("numbers decrease"));
    }
    // Not `hi - lo + 1`: `0-18446744073709551615` would wrap to 0 hosts
    // (found by the fuzzer).
    if hi - lo >= MAX_RANGE {
        return Err(err("more than 1048576 hosts"));
    }
    Ok((lo, hi, lo_s.len()))
}

impl Item {
    /// One host name, taken literally (see [`Hostlist::push`]); `None` for
    /// an empty name.
    fn of_host(host: &str) -> Option<Item> {
        if host.is_empty() {
            return None;
        }
        Some(match split_number(host) {
            Some((prefix, n, width)) if !host.contains([',', '[', ']', ' ', '\t']) => Item::Range {
                prefix: prefix.to_owned(),
                lo: n,
                hi: n,
                width: canonical_width(n, width),
            },
            _ => Item::Single(host.to_owned()),
        })
    }
}

impl Hostlist {
    /// `text` as flux-core writes the hostlist it decodes to (what
    /// [`Hostlist::parse`] and Display make of it), without building the
    /// list when `text` is written so already as one prefix and one range
    /// (`node[3-17]`), the way R's nodelists mostly come.
    pub fn normalize(text: &str) -> Result<Cow<'_, str>, HostlistError> {
        if is_one_plain_range(text) {
            return Ok(Cow::Borrowed(text));
        }
        Ok(Cow::Owned(Hostlist::parse(text)?.to_string()))
    }

    /// Decodes an RFC 29 hostlist. `""` (or only separators) is empty.
    pub fn parse(s: &str) -> Result<Hostlist, HostlistError> {
        let mut hl = Hostlist::default();
        for tok in tokens(s) {
            let Some((prefix, rest)) = tok.split_once('[') else {
                if tok.contains(']') {
                    return Err(HostlistError::Brackets {
                        input: s.to_owned(),
                        token: tok.to_owned(),
                    });
                }
                hl.push(tok);
                continue;
            };
            let Some((list, suffix)) = rest.split_once(']') else {
                return Err(HostlistError::Brackets {
                    input: s.to_owned(),
                    token: tok.to_owned(),
                });
            };
            // Validate the whole bracket before appending any of it.
            let ranges = list
                .split(',')
                .map(|r| parse_range(r, s))
                .collect::<Result<Vec<_>, _>>()?;
            for (lo, hi, width) in ranges {
                let width = canonical_width(lo, width);
                if suffix.is_empty() {
                    hl.append_item(Item::Range {
                        prefix: prefix.to_owned(),
                        lo,
                        hi,
                        width,
                    });
                } else {
                    hl.append_item(Item::Expanded {
                        prefix: prefix.to_owned(),
                        lo,
                        hi,
                        width,
                        suffix: suffix.to_owned(),
                    });
                }
            }
        }
        Ok(hl)
    }

    /// Number of hosts, duplicates included.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The host at `index` (rank → hostname). O(number of items).
    pub fn get(&self, index: usize) -> Option<String> {
        let mut k = index as u64;
        for item in &self.items {
            let n = item.count();
            if k < n {
                return Some(item.host(k));
            }
            k -= n;
        }
        None
    }

    /// Index of the first occurrence of `host` (hostname → rank).
    /// O(number of items).
    pub fn position(&self, host: &str) -> Option<usize> {
        let mut base: u64 = 0;
        for item in &self.items {
            if let Some(k) = item.position(host) {
                return usize::try_from(base + k).ok();
            }
            base += item.count();
        }
        None
    }

    /// Hosts in order.
    pub fn iter(&self) -> impl Iterator<Item = String> + '_ {
        self.items
            .iter()
            .flat_map(|item| (0..item.count()).map(move |k| item.host(k)))
    }

    /// Appends one host name, taken literally (no brackets are expanded).
    /// An empty name is ignored, as flux-core does. A name holding `,`,
    /// `[`, `]`, space or tab is kept, but then the encoding will not
    /// decode back to it.
    pub fn push(&mut self, host: &str) {
        if let Some(item) = Item::of_host(host) {
            self.append_item(item);
        }
    }

    /// Appends every host of `other`.
    pub fn append(&mut self, other: &Hostlist) {
        for item in &other.items {
            self.append_item(item.clone());
        }
    }

    /// Sorted with duplicates kept, as flux-core's `hostlist_sort` (how
    /// `flux resource` lists the hosts of a row merged from several).
    pub fn sorted(&self) -> Hostlist {
        let mut hosts: Vec<(Item, String)> = self
            .iter()
            .filter_map(|host| Some((Item::of_host(&host)?, host)))
            .collect();
        hosts.sort_by(|a, b| sort_key(&a.0).cmp(&sort_key(&b.0)));
        let mut out = Hostlist::default();
        for (_, host) in &hosts {
            out.push(host);
        }
        out
    }

    /// Sorted with duplicates removed, as flux-core's `hostlist_uniq`
    /// (`flux hostlist --sort --uniq`): by prefix, then padding width, then
    /// number; hosts without a number sort before numbered ones of the same
    /// prefix.
    pub fn sorted_unique(&self) -> Hostlist {
        // Singles of an Expanded item sort by their full names, so expand
        // them (such items are at most 2^20 hosts each).
        let mut parts: Vec<Item> = Vec::with_capacity(self.items.len());
        for item in &self.items {
            match item {
                Item::Expanded { .. } => {
                    parts.extend((0..item.count()).map(|k| Item::Single(item.host(k))));
                }
                _ => parts.push(item.clone()),
            }
        }
        parts.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
        let mut out: Vec<Item> = Vec::with_capacity(parts.len());
        for item in parts {
            if let Some(last) = out.last_mut()
                && join(last, &item)
            {
                continue;
            }
            out.push(item);
        }
        let count = out.iter().map(|i| i.count() as usize).sum();
        Hostlist { items: out, count }
    }

    /// Appends an item, merging it into the last range when it continues
    /// it (same prefix, next number, compatible padding), like flux-core.
    fn append_item(&mut self, item: Item) {
        self.count += item.count() as usize;
        if let (
            Some(Item::Range {
                prefix: tp,
                lo: tlo,
                hi: thi,
                width: tw,
            }),
            Item::Range {
                prefix,
                lo,
                hi,
                width,
            },
        ) = (self.items.last_mut(), &item)
            && *tp == *prefix
            && thi.checked_add(1) == Some(*lo)
            && widths_compatible(*tlo, *tw, *lo, *width)
        {
            // The tail keeps its first number, so its canonical width
            // still describes the merged range.
            *thi = *hi;
            return;
        }
        self.items.push(item);
    }
}

/// Sort key matching flux-core's range comparison: prefix bytes, singles
/// first, then the padding class (the width if padded, else the digit
/// count of the first number), then the first number.
fn sort_key(item: &Item) -> (&str, bool, usize, u64) {
    match item {
        Item::Single(name) => (name, false, 0, 0),
        Item::Range {
            prefix, lo, width, ..
        } => (
            prefix,
            true,
            if *width > 0 { *width } else { digits(*lo) },
            *lo,
        ),
        // Expanded items are expanded before sorting.
        Item::Expanded { prefix, lo, .. } => (prefix, true, usize::MAX, *lo),
    }
}

/// Joins sorted neighbour `next` into `last` when they overlap, touch or
/// are the same single host. Returns whether `next` was absorbed.
fn join(last: &mut Item, next: &Item) -> bool {
    match (last, next) {
        (Item::Single(a), Item::Single(b)) => a == b,
        (
            Item::Range {
                prefix: lp,
                lo: llo,
                hi: lhi,
                width: lw,
            },
            Item::Range {
                prefix,
                lo,
                hi,
                width,
            },
        ) => {
            if lp != prefix
                || !widths_compatible(*llo, *lw, *lo, *width)
                || lhi.saturating_add(1) < *lo
            {
                return false;
            }
            *lhi = (*lhi).max(*hi);
            true
        }
        _ => false,
    }
}

impl PartialEq for Hostlist {
    /// Same hosts in the same order (the compressed forms may differ, e.g.
    /// `foo[0-1]x` and `foo0x,foo1x`).
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items || (self.count == other.count && self.iter().eq(other.iter()))
    }
}

impl Eq for Hostlist {}

impl fmt::Display for Hostlist {
    /// flux-core's compressed encoding: consecutive numbered ranges with
    /// one prefix share a bracket; singles are written as they are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items = &self.items;
        let mut i = 0;
        while i < items.len() {
            if i > 0 {
                f.write_str(",")?;
            }
            match &items[i] {
                Item::Single(name) => {
                    f.write_str(name)?;
                    i += 1;
                }
                item @ Item::Expanded { .. } => {
                    for k in 0..item.count() {
                        if k > 0 {
                            f.write_str(",")?;
                        }
                        f.write_str(&item.host(k))?;
                    }
                    i += 1;
                }
                Item::Range { prefix, .. } => {
                    let mut j = i + 1;
                    while matches!(items.get(j), Some(Item::Range { prefix: p, .. }) if p == prefix)
                    {
                        j += 1;
                    }
                    let bracket = j - i > 1 || items[i].count() > 1;
                    f.write_str(prefix)?;
                    if bracket {
                        f.write_str("[")?;
                    }
                    for (n, item) in items[i..j].iter().enumerate() {
                        if let Item::Range { lo, hi, width, .. } = item {
                            if n > 0 {
                                f.write_str(",")?;
                            }
                            write!(f, "{lo:0width$}")?;
                            if hi > lo {
                                write!(f, "-{hi:0width$}")?;
                            }
                        }
                    }
                    if bracket {
                        f.write_str("]")?;
                    }
                    i = j;
                }
            }
        }
        Ok(())
    }
}

impl FromStr for Hostlist {
    type Err = HostlistError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Hostlist::parse(s)
    }
}

impl FromIterator<String> for Hostlist {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        let mut hl = Hostlist::default();
        for h in iter {
            hl.push(&h);
        }
        hl
    }
}

impl<'a> FromIterator<&'a str> for Hostlist {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let mut hl = Hostlist::default();
        for h in iter {
            hl.push(h);
        }
        hl
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sorting_keeps_duplicates() {
        let hl = Hostlist::parse("vm,vm").unwrap();
        assert_eq!(hl.sorted().to_string(), "vm,vm");
        let hl = Hostlist::parse("node6,node2,node1").unwrap();
        assert_eq!(hl.sorted().to_string(), "node[1-2,6]");
        assert_eq!(hl.sorted().len(), 3);
    }

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn hosts(s: &str) -> Vec<String> {
        Hostlist::parse(s).unwrap().iter().collect()
    }

    #[test]
    fn rfc29_vectors() {
        assert_eq!(hosts("foo[1-5]"), ["foo1", "foo2", "foo3", "foo4", "foo5"]);
        assert_eq!(
            hosts("foo[0-4]-eth2"),
            [
                "foo0-eth2",
                "foo1-eth2",
                "foo2-eth2",
                "foo3-eth2",
                "foo4-eth2"
            ]
        );
        assert_eq!(hosts("[1-3,5-6]"), ["1", "2", "3", "5", "6"]);
        assert_eq!(hosts("foo[1,1,2,1]"), ["foo1", "foo1", "foo2", "foo1"]);
        assert_eq!(hosts("[00-2]"), ["00", "01", "02"]);
        assert_eq!(hosts(""), Vec::<String>::new());
        assert!(Hostlist::parse(" ,\t").unwrap().is_empty());
    }

    #[test]
    fn encodes_like_flux() {
        let enc = |s: &str| Hostlist::parse(s).unwrap().to_string();
        assert_eq!(enc("foo9,foo10"), "foo[9-10]");
        assert_eq!(enc("foo09,foo10"), "foo[09-10]");
        assert_eq!(enc("foo9,foo010"), "foo[9,010]");
        assert_eq!(enc("n[10-11],n12"), "n[10-12]");
        assert_eq!(enc("n[05-07],n[08-12]"), "n[05-12]");
        assert_eq!(enc("n[05-07],n8"), "n[05-07,8]");
        assert_eq!(enc("a,b[1-2]x,c5"), "a,b1x,b2x,c5");
        assert_eq!(enc("n5,m6,n7"), "n5,m6,n7");
        assert_eq!(enc("n5,n7"), "n[5,7]");
    }

    #[test]
    fn every_error_path() {
        let e = |s: &str| Hostlist::parse(s).unwrap_err();
        for s in ["host[0-3", "host0-3]", "node]1[", "a],b", "x[", "]"] {
            assert!(matches!(e(s), HostlistError::Brackets { .. }), "{s}");
        }
        let reason = |s: &str| match e(s) {
            HostlistError::Range { reason, .. } => reason,
            other => panic!("{s}: {other:?}"),
        };
        for s in [
            "host[]", "h[a-b]", "h[1-2-3]", "h[-1]", "h[1,]", "h[,1]", "h[ 1]", "h[+1]", "h[1x-3]",
        ] {
            assert_eq!(reason(s), "not a number or range", "{s}");
        }
        assert_eq!(reason("h[3-1]"), "numbers decrease");
        assert_eq!(reason("h[99999999999999999999]"), "number too large");
        assert_eq!(reason("h[0-1048576]"), "more than 1048576 hosts");
        // The whole u64 range: its size does not fit in a u64.
        assert_eq!(
            reason("h[0-000018446744073709551615]"),
            "more than 1048576 hosts"
        );
        assert!(Hostlist::parse("h[0-1048575]").is_ok());
        assert_eq!(
            e("host[3-0]").to_string(),
            "invalid hostlist `host[3-0]`: bad range `3-0`: numbers decrease"
        );
    }

    #[test]
    fn get_and_position_are_consistent() {
        let hl = Hostlist::parse("n[0-2],x,n[05-06],a[1-2]b,n1").unwrap();
        let all: Vec<String> = hl.iter().collect();
        assert_eq!(
            all,
            ["n0", "n1", "n2", "x", "n05", "n06", "a1b", "a2b", "n1"]
        );
        assert_eq!(hl.len(), all.len());
        for (i, h) in all.iter().enumerate() {
            assert_eq!(hl.get(i).as_ref(), Some(h));
        }
        assert_eq!(hl.get(all.len()), None);
        assert_eq!(hl.position("n1"), Some(1));
        assert_eq!(hl.position("n06"), Some(5));
        assert_eq!(hl.position("n6"), None);
        assert_eq!(hl.position("a2b"), Some(7));
        assert_eq!(hl.position("x"), Some(3));
        assert_eq!(hl.position("n"), None);
        assert_eq!(hl.position("n+1"), None);
    }

    #[test]
    fn huge_ranges_stay_cheap() {
        let hl = Hostlist::parse("host[0-1000000],h[0-1048575]x").unwrap();
        assert_eq!(hl.len(), 1_000_001 + 1_048_576);
        assert_eq!(hl.get(999_999).as_deref(), Some("host999999"));
        assert_eq!(hl.get(1_000_001).as_deref(), Some("h0x"));
        assert_eq!(hl.position("h1048575x"), Some(hl.len() - 1));
    }

    #[test]
    fn push_and_collect() {
        let mut hl: Hostlist = ["node1", "node2", "node3"].into_iter().collect();
        hl.push("");
        hl.push("login");
        hl.push("node4");
        hl.push("bad,name");
        assert_eq!(hl.to_string(), "node[1-3],login,node4,bad,name");
        assert_eq!(hl.len(), 6);
        let hl2: Hostlist = vec!["a1".to_string(), "a2".to_string()]
            .into_iter()
            .collect();
        assert_eq!(hl2.to_string(), "a[1-2]");
        let mut hl3 = Hostlist::parse("a[1-2]").unwrap();
        hl3.append(&Hostlist::parse("a3,b").unwrap());
        assert_eq!(hl3.to_string(), "a[1-3],b");
        // A number too large for u64 stays a plain name.
        let big = "n99999999999999999999999";
        assert_eq!(Hostlist::parse(big).unwrap().to_string(), big);
    }

    #[test]
    fn equality_compares_hosts() {
        let a = Hostlist::parse("foo[0-1]x").unwrap();
        let b = Hostlist::parse("foo0x,foo1x").unwrap();
        assert_eq!(a, b);
        assert_ne!(a, Hostlist::parse("foo1x,foo0x").unwrap());
        assert_eq!(
            Hostlist::parse("n[1-3]").unwrap(),
            "n1,n2,n3".parse().unwrap()
        );
    }

    #[test]
    fn sorted_unique() {
        let su = |s: &str| Hostlist::parse(s).unwrap().sorted_unique().to_string();
        assert_eq!(su("b2,a1,b1,a1,x,b"), "a1,b,b[1-2],x");
        assert_eq!(su("foo[1-3]x,foo2x"), "foo1x,foo2x,foo3x");
        assert_eq!(su(""), "");
        assert_eq!(Hostlist::parse("n[5,5]").unwrap().sorted_unique().len(), 1);
    }

    fn read_oracle(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/corpus/oracles/");
        std::fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    #[test]
    fn oracle() {
        let text = read_oracle("hostlist_oracle.tsv");
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
        assert_eq!(
            header,
            [
                "input",
                "result",
                "encode",
                "count",
                "expanded",
                "encode_sorted_uniq",
                "errno",
                "python_result",
                "python_str",
                "python_error",
                "cli_rc",
                "cli_stdout",
                "cli_stderr",
                "cli_expand_stdout",
                "cli_count_stdout",
                "cli_sort_uniq_stdout"
            ]
        );
        let json = |s: &str| -> serde_json::Value { serde_json::from_str(s).unwrap() };
        let string = |s: &str| json(s).as_str().unwrap().to_owned();
        let mut rows = 0;
        for line in lines {
            let c: Vec<&str> = line.split('\t').collect();
            assert_eq!(c.len(), 16, "{line}");
            let input = string(c[0]);
            rows += 1;
            let ours = Hostlist::parse(&input);
            if c[1] == "error" {
                assert!(ours.is_err(), "{input:?} should fail: {ours:?}");
                assert_eq!((c[7], c[10]), ("error", "1"));
                continue;
            }
            let hl = ours.unwrap_or_else(|e| panic!("{input:?}: {e}"));
            let enc = string(c[2]);
            assert_eq!(hl.to_string(), enc, "{input:?}");
            assert_eq!(string(c[8]), enc);
            assert_eq!(string(c[11]), format!("{enc}\n").trim_start_matches('\n'));
            assert_eq!(hl.len().to_string(), c[3], "{input:?}");
            assert_eq!(string(c[14]), format!("{}\n", c[3]));
            let hosts: Vec<String> = hl.iter().collect();
            match json(c[4]) {
                serde_json::Value::Array(want) => {
                    let want: Vec<String> = want
                        .iter()
                        .map(|v| v.as_str().unwrap().to_owned())
                        .collect();
                    assert_eq!(hosts, want, "{input:?}");
                    assert_eq!(string(c[13]), want.join(" "));
                }
                other => assert!(other.as_str().unwrap().starts_with("<omitted")),
            }
            for (i, h) in hosts.iter().enumerate().take(100) {
                assert_eq!(hl.get(i).as_ref(), Some(h));
            }
            let su = string(c[5]);
            assert_eq!(hl.sorted_unique().to_string(), su, "{input:?}");
            assert_eq!(string(c[15]), format!("{su}\n").trim_start_matches('\n'));
            // Our encoding decodes back to the same hosts, unless a host
            // name holds brackets (`a1b[3-4]`), which flux cannot re-read
            // either.
            if !hosts.iter().any(|h| h.contains(['[', ']'])) {
                assert_eq!(Hostlist::parse(&enc).unwrap(), hl, "{input:?}");
            }
        }
        assert_eq!(rows, 87);
    }

    /// flux-core's padding check, transcribed literally as a model: it
    /// compares the padding each first number gets under either width.
    fn flux_width_equiv(n: u64, wn: usize, m: u64, wm: usize) -> bool {
        let pad = |v: u64, w: usize| w.saturating_sub(digits(v));
        let (npad, nmpad) = (pad(n, wn), pad(n, wm));
        let (mpad, mnpad) = (pad(m, wm), pad(m, wn));
        !(npad != nmpad && mpad != mnpad)
    }

    fn host_strategy() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["", "node", "n-", "rack1-node", "a1b", "x"]),
            prop::option::of((0u64..40, 0usize..4)),
            prop::sample::select(vec!["", "", "", "-ib", "x2"]),
        )
            .prop_map(|(p, num, s)| match num {
                Some((n, w)) => format!("{p}{n:0w$}{s}"),
                None if p.is_empty() && s.is_empty() => "h".to_string(),
                None => format!("{p}{s}"),
            })
    }

    fn bracket_strategy() -> impl Strategy<Value = String> {
        let range = (0u64..30, 0u64..5, 0usize..4).prop_map(|(lo, len, w)| {
            if len == 0 {
                format!("{lo:0w$}")
            } else {
                format!("{lo:0w$}-{}", lo + len)
            }
        });
        let token = (
            prop::sample::select(vec!["", "n", "node-", "r1n"]),
            prop::collection::vec(range, 1..4),
            prop::sample::select(vec!["", "", "-ib"]),
        )
            .prop_map(|(p, r, s)| format!("{p}[{}]{s}", r.join(",")));
        prop::collection::vec(prop_oneof![token, host_strategy()], 0..6).prop_map(|t| t.join(","))
    }

    #[test]
    fn one_plain_range_is_kept_as_written() {
        for (text, kept) in [
            ("node[3-17]", true),
            ("node1[9-10]", true),
            ("n[0-1]", true),
            ("node[3-3]", false),
            ("node[03-17]", false),
            ("node[3-17],x", false),
            ("[3-17]", false),
            ("node[3-17]x", false),
            ("node[17-3]", false),
        ] {
            assert_eq!(is_one_plain_range(text), kept, "{text}");
            let parsed = Hostlist::parse(text).map(|h| h.to_string());
            assert_eq!(
                Hostlist::normalize(text).map(Cow::into_owned),
                parsed,
                "{text}"
            );
        }
    }

    proptest! {
        /// The short way says what parsing and printing say.
        #[test]
        fn normalize_is_parse_then_display(
            text in r"[a-z0-9]{0,3}(\[[0-9]{1,3}(-[0-9]{0,3})?(,[0-9]{1,2})?\])?[a-z,]{0,2}|[a-z\[\]0-9, -]{0,12}"
        ) {
            let parsed = Hostlist::parse(&text).map(|h| h.to_string());
            prop_assert_eq!(Hostlist::normalize(&text).map(Cow::into_owned), parsed);
        }

        #[test]
        fn compatibility_matches_flux(n in 0u64..2000, wn in 0usize..6, m in 0u64..2000, wm in 0usize..6) {
            prop_assert_eq!(
                widths_compatible(n, canonical_width(n, wn), m, canonical_width(m, wm)),
                flux_width_equiv(n, wn, m, wm)
            );
        }

        #[test]
        fn pushed_hosts_round_trip(hs in prop::collection::vec(host_strategy(), 0..30)) {
            let hl: Hostlist = hs.iter().map(String::as_str).collect();
            prop_assert_eq!(hl.iter().collect::<Vec<_>>(), hs.clone());
            prop_assert_eq!(hl.len(), hs.len());
            let back = Hostlist::parse(&hl.to_string()).unwrap();
            prop_assert_eq!(back.iter().collect::<Vec<_>>(), hs.clone());
            for (i, h) in hs.iter().enumerate() {
                prop_assert_eq!(hl.get(i), Some(h.clone()));
                let p = hl.position(h).unwrap();
                prop_assert_eq!(&hs[p], h);
                prop_assert!(p <= i);
            }
            let su = hl.sorted_unique();
            let got: Vec<String> = su.iter().collect();
            let want: BTreeSet<String> = hs.iter().cloned().collect();
            prop_assert_eq!(got.len(), want.len(), "duplicates in {}", su);
            prop_assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
        }

        #[test]
        fn bracketed_lists_round_trip(s in bracket_strategy()) {
            let hl = Hostlist::parse(&s).unwrap();
            let back = Hostlist::parse(&hl.to_string()).unwrap();
            prop_assert_eq!(back.iter().collect::<Vec<_>>(), hl.iter().collect::<Vec<_>>());
            // Encoding is stable once decoded again.
            prop_assert_eq!(back.to_string(), Hostlist::parse(&back.to_string()).unwrap().to_string());
        }

        #[test]
        fn never_panics(s in ".*") {
            if let Ok(hl) = Hostlist::parse(&s) {
                let _ = hl.to_string();
                let _ = hl.sorted_unique();
                let _ = hl.get(0);
            }
        }

        #[test]
        fn never_panics_on_hostlist_like_text(s in "[a\\[\\]0-9,\\- \t]{0,30}") {
            if let Ok(hl) = Hostlist::parse(&s) {
                let _ = hl.to_string();
                let _ = hl.sorted_unique().to_string();
                prop_assert_eq!(hl.iter().count(), hl.len());
            }
        }
    }
}
