//! Checkpoint decoding never panics, on raw bytes or on bytes framed with a
//! valid header and checksum (so the MessagePack decoding is reached), and
//! whatever decodes can be dealt out to shards, merged or part by part as
//! a restore deals them.
#![no_main]

use fluxpipe::checkpoint::file::{decode, frame};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = decode(data, Path::new("fuzz"));
    let pick = |cluster: &str, id: Option<u64>| (cluster.len() + id.unwrap_or(0) as usize) % 3;
    if let Ok(c) = decode(&frame(data), Path::new("fuzz")) {
        for part in c.parts {
            let _ = part.deal(3, pick);
        }
    }
    if let Ok(c) = decode(&frame(data), Path::new("fuzz")) {
        let _ = c.split(3, pick);
    }
});
