//! Any bytes as a line, under every origin: decoding never panics.
#![no_main]

use fluxpipe::decode::{EventStream, Format, Origin, decode_line};
use fluxpipe::flux::jobid::JobId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for stream in [None, Some(EventStream::Job), Some(EventStream::Exec), Some(EventStream::Resource)] {
        let origin = Origin { stream, id: Some(JobId(1)) };
        let _ = decode_line(data, &origin, Format::Auto);
    }
});
