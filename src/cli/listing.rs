//! Tables as the `flux` commands print them (flux-core's output formats):
//! columns separated by one space, each at least its width (a longer value
//! pushes the rest right), some widened to their longest value, some cut;
//! a header of the column names padded alike. And the small conventions
//! those tables share: `-` for an empty value, F58 ids, dependencies.

use crate::flux::jobid::JobId;
use std::io::Write;

#[derive(Debug, Clone, Copy)]
enum Align {
    Left,
    Right,
}

#[derive(Debug, Clone)]
struct Column {
    heading: &'static str,
    align: Align,
    width: usize,
    /// Widened to the longest value (flux's `+:` prefix).
    grow: bool,
    /// Cut to the width; with a `+` in place of the last kept character
    /// when `marker` (flux's `.N+`).
    cut: Option<bool>,
}

/// `1 job`, `2 jobs`: a count and its noun, singular for one.
pub fn counted(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// A table's columns and rows; the last column is never padded.
#[derive(Debug, Clone, Default)]
pub struct Columns {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Columns {
    pub fn new() -> Self {
        Columns::default()
    }

    fn add(&mut self, heading: &'static str, align: Align, width: usize) -> &mut Column {
        self.columns.push(Column {
            heading,
            align,
            width,
            grow: false,
            cut: None,
        });
        let last = self.columns.len() - 1;
        &mut self.columns[last]
    }

    /// `{x:>W}`.
    pub fn right(&mut self, heading: &'static str, width: usize) {
        self.add(heading, Align::Right, width);
    }

    /// `{x:<W}`.
    pub fn left(&mut self, heading: &'static str, width: usize) {
        self.add(heading, Align::Left, width);
    }

    /// `+:{x:<W}`: as wide as its longest value or heading, at least W.
    pub fn left_grow(&mut self, heading: &'static str, width: usize) {
        self.add(heading, Align::Left, width).grow = true;
    }

    /// `{x:<W.W}`, or `{x:<W.W+}` with `marker`.
    pub fn left_cut(&mut self, heading: &'static str, width: usize, marker: bool) {
        self.add(heading, Align::Left, width).cut = Some(marker);
    }

    /// The last column: its values as they are.
    pub fn last(&mut self, heading: &'static str) {
        self.add(heading, Align::Left, 0);
    }

    pub fn row(&mut self, values: Vec<String>) {
        self.rows.push(values);
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Every column's width, with the widened ones widened.
    fn widths(&self) -> Vec<usize> {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if !c.grow {
                    return c.width;
                }
                let longest = self
                    .rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|v| v.chars().count())
                    .max()
                    .unwrap_or(0);
                c.width.max(c.heading.len()).max(longest)
            })
            .collect()
    }

    fn line(&self, values: &[&str], widths: &[usize], cut: bool) -> String {
        let mut line = String::new();
        let last = self.columns.len().saturating_sub(1);
        for (i, (c, value)) in self.columns.iter().zip(values).enumerate() {
            if i > 0 {
                line.push(' ');
            }
            if i == last {
                line.push_str(value);
                break;
            }
            let w = widths[i];
            let value = match (cut, c.cut) {
                (true, Some(marker)) => truncate(value, w, marker),
                _ => value.to_string(),
            };
            match c.align {
                Align::Left => line.push_str(&format!("{value:<w$}")),
                Align::Right => line.push_str(&format!("{value:>w$}")),
            }
        }
        line
    }
}

/// `value` cut to `width` characters; with `marker`, a cut value ends in `+`.
fn truncate(value: &str, width: usize, marker: bool) -> String {
    if value.chars().count() <= width {
        return value.to_string();
    }
    let keep = if marker {
        width.saturating_sub(1)
    } else {
        width
    };
    let mut out: String = value.chars().take(keep).collect();
    if marker && width > 0 {
        out.push('+');
    }
    out
}

/// Print the table, with its header line first if `header`.
pub fn print(out: &mut impl Write, table: &Columns, header: bool) -> std::io::Result<()> {
    let widths = table.widths();
    if header {
        let headings: Vec<&str> = table.columns.iter().map(|c| c.heading).collect();
        writeln!(out, "{}", table.line(&headings, &widths, false))?;
    }
    for row in &table.rows {
        let values: Vec<&str> = row.iter().map(String::as_str).collect();
        writeln!(out, "{}", table.line(&values, &widths, true))?;
    }
    Ok(())
}

/// flux's `h` format: a value that prints as nothing (`""`, `0s`, `0.0`,
/// `0:00:00`) prints as `-`.
pub fn hyphen_if_empty(value: String) -> String {
    if ["", "0s", "0.0", "0:00:00"].contains(&value.as_str()) {
        "-".into()
    } else {
        value
    }
}

