//! Checkpoint decoding never panics, on raw bytes or on bytes framed with a
//! valid header and checksum (so the MessagePack decoding is reached), and
//! whatever decodes can be dealt out to shards.
#![no_main]

use fluxpipe::checkpoint::file::{decode, frame};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = decode(data, Path::new("fuzz"));
    if let Ok(c) = decode(&frame(data), Path::new("fuzz")) {
        let _ = c.split(3, |cluster, id| {
            (cluster.len() + id.unwrap_or(0) as usize) % 3
        });
    }
});
