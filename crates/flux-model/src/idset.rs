//! RFC 22 idsets (`0-3,5`, `[0-3,5]`) and the RFC 21/32 `ranks` field,
//! which is an idset or the word `all`.
//!
//! An [`IdSet`] keeps sorted, disjoint, non-adjacent inclusive ranges, so
//! `0-4000000000` costs one pair, not four billion bits.

use std::fmt;
use std::str::FromStr;

/// A set of `u32` ids.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct IdSet {
    /// Sorted by `lo`; no two ranges overlap or touch (touching ones merge),
    /// which makes the representation of a set unique and `==` meaningful.
    ranges: Vec<(u32, u32)>,
}

/// Why a string is not an idset. Messages quote flux-core's own wording
/// for the part after the colon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdsetError {
    #[error("invalid idset `{input}`: mismatched or nested brackets")]
    Brackets { input: String },
    #[error("invalid idset `{input}`: error parsing range '{range}'")]
    Range { input: String, range: String },
    #[error("invalid idset `{input}`: range '{range}' is out of order")]
    OutOfOrder { input: String, range: String },
    #[error("invalid idset `{input}`: range '{range}' goes past 4294967295")]
    TooLarge { input: String, range: String },
}

impl IdSet {
    /// The empty set.
    pub fn new() -> Self {
        IdSet::default()
    }

    /// Decodes RFC 22 text as strictly as flux-core: ascending, no overlaps,
    /// no leading zeros, no whitespace, `lo < hi` in a range, optional outer
    /// brackets, empty items ignored. `""` and `[]` are the empty set.
    ///
    /// Unlike flux-core, every `u32` is allowed (flux-core stops at
    /// 2147483647 for lack of bitmap space) and larger numbers are an error
    /// (flux-core wraps them modulo 2^32).
    pub fn parse(s: &str) -> Result<IdSet, IdsetError> {
        let inner = match s.strip_prefix('[') {
            Some(rest) => rest.strip_suffix(']'),
            None => Some(s),
        };
        let inner = match inner {
            Some(i) if !i.contains(['[', ']']) => i,
            _ => {
                return Err(IdsetError::Brackets {
                    input: s.to_owned(),
                });
            }
        };
        let mut set = IdSet::new();
        for tok in inner.split(',').filter(|t| !t.is_empty()) {
            let (lo, hi) = parse_range(tok, s)?;
            if let Some(&(_, last)) = set.ranges.last()
                && lo <= last
            {
                return Err(IdsetError::OutOfOrder {
                    input: s.to_owned(),
                    range: tok.to_owned(),
                });
            }
            // Ascending input: appending keeps the invariant.
            set.push_back(lo, hi);
        }
        Ok(set)
    }

    /// `lo..=hi`; empty when `lo > hi`.
    pub fn from_range(lo: u32, hi: u32) -> Self {
        let mut set = IdSet::new();
        if lo <= hi {
            set.ranges.push((lo, hi));
        }
        set
    }

    pub fn insert(&mut self, id: u32) {
        self.insert_range(id, id);
    }

    /// Adds `lo..=hi` (nothing when `lo > hi`).
    pub fn insert_range(&mut self, lo: u32, hi: u32) {
        if lo > hi {
            return;
        }
        // Ranges that overlap or touch [lo, hi] form the slice [first, end).
        let first = self
            .ranges
            .partition_point(|&(_, h)| u64::from(h) + 1 < u64::from(lo));
        let end = self
            .ranges
            .partition_point(|&(l, _)| u64::from(l) <= u64::from(hi) + 1);
        let (mut nlo, mut nhi) = (lo, hi);
        if first < end {
            nlo = nlo.min(self.ranges[first].0);
            nhi = nhi.max(self.ranges[end - 1].1);
        }
        self.ranges.splice(first..end, [(nlo, nhi)]);
    }

    pub fn remove(&mut self, id: u32) {
        let i = self.ranges.partition_point(|&(_, h)| h < id);
        let Some(&(lo, hi)) = self.ranges.get(i) else {
            return;
        };
        if id < lo {
            return;
        }
        // id is inside [lo, hi]: shrink or split.
        match (id == lo, id == hi) {
            (true, true) => {
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i].0 = id + 1,
            (false, true) => self.ranges[i].1 = id - 1,
            (false, false) => {
                self.ranges[i].1 = id - 1;
                self.ranges.insert(i + 1, (id + 1, hi));
            }
        }
    }

