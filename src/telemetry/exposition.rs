//! The two text formats `/metrics` speaks: Prometheus text 0.0.4, which
//! the exporter and our own boards render, and OpenMetrics 1.0, for
//! scrapers that ask for it in `Accept`. Pure: no I/O.
//!
//! OpenMetrics is derived from the 0.0.4 text rather than rendered twice:
//! the two differ only in metadata (a counter's family name drops
//! `_total`, `untyped` is `unknown`, a quote in HELP is escaped), in what
//! may stand between families (no blank lines, no other comments) and in
//! the closing `# EOF`.

use mediatype::{MediaTypeList, ReadParams, names};

/// The content type of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A text format of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// The format an `Accept` header prefers: OpenMetrics when it is listed
/// with a weight no lower than any range that also covers the text format
/// (Prometheus sends OpenMetrics at 1, `text/plain` at 0.5); the text
/// format otherwise, and for a header that cannot be read.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let (mut openmetrics, mut text) = (0.0_f64, 0.0_f64);
    for range in MediaTypeList::new(accept) {
        let Ok(range) = range else {
            return Format::Text;
        };
        let q = range
            .get_param(names::Q)
            .and_then(|q| q.as_str().parse::<f64>().ok())
            .filter(|q| (0.0..=1.0).contains(q))
            .unwrap_or(1.0);
        let (ty, subty) = (range.ty.as_str(), range.subty.as_str());
        if ty.eq_ignore_ascii_case("application") && subty.eq_ignore_ascii_case("openmetrics-text")
        {
            openmetrics = openmetrics.max(q);
        } else if (ty.eq_ignore_ascii_case("text")
            && (subty == "*" || subty.eq_ignore_ascii_case("plain")))
            || (ty == "*" && subty == "*")
        {
            text = text.max(q);
        }
    }
    if openmetrics > 0.0 && openmetrics >= text {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// The 0.0.4 text `text` in OpenMetrics 1.0, ending in `# EOF`.
pub fn to_openmetrics(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    // A HELP line comes before its TYPE line, which tells the family name.
    let mut help: Option<&str> = None;
    for line in text.lines() {
        let mut words = line
            .strip_prefix('#')
            .map(|c| c.trim_start().splitn(3, ' '));
        let (keyword, name, rest) = match words.as_mut() {
            Some(w) => (w.next(), w.next().unwrap_or(""), w.next().unwrap_or("")),
            None => (None, "", ""),
        };
        if keyword != Some("TYPE")
            && let Some((name, text)) = help.take().and_then(|h| h.split_once(' '))
        {
            write_help(name, text, &mut out);
        }
        match keyword {
            Some("HELP") if !name.is_empty() => help = line.strip_prefix("# HELP "),
            Some("TYPE") if !name.is_empty() => {
                let (family, kind) = match rest.trim() {
                    "counter" => match name.strip_suffix("_total") {
                        Some(family) => (family, "counter"),
                        // Counter samples must end in `_total`: this one
                        // can only be exported as of unknown type.
                        None => (name, "unknown"),
                    },
                    "untyped" => (name, "unknown"),
                    other => (name, other),
                };
                if let Some((_, text)) = help.take().and_then(|h| h.split_once(' ')) {
                    write_help(family, text, &mut out);
                }
                out.push_str("# TYPE ");
                out.push_str(family);
                out.push(' ');
                out.push_str(kind);
                out.push('\n');
            }
            // Other comments and blank lines are not allowed in OpenMetrics.
            Some(_) => {}
            None if line.is_empty() => {}
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let Some((name, text)) = help.and_then(|h| h.split_once(' ')) {
        write_help(name, text, &mut out);
    }
    out.push_str("# EOF\n");
    out
}

/// The values of every sample of the family `name` in the 0.0.4 text
/// (any labels), for a page that shows a few of the pipeline's own
/// figures. Samples carry no timestamp here, so the value is the last word.
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        line.rsplit_once(' ')?.1.parse().ok()
    })
}

/// One sample of the 0.0.4 text: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if it has one.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of the 0.0.4 text by family name (a histogram's series
/// under their own names: `x_bucket`, `x_sum`, `x_count`). Lines that do
/// not read as samples are skipped; nothing panics.
pub fn parse_samples(text: &str) -> std::collections::BTreeMap<String, Vec<Sample>> {
    let mut out: std::collections::BTreeMap<String, Vec<Sample>> = Default::default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if let Some((name, sample)) = parse_sample(line) {
            out.entry(name).or_default().push(sample);
        }
    }
    out
}

fn parse_sample(line: &str) -> Option<(String, Sample)> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let rest = &line[name_end..];
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => parse_labels(inner)?,
        None => (Vec::new(), rest),
    };
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name.to_string(), Sample { labels, value }))
}

