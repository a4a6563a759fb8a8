//! Any body, cut into any reads, for either API: the boundary must not panic, and the verdict
//! must be the one it gives the body read whole (BND-9).
#![no_main]

use docsfab_boundary::{BoundaryConfig, Secret};
use docsfab_record::Api;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The first byte picks the API and the read sizes; the rest is the body.
    let Some((&control, body)) = input.split_first() else {
        return;
    };
    let api = if control & 1 == 0 {
        Api::OpenaiChat
    } else {
        Api::AnthropicMessages
    };
    let Ok(secret) = Secret::new("HOST_KEY", "hostsecret-0123456789") else {
        return;
    };
    let Ok(config) = BoundaryConfig::new(api, "m", &[secret]) else {
        return;
    };
    let whole = config.check(body);

    let step = usize::from(control >> 1) + 1;
    let mut boundary = config.start();
    for (i, read) in body.chunks(step).enumerate() {
        // Vary the read sizes a little so that cuts land everywhere.
        let (a, b) = read.split_at(i % read.len().max(1));
        boundary.feed(a);
        boundary.feed(b);
    }
    assert_eq!(boundary.finish(), whole);
});