    pub fn union_with(&mut self, other: &IdSet) {
        let mut out = IdSet::new();
        let (mut a, mut b) = (
            self.ranges.iter().peekable(),
            other.ranges.iter().peekable(),
        );
        // Merge by `lo`, coalescing as we go: linear in both sizes.
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            if let Some(&(lo, hi)) = next {
                out.push_back(lo, hi);
            }
        }
        *self = out;
    }

    pub fn subtract(&mut self, other: &IdSet) {
        let mut out = Vec::with_capacity(self.ranges.len());
        let mut j = 0;
        for &(lo, hi) in &self.ranges {
            // Skip subtrahend ranges wholly below this one.
            while j < other.ranges.len() && other.ranges[j].1 < lo {
                j += 1;
            }
            let mut cur = Some(lo);
            let mut k = j;
            while let Some(start) = cur {
                match other.ranges.get(k) {
                    Some(&(olo, ohi)) if olo <= hi => {
                        if olo > start {
                            out.push((start, olo - 1));
                        }
                        cur = if ohi >= hi { None } else { Some(ohi + 1) };
                        k += 1;
                    }
                    _ => {
                        out.push((start, hi));
                        cur = None;
                    }
                }
            }
        }
        self.ranges = out;
    }

    pub fn intersection(&self, other: &IdSet) -> IdSet {
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        while let (Some(&(alo, ahi)), Some(&(blo, bhi))) = (self.ranges.get(i), other.ranges.get(j))
        {
            let (lo, hi) = (alo.max(blo), ahi.min(bhi));
            if lo <= hi {
                out.push((lo, hi));
            }
            // Advance whichever ends first; it cannot meet anything later.
            if ahi < bhi {
                i += 1;
            } else {
                j += 1;
            }
        }
        IdSet { ranges: out }
    }

    pub fn contains(&self, id: u32) -> bool {
        let i = self.ranges.partition_point(|&(_, h)| h < id);
        self.ranges.get(i).is_some_and(|&(lo, _)| lo <= id)
    }

    /// Number of ids (a `u64`: the full `u32` range has 2^32 of them).
    pub fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|&(lo, hi)| u64::from(hi - lo) + 1)
            .sum()
    }

    /// Empties it, keeping its room.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn first(&self) -> Option<u32> {
        self.ranges.first().map(|r| r.0)
    }

    pub fn last(&self) -> Option<u32> {
        self.ranges.last().map(|r| r.1)
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// The sorted, disjoint, non-adjacent inclusive ranges.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    /// Like [`Display`](fmt::Display), wrapped in `[...]` when the set holds
    /// more than one id (flux's `IDSET_FLAG_BRACKETS`).
    pub fn to_bracketed(&self) -> String {
        if self.len() > 1 {
            format!("[{self}]")
        } else {
            self.to_string()
        }
    }

    /// Appends a range that starts after every id already in the set.
    fn push_back(&mut self, lo: u32, hi: u32) {
        match self.ranges.last_mut() {
            Some(last) if u64::from(last.1) + 1 >= u64::from(lo) => last.1 = last.1.max(hi),
            _ => self.ranges.push((lo, hi)),
        }
    }
}

/// One RFC 22 token: `N` or `N-M` with `N < M`, canonical decimals.
fn parse_range(tok: &str, input: &str) -> Result<(u32, u32), IdsetError> {
    let bad = || IdsetError::Range {
        input: input.to_owned(),
        range: tok.to_owned(),
    };
    let too_large = || IdsetError::TooLarge {
        input: input.to_owned(),
        range: tok.to_owned(),
    };
    let (lo, hi) = match tok.split_once('-') {
        Some((a, b)) => (number(a).ok_or_else(bad)?, Some(number(b).ok_or_else(bad)?)),
        None => (number(tok).ok_or_else(bad)?, None),
    };
    let lo = u32::try_from(lo).map_err(|_| too_large())?;
    let Some(hi) = hi else {
        return Ok((lo, lo));
    };
    // flux-core refuses `1-1` and `3-1`, not only reversed ranges.
    if hi <= u64::from(lo) {
        return Err(bad());
    }
    let hi = u32::try_from(hi).map_err(|_| too_large())?;
    Ok((lo, hi))
}

