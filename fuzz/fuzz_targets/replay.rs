//! Lines of any content through decoding and the state machines of every
//! stream: never panics.
#![no_main]

use fluxpipe::decode::{EventStream, Format, Origin, decode_line};
use fluxpipe::flux::jobid::JobId;
use fluxpipe::keyed::state::State;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut state = State::new();
    let streams = [EventStream::Job, EventStream::Exec, EventStream::Resource];
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        let origin = Origin { stream: Some(streams[i % 3]), id: Some(JobId(7)) };
        for rec in decode_line(line, &origin, Format::Auto).records {
            state.apply("c", rec);
        }
    }
    let _ = state.finish();
});
