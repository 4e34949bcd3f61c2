//! Job id decoding never panics, and whatever decodes re-encodes to itself.
#![no_main]

use flux_model::jobid::{Encoding, JobId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(id) = JobId::parse(s) {
        for enc in [Encoding::Dec, Encoding::F58, Encoding::Hex, Encoding::Dothex, Encoding::Kvs, Encoding::Words] {
            assert_eq!(JobId::parse(&id.encode(enc)), Ok(id));
        }
    }
});
