//! Flux job ids (RFC 19 FLUIDs) and their text encodings.
//!
//! A job id is a `u64`. People see it as F58 (`ƒuZZybuNNy`), the KVS uses
//! dothex (`job.0017.e9fb.8df1.6c2e`), and JSON messages carry the integer.
//! [`JobId::parse`] accepts every encoding flux-core's decoder accepts, minus
//! the inputs that flux-core silently turns into a wrong id (see the oracle
//! tests at the bottom of this file for the exact list).

use std::fmt;
use std::str::FromStr;

/// A Flux job id. Unique within one Flux instance only.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct JobId(pub u64);

/// The text encodings of a job id.
///
/// Emoji ids (`flux job id --to=emoji`) are not supported: flux-core's emoji
/// alphabet could not be confirmed, and guessing it would mis-decode ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Decimal, `6731191091817518`.
    Dec,
    /// F58 with the `ƒ` prefix, `ƒuZZybuNNy`.
    F58,
    /// F58 with the ASCII `f` prefix, `fuZZybuNNy`.
    F58Ascii,
    /// `0x17e9fb8df16c2e`.
    Hex,
    /// `0017.e9fb.8df1.6c2e`.
    Dothex,
    /// KVS directory key, `job.0017.e9fb.8df1.6c2e`.
    Kvs,
    /// KVS dump folder, `job/0017/e9fb/8df1/6c2e`.
    KvsPath,
    /// Mnemonicode, `reform-remote-galileo--heart-package-academy`.
    Words,
}

impl Encoding {
    /// Every encoding, in the order [`Encoding::name`] documents them.
    pub const ALL: [Encoding; 8] = [
        Encoding::Dec,
        Encoding::F58,
        Encoding::F58Ascii,
        Encoding::Hex,
        Encoding::Dothex,
        Encoding::Kvs,
        Encoding::KvsPath,
        Encoding::Words,
    ];

    /// Looks an encoding up by the name `flux job id --to=` uses
    /// (`f58plain` is flux's name for ASCII F58; `kvs-path` is ours).
    pub fn parse(name: &str) -> Option<Encoding> {
        Some(match name {
            "dec" => Encoding::Dec,
            "f58" => Encoding::F58,
            "f58plain" => Encoding::F58Ascii,
            "hex" => Encoding::Hex,
            "dothex" => Encoding::Dothex,
            "kvs" => Encoding::Kvs,
            "kvs-path" => Encoding::KvsPath,
            "words" => Encoding::Words,
            _ => return None,
        })
    }

    /// The name [`Encoding::parse`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Dec => "dec",
            Encoding::F58 => "f58",
            Encoding::F58Ascii => "f58plain",
            Encoding::Hex => "hex",
            Encoding::Dothex => "dothex",
            Encoding::Kvs => "kvs",
            Encoding::KvsPath => "kvs-path",
            Encoding::Words => "words",
        }
    }
}

/// Why a string is not a job id. Every message names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobIdError {
    #[error("malformed job id `{0}`: empty")]
    Empty(String),
    #[error("malformed job id `{0}`: dothex needs 4 groups of 4 hex digits")]
    Dothex(String),
    #[error("malformed job id `{0}`: a KVS path needs job/xxxx/xxxx/xxxx/xxxx")]
    KvsPath(String),
    #[error("malformed job id `{0}`: not a 64-bit mnemonicode word list")]
    Words(String),
    #[error("malformed job id `{input}`: `{digit}` is not an F58 digit")]
    F58Digit { input: String, digit: char },
    #[error("malformed job id `{0}`: F58 needs 1 to 12 digits after the prefix")]
    F58Length(String),
    #[error("malformed job id `{0}`: emoji job ids are not supported")]
    Emoji(String),
    #[error("malformed job id `{0}`: hex needs hex digits after `0x`")]
    Hex(String),
    #[error("malformed job id `{0}`: not a decimal number")]
    Decimal(String),
    #[error("malformed job id `{0}`: larger than 18446744073709551615")]
    Overflow(String),
}

const F58_ALPHABET: &[u8; 58] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
const F58_PREFIX: &str = "ƒ";
const F58_ASCII_PREFIX: &str = "f";
/// flux-core refuses F58 strings longer than this (u64::MAX needs 11).
const F58_MAX_DIGITS: usize = 12;

