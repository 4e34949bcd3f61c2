//! Reading a changelog partition back never panics, whatever its records
//! hold: the input is split into (key, value) records, some keys made to
//! look like fluxpipe's own, and each value tried framed and raw.
#![no_main]

use fluxpipe::checkpoint::changelog::{FORMAT, Restorer};
use fluxpipe::keyed::Owner;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let mut restorer = Restorer::new("t");
    for (i, chunk) in data.split(|b| *b == 0xff).enumerate() {
        let (key, value) = chunk.split_at(chunk.len().min(4));
        let key = match i % 4 {
            0 => [b"job/c/".as_slice(), key].concat(),
            1 => b"resource/c".to_vec(),
            2 => b"offset/t".to_vec(),
            _ => key.to_vec(),
        };
        let value = (!value.is_empty()).then(|| [&[FORMAT][..], value].concat());
        restorer.push(&key, value.as_deref());
        restorer.push(&key, Some(chunk));
    }
    let owner = Owner {
        source: Arc::from("k"),
        partition: 0,
    };
    let _ = restorer.finish(&owner);
});
