//! flux's output format strings (`flux jobs -o FORMAT`): Python
//! `str.format` fields, `{name!conv:spec}`, with flux's additions: the
//! conversions `!d` (a time, strftime after it, then `::` and the spec),
//! `!D`, `!F`, `!H` and `!P`; the spec suffixes `h` (an empty value prints
//! as `-`) and `+` (a cut value ends in `+`); and the prefixes `?:` (the
//! column is left out when empty for every row), `+:` (widened to its
//! longest value) and `?+:` (both). The header is each field's heading,
//! aligned and padded as the field.

use crate::flux::fsd;
use std::fmt::Write as _;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("unmatched `{0}` at character {1} (write `{0}{0}` for the character itself)")]
    Unmatched(char, usize),
    #[error("unknown format field: {0}")]
    UnknownField(String),
    #[error("field {0}: unknown conversion `!{1}` (flux has d, D, F, H and P)")]
    Conversion(String, char),
    #[error("field {0}: invalid format spec `{1}`")]
    Spec(String, String),
    #[error("`sort:` in a format is not supported: fluxpipe lists jobs in `flux jobs` order")]
    Sort,
    #[error("`{0}` names no field (of flux's named formats only `default` is known here)")]
    NoField(String),
}

/// A field's value before it is formatted.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Str(String),
    Int(i64),
    Float(f64),
    /// Not known: prints as an empty string, as flux prints a field the
    /// job does not have.
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
    Center,
    /// Padding after the sign (`=`).
    Sign,
}

/// A Python format spec, with flux's suffixes.
#[derive(Debug, Clone, Default, PartialEq)]
struct Spec {
    fill: Option<char>,
    align: Option<Align>,
    sign: Option<char>,
    zero: bool,
    width: Option<usize>,
    grouping: Option<char>,
    /// `#`: `0x`, `0o`, `0b` before a hexadecimal, octal or binary number.
    alternate: bool,
    precision: Option<usize>,
    ty: Option<char>,
    hyphen: bool,
    truncate: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    heading: &'static str,
    conv: Option<char>,
    /// `!d`: the strftime format before `::`.
    time_format: Option<String>,
    spec: Spec,
    omit_empty: bool,
    expand: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Item {
    Text(String),
    Field(Field),
}

/// A parsed format: render rows with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Format {
    items: Vec<Item>,
}

/// Strings that count as empty for `h` and `?:`, as flux's.
const EMPTY: &[&str] = &["", "0s", "0.0", "0:00:00", "1970-01-01T00:00:00"];

