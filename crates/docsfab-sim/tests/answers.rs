//! Streamed and JSON answers in the shape of each API, and the faults inside a 200 stream.

mod support;

use serde_json::{Value, json};
use support::*;

async fn one(yaml: &str, path: &str, body: &str) -> Parsed {
    let server = start(yaml).await;
    let reply = send(server.local_addr(), path, body).await;
    server.shutdown().await;
    assert_eq!(reply.end, End::Eof);
    reply.parsed()
}

fn openai_content(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn openai_finish(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn openai_text_answer_streams_in_deltas_and_ends_with_done() {
    let p = one(
        "responses:\n  - answer: {text: 'Hello from the simulator', deltas: 4}\n",
        CHAT,
        &openai_body("gpt-test", true),
    )
    .await;
    assert!(p.complete);
    assert_eq!(p.header("content-type"), Some("text/event-stream"));
    let evs = events(&p.body);
    assert_eq!(evs.last().unwrap().data, "[DONE]");
    let chunks = data_json(&evs);
    assert_eq!(openai_content(&chunks), "Hello from the simulator");
    let content_chunks = chunks.iter().filter(|c| {
        c["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    });
    assert_eq!(content_chunks.count(), 4);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(openai_finish(&chunks), ["stop"]);
    assert!(
        chunks
            .iter()
            .all(|c| c["model"] == "gpt-test" && c["object"] == "chat.completion.chunk")
    );
    // No usage chunk unless the request asks for it.
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn openai_usage_chunk_follows_the_finish_when_requested() {
    let body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": []});
    let p = one(
        "responses:\n  - answer: {text: hi, usage: {input_tokens: 12, output_tokens: 3}}\n",
        CHAT,
        &body.to_string(),
    )
    .await;
    let chunks = data_json(&events(&p.body));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15})
    );
}

#[tokio::test]
async fn a_json_answer_streams_the_json_text_as_content() {
    let p = one(
        "responses:\n  - answer:\n      json: {modules: [core, cli]}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    let content = openai_content(&data_json(&events(&p.body)));
    assert_eq!(
        serde_json::from_str::<Value>(&content).unwrap(),
        json!({"modules": ["core", "cli"]})
    );
}

#[tokio::test]
async fn openai_tool_calls_stream_id_name_and_split_arguments() {
    let p = one(
        r#"
responses:
  - answer:
      tool_calls:
        - {id: call_1, name: read_file, arguments: {path: src/lib.rs}, deltas: 3}
        - {name: list_files, arguments: '{"path":"."}'}
"#,
        CHAT,
        &openai_body("m", true),
    )
    .await;
    let chunks = data_json(&events(&p.body));
    let mut names = Vec::new();
    let mut args = ["".to_owned(), "".to_owned()];
    let mut arg_chunks = [0, 0];
    for c in &chunks {
        if let Some(calls) = c["choices"][0]["delta"]["tool_calls"].as_array() {
            for call in calls {
                let k = call["index"].as_u64().unwrap() as usize;
                if let Some(name) = call["function"]["name"].as_str() {
                    names.push((call["id"].as_str().unwrap().to_owned(), name.to_owned()));
                }
                let piece = call["function"]["arguments"].as_str().unwrap();
                if !piece.is_empty() {
                    arg_chunks[k] += 1;
                }
                args[k].push_str(piece);
            }
        }
    }
    assert_eq!(names[0], ("call_1".to_owned(), "read_file".to_owned()));
    assert_eq!(names[1].1, "list_files");
    assert!(!names[1].0.is_empty(), "a default id is generated");
    assert_eq!(
        serde_json::from_str::<Value>(&args[0]).unwrap(),
        json!({"path": "src/lib.rs"})
    );
    assert_eq!(args[1], r#"{"path":"."}"#);
    assert_eq!(arg_chunks[0], 3, "arguments are split across chunks");
    assert_eq!(openai_finish(&chunks), ["tool_calls"]);
}

#[tokio::test]
async fn a_truncated_tool_argument_stops_mid_json_but_the_stream_ends_normally() {
    let p = one(
        "responses:\n  - answer:\n      tool_calls: [{name: read_file, arguments: {path: src/lib.rs}, truncate_arguments: 9}]\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    assert!(p.complete);
    let chunks = data_json(&events(&p.body));
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, r#"{"path":""#);
    assert_eq!(openai_finish(&chunks), ["tool_calls"]);
}

#[tokio::test]
async fn anthropic_stream_has_the_messages_event_sequence() {
    let p = one(
        r#"
responses:
  - answer:
      text: "Reading the file."
      tool_calls: [{id: toolu_1, name: read_file, arguments: {path: a.rs}, deltas: 2}]
      usage: {input_tokens: 40, output_tokens: 9}
"#,
        MESSAGES,
        &anthropic_body("claude-test", true),
    )
    .await;
    assert!(p.complete);
    let evs = events(&p.body);
    let names: Vec<&str> = evs.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let data = data_json(&evs);
    for (e, d) in evs.iter().zip(&data) {
        assert_eq!(
            e.name.as_deref(),
            d["type"].as_str(),
            "event name matches data type"
        );
    }
    assert_eq!(data[0]["message"]["model"], "claude-test");
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], 40);
    let text: String = data
        .iter()
        .filter_map(|d| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Reading the file.");
    assert_eq!(
        data[7]["content_block"],
        json!({"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}})
    );
    let partial: String = data
        .iter()
        .filter_map(|d| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        json!({"path": "a.rs"})
    );
    assert_eq!(data[11]["delta"]["stop_reason"], "tool_use");
    assert_eq!(data[11]["usage"]["output_tokens"], 9);
}

#[tokio::test]
async fn finish_reasons_can_be_named_per_api() {
    let p = one(
        "responses:\n  - answer: {text: cut, finish_reason: length}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    assert_eq!(openai_finish(&data_json(&events(&p.body))), ["length"]);
    let p = one(
        "responses:\n  - answer: {text: cut, finish_reason: max_tokens}\n",
        MESSAGES,
        &anthropic_body("m", true),
    )
    .await;
    let data = data_json(&events(&p.body));
    assert!(
        data.iter()
            .any(|d| d["delta"]["stop_reason"] == "max_tokens")
    );
}

#[tokio::test]
async fn non_streamed_requests_get_a_json_completion() {
    let yaml = "responses:\n  - answer: {text: hi, tool_calls: [{id: t1, name: list_files, arguments: {}}]}\n";
    let p = one(yaml, CHAT, &openai_body("gpt-x", false)).await;
    assert_eq!(p.header("content-type"), Some("application/json"));
    let v = p.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-x");
    assert_eq!(v["choices"][0]["message"]["content"], "hi");
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "list_files"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let p = one(yaml, MESSAGES, &anthropic_body("claude-x", false)).await;
    let v = p.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], "claude-x");
    assert_eq!(v["content"][0], json!({"type": "text", "text": "hi"}));
    assert_eq!(
        v["content"][1],
        json!({"type": "tool_use", "id": "t1", "name": "list_files", "input": {}})
    );
    assert_eq!(v["stop_reason"], "tool_use");
}

#[tokio::test]
async fn omitting_finish_and_done_still_ends_the_chunked_body_cleanly() {
    let p = one(
        "responses:\n  - answer: {text: 'half an answ', omit_finish_reason: true, omit_done: true}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    assert!(p.complete, "a clean end: the terminating chunk is there");
    let evs = events(&p.body);
    assert!(evs.iter().all(|e| e.data != "[DONE]"));
    let chunks = data_json(&evs);
    assert!(openai_finish(&chunks).is_empty());
    assert_eq!(openai_content(&chunks), "half an answ");

    let p = one(
        "responses:\n  - answer: {text: 'half', omit_finish_reason: true, omit_done: true}\n",
        MESSAGES,
        &anthropic_body("m", true),
    )
    .await;
    assert!(p.complete);
    let names: Vec<String> = events(&p.body).into_iter().filter_map(|e| e.name).collect();
    assert!(
        !names
            .iter()
            .any(|n| n == "message_delta" || n == "message_stop"),
        "{names:?}"
    );
}

#[tokio::test]
async fn done_without_finish_reason() {
    let p = one(
        "responses:\n  - answer: {text: x, omit_finish_reason: true}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    let evs = events(&p.body);
    assert_eq!(evs.last().unwrap().data, "[DONE]");
    assert!(openai_finish(&data_json(&evs)).is_empty());
}

#[tokio::test]
async fn a_structured_error_event_follows_the_content() {
    let yaml = "responses:\n  - answer:\n      text: partial\n      error_event: {type: service_unavailable, code: 503}\n      omit_finish_reason: true\n";
    let p = one(yaml, CHAT, &openai_body("m", true)).await;
    let evs = events(&p.body);
    let datas: Vec<&str> = evs.iter().map(|e| e.data.as_str()).collect();
    let n = datas.len();
    assert_eq!(
        datas[n - 2],
        r#"{"error":{"type":"service_unavailable","code":503}}"#
    );
    assert_eq!(datas[n - 1], "[DONE]");

    let yaml = "responses:\n  - answer:\n      text: partial\n      error_event: {type: overloaded_error, message: Overloaded}\n      omit_finish_reason: true\n      omit_done: true\n";
    let p = one(yaml, MESSAGES, &anthropic_body("m", true)).await;
    let last = events(&p.body).pop().unwrap();
    assert_eq!(last.name.as_deref(), Some("error"));
    assert_eq!(
        last.data,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
    );
}

#[tokio::test]
async fn stream_error_is_a_stream_of_only_the_error_event() {
    let p = one(
        "responses:\n  - stream_error: {type: service_unavailable, code: 503}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    assert_eq!(p.status, 200);
    assert_eq!(
        p.text(),
        "data: {\"error\":{\"type\":\"service_unavailable\",\"code\":503}}\n\ndata: [DONE]\n\n"
    );
    let p = one(
        "responses:\n  - stream_error: {type: insufficient_quota, code: 429, done: false}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    assert_eq!(
        p.text(),
        "data: {\"error\":{\"type\":\"insufficient_quota\",\"code\":429}}\n\n"
    );
    let p = one(
        "responses:\n  - stream_error: {type: overloaded_error}\n",
        MESSAGES,
        &anthropic_body("m", true),
    )
    .await;
    assert_eq!(
        p.text(),
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"simulated overloaded_error\"}}\n\n"
    );
}

#[tokio::test]
async fn line_endings_can_be_crlf_cr_or_mixed() {
    for (ending, bytes) in [("crlf", "\r\n"), ("cr", "\r")] {
        let yaml = format!("responses:\n  - answer: {{text: hi, line_ending: {ending}}}\n");
        let p = one(&yaml, CHAT, &openai_body("m", true)).await;
        let text = p.text();
        assert!(
            text.ends_with(&format!("data: [DONE]{bytes}{bytes}")),
            "{text:?}"
        );
        if ending == "cr" {
            assert!(!text.contains('\n'));
        }
        assert_eq!(openai_content(&data_json(&events(&p.body))), "hi");
    }
    let p = one(
        "responses:\n  - answer: {text: hi, line_ending: mixed}\n",
        MESSAGES,
        &anthropic_body("m", true),
    )
    .await;
    let text = p.text();
    assert!(
        text.contains("\r\n") && text.contains("\r") && text.replace("\r\n", "").contains('\n')
    );
    assert_eq!(
        events(&p.body).last().unwrap().name.as_deref(),
        Some("message_stop")
    );
}

#[tokio::test]
async fn byte_order_marks_start_the_chosen_lines() {
    let p = one(
        "responses:\n  - answer: {text: hi, bom: {count: 2, lines: data}}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    let text = p.text();
    let data_lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        data_lines
            .iter()
            .all(|l| l.starts_with("\u{FEFF}\u{FEFF}data: ")),
        "{text:?}"
    );
    let p = one(
        "responses:\n  - answer: {text: hi, bom: {lines: first}}\n",
        MESSAGES,
        &anthropic_body("m", true),
    )
    .await;
    let text = p.text();
    assert!(text.starts_with("\u{FEFF}event: message_start\n"));
    assert_eq!(text.matches('\u{FEFF}').count(), 1);
}

#[tokio::test]
async fn a_chunk_can_name_another_model_and_data_can_follow_done() {
    let yaml = "responses:\n  - answer:\n      text: hello\n      foreign_model: other-model\n      after_done: ['{\"late\":true}']\n";
    let p = one(yaml, CHAT, &openai_body("selected", true)).await;
    let evs = events(&p.body);
    let models: Vec<String> = data_json(&evs)
        .iter()
        .filter_map(|c| c["model"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(models.iter().filter(|m| *m == "other-model").count(), 1);
    assert_eq!(models[0], "selected");
    assert_eq!(models[1], "other-model");
    let n = evs.len();
    assert_eq!(evs[n - 2].data, "[DONE]");
    assert_eq!(evs[n - 1].data, r#"{"late":true}"#);

    let p = one(
        "responses:\n  - answer: {text: hello, foreign_model: other-model}\n",
        MESSAGES,
        &anthropic_body("selected", true),
    )
    .await;
    assert_eq!(
        data_json(&events(&p.body))[0]["message"]["model"],
        "other-model"
    );
}

#[tokio::test]
async fn the_scenario_model_overrides_the_request_model() {
    let p = one(
        "responses:\n  - answer: {text: x, model: fixed}\n",
        CHAT,
        &openai_body("asked", true),
    )
    .await;
    assert!(
        data_json(&events(&p.body))
            .iter()
            .all(|c| c["model"] == "fixed")
    );
}

#[tokio::test]
async fn an_empty_answer_streams_no_content() {
    let p = one(
        "responses:\n  - answer: {}\n",
        CHAT,
        &openai_body("m", true),
    )
    .await;
    let chunks = data_json(&events(&p.body));
    assert_eq!(openai_content(&chunks), "");
    assert_eq!(openai_finish(&chunks), ["stop"]);
}

#[tokio::test]
async fn a_crlf_can_be_split_across_http_chunks() {
    let server = start(
        "responses:\n  - answer: {text: hi, line_ending: crlf, split_crlf: true, event_delay_ms: 2}\n  - answer: {text: hi, chunk_bytes: 7}\n",
    )
    .await;
    let addr = server.local_addr();
    let split = send(addr, CHAT, &openai_body("m", true)).await;
    // On the wire a chunk ends with each CR and the LF starts the next chunk: "\r" | "\n\r" | "\n".
    assert!(
        String::from_utf8_lossy(&split.raw)
            .contains("data: [DONE]\r\r\n2\r\n\n\r\r\n1\r\n\n\r\n0\r\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&split.raw)
    );
    let p = split.parsed();
    assert!(p.complete);
    assert_eq!(openai_content(&data_json(&events(&p.body))), "hi");

    let small = send(addr, CHAT, &openai_body("m", true)).await;
    let p = small.parsed();
    assert!(p.complete);
    assert_eq!(openai_content(&data_json(&events(&p.body))), "hi");
    let head_end = small.raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(
        small.raw[head_end..].starts_with(b"7\r\n"),
        "chunks of 7 bytes"
    );
    server.shutdown().await;
}

/// A request's user message with `marker` in it, in the OpenAI shape.
fn marked_body(marker: &str) -> String {
    json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": format!("Write the page for {marker}.")}]})
        .to_string()
}

fn chat_text(p: &Parsed) -> String {
    let v: Value = serde_json::from_slice(&p.body).unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn lanes_answer_each_marked_conversation_from_its_own_script_in_any_arrival_order() {
    let yaml = r#"
responses:
  - answer: {text: main-1}
  - answer: {text: main-2}
lanes:
  - contains: "module alpha"
    responses:
      - answer: {text: alpha-1}
      - answer: {text: alpha-2}
  - contains: "module beta"
    responses:
      - answer: {text: beta-1}
"#;
    let server = start(yaml).await;
    let addr = server.local_addr();
    let mut got = Vec::new();
    // Interleaved arrivals: each lane still answers its own requests in its own order, and the
    // main script only answers requests no lane takes.
    for marker in [
        "module beta",
        "module alpha",
        "nothing",
        "module beta",
        "module alpha",
        "module alpha",
        "nothing",
    ] {
        let reply = send(addr, CHAT, &marked_body(marker)).await;
        got.push(chat_text(&reply.parsed()));
    }
    assert_eq!(
        got,
        [
            "beta-1", "alpha-1", "main-1", "beta-1", "alpha-2", "alpha-2", "main-2"
        ]
    );
    let labels: Vec<String> = server.requests().into_iter().map(|e| e.entry).collect();
    assert_eq!(labels[0], "lanes[1] responses[0]");
    assert_eq!(labels[2], "responses[0]");
    assert_eq!(labels[5], "lanes[0] responses[1] (fallback: repeat-last)");
    server.shutdown().await;
}

#[test]
fn a_lane_without_text_or_answers_is_refused_with_its_line() {
    let e = docsfab_sim::Scenario::from_yaml_str(
        "responses:\n  - status: 500\nlanes:\n  - contains: ''\n    responses: [{status: 200}]\n",
        "s.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("line 4") && e.contains("contains is empty"),
        "{e}"
    );
    let e = docsfab_sim::Scenario::from_yaml_str(
        "responses:\n  - status: 500\nlanes:\n  - contains: x\n",
        "s.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("lane for \"x\"") && e.contains("responses is empty"),
        "{e}"
    );
}
