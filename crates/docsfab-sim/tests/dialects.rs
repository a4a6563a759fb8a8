//! Server dialects (`quirks` on an answer): the bytes each quirk puts on the wire, as the real
//! servers named in docs/compat-results.md ("Servers") send them.

mod support;

use serde_json::Value;
use support::*;

async fn body(yaml: &str) -> String {
    let server = start(yaml).await;
    let request = serde_json::json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hello"}]
    });
    let reply = send(server.local_addr(), CHAT, &request.to_string()).await;
    server.shutdown().await;
    assert_eq!(reply.end, End::Eof);
    String::from_utf8(reply.parsed().body).unwrap()
}

/// The tool-call deltas of every data line, in order.
fn tool_deltas(text: &str) -> Vec<Value> {
    events(text.as_bytes())
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["tool_calls"][0]
                .as_object()
                .cloned()
        })
        .map(Value::Object)
        .collect()
}

#[tokio::test]
async fn error_field_line_is_llamas_bare_error_then_done_only() {
    let text = body("responses:\n  - answer:\n      text: hi\n      error_event: {type: server_error, code: 500}\n      quirks: [error-field-line]\n").await;
    let tail = "error: {\"code\":500,\"message\":\"simulated server_error\",\"type\":\"server_error\"}\n\ndata: [DONE]\n\n";
    assert!(text.ends_with(tail), "{text}");
    assert!(!text.contains("finish_reason\":\"stop"), "{text}");
}

#[tokio::test]
async fn error_field_line_without_an_error_event_is_refused() {
    let yaml = "responses:\n  - answer:\n      text: hi\n      quirks: [error-field-line]\n";
    let err = docsfab_sim::Scenario::from_yaml_str(yaml, "s.yaml").unwrap_err();
    assert!(
        err.to_string()
            .contains("error-field-line needs an error_event"),
        "{err}"
    );
    let yaml = "responses:\n  - answer:\n      quirks: [no-such-quirk]\n";
    assert!(docsfab_sim::Scenario::from_yaml_str(yaml, "s.yaml").is_err());
}

#[tokio::test]
async fn tool_call_quirks_shape_the_deltas() {
    let call = "tool_calls: [{name: read_file, arguments: {path: a}, deltas: 2}]";
    let yaml = |q: &str| format!("responses:\n  - answer:\n      {call}\n      quirks: [{q}]\n");
    let d = tool_deltas(&body(&yaml("tool-ids-missing")).await);
    assert_eq!(d.len(), 3);
    assert!(d.iter().all(|c| c.get("id").is_none()), "{d:?}");

    let d = tool_deltas(&body(&yaml("tool-id-every-chunk")).await);
    assert!(
        d.iter()
            .all(|c| c["id"] == d[0]["id"] && c["function"]["name"] == "read_file")
    );

    let d = tool_deltas(&body(&yaml("tool-name-empty-on-continuations")).await);
    assert_eq!(d[0]["function"]["name"], "read_file");
    assert!(d[1..].iter().all(|c| c["function"]["name"] == ""), "{d:?}");

    let text = body(&format!(
        "responses:\n  - answer:\n      {call}\n      finish_reason: stop\n      quirks: [tool-calls-whole]\n"
    ))
    .await;
    let d = tool_deltas(&text);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["function"]["arguments"], "{\"path\":\"a\"}");
    // The finish reason rides on the same chunk, and no other chunk carries one.
    assert_eq!(
        text.matches("\"finish_reason\":\"stop\"").count(),
        1,
        "{text}"
    );
}

#[tokio::test]
async fn framing_quirks_pings_extra_usage_and_repeated_finishes() {
    let text = body("responses:\n  - answer:\n      text: hi\n      quirks: [ping-comments, usage-extra-members, null-finish-chunk, duplicate-finish]\n").await;
    assert_eq!(
        text.matches(": ping\n").count(),
        events(text.as_bytes()).len()
    );
    assert_eq!(text.matches("\"finish_reason\":\"stop\"").count(), 2);
    let datas: Vec<Value> = events(text.as_bytes())
        .iter()
        .filter_map(|e| serde_json::from_str(&e.data).ok())
        .collect();
    let usage = datas.iter().find(|v| v["usage"].is_object()).unwrap();
    assert!(usage["timings"].is_object());
    assert!(usage["usage"]["completion_tokens_details"].is_null());
    let last = datas.last().unwrap();
    assert!(last["choices"][0]["finish_reason"].is_null(), "{last}");
}
