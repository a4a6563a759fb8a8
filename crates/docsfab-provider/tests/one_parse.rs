//! One parse per stream event: the stream reader fed from the boundary's own pass
//! ([`EventReader`] + [`StreamReader::read`]) reads every body exactly as the reader fed from
//! separately decoded events ([`SseDecoder`] + [`StreamReader::event`], which builds a
//! `serde_json::Value` per line), whatever the reads; and the verdict reached in that pass is the
//! boundary's verdict on the whole body (BND-1, BND-9).
//!
//! The bodies are generated to stress where a hand-written visitor could part from `Value`
//! indexing: repeated member names (the last wins), members of the wrong type, negative, float
//! and oversized numbers, escaped names, error members, multi-line events, lines that are not
//! JSON and bytes that are not UTF-8.

use docsfab_boundary::{BoundaryConfig, EventReader, SseDecoder};
use docsfab_provider::outcome::{StreamOutcome, StreamReader, TransportFailure};
use docsfab_record::Api as BoundaryApi;
use docsfab_record::Api;
use proptest::prelude::*;

type Read = Result<StreamOutcome, TransportFailure>;

/// The reader as it was: events decoded on their own, each line parsed into a `Value`. Also
/// the content-published flag after each read (what a cut at that point would report).
fn before(api: Api, reads: &[&[u8]]) -> (Read, Vec<bool>) {
    let mut dec = SseDecoder::new();
    let mut reader = StreamReader::new(api, 200);
    let mut published = Vec::new();
    for r in reads {
        let mut events = Vec::new();
        dec.feed(r, |e| events.push(e));
        for e in &events {
            if let Err(f) = reader.event(e) {
                return (Err(f), published);
            }
        }
        published.push(reader.content_published());
    }
    let mut events = Vec::new();
    dec.finish(|e| events.push(e));
    for e in &events {
        if let Err(f) = reader.event(e) {
            return (Err(f), published);
        }
    }
    (reader.finish(), published)
}

/// The reader fed from the boundary's pass, with the verdict that pass reached.
fn after(
    api: Api,
    config: &BoundaryConfig,
    reads: &[&[u8]],
) -> (Read, Vec<bool>, Option<docsfab_boundary::Verdict>) {
    let mut dec = EventReader::judged(config);
    let mut reader = StreamReader::new(api, 200);
    let mut published = Vec::new();
    let mut failed = None;
    for r in reads {
        dec.feed(r, |e| {
            if failed.is_none() {
                failed = reader.read(e).err();
            }
        });
        if failed.is_some() {
            break;
        }
        published.push(reader.content_published());
    }
    if let Some(f) = failed {
        return (Err(f), published, None);
    }
    let verdict = dec.finish(|e| {
        if failed.is_none() {
            failed = reader.read(e).err();
        }
    });
    let read = match failed {
        Some(f) => Err(f),
        None => reader.finish(),
    };
    (read, published, verdict)
}

/// The full verdict needs the whole body, so it is checked with a reader that never stops.
fn verdict_of(config: &BoundaryConfig, reads: &[&[u8]]) -> Option<docsfab_boundary::Verdict> {
    let mut dec = EventReader::judged(config);
    for r in reads {
        dec.feed(r, |_| {});
    }
    dec.finish(|_| {})
}

const KEYS: &[&str] = &[
    "error",
    "type",
    "model",
    "usage",
    "choices",
    "message",
    "index",
    "content_block",
    "delta",
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "content",
    "tool_calls",
    "finish_reason",
    "id",
    "function",
    "name",
    "arguments",
    "text",
    "partial_json",
    "stop_reason",
    "role",
    "mod\\u0065l",
    "t\\u0065xt",
];

const SCALARS: &[&str] = &[
    "\"m1\"",
    "\"m2\"",
    "\"stop\"",
    "\"length\"",
    "\"tool_calls\"",
    "\"content_filter\"",
    "\"end_turn\"",
    "\"max_tokens\"",
    "\"tool_use\"",
    "\"refusal\"",
    "\"text\"",
    "\"text_delta\"",
    "\"input_json_delta\"",
    "\"message_start\"",
    "\"content_block_start\"",
    "\"content_block_delta\"",
    "\"message_delta\"",
    "\"message_stop\"",
    "\"error\"",
    "\"invalid_request_error\"",
    "\"context_length_exceeded\"",
    "\"Hi \\u00e9\\n\"",
    "\"\"",
    "\"{\\\"a\\\":\"",
    "\"1}\"",
    "0",
    "1",
    "7",
    "-1",
    "-0",
    "1.5",
    "1e2",
    "18446744073709551616",
    "null",
    "true",
    "false",
];

fn json() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(SCALARS).prop_map(str::to_owned);
    leaf.prop_recursive(5, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                let members: Vec<String> = kv
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
}

/// A top-level object, mostly.
fn data_value() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec((prop::sample::select(KEYS), json()), 0..6).prop_map(|kv| {
            let members: Vec<String> =
                kv.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", members.join(","))
        }),
        1 => json(),
        1 => prop::sample::select(vec![
            "[DONE]", " [DONE] ", "", "{bad", "{\"model\":\"\u{0}\"", "{\"text\":\"\\ud800\"}",
        ])
        .prop_map(str::to_owned),
    ]
}

