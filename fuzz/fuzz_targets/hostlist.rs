//! Hostlist decoding never panics, and whatever decodes round-trips.
#![no_main]

use flux_model::hostlist::Hostlist;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(hl) = Hostlist::parse(s) {
        // Expanding must stay cheap: only walk small lists. A host whose
        // own name holds brackets or commas (`a[1-2]b[3-4]` gives
        // `a1b[3-4]`) has no re-readable encoding, in flux-core too.
        let hosts: Vec<String> = if hl.len() <= 4096 { hl.iter().collect() } else { Vec::new() };
        if !hosts.is_empty() && hosts.iter().all(|h| !h.contains(['[', ']', ','])) {
            let again = Hostlist::parse(&hl.to_string()).expect("encoding parses");
            assert_eq!(again.iter().collect::<Vec<_>>(), hosts);
        }
    }
});