impl JobId {
    /// Decodes any encoding, after trimming surrounding whitespace.
    ///
    /// Order, as flux-core's decoder: `job.` prefix (the rest is decoded by
    /// the remaining rules, as flux does), `job/` KVS path, `.` → dothex,
    /// `-` → words, `ƒ`/`f` → F58, emoji (rejected), `0x` → hex, decimal.
    pub fn parse(s: &str) -> Result<JobId, JobIdError> {
        let t = s.trim();
        if let Some(rest) = t.strip_prefix("job.") {
            return parse_bare(rest, s);
        }
        if let Some(rest) = t.strip_prefix("job/") {
            return parse_groups(rest, '/').ok_or_else(|| JobIdError::KvsPath(s.to_owned()));
        }
        parse_bare(t, s)
    }

    /// Encodes in `enc`.
    pub fn encode(self, enc: Encoding) -> String {
        match enc {
            Encoding::Dec => self.0.to_string(),
            Encoding::F58 => self.to_f58(),
            Encoding::F58Ascii => self.to_f58_ascii(),
            Encoding::Hex => format!("{:#x}", self.0),
            Encoding::Dothex => self.to_dothex(),
            Encoding::Kvs => self.to_kvs(),
            Encoding::KvsPath => self.to_kvs_path(),
            Encoding::Words => self.to_words(),
        }
    }

    /// `ƒuZZybuNNy`.
    pub fn to_f58(self) -> String {
        self.f58().to_string()
    }

    /// `ƒuZZybuNNy`, written where it is displayed (no string of its own;
    /// width and alignment are honoured).
    pub fn f58(self) -> F58 {
        F58 {
            id: self,
            prefix: F58_PREFIX,
        }
    }

    /// `fuZZybuNNy`, for places that cannot show `ƒ`.
    pub fn to_f58_ascii(self) -> String {
        F58 {
            id: self,
            prefix: F58_ASCII_PREFIX,
        }
        .to_string()
    }

    /// `0017.e9fb.8df1.6c2e`.
    pub fn to_dothex(self) -> String {
        self.groups('.')
    }

    /// `job.0017.e9fb.8df1.6c2e`, the job's KVS directory.
    pub fn to_kvs(self) -> String {
        format!("job.{}", self.groups('.'))
    }

    /// `job/0017/e9fb/8df1/6c2e`, the job's folder in a KVS dump.
    pub fn to_kvs_path(self) -> String {
        format!("job/{}", self.groups('/'))
    }

    /// Mnemonicode of the little-endian bytes, as flux-core encodes it.
    pub fn to_words(self) -> String {
        mnemonic::to_string(self.0.to_le_bytes())
    }

    fn groups(self, sep: char) -> String {
        let v = self.0;
        format!(
            "{:04x}{sep}{:04x}{sep}{:04x}{sep}{:04x}",
            (v >> 48) & 0xffff,
            (v >> 32) & 0xffff,
            (v >> 16) & 0xffff,
            v & 0xffff
        )
    }
}

/// A job id in F58, as [`JobId::f58`] displays it.
#[derive(Debug, Clone, Copy)]
pub struct F58 {
    id: JobId,
    prefix: &'static str,
}

impl fmt::Display for F58 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // At most 11 digits after a prefix of at most 2 bytes (`ƒ`), filled
        // from the end: the least significant digit comes first.
        let mut buf = [0u8; 13];
        let mut at = buf.len();
        let mut v = self.id.0;
        loop {
            at -= 1;
            buf[at] = F58_ALPHABET[(v % 58) as usize];
            v /= 58;
            if v == 0 {
                break;
            }
        }
        at -= self.prefix.len();
        buf[at..at + self.prefix.len()].copy_from_slice(self.prefix.as_bytes());
        match std::str::from_utf8(&buf[at..]) {
            Ok(text) => f.pad(text),
            Err(_) => Err(fmt::Error),
        }
    }
}

/// Decodes everything but the `job.`/`job/` forms. `orig` is the caller's
/// input, for error messages.
fn parse_bare(t: &str, orig: &str) -> Result<JobId, JobIdError> {
    let err = |f: fn(String) -> JobIdError| f(orig.to_owned());
    if t.is_empty() {
        return Err(err(JobIdError::Empty));
    }
    if t.contains('.') {
        return parse_groups(t, '.').ok_or_else(|| err(JobIdError::Dothex));
    }
    if t.contains('-') {
        return parse_words(t).ok_or_else(|| err(JobIdError::Words));
    }
    if let Some(digits) = t
        .strip_prefix(F58_PREFIX)
        .or_else(|| t.strip_prefix(F58_ASCII_PREFIX))
    {
        return parse_f58(digits, orig);
    }
    // Emoji live in U+1Fxxx, whose UTF-8 starts with F0 9F.
    if t.as_bytes().starts_with(&[0xf0, 0x9f]) {
        return Err(err(JobIdError::Emoji));
    }
    if let Some(hex) = t.strip_prefix("0x") {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(JobIdError::Hex));
        }
        // Leading zeros are fine (flux uses strtoull); only the value counts.
        return u64::from_str_radix(hex, 16)
            .map(JobId)
            .map_err(|_| err(JobIdError::Overflow));
    }
    // flux (strtoull) accepts one leading `+`, never `-`.
    let dec = t.strip_prefix('+').unwrap_or(t);
    if dec.is_empty() || !dec.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(JobIdError::Decimal));
    }
    dec.parse::<u64>()
        .map(JobId)
        .map_err(|_| err(JobIdError::Overflow))
}