impl Format {
    /// Parse `text`; `heading` gives a known field's column heading.
    pub fn parse(
        text: &str,
        heading: impl Fn(&str) -> Option<&'static str>,
    ) -> Result<Format, FormatError> {
        if text.starts_with("sort:") {
            return Err(FormatError::Sort);
        }
        let mut items = Vec::new();
        let mut literal = String::new();
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '{' if chars.get(i + 1) == Some(&'{') => {
                    literal.push('{');
                    i += 2;
                }
                '}' if chars.get(i + 1) == Some(&'}') => {
                    literal.push('}');
                    i += 2;
                }
                '}' => return Err(FormatError::Unmatched('}', i)),
                '{' => {
                    let start = i;
                    let end = chars[i + 1..]
                        .iter()
                        .position(|c| *c == '}' || *c == '{')
                        .map(|p| p + i + 1)
                        .filter(|e| chars[*e] == '}')
                        .ok_or(FormatError::Unmatched('{', start))?;
                    let inner: String = chars[i + 1..end].iter().collect();
                    let (omit_empty, expand) = take_sentinel(&mut literal);
                    if !literal.is_empty() {
                        items.push(Item::Text(std::mem::take(&mut literal)));
                    }
                    let mut field = parse_field(&inner, &heading)?;
                    field.omit_empty = omit_empty;
                    field.expand = expand;
                    items.push(Item::Field(field));
                    i = end + 1;
                }
                c => {
                    literal.push(c);
                    i += 1;
                }
            }
        }
        if !literal.is_empty() {
            items.push(Item::Text(literal));
        }
        // A named format (`long`, `deps`) would print its name on each line.
        if !items.iter().any(|i| matches!(i, Item::Field(_))) {
            return Err(FormatError::NoField(text.to_string()));
        }
        Ok(Format { items })
    }

    /// The names of the fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.items.iter().filter_map(|i| match i {
            Item::Field(f) => Some(f.name.as_str()),
            Item::Text(_) => None,
        })
    }

    /// The lines for `rows` (a header first when `header`); `value` gives
    /// a row's value of a field.
    pub fn render<R>(
        &self,
        rows: &[R],
        value: impl Fn(&R, &str) -> Val,
        header: bool,
    ) -> Vec<String> {
        let fitted = self.fitted(rows, &value, header);
        let mut lines = Vec::new();
        if header {
            lines.push(fitted.header());
        }
        for row in rows {
            let mut line = String::new();
            for item in &fitted.items {
                match item {
                    Item::Text(t) => line.push_str(t),
                    Item::Field(f) => line.push_str(&f.format(value(row, &f.name))),
                }
            }
            // As flux: a line that formats to nothing is not printed.
            if !line.trim().is_empty() {
                lines.push(line);
            }
        }
        lines
    }

    /// The format with `?:` fields empty in every row left out and `+:`
    /// fields widened to their longest value (and heading).
    fn fitted<R>(&self, rows: &[R], value: &impl Fn(&R, &str) -> Val, header: bool) -> Format {
        let mut items = Vec::new();
        for item in &self.items {
            let Item::Field(f) = item else {
                items.push(item.clone());
                continue;
            };
            if !(f.omit_empty || f.expand) {
                items.push(item.clone());
                continue;
            }
            let widest = rows
                .iter()
                .map(|r| f.converted(value(r, &f.name)))
                .map(|s| {
                    if EMPTY.contains(&s.as_str()) {
                        0
                    } else {
                        s.chars().count()
                    }
                })
                .max()
                .unwrap_or(0);
            if f.omit_empty && widest == 0 {
                // The text just before a field goes with it, as flux's.
                if matches!(items.last(), Some(Item::Text(_))) {
                    items.pop();
                }
                continue;
            }
            let mut f = f.clone();
            if f.expand {
                let heading = if header { f.heading.chars().count() } else { 0 };
                let width = f.spec.width.unwrap_or(0).max(widest).max(heading);
                f.spec.width = Some(width);
                // A string's cut widens with it, as flux's.
                if let Some(p) = f.spec.precision
                    && matches!(f.spec.ty, None | Some('s'))
                    && p < width
                {
                    f.spec.precision = Some(width);
                }
            }
            items.push(Item::Field(f));
        }
        Format { items }
    }

    /// Each field's heading, aligned and padded as the field, within the
    /// format's text.
    fn header(&self) -> String {
        let mut line = String::new();
        for item in &self.items {
            match item {
                Item::Text(t) => line.push_str(t),
                Item::Field(f) => {
                    let spec = Spec {
                        align: f.spec.align,
                        width: f.spec.width,
                        ..Spec::default()
                    };
                    line.push_str(&pad(f.heading, &spec, Align::Left));
                }
            }
        }
        line
    }
}

/// Take a `?:`, `+:` or `?+:` off the end of the text before a field:
/// (leave out when empty, widen).
fn take_sentinel(text: &mut String) -> (bool, bool) {
    for (sentinel, flags) in [
        ("?+:", (true, true)),
        ("?:", (true, false)),
        ("+:", (false, true)),
    ] {
        if text.ends_with(sentinel) {
            text.truncate(text.len() - sentinel.len());
            return flags;
        }
    }
    (false, false)
}

fn parse_field(
    inner: &str,
    heading: &impl Fn(&str) -> Option<&'static str>,
) -> Result<Field, FormatError> {
    let name_end = inner.find(['!', ':']).unwrap_or(inner.len());
    let name = inner[..name_end].trim_start_matches("0.").to_string();
    let heading = heading(&name).ok_or_else(|| FormatError::UnknownField(name.clone()))?;
    let mut rest = &inner[name_end..];
    let mut conv = None;
    if let Some(after) = rest.strip_prefix('!') {
        let mut cs = after.chars();
        let c = cs
            .next()
            .ok_or_else(|| FormatError::Spec(name.clone(), inner.to_string()))?;
        if !"dDFHPsr".contains(c) {
            return Err(FormatError::Conversion(name, c));
        }
        conv = Some(c);
        rest = cs.as_str();
        if !(rest.is_empty() || rest.starts_with(':')) {
            return Err(FormatError::Spec(name, inner.to_string()));
        }
    }
    let spec_text = rest.strip_prefix(':').unwrap_or("");
    let (time_format, spec_text) = match (conv, spec_text.split_once("::")) {
        (Some('d'), Some((t, s))) => ((!t.is_empty()).then(|| t.to_string()), s),
        (Some('d'), None) if !spec_text.is_empty() => (Some(spec_text.to_string()), ""),
        _ => (None, spec_text),
    };
    let spec =
        parse_spec(spec_text).ok_or_else(|| FormatError::Spec(name.clone(), spec_text.into()))?;
    Ok(Field {
        name,
        heading,
        conv,
        time_format,
        spec,
        omit_empty: false,
        expand: false,
    })
}