/// A canonical decimal (no sign, no leading zero but `0` itself). Values
/// past u64 (20+ digits) are reported as not-a-number, like flux-core.
fn number(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    s.parse().ok()
}

impl fmt::Display for IdSet {
    /// `0-3,5`: ascending, ranges compressed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for IdSet {
    type Err = IdsetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdSet::parse(s)
    }
}

impl FromIterator<u32> for IdSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut ids: Vec<u32> = iter.into_iter().collect();
        ids.sort_unstable();
        let mut set = IdSet::new();
        for id in ids {
            set.push_back(id, id);
        }
        set
    }
}

impl Extend<u32> for IdSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        let more: IdSet = iter.into_iter().collect();
        self.union_with(&more);
    }
}

/// An idset or the word `all` (RFC 21/32 release `ranks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ranks {
    All,
    Set(IdSet),
}

impl Ranks {
    /// `all` (exactly, as flux writes it) or an idset.
    pub fn parse(s: &str) -> Result<Ranks, IdsetError> {
        if s == "all" {
            Ok(Ranks::All)
        } else {
            IdSet::parse(s).map(Ranks::Set)
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        match self {
            Ranks::All => true,
            Ranks::Set(set) => set.contains(id),
        }
    }
}

impl fmt::Display for Ranks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ranks::All => f.write_str("all"),
            Ranks::Set(set) => fmt::Display::fmt(set, f),
        }
    }
}

impl FromStr for Ranks {
    type Err = IdsetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ranks::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn set(s: &str) -> IdSet {
        IdSet::parse(s).unwrap()
    }

