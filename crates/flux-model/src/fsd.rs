//! Flux Standard Duration (RFC 23): a number of seconds, minutes, hours or
//! days (`2.5m`, `1.5h`, `inf`), as the `flux` commands print and take
//! them. Printing follows flux-core's `flux.util.fsd`: below 1 ms is `0s`,
//! below 10 s three decimals, above that four significant digits in the
//! largest unit that keeps the number small.

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
#[error("`{0}` is not a duration (a number and one of s, m, h, d; or inf)")]
pub struct FsdError(String);

/// `secs` as flux-core prints a duration.
pub fn format(secs: f64) -> String {
    let mut out = String::new();
    write(&mut out, secs);
    out
}

/// [`format`], appended to `out` (a caller formatting many reuses one
/// buffer).
pub fn write(out: &mut String, secs: f64) {
    use std::fmt::Write as _;
    if secs.is_infinite() {
        return out.push_str("inf");
    }
    if secs.is_nan() || secs < 1.0e-3 {
        return out.push_str("0s");
    }
    if secs < 10.0 {
        _ = std::write!(out, "{secs:.3}s");
        return;
    }
    let (value, unit) = if secs < 60.0 {
        (secs, 's')
    } else if secs < 3600.0 {
        (secs / 60.0, 'm')
    } else if secs < 86400.0 {
        (secs / 3600.0, 'h')
    } else {
        (secs / 86400.0, 'd')
    };
    if !four_digits_fixed(out, value) {
        out.push_str(&general(value, 4));
    }
    out.push(unit);
}

/// `general(value, 4)` for a value from 1 to below 10000 whose rounding to
/// four significant digits does not carry into a fifth (as 9.99996 does),
/// in one formatting instead of two; false, with `out` as it was, for any
/// other value.
fn four_digits_fixed(out: &mut String, value: f64) -> bool {
    use std::fmt::Write as _;
    let whole_digits = match value {
        v if (1.0..10.0).contains(&v) => 1,
        v if (10.0..100.0).contains(&v) => 2,
        v if (100.0..1000.0).contains(&v) => 3,
        v if (1000.0..10000.0).contains(&v) => 4,
        _ => return false,
    };
    let start = out.len();
    let decimals = 4 - whole_digits;
    _ = std::write!(out, "{value:.decimals$}");
    // Rounded at the same place as `general`'s exponent form, so the same
    // carry: without one, the exponent is the one assumed here.
    let whole = out[start..].find('.').unwrap_or(out.len() - start);
    if whole != whole_digits {
        out.truncate(start);
        return false;
    }
    let kept = trim_zeros(&out[start..]).len();
    out.truncate(start + kept);
    true
}

/// Parse a duration: a non-negative number with an optional unit (seconds
/// by default), or `inf` / `infinity`.
pub fn parse(text: &str) -> Result<f64, FsdError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity") {
        return Ok(f64::INFINITY);
    }
    let err = || FsdError(text.to_string());
    let (number, scale) = match t.as_bytes().last() {
        Some(b's') => (&t[..t.len() - 1], 1.0),
        Some(b'm') => (&t[..t.len() - 1], 60.0),
        Some(b'h') => (&t[..t.len() - 1], 3600.0),
        Some(b'd') => (&t[..t.len() - 1], 86400.0),
        _ => (t, 1.0),
    };
    // Digits only: no sign, no `inf` or `nan` spelled as a number.
    if number.is_empty()
        || !number.bytes().all(|b| {
            b.is_ascii_digit() || b == b'.' || b == b'e' || b == b'E' || b == b'+' || b == b'-'
        })
        || number.starts_with(['-', '+'])
    {
        return Err(err());
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let secs = value * scale;
    if secs.is_finite() && secs >= 0.0 {
        Ok(secs)
    } else {
        Err(err())
    }
}

