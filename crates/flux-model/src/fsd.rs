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
    if secs.is_infinite() {
        return "inf".into();
    }
    if secs.is_nan() || secs < 1.0e-3 {
        return "0s".into();
    }
    if secs < 10.0 {
        return std::format!("{secs:.3}s");
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
    std::format!("{}{unit}", general(value, 4))
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

    proptest! {
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