/// `[[fill]align][sign][0][width][grouping][.precision][type][h][W][+]`.
fn parse_spec(text: &str) -> Option<Spec> {
    let cs: Vec<char> = text.chars().collect();
    let mut spec = Spec::default();
    let mut i = 0;
    let align_of = |c: char| match c {
        '<' => Some(Align::Left),
        '>' => Some(Align::Right),
        '^' => Some(Align::Center),
        '=' => Some(Align::Sign),
        _ => None,
    };
    if cs.len() >= 2
        && let Some(a) = align_of(cs[1])
    {
        spec.fill = Some(cs[0]);
        spec.align = Some(a);
        i = 2;
    } else if let Some(a) = cs.first().and_then(|c| align_of(*c)) {
        spec.align = Some(a);
        i = 1;
    }
    if let Some(c @ ('+' | '-' | ' ')) = cs.get(i) {
        // A `+` here is a sign only if something follows it.
        if !(*c == '+' && i + 1 == cs.len()) {
            spec.sign = Some(*c);
            i += 1;
        }
    }
    // `z` (no negative zero) is taken and has no effect here.
    eat(&cs, &mut i, 'z');
    spec.alternate = eat(&cs, &mut i, '#');
    if eat(&cs, &mut i, '0') {
        spec.zero = true;
        // As Python: `0` fills with zeros where no fill is given.
        if spec.fill.is_none() {
            spec.fill = Some('0');
        }
    }
    let digits = |i: &mut usize| -> Option<Option<usize>> {
        let start = *i;
        while cs.get(*i).is_some_and(char::is_ascii_digit) {
            *i += 1;
        }
        if *i == start {
            return Some(None);
        }
        let text: String = cs[start..*i].iter().collect();
        // A width past any terminal's is refused, not allocated.
        text.parse::<usize>()
            .ok()
            .filter(|n| *n <= 10_000)
            .map(Some)
    };
    spec.width = digits(&mut i)?;
    if let Some(c @ (',' | '_')) = cs.get(i) {
        spec.grouping = Some(*c);
        i += 1;
    }
    if cs.get(i) == Some(&'.') {
        i += 1;
        spec.precision = Some(digits(&mut i)??);
    }
    if let Some(c) = cs.get(i)
        && "bcdeEfFgGnosxX%".contains(*c)
    {
        spec.ty = Some(*c);
        i += 1;
    }
    spec.hyphen = eat(&cs, &mut i, 'h');
    eat(&cs, &mut i, 'W');
    spec.truncate = eat(&cs, &mut i, '+');
    (i == cs.len()).then_some(spec)
}

/// Step over `c` if it is next; whether it was.
fn eat(cs: &[char], i: &mut usize, c: char) -> bool {
    let there = cs.get(*i) == Some(&c);
    *i += usize::from(there);
    there
}

impl Field {
    /// The value after its conversion, as a string (what `?:` and `+:`
    /// measure).
    fn converted(&self, v: Val) -> String {
        self.plain(self.convert(v))
    }

    fn convert(&self, v: Val) -> Val {
        let secs = match &v {
            Val::Int(n) => Some(*n as f64),
            Val::Float(x) => Some(*x),
            _ => None,
        };
        match (self.conv, secs) {
            (Some('d' | 'D' | 'F' | 'H' | 'P'), None) => Val::Str(String::new()),
            (Some('d'), Some(t)) => {
                Val::Str(time(t, self.time_format.as_deref().unwrap_or("%FT%T")))
            }
            (Some('D'), Some(t)) => Val::Str(time(t, "%FT%T")),
            (Some('F'), Some(t)) => Val::Str(fsd::format(t)),
            (Some('H'), Some(t)) => Val::Str(hms(t)),
            (Some('P'), Some(x)) => Val::Str(percent(x)),
            (Some('s' | 'r'), _) => Val::Str(self.plain(v)),
            _ => v,
        }
    }