fn event() -> impl Strategy<Value = Vec<u8>> {
    let name = prop::option::of(prop::sample::select(vec![
        "message_start",
        "content_block_delta",
        "message_delta",
        "message_stop",
        "error",
        "ping",
    ]));
    let ending = prop::sample::select(vec!["\n", "\r\n", "\r"]);
    let extra = prop::sample::select(vec!["", ": keep-alive\n", "id: 3\n", "data: \u{feff}x\n"]);
    (
        name,
        prop::collection::vec(data_value(), 1..3),
        ending,
        extra,
        any::<bool>(),
    )
        .prop_map(|(name, data, end, extra, bad_utf8)| {
            let mut out = Vec::new();
            if let Some(n) = name {
                out.extend_from_slice(format!("event: {n}{end}").as_bytes());
            }
            for d in data {
                out.extend_from_slice(format!("data: {d}{end}").as_bytes());
            }
            if bad_utf8 {
                out.extend_from_slice(b"data: {\"content\":\"\xff\"}\n");
            }
            out.extend_from_slice(extra.as_bytes());
            out.extend_from_slice(end.as_bytes());
            out
        })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(event(), 0..8),
        prop::sample::select(vec!["", "data: [DONE]\n\n", "data: [DONE]"]),
    )
        .prop_map(|(events, tail)| {
            let mut out: Vec<u8> = events.concat();
            out.extend_from_slice(tail.as_bytes());
            out
        })
}

fn split(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
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

fn same_reading(body: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let parts = split(body, cuts);
    let reads: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    for (api, bapi) in [
        (Api::OpenaiChat, BoundaryApi::OpenaiChat),
        (Api::AnthropicMessages, BoundaryApi::AnthropicMessages),
    ] {
        let config = BoundaryConfig::new(bapi, "m1", &[]).unwrap();
        let (want, want_published) = before(api, &reads);
        let (got, got_published, _) = after(api, &config, &reads);
        prop_assert_eq!(&got, &want, "{:?}", String::from_utf8_lossy(body));
        prop_assert_eq!(got_published, want_published);
        prop_assert_eq!(verdict_of(&config, &reads), Some(config.check(body)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn one_parse_reads_every_body_as_the_value_reader_did_bnd_1(
        body in body(),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        same_reading(&body, &cuts)?;
    }
}

#[test]
fn one_parse_realistic_streams_read_the_same_and_pass() {
    let openai = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"H\u{e9}llo\\n\"}}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"pa\"}}]}}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";
    let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m1\",\"usage\":{\"input_tokens\":2}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"read_file\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":5}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    for (api, bapi, body) in [
        (Api::OpenaiChat, BoundaryApi::OpenaiChat, openai),
        (
            Api::AnthropicMessages,
            BoundaryApi::AnthropicMessages,
            anthropic,
        ),
    ] {
        let config = BoundaryConfig::new(bapi, "m1", &[]).unwrap();
        let (want, _) = before(api, &[body.as_bytes()]);
        let (got, _, verdict) = after(api, &config, &[body.as_bytes()]);
        let got = got.expect("a complete stream");
        assert_eq!(Ok(got.clone()), want);
        assert!(!got.tool_calls.is_empty() && !got.text.is_empty());
        assert!(matches!(verdict, Some(docsfab_boundary::Verdict::Pass(_))));
    }
}

/// The transport over real loopback HTTP: a completed outcome carries the verdict reached while
/// reading, the one `check` gives on its raw body, under the configuration it was given; under
/// another configuration `verdict_under` checks afresh (BND-1).
#[tokio::test]
async fn one_parse_transport_keeps_the_verdict_it_reached_while_reading_bnd_1() {
    use docsfab_provider::{HttpConfig, HttpTransport, Message, Payload, Transport, TurnRequest};
    use docsfab_sim::{Scenario, SimServer};

    for (api, bapi) in [
        (Api::OpenaiChat, BoundaryApi::OpenaiChat),
        (Api::AnthropicMessages, BoundaryApi::AnthropicMessages),
    ] {
        let scenario = Scenario::from_yaml_str(
            "responses:\n  - answer:\n      text: \"Done, in two words.\"\n",
            "one-parse",
        )
        .unwrap();
        let sim = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
            .await
            .unwrap();
        let selected = BoundaryConfig::new(bapi, "sim-model", &[]).unwrap();
        let transport = HttpTransport::new(HttpConfig {
            keep_raw_body: true,
            ..HttpConfig::new(api, sim.base_url(), None)
        })
        .unwrap()
        .with_boundary(selected.clone());
        let payload = Payload::build(
            api,
            &TurnRequest {
                include_usage: true,
                prompt_cache_key: None,
                response_format: None,
                tool_choice: None,
                model: "sim-model".into(),
                max_output_tokens: 64,
                system: None,
                messages: vec![Message::User { text: "hi".into() }],
                tools: vec![],
            },
        )
        .unwrap();
        let outcome = transport.send(payload.bytes().clone()).await.unwrap();
        sim.shutdown().await;

        let raw = outcome.raw_body.clone().expect("the raw body is kept");
        let (judged_under, verdict) = outcome.verdict.clone().expect("judged while reading");
        assert_eq!(judged_under, selected);
        assert_eq!(verdict, selected.check(&raw));
        assert!(matches!(verdict, docsfab_boundary::Verdict::Pass(_)));
        assert_eq!(outcome.text, "Done, in two words.");
        // An equal configuration built apart reuses the verdict; another model checks afresh
        // and is refused.
        let equal = BoundaryConfig::new(bapi, "sim-model", &[]).unwrap();
        assert_eq!(outcome.verdict_under(&equal), Some(verdict));
        let other = BoundaryConfig::new(bapi, "other-model", &[]).unwrap();
        let fresh = outcome.verdict_under(&other).unwrap();
        assert_eq!(fresh, other.check(&raw));
        assert!(matches!(fresh, docsfab_boundary::Verdict::Refuse(_)));
    }
}