/// A job id in F58 as `flux` prints it: `ƒ` in a UTF-8 locale (what
/// Python makes of a C locale too), `f` when `FLUX_F58_FORCE_ASCII` is
/// set or the locale names another character set.
pub fn f58(id: JobId) -> String {
    if std::env::var_os("FLUX_F58_FORCE_ASCII").is_some() || !utf8_locale() {
        id.to_f58_ascii()
    } else {
        id.to_f58()
    }
}

fn utf8_locale() -> bool {
    let locale = ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .find(|v| !v.is_empty());
    match locale {
        None => true,
        Some(l) if l == "C" || l == "POSIX" => true,
        Some(l) => {
            let l = l.to_ascii_lowercase();
            l.contains("utf-8") || l.contains("utf8")
        }
    }
}

/// A dependency as `flux jobs` shows it: `begin-time=T` as `begin@HH:MM`
/// (today) or `begin@MonDD-HH:MM`, with `:SS` if the seconds are not 0, in
/// local time; the others as they are.
pub fn dependency(dep: &str) -> String {
    let Some(t) = dep
        .strip_prefix("begin-time=")
        .and_then(|t| t.parse::<f64>().ok())
    else {
        return dep.to_string();
    };
    let Ok(at) = jiff::Timestamp::from_microsecond((t * 1e6) as i64) else {
        return dep.to_string();
    };
    let tz = jiff::tz::TimeZone::system();
    let at = at.to_zoned(tz.clone());
    let today = jiff::Timestamp::now().to_zoned(tz).date();
    let mut out = if at.date() == today {
        format!("begin@{}", at.strftime("%H:%M"))
    } else {
        format!("begin@{}", at.strftime("%b%d-%H:%M"))
    };
    if at.second() > 0 {
        out.push_str(&format!(":{}", at.strftime("%S")));
    }
    out
}

/// A drain time as `flux resource drain` shows it: `MonDD HH:MM`, local.
/// flux-core's resource module rounds drain times to whole seconds before
/// the command formats them, so a drain at HH:MM:59.6 shows the next minute.
pub fn drain_time(t: f64) -> String {
    let t = t.round();
    if t <= 0.0 || !t.is_finite() {
        return String::new();
    }
    match jiff::Timestamp::from_second(t as i64) {
        Ok(at) => at
            .to_zoned(jiff::tz::TimeZone::system())
            .strftime("%b%d %H:%M")
            .to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_times_round_to_the_second_as_flux_core_does() {
        // A multiple of 60 s is a minute's start in every whole-minute zone.
        let minute = 1_764_374_400.0;
        assert_ne!(drain_time(minute), drain_time(minute - 59.0));
        assert_eq!(drain_time(minute - 0.4), drain_time(minute));
        assert_eq!(drain_time(minute - 0.5), drain_time(minute));
        assert_eq!(drain_time(minute - 0.6), drain_time(minute - 59.0));
        assert_eq!(drain_time(0.0), "");
        assert_eq!(drain_time(f64::NAN), "");
    }

    #[test]
    fn widths_pad_grow_and_cut_as_flux_formats_do() {
        let mut t = Columns::new();
        t.right("A", 4);
        t.left_grow("USER", 8);
        t.left_cut("REASON", 6, true);
        t.last("NODES");
        t.row(vec![
            "123456".into(),
            "averylongname".into(),
            "abcdefgh".into(),
            "n1".into(),
        ]);
        t.row(vec!["1".into(), "x".into(), "abc".into(), "".into()]);
        let mut out = Vec::new();
        print(&mut out, &t, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "   A USER          REASON NODES\n\
             123456 averylongname abcde+ n1\n\
             \x20  1 x             abc    \n"
        );
    }

    #[test]
    fn empty_values_print_as_a_hyphen() {
        assert_eq!(hyphen_if_empty("0s".into()), "-");
        assert_eq!(hyphen_if_empty("".into()), "-");
        assert_eq!(hyphen_if_empty("0".into()), "0");
        assert_eq!(hyphen_if_empty("1.5m".into()), "1.5m");
    }

    #[test]
    fn other_dependencies_are_shown_as_they_are() {
        assert_eq!(dependency("after-success=ƒki9ptf"), "after-success=ƒki9ptf");
        assert_eq!(dependency("begin-time=nonsense"), "begin-time=nonsense");
        assert!(dependency("begin-time=1700000000.0").starts_with("begin@"));
    }
}
