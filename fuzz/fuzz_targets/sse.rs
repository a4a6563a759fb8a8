//! Any body, cut into any reads: the SSE decoder must not panic and must dispatch the same
//! events as when it reads the body whole (BND-9).
#![no_main]

use docsfab_boundary::SseDecoder;
use libfuzzer_sys::fuzz_target;

fn decode<'a>(reads: impl Iterator<Item = &'a [u8]>) -> Vec<docsfab_boundary::SseEvent> {
    let mut decoder = SseDecoder::new();
    let mut events = Vec::new();
    for read in reads {
        decoder.feed(read, |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    events
}

fuzz_target!(|input: &[u8]| {
    let Some((&control, body)) = input.split_first() else {
        return;
    };
    let step = usize::from(control) + 1;
    assert_eq!(decode(body.chunks(step)), decode(std::iter::once(body)));
});
