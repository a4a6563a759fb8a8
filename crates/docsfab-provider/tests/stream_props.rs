//! The stream reader on arbitrary input: no panic on any bytes a provider may send, and the
//! outcome never depends on how the body was split into reads.

use docsfab_boundary::SseDecoder;
use docsfab_provider::outcome::{StreamOutcome, StreamReader, TransportFailure};
use docsfab_record::Api;
use proptest::prelude::*;

fn read(api: Api, reads: &[&[u8]]) -> Result<StreamOutcome, TransportFailure> {
    let mut dec = SseDecoder::new();
    let mut events = Vec::new();
    let mut reader = StreamReader::new(api, 200);
    for r in reads {
        dec.feed(r, |e| events.push(e));
        for e in events.drain(..) {
            reader.event(&e)?;
        }
    }
    dec.finish(|e| events.push(e));
    for e in events.drain(..) {
        reader.event(&e)?;
    }
    reader.finish()
}

const OPENAI: &str = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"H\u{e9}llo \"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"pa\"}}]}}]}\r\r\
data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";

const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"c\",\"usage\":{\"input_tokens\":2}}}\n\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n\
event: content_block_delta\rdata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \u{1F600}\"}}\r\r\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn split_at(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points {
        out.push(body[at..p].to_vec());
        at = p;
    }
    out.push(body[at..].to_vec());
    out
}

proptest! {
    #[test]
    fn any_split_of_a_stream_reads_the_same(cuts in prop::collection::vec(any::<usize>(), 0..12)) {
        for (api, body) in [(Api::OpenaiChat, OPENAI), (Api::AnthropicMessages, ANTHROPIC)] {
            let whole = read(api, &[body.as_bytes()]).expect("a complete stream");
            let parts = split_at(body.as_bytes(), &cuts);
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(read(api, &refs).expect("the same stream"), whole);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        for api in [Api::OpenaiChat, Api::AnthropicMessages] {
            let _ = read(api, &[&body]);
        }
    }

    #[test]
    fn arbitrary_json_events_never_panic(values in prop::collection::vec(
        prop_oneof![
            Just("{}".to_string()),
            Just("{\"error\":null}".to_string()),
            Just("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":18446744073709551615}]}}]}".to_string()),
            Just("{\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{\"type\":\"input_json_delta\"}}".to_string()),
            Just("{\"usage\":{\"prompt_tokens\":-5}}".to_string()),
            "[a-z{}\\[\\]\":,0-9 ]{0,40}",
        ],
        0..8,
    )) {
        for api in [Api::OpenaiChat, Api::AnthropicMessages] {
            let body: String = values.iter().map(|v| format!("data: {v}\n\n")).collect();
            let _ = read(api, &[body.as_bytes()]);
        }
    }
}

#[test]
fn the_sample_streams_are_read_in_full() {
    let o = read(Api::OpenaiChat, &[OPENAI.as_bytes()]).expect("openai");
    assert_eq!(o.text, "H\u{e9}llo ");
    assert_eq!(o.tool_calls[0].arguments, "{\"path\":1}");
    assert!(!o.tool_calls[0].truncated);
    let o = read(Api::AnthropicMessages, &[ANTHROPIC.as_bytes()]).expect("anthropic");
    assert_eq!(o.text, "Hi \u{1F600}");
    assert_eq!(o.usage.output_tokens, Some(5));
}
