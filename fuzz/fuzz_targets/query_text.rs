//! What the query API and its commands read from text never panics: a page
//! position (`after`), a state list (`state`), a duration (RFC 23), the
//! Prometheus text `fluxpipe top` reads, a `-o` format string (parsed and
//! rendered against every kind of value); and a
//! duration that reads back prints and reads again to about itself.
#![no_main]

use fluxpipe::cli::format::{Format, Val};
use fluxpipe::flux::fsd;
use fluxpipe::keyed::query::{JobFilter, Position};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(p) = Position::decode(s) {
        let back = Position::decode(&p.encode()).expect("an encoded position decodes");
        assert_eq!(back.cmp(&p), std::cmp::Ordering::Equal);
    }
    let _ = JobFilter::parse_states(s);
    if let Ok(format) = Format::parse(s, |_| Some("HEADING")) {
        let values = [Val::Int(-7), Val::Float(1.5e300), Val::Str("ƒ2GeDKtT".into()), Val::Empty];
        let _ = format.render(&values, |v, _| v.clone(), true);
    }
    // What `fluxpipe top` reads from /metrics.
    let _ = fluxpipe::telemetry::exposition::parse_samples(s);
    if let Ok(secs) = fsd::parse(s)
        && secs.is_finite()
    {
        let back = fsd::parse(&fsd::format(secs)).expect("a printed duration reads back");
        assert!(back.is_finite());
    }
});