/// Exactly 4 groups of exactly 4 hex digits, joined by `sep`.
fn parse_groups(s: &str, sep: char) -> Option<JobId> {
    let mut v: u64 = 0;
    let mut n = 0;
    for g in s.split(sep) {
        if g.len() != 4 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        v = (v << 16) | u64::from(u16::from_str_radix(g, 16).ok()?);
        n += 1;
    }
    (n == 4).then_some(JobId(v))
}

fn parse_words(s: &str) -> Option<JobId> {
    let mut bytes = Vec::with_capacity(8);
    mnemonic::decode(s, &mut bytes).ok()?;
    // A job id is exactly 8 bytes; anything else is a different payload.
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some(JobId(u64::from_le_bytes(arr)))
}

fn parse_f58(digits: &str, orig: &str) -> Result<JobId, JobIdError> {
    let n = digits.chars().count();
    if n == 0 || n > F58_MAX_DIGITS {
        return Err(JobIdError::F58Length(orig.to_owned()));
    }
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = F58_ALPHABET
            .iter()
            .position(|&a| char::from(a) == c)
            .ok_or_else(|| JobIdError::F58Digit {
                input: orig.to_owned(),
                digit: c,
            })?;
        // flux wraps silently past u64::MAX; we refuse instead.
        v = v
            .checked_mul(58)
            .and_then(|v| v.checked_add(d as u64))
            .ok_or_else(|| JobIdError::Overflow(orig.to_owned()))?;
    }
    Ok(JobId(v))
}

impl fmt::Display for JobId {
    /// Decimal, as flux's JSON carries it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for JobId {
    type Err = JobIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobId::parse(s)
    }
}

impl From<u64> for JobId {
    fn from(v: u64) -> Self {
        JobId(v)
    }
}