/// `x` with `digits` significant digits, as C's and Python's `%.Ng`: fixed
/// notation while the exponent is from -4 to below `digits`, else
/// scientific; trailing zeros and a trailing point dropped.
pub fn general(x: f64, digits: usize) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x.is_infinite() {
            if x > 0.0 { "inf".into() } else { "-inf".into() }
        } else {
            "0".into()
        };
    }
    let digits = digits.max(1);
    // The exponent after rounding to `digits` digits (9.9996 is 1.000e1).
    let sci = std::format!("{:.*e}", digits - 1, x);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= digits as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        std::format!("{}e{sign}{:02}", trim_zeros(mantissa), exp.unsigned_abs())
    } else {
        let decimals = (digits as i32 - 1 - exp).max(0) as usize;
        trim_zeros(&std::format!("{x:.decimals$}")).to_string()
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn as_flux_prints_them() {
        // Values from flux-core's `flux.util.fsd`.
        assert_eq!(format(0.0), "0s");
        assert_eq!(format(0.0004), "0s");
        assert_eq!(format(0.5), "0.500s");
        assert_eq!(format(9.9994), "9.999s");
        assert_eq!(format(10.0), "10s");
        assert_eq!(format(12.345_67), "12.35s");
        assert_eq!(format(59.99), "59.99s");
        assert_eq!(format(60.0), "1m");
        assert_eq!(format(90.0), "1.5m");
        assert_eq!(format(3599.0), "59.98m");
        assert_eq!(format(3600.0), "1h");
        assert_eq!(format(5400.0), "1.5h");
        assert_eq!(format(86400.0), "1d");
        assert_eq!(format(86400.0 * 365.0), "365d");
        assert_eq!(format(86400.0 * 12345.0), "1.234e+04d");
        assert_eq!(format(f64::INFINITY), "inf");
    }

    #[test]
    fn general_matches_printf() {
        assert_eq!(general(1.0, 4), "1");
        assert_eq!(general(1.5, 4), "1.5");
        assert_eq!(general(123.456, 4), "123.5");
        assert_eq!(general(9999.6, 4), "1e+04");
        assert_eq!(general(0.000_123_4, 4), "0.0001234");
        assert_eq!(general(0.000_012_34, 4), "1.234e-05");
    }

    #[test]
    fn durations_parse_with_their_units() {
        assert_eq!(parse("90"), Ok(90.0));
        assert_eq!(parse("1.5m"), Ok(90.0));
        assert_eq!(parse("2h"), Ok(7200.0));
        assert_eq!(parse("1d"), Ok(86400.0));
        assert_eq!(parse("inf"), Ok(f64::INFINITY));
        for bad in ["", "m", "-1s", "1x", "nan", "infs", "1..2s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_short_way_leaves_carries_to_general() {
        for v in [
            9.999_96, 99.999_6, 999.996, 9999.6, 9999.5, 1.0, 10.0, 9999.4,
        ] {
            let mut out = String::new();
            if four_digits_fixed(&mut out, v) {
                assert_eq!(out, general(v, 4), "{v}");
            } else {
                assert!(out.is_empty(), "{v}");
            }
        }
        assert_eq!(format(60.0 * 9.999_96), "10m");
        assert_eq!(format(86400.0 * 9999.6), "1e+04d");
    }

    proptest! {
        /// One formatting prints what `general`'s two do.
        #[test]
        fn the_short_way_prints_as_general(v in 1.0f64..10000.0, near in 0usize..4) {
            // Also values just below a power of ten, where rounding carries.
            let v = match near {
                0 => v,
                n => 10f64.powi(n as i32) - v / 1e5,
            };
            let mut out = String::from("kept ");
            if four_digits_fixed(&mut out, v) {
                prop_assert_eq!(&out[5..], general(v, 4));
            } else {
                prop_assert_eq!(out, "kept ");
            }
        }

        #[test]
        fn printed_durations_read_back_within_their_digits(secs in 0.0f64..1e9) {
            let back = parse(&format(secs)).unwrap();
            if secs < 1e-3 {
                prop_assert_eq!(back, 0.0);
            } else {
                // Four significant digits (or 1 ms below 10 s).
                prop_assert!((back - secs).abs() <= secs * 1e-3 + 1e-3, "{} {}", secs, back);
            }
        }

        #[test]
        fn parsing_never_panics(text in ".*") {
            let _ = parse(&text);
        }
    }
}
