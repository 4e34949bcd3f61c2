//! Idset decoding never panics, and whatever decodes round-trips.
#![no_main]

use flux_model::idset::{IdSet, Ranks};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(set) = IdSet::parse(s) {
        assert_eq!(IdSet::parse(&set.to_string()).as_ref(), Ok(&set));
        assert_eq!(IdSet::parse(&set.to_bracketed()).as_ref(), Ok(&set));
    }
    let _ = Ranks::parse(s);
});
