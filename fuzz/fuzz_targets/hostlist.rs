//! Hostlist decoding never panics, and whatever decodes round-trips.
#![no_main]

use fluxpipe::flux::hostlist::Hostlist;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(hl) = Hostlist::parse(s) {
        // Expanding must stay cheap: only walk small lists.
        if hl.len() <= 4096 {
            let hosts: Vec<String> = hl.iter().collect();
            let again = Hostlist::parse(&hl.to_string()).expect("encoding parses");
            assert_eq!(again.iter().collect::<Vec<_>>(), hosts);
        }
    }
});