    fn plain(&self, v: Val) -> String {
        match v {
            Val::Str(s) => s,
            Val::Int(n) => n.to_string(),
            Val::Float(x) => python_float(x),
            Val::Empty => String::new(),
        }
    }

    /// The value converted and formatted by the spec.
    fn format(&self, v: Val) -> String {
        let v = self.convert(v);
        let mut spec = self.spec.clone();
        let v = if spec.hyphen {
            let s = self.plain(v);
            spec.ty = None;
            Val::Str(if EMPTY.contains(&s.as_str()) {
                "-".into()
            } else {
                s
            })
        } else {
            v
        };
        let whole = self.plain(v.clone());
        let out = match v {
            Val::Str(s) => {
                let cut: String = match spec.precision {
                    Some(p) => s.chars().take(p).collect(),
                    None => s,
                };
                pad(&cut, &spec, Align::Left)
            }
            Val::Empty => pad("", &spec, Align::Left),
            Val::Int(n) => number(n as f64, Some(n), &spec),
            Val::Float(x) => number(x, None, &spec),
        };
        if spec.truncate && out.chars().count() < whole.chars().count() {
            let mut kept: Vec<char> = out.chars().collect();
            kept.pop();
            kept.push('+');
            return kept.into_iter().collect();
        }
        out
    }
}

/// Pad `s` to the spec's width by its alignment (`default` when none).
fn pad(s: &str, spec: &Spec, default: Align) -> String {
    let len = s.chars().count();
    let width = spec.width.unwrap_or(0);
    if len >= width {
        return s.to_string();
    }
    let fill = spec.fill.unwrap_or(' ');
    let n = width - len;
    let run = |k: usize| std::iter::repeat_n(fill, k).collect::<String>();
    match spec.align.unwrap_or(default) {
        Align::Left => format!("{s}{}", run(n)),
        Align::Right => format!("{}{s}", run(n)),
        Align::Center => format!("{}{s}{}", run(n / 2), run(n - n / 2)),
        Align::Sign => match s.strip_prefix(['-', '+', ' ']) {
            Some(digits) => format!("{}{}{digits}", &s[..1], run(n)),
            None => format!("{}{s}", run(n)),
        },
    }
}

/// A number by the spec: `d`, `f`, `e`, `g`, `%`, `x`, `o`, `b` or none.
fn number(x: f64, int: Option<i64>, spec: &Spec) -> String {
    let mut body = match (spec.ty, int) {
        (None | Some('d' | 'n'), Some(n)) => n.unsigned_abs().to_string(),
        (Some('x'), Some(n)) => format!("{:x}", n.unsigned_abs()),
        (Some('X'), Some(n)) => format!("{:X}", n.unsigned_abs()),
        (Some('o'), Some(n)) => format!("{:o}", n.unsigned_abs()),
        (Some('b'), Some(n)) => format!("{:b}", n.unsigned_abs()),
        (Some('f' | 'F'), _) => format!("{:.*}", spec.precision.unwrap_or(6), x.abs()),
        (Some('e' | 'E'), _) => sci(x.abs(), spec.precision.unwrap_or(6)),
        (Some('%'), _) => format!("{:.*}%", spec.precision.unwrap_or(6), x.abs() * 100.0),
        (Some('g' | 'G'), _) => general(x.abs(), spec.precision.unwrap_or(6)),
        (None, None) => match spec.precision {
            Some(p) => general(x.abs(), p),
            None => python_float(x.abs()),
        },
        // A type that does not apply (`s` for a number): as it is.
        _ => match int {
            Some(n) => n.unsigned_abs().to_string(),
            None => python_float(x.abs()),
        },
    };
    if spec.ty == Some('E') || spec.ty == Some('G') {
        body = body.to_uppercase();
    }
    if let Some(sep) = spec.grouping {
        body = group(&body, sep);
    }
    if spec.alternate && int.is_some() {
        let prefix = match spec.ty {
            Some('x') => "0x",
            Some('X') => "0X",
            Some('o') => "0o",
            Some('b') => "0b",
            _ => "",
        };
        body = format!("{prefix}{body}");
    }
    let negative = x < 0.0 || int.is_some_and(|n| n < 0);
    let sign = match (negative, spec.sign) {
        (true, _) => "-",
        (false, Some('+')) => "+",
        (false, Some(' ')) => " ",
        _ => "",
    };
    let text = format!("{sign}{body}");
    // `0` with no alignment pads after the sign.
    let default = if spec.zero { Align::Sign } else { Align::Right };
    pad(&text, spec, default)
}

