//! Usage accounting and prompt caching over real loopback HTTP: what the body reports, what the
//! request log's `billed` says the provider bills, and the provider shapes `usage: never` and
//! `stream_options: refuse`.

mod support;

use std::time::Duration;

use docsfab_sim::{BilledUsage, STREAM_OPTIONS_ENTRY, Scenario};
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A system text long enough that its prefix is a visible number of tokens.
const SYSTEM: &str = "You are the documentation writer for a Rust workspace. Answer tersely.";

/// Anthropic streamed request: a cached system block, then one user message.
fn anthropic_cached(last: &str) -> String {
    json!({
        "model": "claude-test", "stream": true, "max_tokens": 100,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": last}]
    })
    .to_string()
}

/// The tokens of the system block's prefix as the simulator sizes it: canonical JSON (keys
/// sorted, the block's `cache_control` left out) bytes / 4.
fn system_prefix_tokens() -> u64 {
    let canonical = format!(r#"{{"text":{},"type":"text"}}"#, json!(SYSTEM));
    canonical.len() as u64 / 4
}

fn message_start_usage(p: &Parsed) -> Value {
    let data = data_json(&events(&p.body));
    data[0]["message"]["usage"].clone()
}

fn usage_chunk(p: &Parsed) -> Option<Value> {
    data_json(&events(&p.body))
        .into_iter()
        .find_map(|c| c.get("usage").cloned())
}

fn prompt_estimate(body: &str) -> u64 {
    (body.len() as u64 / 4).max(1)
}

#[tokio::test]
async fn anthropic_cache_control_creates_the_prefix_then_reads_it_with_a_new_last_message() {
    let server = start("responses:\n  - answer: {text: 'Done.'}\n").await;
    let addr = server.local_addr();
    let (first_body, second_body) = (
        anthropic_cached("Write the overview."),
        anthropic_cached("Now the API page."),
    );
    let first = send(addr, MESSAGES, &first_body).await.parsed();
    let second = send(addr, MESSAGES, &second_body).await.parsed();
    let prefix = system_prefix_tokens();
    assert!(prefix > 10, "{prefix}");

    let u1 = message_start_usage(&first);
    assert_eq!(u1["cache_creation_input_tokens"], prefix);
    assert_eq!(u1["cache_read_input_tokens"], 0);
    assert_eq!(u1["input_tokens"], prompt_estimate(&first_body) - prefix);

    let u2 = message_start_usage(&second);
    assert_eq!(u2["cache_creation_input_tokens"], 0);
    assert_eq!(u2["cache_read_input_tokens"], prefix);
    assert_eq!(u2["input_tokens"], prompt_estimate(&second_body) - prefix);

    // `billed.input_tokens` is the whole prompt, cache parts included.
    let log = server.requests();
    assert_eq!(
        log[0].billed,
        BilledUsage {
            input_tokens: prompt_estimate(&first_body),
            output_tokens: 1,
            cache_creation_input_tokens: prefix,
            cache_read_input_tokens: 0,
        }
    );
    assert_eq!(log[1].billed.input_tokens, log[1].prompt_tokens);
    assert_eq!(log[1].billed.cache_read_input_tokens, prefix);
    assert_eq!(log[1].billed.cache_creation_input_tokens, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_without_cache_control_reports_both_cache_fields_as_zero() {
    let server = start("responses:\n  - answer: {text: 'Done.'}\n").await;
    let addr = server.local_addr();
    for stream in [true, false] {
        let body = anthropic_body("claude-test", stream);
        let p = send(addr, MESSAGES, &body).await.parsed();
        let usage = if stream {
            message_start_usage(&p)
        } else {
            p.json()["usage"].clone()
        };
        assert_eq!(usage["cache_creation_input_tokens"], 0, "{usage}");
        assert_eq!(usage["cache_read_input_tokens"], 0, "{usage}");
        assert_eq!(usage["input_tokens"], prompt_estimate(&body), "{usage}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_json_answers_report_the_cache_and_bill_the_whole_prompt() {
    let server = start("responses:\n  - answer: {text: 'Done.'}\n").await;
    let addr = server.local_addr();
    let body = |last: &str| {
        json!({
            "model": "claude-test", "max_tokens": 100,
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": last}]}]
        })
        .to_string()
    };
    let tool = r#"{"input_schema":{"type":"object"},"name":"read_file"}"#.len() as u64 / 4;
    send(addr, MESSAGES, &body("one")).await;
    let p = send(addr, MESSAGES, &body("two")).await.parsed();
    let usage = &p.json()["usage"];
    assert_eq!(usage["cache_read_input_tokens"], tool);
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    let log = server.requests();
    let reported = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_creation_input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(log[1].billed.input_tokens, reported);
    assert_eq!(
        log[1].billed.output_tokens,
        usage["output_tokens"].as_u64().unwrap()
    );
    server.shutdown().await;
}

fn openai_keyed(key: Option<&str>, last: &str) -> String {
    let mut body = json!({
        "model": "gpt-test", "stream": true, "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": last}
        ]
    });
    if let Some(key) = key {
        body["prompt_cache_key"] = json!(key);
    }
    body.to_string()
}

#[tokio::test]
async fn openai_prompt_cache_key_reads_the_leading_messages_on_a_second_request() {
    let server = start("responses:\n  - answer: {text: 'Done.'}\n").await;
    let addr = server.local_addr();
    let system = format!(r#"{{"content":{},"role":"system"}}"#, json!(SYSTEM)).len() as u64 / 4;

    let first_body = openai_keyed(Some("docs"), "Write the overview.");
    let first = usage_chunk(&send(addr, CHAT, &first_body).await.parsed()).unwrap();
    assert_eq!(first["prompt_tokens_details"], json!({"cached_tokens": 0}));
    assert_eq!(first["prompt_tokens"], prompt_estimate(&first_body));

    let second_body = openai_keyed(Some("docs"), "Now the API page.");
    let second = usage_chunk(&send(addr, CHAT, &second_body).await.parsed()).unwrap();
    assert_eq!(
        second["prompt_tokens_details"],
        json!({"cached_tokens": system})
    );
    // prompt_tokens stays the total: it includes the cached tokens.
    assert_eq!(second["prompt_tokens"], prompt_estimate(&second_body));

    // Another key shares nothing; no key, no caching and no details.
    let other = usage_chunk(
        &send(
            addr,
            CHAT,
            &openai_keyed(Some("other"), "Now the API page."),
        )
        .await
        .parsed(),
    )
    .unwrap();
    assert_eq!(other["prompt_tokens_details"], json!({"cached_tokens": 0}));
    let unkeyed = usage_chunk(
        &send(addr, CHAT, &openai_keyed(None, "Now the API page."))
            .await
            .parsed(),
    )
    .unwrap();
    assert!(unkeyed.get("prompt_tokens_details").is_none(), "{unkeyed}");

    let log = server.requests();
    assert_eq!(log[1].billed.cache_read_input_tokens, system);
    assert_eq!(log[1].billed.cache_creation_input_tokens, 0);
    assert_eq!(log[3].billed.cache_read_input_tokens, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn billed_of_a_full_answer_equals_the_usage_in_the_body() {
    let server = start(
        "responses:\n  - answer: {text: 'The crate has three modules.', tool_calls: [{name: read_file, arguments: {path: src/lib.rs}}]}\n",
    )
    .await;
    let addr = server.local_addr();
    let body = openai_keyed(None, "hello");
    let usage = usage_chunk(&send(addr, CHAT, &body).await.parsed()).unwrap();
    let json_answer = send(addr, CHAT, &openai_body("gpt-test", false))
        .await
        .parsed()
        .json();
    let log = server.requests();
    for (entry, usage) in log.iter().zip([&usage, &json_answer["usage"]]) {
        assert_eq!(
            entry.billed,
            BilledUsage {
                input_tokens: usage["prompt_tokens"].as_u64().unwrap(),
                output_tokens: usage["completion_tokens"].as_u64().unwrap(),
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
            "{usage}"
        );
    }
    // A request that asked for no usage is billed what the provider counted all the same.
    send(addr, CHAT, &openai_body("gpt-test", true)).await;
    assert_eq!(server.requests()[2].billed.output_tokens, (28 + 9 + 21) / 4);
    server.shutdown().await;
}

#[tokio::test]
async fn explicit_scenario_usage_keeps_its_numbers_and_cache_keys() {
    let server = start(
        "responses:\n  - answer: {text: hi, usage: {input_tokens: 10, output_tokens: 2, cache_creation_input_tokens: 5, cache_read_input_tokens: 30, cached_tokens: 7}}\n",
    )
    .await;
    let addr = server.local_addr();
    let anthropic =
        message_start_usage(&send(addr, MESSAGES, &anthropic_cached("x")).await.parsed());
    assert_eq!(
        anthropic,
        json!({"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 30, "output_tokens": 1})
    );
    let openai = usage_chunk(&send(addr, CHAT, &openai_keyed(None, "x")).await.parsed()).unwrap();
    assert_eq!(
        openai,
        json!({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 7}})
    );
    let log = server.requests();
    assert_eq!(
        log[0].billed,
        BilledUsage {
            input_tokens: 45,
            output_tokens: 2,
            cache_creation_input_tokens: 5,
            cache_read_input_tokens: 30,
        }
    );
    assert_eq!(
        log[1].billed,
        BilledUsage {
            input_tokens: 10,
            output_tokens: 2,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 7,
        }
    );
    server.shutdown().await;
}

/// The answer content (text deltas, tool-call names and arguments) of the events that arrived
/// whole, in bytes: what docsfab counts on a cut stream.
fn content_received(body: &[u8]) -> u64 {
    let len = |v: &Value| v.as_str().map_or(0, str::len) as u64;
    let text = String::from_utf8_lossy(body);
    // Only events whose blank line arrived; a partial last event is not counted.
    let whole = match text.rfind("\n\n") {
        Some(at) => &text[..at + 2],
        None => "",
    };
    events(whole.as_bytes())
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .map(|v| {
            let delta = &v["choices"][0]["delta"];
            let call = &delta["tool_calls"][0]["function"];
            let block = &v["content_block"];
            len(&delta["content"])
                + len(&call["name"])
                + len(&call["arguments"])
                + len(&v["delta"]["text"])
                + len(&v["delta"]["partial_json"])
                + if block["type"] == "tool_use" {
                    len(&block["name"])
                } else {
                    0
                }
        })
        .sum()
}

#[tokio::test]
async fn billed_of_a_cut_stream_is_the_prompt_and_the_content_sent_before_the_cut_over_four() {
    let text = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKL";
    for (path, body, after) in [
        (CHAT, openai_body("gpt-test", true), 620),
        (MESSAGES, anthropic_body("claude-test", true), 900),
    ] {
        let server = start(&format!(
            "responses:\n  - answer: {{text: '{text}', deltas: 6, tool_calls: [{{name: read_file, arguments: {{path: src/lib.rs}}, deltas: 2}}]}}\n    cut: {{after_bytes: {after}, with: close}}\n"
        ))
        .await;
        let p = send(server.local_addr(), path, &body).await.parsed();
        assert!(!p.complete);
        assert_eq!(p.body.len(), after);
        let received = content_received(&p.body);
        // The cut falls inside the answer, so some but not all of it counts.
        assert!(
            received > 0 && received < (text.len() + 9 + 21) as u64,
            "{path}: {received}"
        );
        let log = server.requests();
        assert_eq!(
            log[0].billed,
            BilledUsage {
                input_tokens: prompt_estimate(&body),
                output_tokens: received / 4,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
            "{path}"
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn billed_of_a_stream_the_client_gives_up_on_during_a_stall_counts_up_to_the_stall() {
    let server = start(
        "responses:\n  - answer: {text: 'abcdefghijklmnopqrstuvwxyz0123456789', deltas: 6}\n    stall: {after_bytes: 500, ms: 1500}\n",
    )
    .await;
    let body = openai_body("gpt-test", true);
    let mut stream = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // Read until nothing has come for 300 ms (the stall), then give up.
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    let received = Reply {
        raw,
        end: End::Eof,
        first_byte_after: None,
        elapsed: Duration::ZERO,
        reads: Vec::new(),
    }
    .parsed();
    assert_eq!(received.body.len(), 500);
    let want = content_received(&received.body) / 4;
    assert!(want > 0 && want < 36 / 4);
    let mut billed = server.requests()[0].billed;
    for _ in 0..100 {
        if billed.output_tokens == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        billed = server.requests()[0].billed;
    }
    assert_eq!(
        billed,
        BilledUsage {
            input_tokens: prompt_estimate(&body),
            output_tokens: want,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    );
    server.shutdown().await;
}

#[tokio::test]
async fn billed_of_a_status_answer_or_capacity_429_is_zero_and_of_a_drop_is_the_prompt() {
    let server = start(
        "capacity: {requestsPerMinute: 60, burst: 3}\nresponses:\n  - status: 429\n  - status: 503\n  - drop: close\n",
    )
    .await;
    let addr = server.local_addr();
    let body = anthropic_cached("hello");
    for _ in 0..4 {
        send(addr, MESSAGES, &body).await;
    }
    send(addr, "/v1/other", &body).await;
    let log = server.requests();
    let entries: Vec<&str> = log.iter().map(|e| e.entry.as_str()).collect();
    assert_eq!(
        entries,
        [
            "responses[0]",
            "responses[1]",
            "responses[2]",
            docsfab_sim::CAPACITY_ENTRY,
            "no-route"
        ]
    );
    for i in [0, 1, 3, 4] {
        assert_eq!(log[i].billed, BilledUsage::default(), "{}", log[i].entry);
    }
    // Refusals cache nothing, so the drop (which processed the prompt) is the first to write it.
    assert_eq!(
        log[2].billed,
        BilledUsage {
            input_tokens: prompt_estimate(&body),
            output_tokens: 0,
            cache_creation_input_tokens: system_prefix_tokens(),
            cache_read_input_tokens: 0,
        }
    );
    server.shutdown().await;
}

#[tokio::test]
async fn usage_never_sends_no_usage_chunk_but_bills_what_the_provider_counted() {
    let server = start("usage: never\nresponses:\n  - answer: {text: 'Twelve bytes'}\n").await;
    let addr = server.local_addr();
    let body = openai_keyed(Some("k"), "hello");
    let p = send(addr, CHAT, &body).await.parsed();
    assert!(p.complete);
    let chunks = data_json(&events(&p.body));
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "{chunks:?}"
    );
    assert_eq!(events(&p.body).last().unwrap().data, "[DONE]");
    let json_answer = send(addr, CHAT, &openai_body("gpt-test", false))
        .await
        .parsed()
        .json();
    assert!(json_answer.get("usage").is_none(), "{json_answer}");
    // Anthropic always reports usage.
    let anthropic = send(addr, MESSAGES, &anthropic_body("claude-test", true))
        .await
        .parsed();
    assert!(
        message_start_usage(&anthropic)["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let log = server.requests();
    assert_eq!(
        log[0].billed,
        BilledUsage {
            input_tokens: prompt_estimate(&body),
            output_tokens: 3,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    );
    server.shutdown().await;
}

#[tokio::test]
async fn stream_options_refuse_answers_400_without_using_the_script() {
    let server = start(
        "stream_options: refuse\nresponses:\n  - answer: {text: first}\n  - answer: {text: second}\n",
    )
    .await;
    let addr = server.local_addr();
    let refused = send(addr, CHAT, &openai_keyed(None, "hello"))
        .await
        .parsed();
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json(),
        json!({"error": {"message": "Unrecognized request argument supplied: stream_options",
            "type": "invalid_request_error", "param": "stream_options", "code": null}})
    );
    let accepted = send(addr, CHAT, &openai_body("gpt-test", false))
        .await
        .parsed();
    assert_eq!(accepted.status, 200);
    assert_eq!(accepted.json()["choices"][0]["message"]["content"], "first");
    // Anthropic has no stream_options member to refuse.
    let anthropic = json!({"model": "c", "max_tokens": 5, "stream_options": {}, "messages": []});
    let p = send(addr, MESSAGES, &anthropic.to_string()).await.parsed();
    assert_eq!(p.status, 200);
    let log = server.requests();
    assert_eq!(log[0].entry, STREAM_OPTIONS_ENTRY);
    assert_eq!(log[0].billed, BilledUsage::default());
    assert_eq!(log[1].entry, "responses[0]");
    server.shutdown().await;
}

#[test]
fn usage_and_stream_options_keys_are_checked() {
    let err = |yaml: &str| {
        Scenario::from_yaml_str(yaml, "s.yaml")
            .expect_err("invalid")
            .to_string()
    };
    assert_eq!(
        err("usage: sometimes\nresponses: [{status: 200}]\n"),
        "scenario s.yaml, line 1: usage must be reported or never, not sometimes"
    );
    assert_eq!(
        err("responses: [{status: 200}]\nstream_options: ignore\n"),
        "scenario s.yaml, line 2: stream_options must be accept or refuse, not ignore"
    );
    for ok in [
        "usage: reported\nstream_options: accept\nresponses: [{status: 200}]\n",
        "usage: never\nstream_options: refuse\nresponses: [{status: 200}]\n",
    ] {
        Scenario::from_yaml_str(ok, "s.yaml").expect("valid");
    }
    let e = err("streamOptions: refuse\nresponses: [{status: 200}]\n");
    assert!(e.contains("unknown field `streamOptions`"), "{e}");
}
