//! The time-to-first-byte cost of the response boundary (BND-1): the route holds a stream until
//! its last byte has arrived and passed the check, so its client's first byte comes after the
//! whole upstream stream, where a direct client gets the first event at once. This test streams
//! an answer with a pause between events, measures both, prints the numbers (run with
//! `--nocapture` to see them; docs/route.md quotes a run) and checks the route waited.

mod support;

use std::time::Duration;

use support::route::{Setup, path_of, post, request};

const EVENTS: u32 = 20;
const EVENT_DELAY_MS: u64 = 25;

#[tokio::test]
async fn the_route_buffers_the_whole_stream_before_its_first_byte_bnd_1() {
    for api in ["openai-chat", "anthropic-messages"] {
        let scenario = format!(
            "responses:\n  - answer: {{text: \"{}\", deltas: {EVENTS}, event_delay_ms: {EVENT_DELAY_MS}}}\n    repeat: 2\n",
            "word ".repeat(EVENTS as usize)
        );
        let s = Setup::start(api, &scenario).await;
        let direct = post(&s.sim.local_addr().to_string(), path_of(api), &request(api)).await;
        let routed = s.post(path_of(api), &request(api)).await;
        assert_eq!(direct.status, 200);
        assert_eq!(routed.status, 200, "{}", routed.text());
        eprintln!(
            "{api}: {EVENTS} deltas, {EVENT_DELAY_MS} ms apart: direct first byte {} ms, last byte {} ms; through the route first byte {} ms, last byte {} ms",
            direct.first_byte.as_millis(),
            direct.total.as_millis(),
            routed.first_byte.as_millis(),
            routed.total.as_millis()
        );
        // The pauses between the events the simulator sends: a lower bound on any stream's
        // length. The checks compare times with it, never with a tight ceiling, so a loaded
        // machine cannot fail them.
        let upstream = Duration::from_millis(EVENT_DELAY_MS * u64::from(EVENTS));
        // A direct client gets its first byte long before its last (the answer streams)...
        assert!(
            direct.first_byte + upstream / 2 <= direct.total,
            "{api}: direct first byte {:?}, last {:?}",
            direct.first_byte,
            direct.total
        );
        // ...while the route sends nothing before the upstream stream has ended.
        assert!(
            routed.first_byte >= upstream,
            "{api}: first byte after {:?}, before the stream could have ended ({upstream:?})",
            routed.first_byte
        );
        // And it arrives in one piece with it, not paced like the upstream stream.
        assert!(
            routed.total - routed.first_byte < upstream / 2,
            "{api}: the routed answer took {:?} after its first byte",
            routed.total - routed.first_byte
        );
    }
}