/// Thousands separators in the integer part.
fn group(body: &str, sep: char) -> String {
    let (int, rest) = body.split_at(
        body.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(body.len()),
    );
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(sep);
        }
        out.push(c);
    }
    out + rest
}

/// Python's `str(float)`: `1.0`, `0.5`, `1e+20`.
fn python_float(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    if x != 0.0 && (x.abs() >= 1e16 || x.abs() < 1e-4) {
        let s = format!("{x:e}");
        return python_exponent(&s);
    }
    let s = format!("{x}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// `1.5e2` → `1.5e+02`, as C and Python write exponents.
fn python_exponent(s: &str) -> String {
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s.to_string(),
    }
}

fn sci(x: f64, precision: usize) -> String {
    python_exponent(&format!("{x:.precision$e}"))
}

/// C's `%.Pg`: fixed or scientific by the exponent, trailing zeros gone.
fn general(x: f64, precision: usize) -> String {
    let p = precision.max(1);
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return python_float(x);
    }
    let exp = format!("{x:.*e}", p - 1)
        .split_once('e')
        .and_then(|(_, e)| e.parse::<i32>().ok())
        .unwrap_or(0);
    let strip = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if exp < -4 || exp >= p as i32 {
        let s = format!("{x:.*e}", p - 1);
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        python_exponent(&format!("{}e{e}", strip(m.to_string())))
    } else {
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        strip(format!("{x:.decimals$}"))
    }
}

/// A time in the local zone, by a strftime format; 0 is no time.
fn time(t: f64, format: &str) -> String {
    if t == 0.0 || !t.is_finite() {
        return String::new();
    }
    let Ok(ts) = jiff::Timestamp::from_second(t.floor() as i64) else {
        return String::new();
    };
    let zoned = ts.to_zoned(jiff::tz::TimeZone::system());
    let mut out = String::new();
    // A format jiff cannot render prints as nothing, not a panic.
    match write!(out, "{}", zoned.strftime(format)) {
        Ok(()) => out,
        Err(_) => String::new(),
    }
}

/// Python's `str(timedelta)`: `H:MM:SS`, `N day(s), H:MM:SS`; a part of
/// a second rounds up to one.
fn hms(t: f64) -> String {
    if !t.is_finite() {
        return String::new();
    }
    let t = if t > 0.0 && t < 1.0 { 1.0 } else { t };
    let total = t.round() as i64;
    let (days, secs) = (total.div_euclid(86400), total.rem_euclid(86400));
    let clock = format!("{}:{:02}:{:02}", secs / 3600, secs % 3600 / 60, secs % 60);
    match days {
        0 => clock,
        1 | -1 => format!("{days} day, {clock}"),
        _ => format!("{days} days, {clock}"),
    }
}