impl From<JobId> for u64 {
    fn from(id: JobId) -> Self {
        id.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: JobId = JobId(6731191091817518);

    #[test]
    fn encodes_the_rfc19_example() {
        assert_eq!(EXAMPLE.to_f58(), "ƒuZZybuNNy");
        assert_eq!(EXAMPLE.to_f58_ascii(), "fuZZybuNNy");
        assert_eq!(EXAMPLE.to_dothex(), "0017.e9fb.8df1.6c2e");
        assert_eq!(EXAMPLE.to_kvs(), "job.0017.e9fb.8df1.6c2e");
        assert_eq!(EXAMPLE.to_kvs_path(), "job/0017/e9fb/8df1/6c2e");
        assert_eq!(EXAMPLE.encode(Encoding::Hex), "0x17e9fb8df16c2e");
        assert_eq!(EXAMPLE.encode(Encoding::Dec), "6731191091817518");
        assert_eq!(EXAMPLE.to_string(), "6731191091817518");
        assert_eq!(
            JobId(0).to_words(),
            "academy-academy-academy--academy-academy-academy"
        );
    }

    #[test]
    fn zero_and_max_encode() {
        assert_eq!(JobId(0).to_f58(), "ƒ1");
        assert_eq!(JobId(0).encode(Encoding::Hex), "0x0");
        assert_eq!(JobId(u64::MAX).to_f58(), "ƒjpXCZedGfVQ");
        assert_eq!(JobId(u64::MAX).to_dothex(), "ffff.ffff.ffff.ffff");
        assert_eq!(JobId(u64::MAX).to_f58_ascii(), "fjpXCZedGfVQ");
    }

    #[test]
    fn f58_displays_with_width_and_alignment() {
        // Width counts characters: `ƒ` is one.
        assert_eq!(format!("{:>12}", EXAMPLE.f58()), "  ƒuZZybuNNy");
        assert_eq!(format!("{:<12}|", JobId(0).f58()), "ƒ1          |");
        assert_eq!(format!("{:3}", EXAMPLE.f58()), "ƒuZZybuNNy");
    }

    #[test]
    fn parses_every_form_of_the_example() {
        for s in [
            "6731191091817518",
            "+6731191091817518",
            "ƒuZZybuNNy",
            "fuZZybuNNy",
            "0x17e9fb8df16c2e",
            "0x0017e9fb8df16c2e",
            "0x17E9FB8DF16C2E",
            "0017.e9fb.8df1.6c2e",
            "0017.E9FB.8DF1.6C2E",
            "job.0017.e9fb.8df1.6c2e",
            "job/0017/e9fb/8df1/6c2e",
            "job.ƒuZZybuNNy",
            "job.6731191091817518",
            " \tƒuZZybuNNy\n",
        ] {
            assert_eq!(JobId::parse(s), Ok(EXAMPLE), "{s:?}");
            assert_eq!(s.parse::<JobId>(), Ok(EXAMPLE), "{s:?}");
        }
        let words = EXAMPLE.to_words();
        assert_eq!(JobId::parse(&words), Ok(EXAMPLE));
    }

    #[test]
    fn encoding_names_round_trip() {
        for enc in Encoding::ALL {
            assert_eq!(Encoding::parse(enc.name()), Some(enc));
        }
        assert_eq!(Encoding::parse("f58plain"), Some(Encoding::F58Ascii));
        assert_eq!(Encoding::parse("emoji"), None);
        assert_eq!(Encoding::parse("DEC"), None);
        assert_eq!(Encoding::parse(""), None);
    }

    #[test]
    fn every_error_path() {
        use JobIdError as E;
        let cases: Vec<(&str, JobIdError)> = vec![
            ("", E::Empty(String::new())),
            ("   ", E::Empty("   ".into())),
            ("job.", E::Empty("job.".into())),
            ("0000.0000.0001", E::Dothex("0000.0000.0001".into())),
            (
                "0000.0000.0000.000g",
                E::Dothex("0000.0000.0000.000g".into()),
            ),
            ("000.0000.0000.0001", E::Dothex("000.0000.0000.0001".into())),
            (
                "0000.0000.0000.0000.0000",
                E::Dothex("0000.0000.0000.0000.0000".into()),
            ),
            (
                "job/0000/0000/0001",
                E::KvsPath("job/0000/0000/0001".into()),
            ),
            (
                "job/0000.0000.0000.0001",
                E::KvsPath("job/0000.0000.0000.0001".into()),
            ),
            ("-1", E::Words("-1".into())),
            ("notaword-academy", E::Words("notaword-academy".into())),
            // Six words give 8 bytes; three give 4: not a job id.
            (
                "academy-academy-academy",
                E::Words("academy-academy-academy".into()),
            ),
            ("ƒ", E::F58Length("ƒ".into())),
            ("f", E::F58Length("f".into())),
            ("ƒ1111111111111", E::F58Length("ƒ1111111111111".into())),
            (
                "ƒ0",
                E::F58Digit {
                    input: "ƒ0".into(),
                    digit: '0',
                },
            ),
            (
                "fI",
                E::F58Digit {
                    input: "fI".into(),
                    digit: 'I',
                },
            ),
            (
                "fƒ1",
                E::F58Digit {
                    input: "fƒ1".into(),
                    digit: 'ƒ',
                },
            ),
            ("ƒjpXCZedGfVR", E::Overflow("ƒjpXCZedGfVR".into())),
            ("😃", E::Emoji("😃".into())),
            ("0x", E::Hex("0x".into())),
            ("0xg", E::Hex("0xg".into())),
            ("0x+1", E::Hex("0x+1".into())),
            (
                "0x10000000000000000",
                E::Overflow("0x10000000000000000".into()),
            ),
            ("0X10", E::Decimal("0X10".into())),
            ("+", E::Decimal("+".into())),
            ("++1", E::Decimal("++1".into())),
            ("1 2", E::Decimal("1 2".into())),
            ("1e3", E::Decimal("1e3".into())),
            ("١٢", E::Decimal("١٢".into())),
            (
                "18446744073709551616",
                E::Overflow("18446744073709551616".into()),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(JobId::parse(input), Err(want), "{input:?}");
        }
    }

    #[test]
    fn errors_name_the_input() {
        let e = JobId::parse("xyz").unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed job id `xyz`: not a decimal number"
        );
        let e = JobId::parse("😃").unwrap_err();
        assert!(e.to_string().contains("emoji job ids are not supported"));
    }

    fn read_oracle(name: &str) -> String {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/corpus/oracles/");
        std::fs::read_to_string(format!("{dir}{name}")).unwrap()
    }

    /// Splits a TSV line and checks the column count.
    fn cols(line: &str, n: usize) -> Vec<&str> {
        let c: Vec<&str> = line.split('\t').collect();
        assert_eq!(c.len(), n, "bad oracle line {line:?}");
        c
    }

    #[test]
    fn oracle_every_encoding() {
        let text = read_oracle("jobid_oracle.tsv");
        let mut lines = text.lines();
        let header = cols(lines.next().unwrap(), 10);
        assert_eq!(
            header,
            [
                "dec",
                "hex",
                "kvs",
                "dothex",
                "words",
                "f58",
                "f58plain",
                "emoji",
                "f58_with_FLUX_F58_FORCE_ASCII",
                "source"
            ]
        );
        let mut rows = 0;
        for line in lines {
            let c = cols(line, 10);
            let id = JobId(c[0].parse().unwrap());
            let encs = [
                (Encoding::Dec, c[0]),
                (Encoding::Hex, c[1]),
                (Encoding::Kvs, c[2]),
                (Encoding::Dothex, c[3]),
                (Encoding::Words, c[4]),
                (Encoding::F58, c[5]),
                (Encoding::F58Ascii, c[6]),
                (Encoding::F58Ascii, c[8]),
            ];
            for (enc, want) in encs {
                assert_eq!(id.encode(enc), want, "{enc:?} of {id}");
                assert_eq!(JobId::parse(want), Ok(id), "parse {want:?}");
            }
            // Deliberate deviation: emoji ids are unsupported (alphabet
            // unknown to us), so the emoji column must fail cleanly.
            assert_eq!(
                JobId::parse(c[7]),
                Err(JobIdError::Emoji(c[7].to_owned())),
                "{line}"
            );
            rows += 1;
        }
        assert_eq!(rows, 100);
    }

    #[test]
    fn oracle_edge_case_inputs() {
        let text = read_oracle("jobid_parse_oracle.tsv");
        let mut lines = text.lines();
        assert_eq!(
            cols(lines.next().unwrap(), 6),
            [
                "input_json",
                "flux_job_id_rc",
                "flux_job_id_to_dec_stdout",
                "flux_job_id_stderr",
                "python_JobID_dec",
                "python_JobID_error"
            ]
        );
        let mut rows = 0;
        let mut deviations = 0;
        for line in lines {
            let c = cols(line, 6);
            let input: String = serde_json::from_str(c[0]).unwrap();
            let flux: Option<u64> = match c[1] {
                "0" => Some(c[2].parse().unwrap()),
                _ => None,
            };
            // The CLI and Python agree on every row.
            assert_eq!(flux.map(|v| v.to_string()).unwrap_or_default(), c[4]);
            let ours = JobId::parse(&input);
            // Deliberate deviations, each one explicit:
            let expected: Result<u64, ()> = match input.as_str() {
                // flux indexes its digit table with the bytes of `ƒ` and
                // yields garbage (185020); `ƒ` is not an F58 digit.
                "fƒ1" | "ƒƒ1" => Err(()),
                // flux wraps past u64::MAX to 0; we refuse.
                "ƒjpXCZedGfVR" => Err(()),
                // We trim surrounding whitespace on every form.
                "ƒ2GeDKtT " => Ok(48335159296),
                // Emoji ids are unsupported.
                s if s.as_bytes().starts_with(&[0xf0, 0x9f]) => Err(()),
                _ => flux.ok_or(()),
            };
            if expected != flux.ok_or(()) {
                deviations += 1;
            }
            assert_eq!(ours.map(|j| j.0).map_err(|_| ()), expected, "{input:?}");
            rows += 1;
        }
        assert_eq!(rows, 62);
        assert_eq!(deviations, 8);
    }

    proptest! {
        #[test]
        fn every_encoding_round_trips(v in any::<u64>()) {
            let id = JobId(v);
            for enc in Encoding::ALL {
                let s = id.encode(enc);
                prop_assert_eq!(JobId::parse(&s), Ok(id), "{:?} {}", enc, s);
                let padded = format!("  {s}\t");
                prop_assert_eq!(JobId::parse(&padded), Ok(id));
            }
        }

        #[test]
        fn small_ids_round_trip(v in 0u64..100_000) {
            for enc in Encoding::ALL {
                prop_assert_eq!(JobId::parse(&JobId(v).encode(enc)), Ok(JobId(v)));
            }
        }

        #[test]
        fn never_panics(s in ".*") {
            let _ = JobId::parse(&s);
        }

        #[test]
        fn never_panics_on_id_like_text(s in "(job[./])?[ƒf0x.\\-/ 0-9a-fA-Z😃]{0,24}") {
            let _ = JobId::parse(&s);
        }
    }
}