    #[test]
    fn parses_and_prints() {
        assert_eq!(set("0-3,5").ranges(), &[(0, 3), (5, 5)]);
        assert_eq!(set("[0-3,5]").to_string(), "0-3,5");
        assert_eq!(set("0-3,4-5").ranges(), &[(0, 5)]);
        assert_eq!(set("1,,2").to_string(), "1-2");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("[]"), IdSet::new());
        assert_eq!(set(",,"), IdSet::new());
        assert_eq!(set("0-4294967295").len(), 1 << 32);
        assert_eq!(set("0-4000000000").ranges(), &[(0, 4_000_000_000)]);
        assert_eq!("7".parse::<IdSet>(), Ok(IdSet::from_range(7, 7)));
    }

    #[test]
    fn every_error_path() {
        let brackets = |s: &str| IdsetError::Brackets { input: s.into() };
        let range = |s: &str, r: &str| IdsetError::Range {
            input: s.into(),
            range: r.into(),
        };
        let order = |s: &str, r: &str| IdsetError::OutOfOrder {
            input: s.into(),
            range: r.into(),
        };
        let large = |s: &str, r: &str| IdsetError::TooLarge {
            input: s.into(),
            range: r.into(),
        };
        for (input, want) in [
            ("[", brackets("[")),
            ("[0", brackets("[0")),
            ("0]", brackets("0]")),
            ("[[0]]", brackets("[[0]]")),
            ("[0-3][5]", brackets("[0-3][5]")),
            ("1-1", range("1-1", "1-1")),
            ("3-1", range("3-1", "3-1")),
            ("01", range("01", "01")),
            ("0-03", range("0-03", "0-03")),
            ("-1", range("-1", "-1")),
            ("1-", range("1-", "1-")),
            ("1-2-3", range("1-2-3", "1-2-3")),
            ("1, 2", range("1, 2", " 2")),
            ("+1", range("+1", "+1")),
            (
                "99999999999999999999",
                range("99999999999999999999", "99999999999999999999"),
            ),
            ("3,1", order("3,1", "1")),
            ("0-3,3-5", order("0-3,3-5", "3-5")),
            ("4294967296", large("4294967296", "4294967296")),
            ("5-4294967296", large("5-4294967296", "5-4294967296")),
        ] {
            assert_eq!(IdSet::parse(input), Err(want), "{input:?}");
        }
        assert_eq!(
            IdSet::parse("3,1,2").unwrap_err().to_string(),
            "invalid idset `3,1,2`: range '1' is out of order"
        );
    }

    #[test]
    fn insert_and_remove() {
        let mut s = IdSet::new();
        for id in [5, 3, 4, 10, 0, u32::MAX] {
            s.insert(id);
        }
        assert_eq!(s.to_string(), "0,3-5,10,4294967295");
        s.insert(4);
        s.insert_range(6, 9);
        assert_eq!(s.to_string(), "0,3-10,4294967295");
        s.insert_range(9, 3);
        assert_eq!(s.to_string(), "0,3-10,4294967295");
        s.remove(7);
        assert_eq!(s.to_string(), "0,3-6,8-10,4294967295");
        s.remove(3);
        s.remove(10);
        s.remove(0);
        s.remove(1000);
        s.remove(u32::MAX);
        assert_eq!(s.to_string(), "4-6,8-9");
        assert_eq!(s.len(), 5);
        assert_eq!((s.first(), s.last()), (Some(4), Some(9)));
        assert_eq!(s.iter().collect::<Vec<_>>(), [4, 5, 6, 8, 9]);
        assert!(s.contains(8) && !s.contains(7) && !s.contains(3));
        assert_eq!(IdSet::from_range(3, 2), IdSet::new());
        assert_eq!((IdSet::new().first(), IdSet::new().last()), (None, None));
    }

    #[test]
    fn set_operations() {
        let mut a = set("0-10,20-30");
        a.union_with(&set("5-25,40"));
        assert_eq!(a.to_string(), "0-30,40");
        a.subtract(&set("3,10-12,29-35"));
        assert_eq!(a.to_string(), "0-2,4-9,13-28,40");
        assert_eq!(
            a.intersection(&set("1-5,27-50")).to_string(),
            "1-2,4-5,27-28,40"
        );
        let mut full = IdSet::from_range(0, u32::MAX);
        full.subtract(&IdSet::from_range(0, u32::MAX));
        assert!(full.is_empty());
    }

    #[test]
    fn brackets_only_for_more_than_one_id() {
        assert_eq!(set("").to_bracketed(), "");
        assert_eq!(set("1").to_bracketed(), "1");
        assert_eq!(set("1-2").to_bracketed(), "[1-2]");
        assert_eq!(set("0-3,5").to_bracketed(), "[0-3,5]");
    }

    #[test]
    fn from_iter_and_extend() {
        let s: IdSet = [5, 1, 2, 2, 3, 9].into_iter().collect();
        assert_eq!(s.to_string(), "1-3,5,9");
        let mut t = s.clone();
        t.extend([4, 0]);
        assert_eq!(t.to_string(), "0-5,9");
    }

    #[test]
    fn ranks() {
        assert_eq!(Ranks::parse("all"), Ok(Ranks::All));
        assert!(Ranks::All.contains(u32::MAX));
        let r: Ranks = "0-2".parse().unwrap();
        assert!(r.contains(2) && !r.contains(3));
        assert_eq!(r.to_string(), "0-2");
        assert_eq!(Ranks::All.to_string(), "all");
        assert!(Ranks::parse("ALL").is_err());
        assert!(Ranks::parse("all,1").is_err());
    }

    fn read_oracle(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/corpus/oracles/");
        std::fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    #[test]
    fn oracle() {
        let text = read_oracle("idset_oracle.tsv");
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
        assert_eq!(
            header,
            [
                "input",
                "result",
                "encode_range",
                "encode_range_brackets",
                "encode_plain",
                "count",
                "first",
                "last",
                "error_text",
                "errno",
                "sized_result",
                "sized_error_text",
                "decode_empty",
                "python_result",
                "python_str",
                "python_error"
            ]
        );
        let json = |s: &str| -> Option<String> { serde_json::from_str(s).unwrap() };
        let (mut rows, mut deviations) = (0, 0);
        for line in lines {
            let c: Vec<&str> = line.split('\t').collect();
            assert_eq!(c.len(), 16, "{line}");
            let input = json(c[0]).unwrap();
            let ours = IdSet::parse(&input);
            // Deliberate deviations, each explicit.
            match input.as_str() {
                // flux wraps ids past u32 modulo 2^32; we refuse.
                "4294967296" | "4294967297" | "0-4294967296" => {
                    assert_eq!(c[1], "ok");
                    assert!(matches!(ours, Err(IdsetError::TooLarge { .. })), "{input}");
                    deviations += 1;
                    continue;
                }
                // flux's bitmap caps ids at 2^31-1 (and reserves u32::MAX);
                // we store ranges, so every u32 is an id.
                "4294967294" | "4294967295" | "2147483648" => {
                    assert_eq!(c[1], "error");
                    let v: u32 = input.parse().unwrap();
                    assert_eq!(ours, Ok(IdSet::from_range(v, v)));
                    deviations += 1;
                    continue;
                }
                _ => {}
            }
            rows += 1;
            if c[1] == "error" {
                let err = ours.expect_err(&input);
                let flux = json(c[8]).unwrap();
                // flux's 20-digit overflow says "error parsing range"; so do we.
                assert!(
                    err.to_string().ends_with(&format!(": {flux}")),
                    "{input:?}: {err} vs {flux}"
                );
                continue;
            }
            assert_eq!(c[1], "ok");
            let s = ours.unwrap();
            assert_eq!(s.to_string(), json(c[2]).unwrap(), "{input:?}");
            assert_eq!(s.to_bracketed(), json(c[3]).unwrap(), "{input:?}");
            let plain = json(c[4]).unwrap();
            if !plain.starts_with("<omitted") {
                let v: Vec<String> = s.iter().map(|i| i.to_string()).collect();
                assert_eq!(v.join(","), plain, "{input:?}");
            }
            assert_eq!(s.len().to_string(), c[5], "{input:?}");
            let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
            assert_eq!(opt(s.first()), c[6]);
            assert_eq!(opt(s.last()), c[7]);
            assert_eq!(s.is_empty(), c[12] == "true");
            assert_eq!(c[13], "ok");
            assert_eq!(s.to_string(), json(c[14]).unwrap());
        }
        assert_eq!((rows, deviations), (69, 6));
    }

    fn model_set() -> impl Strategy<Value = BTreeSet<u32>> {
        // Small values cluster into ranges; a few huge ones hit the edges.
        prop::collection::btree_set(
            prop_oneof![0u32..200, (u32::MAX - 50)..=u32::MAX, any::<u32>()],
            0..60,
        )
    }

    proptest! {
        #[test]
        fn display_round_trips(ids in model_set()) {
            let s: IdSet = ids.iter().copied().collect();
            prop_assert_eq!(IdSet::parse(&s.to_string()), Ok(s.clone()));
            prop_assert_eq!(IdSet::parse(&s.to_bracketed()), Ok(s.clone()));
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), ids.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(s.len(), ids.len() as u64);
        }

        #[test]
        fn operations_match_a_model(a in model_set(), b in model_set(), probe in model_set()) {
            let (sa, sb): (IdSet, IdSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            let mut u = sa.clone();
            u.union_with(&sb);
            prop_assert_eq!(&u, &a.union(&b).copied().collect::<IdSet>());
            let mut d = sa.clone();
            d.subtract(&sb);
            prop_assert_eq!(&d, &a.difference(&b).copied().collect::<IdSet>());
            prop_assert_eq!(sa.intersection(&sb), a.intersection(&b).copied().collect::<IdSet>());
            let mut ins = sa.clone();
            let mut rem = sa.clone();
            for &p in &probe {
                prop_assert_eq!(sa.contains(p), a.contains(&p));
                ins.insert(p);
                rem.remove(p);
            }
            prop_assert_eq!(ins, a.union(&probe).copied().collect::<IdSet>());
            prop_assert_eq!(rem, a.difference(&probe).copied().collect::<IdSet>());
        }

        #[test]
        fn never_panics(s in ".*") {
            let _ = IdSet::parse(&s);
            let _ = Ranks::parse(&s);
        }

        #[test]
        fn never_panics_on_idset_like_text(s in "[\\[\\]0-9,\\- ]{0,30}") {
            if let Ok(set) = IdSet::parse(&s) {
                // Whatever parses must print back to itself.
                prop_assert_eq!(IdSet::parse(&set.to_string()), Ok(set));
            }
        }
    }
}