fn percent(x: f64) -> String {
    let v = x * 100.0;
    if v > 0.0 && v < 1.0 {
        format!("{v:.2}%")
    } else {
        format!("{}%", general(v, 3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn known(name: &str) -> Option<&'static str> {
        match name {
            "id" => Some("JOBID"),
            "name" => Some("NAME"),
            "ntasks" => Some("NTASKS"),
            "queue" => Some("QUEUE"),
            "runtime" => Some("RUNTIME"),
            "t_submit" => Some("T_SUBMIT"),
            _ => None,
        }
    }

    fn render(fmt: &str, rows: &[(&str, Val)]) -> Vec<String> {
        let f = Format::parse(fmt, known).unwrap();
        f.render(
            &[rows.to_vec()],
            |r, name| {
                r.iter()
                    .find(|(k, _)| *k == name)
                    .map_or(Val::Empty, |(_, v)| v.clone())
            },
            true,
        )
    }

    #[test]
    fn fields_are_padded_cut_and_headed_as_python_pads_them() {
        let lines = render(
            "{id:>6} {name:<5.5+}|{ntasks:>4h} {queue:<4h}|",
            &[
                ("id", Val::Int(42)),
                ("name", Val::Str("averylongname".into())),
                ("ntasks", Val::Int(3)),
            ],
        );
        assert_eq!(
            lines,
            [" JOBID NAME |NTASKS QUEUE|", "    42 aver+|   3 -   |"]
        );
    }

    #[test]
    fn conversions_are_flux_s() {
        let f = |fmt: &str, v: Val| render(fmt, &[("runtime", v)])[1].clone();
        assert_eq!(f("{runtime!F}", Val::Float(90.0)), "1.5m");
        assert_eq!(f("{runtime!H}", Val::Float(90061.0)), "1 day, 1:01:01");
        assert_eq!(f("{runtime!H}", Val::Float(0.2)), "0:00:01");
        assert_eq!(f("{runtime!P}", Val::Float(0.256)), "25.6%");
        assert_eq!(f("{runtime!F:>6h}", Val::Float(0.0)), "     -");
        assert_eq!(f("{runtime:.2f}", Val::Float(1.0 / 3.0)), "0.33");
        assert_eq!(f("{runtime}", Val::Float(2.0)), "2.0");
        assert_eq!(f("{runtime:08.3f}", Val::Float(-1.5)), "-001.500");
        assert_eq!(f("{runtime:,}", Val::Int(1234567)), "1,234,567");
        assert_eq!(f("{runtime:.3g}", Val::Float(123456.0)), "1.23e+05");
        assert_eq!(f("{runtime:^7}", Val::Str("ab".into())), "  ab   ");
        assert_eq!(f("{runtime:>05}", Val::Int(5)), "00005");
        assert_eq!(f("{runtime:05}", Val::Str("ab".into())), "ab000");
        assert_eq!(f("{runtime:#x}", Val::Int(255)), "0xff");
        assert_eq!(f("{runtime!d:%Y::>6h}", Val::Empty), "     -");
        assert_eq!(f("{{x}} {runtime}", Val::Empty), "{x} ");
        assert!(!f("{runtime!d:::>20}", Val::Float(1e9)).trim().is_empty());
    }

    #[test]
    fn empty_columns_go_and_widened_ones_fit() {
        let f = Format::parse("{id:>3} ?:{queue:<8} +:{name:<2}|", known).unwrap();
        let rows = [("a", 1), ("abcdef", 2)];
        let lines = f.render(
            &rows,
            |r, name| match name {
                "id" => Val::Int(r.1),
                "name" => Val::Str(r.0.into()),
                _ => Val::Empty,
            },
            true,
        );
        assert_eq!(lines, ["JOBID NAME  |", "  1 a     |", "  2 abcdef|"]);
    }

    #[test]
    fn bad_formats_say_what_is_wrong() {
        assert_eq!(
            Format::parse("{bogus}", known),
            Err(FormatError::UnknownField("bogus".into()))
        );
        assert_eq!(
            Format::parse("{id", known),
            Err(FormatError::Unmatched('{', 0))
        );
        assert_eq!(
            Format::parse("x}", known),
            Err(FormatError::Unmatched('}', 1))
        );
        assert!(matches!(
            Format::parse("{id!q}", known),
            Err(FormatError::Conversion(..))
        ));
        assert!(matches!(
            Format::parse("{id:>>>}", known),
            Err(FormatError::Spec(..))
        ));
        assert_eq!(Format::parse("sort:id {id}", known), Err(FormatError::Sort));
        assert_eq!(
            Format::parse("long", known),
            Err(FormatError::NoField("long".into()))
        );
    }

    proptest! {
        #[test]
        fn any_format_parses_or_errs_and_renders_without_panic(text in "[{}a-z_!:<>^=+0-9.,hdDFHPsxegf% ?-]{0,40}", n in any::<i64>(), x in any::<f64>()) {
            let any = |_: &str| Some("H");
            if let Ok(f) = Format::parse(&text, any) {
                let vals = [Val::Int(n), Val::Float(x), Val::Str("v".into()), Val::Empty];
                for v in vals {
                    let _ = f.render(&[()], |_, _| v.clone(), true);
                }
            }
        }

        #[test]
        fn a_plain_field_prints_the_string_as_it_is(s in "[a-zA-Z0-9 ]{0,20}", w in 0usize..30) {
            let f = Format::parse(&format!("{{name:<{w}}}"), known).unwrap();
            let lines = f.render(&[()], |_, _| Val::Str(s.clone()), false);
            if let Some(line) = lines.first() {
                prop_assert_eq!(line.trim_end(), s.trim_end());
                prop_assert_eq!(line.chars().count(), w.max(s.chars().count()));
            }
        }
    }
}