/// `k="v",...}` (what follows a `{`): the labels, and the text after `}`.
fn parse_labels(mut rest: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once('=')?;
        let quoted = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim().to_string(), value));
        rest = quoted[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// A HELP line; in 0.0.4 only `\\` and newlines are escaped in its text,
/// OpenMetrics also escapes `"`.
fn write_help(name: &str, help: &str, out: &mut String) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push('\\');
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_of_one_family_only() {
        let text = "# TYPE a_total counter\na_total{x=\"1 2\"} 3\na_total 4\na_total_more 9\nb 1\n";
        assert_eq!(samples(text, "a_total").collect::<Vec<_>>(), [3.0, 4.0]);
        assert_eq!(samples(text, "c").count(), 0);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn samples_are_read_with_their_labels() {
        let text = "# HELP a x\n# TYPE a gauge\na{x=\"1 2\",y=\"q\\\"\\\\z\\n\"} 3.5\nb 4\nc{} 1\nh_bucket{le=\"+Inf\"} 2\nbad{x=1} 2\n";
        let s = parse_samples(text);
        assert_eq!(s["a"][0].label("x"), Some("1 2"));
        assert_eq!(s["a"][0].label("y"), Some("q\"\\z\n"));
        assert_eq!(s["a"][0].value, 3.5);
        assert_eq!(s["b"][0].value, 4.0);
        assert!(s["c"][0].labels.is_empty());
        assert_eq!(s["h_bucket"][0].label("le"), Some("+Inf"));
        assert!(!s.contains_key("bad"));
    }

    proptest! {
        #[test]
        fn parsing_any_text_never_panics(text in any::<String>()) {
            let _ = parse_samples(&text);
        }

        #[test]
        fn label_values_read_back_as_rendered(v in any::<String>(), n in -1e9f64..1e9) {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let line = format!("m{{a=\"{escaped}\",b=\"2\"}} {n}");
            let s = parse_samples(&line);
            prop_assert_eq!(s["m"][0].label("a"), Some(v.as_str()));
            prop_assert_eq!(s["m"][0].label("b"), Some("2"));
            prop_assert_eq!(s["m"][0].value, n);
        }
    }

    #[test]
    fn prometheus_scrapers_get_openmetrics_others_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some("*/*")), Format::Text);
        assert_eq!(negotiate(Some("text/plain")), Format::Text);
        assert_eq!(
            negotiate(Some("text/plain, application/openmetrics-text;q=0.3")),
            Format::Text
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        assert_eq!(negotiate(Some("application/json")), Format::Text);
        assert_eq!(negotiate(Some("not a media type")), Format::Text);
    }

    #[test]
    fn counters_lose_total_in_the_family_name_and_the_text_ends_in_eof() {
        let text = "# HELP flux_job_transitions_total Job state transitions \"from\" to \\\\ to.\n\
                    # TYPE flux_job_transitions_total counter\n\
                    flux_job_transitions_total{from=\"SCHED\",to=\"RUN\"} 3\n\
                    \n\
                    # TYPE plain_count counter\n\
                    plain_count 1\n\
                    # TYPE loose untyped\n\
                    loose 2\n\
                    # a stray comment\n\
                    # HELP flux_jobs Active jobs.\n\
                    # TYPE flux_jobs gauge\n\
                    flux_jobs{state=\"RUN\"} 1\n";
        assert_eq!(
            to_openmetrics(text),
            "# HELP flux_job_transitions Job state transitions \\\"from\\\" to \\\\ to.\n\
             # TYPE flux_job_transitions counter\n\
             flux_job_transitions_total{from=\"SCHED\",to=\"RUN\"} 3\n\
             # TYPE plain_count unknown\n\
             plain_count 1\n\
             # TYPE loose unknown\n\
             loose 2\n\
             # HELP flux_jobs Active jobs.\n\
             # TYPE flux_jobs gauge\n\
             flux_jobs{state=\"RUN\"} 1\n\
             # EOF\n"
        );
        assert_eq!(to_openmetrics(""), "# EOF\n");
    }

    proptest! {
        #[test]
        fn any_text_converts_without_panic_and_keeps_every_sample(text in "(#? ?(HELP|TYPE)? ?[a-z_]{0,8} ?[a-z\"\\\\ ]{0,12}\n){0,12}") {
            let om = to_openmetrics(&text);
            prop_assert!(om.ends_with("# EOF\n"));
            let samples = |t: &str| t.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
            prop_assert_eq!(samples(&text), samples(&om));
            prop_assert!(!om.lines().any(str::is_empty));
        }

        #[test]
        fn any_accept_header_negotiates_without_panic(accept in "\\PC{0,64}") {
            let _ = negotiate(Some(&accept));
        }
    }
}
