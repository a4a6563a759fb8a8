//! Issue 31, "Real models on real servers": the shapes real OpenAI-compatible and Anthropic
//! servers send (docs/compat-results.md, "Servers"), each played by `docsfab sim serve` over real
//! HTTP to a real `docsfab run`, with what docsfab records for it.

mod support;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The answer every successful scenario below ends on.
const ANSWER: &str = "  - answer:\n      json: {modules: [lib, count]}\n";

/// Runs the one-step composition against `scenario` on `api`; the exit code and the record.
fn run(api: &str, scenario: &str) -> (Option<i32>, Value, String) {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), scenario);
    let s = Setup::with_api(api, &sim.base_url, FAST_CATALOG);
    let out = s.run_command(&s.composition(ONE_STEP)).output().unwrap();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    let id = stdout.lines().next().unwrap_or_default();
    let record = s.show_json(id);
    validate_against_schema(&record).unwrap();
    (out.status.code(), record, stderr)
}

fn openai(scenario: &str) -> (Option<i32>, Value, String) {
    run("openai-chat", scenario)
}

/// CLS-5/CLS-6: llama.cpp's `error:` field line with a declared 500 is a structured error event
/// of class `server`, replayed in the turn; the replayed request gets the answer.
#[test]
fn llama_error_field_line_declaring_500_is_replayed_as_server_cls_5_cls_6() {
    let scenario = format!(
        "responses:\n  - answer:\n      error_event: {{type: server_error, code: 500, message: boom}}\n      quirks: [error-field-line]\n{ANSWER}"
    );
    let (code, record, stderr) = openai(&scenario);
    assert_eq!(code, Some(0), "{stderr}");
    let turn = &record["steps"][0]["attempts"][0]["turns"][0];
    assert_eq!(turn["replays"][0]["providerErrorClass"], "server", "{turn}");
    assert_eq!(record["steps"][0]["attempts"].as_array().unwrap().len(), 1);
}

/// CLS-6, REP-6: a declared 429 on an `error:` field line is a rate limit without HTTP status:
/// terminal on the first attempt, never replayed.
#[test]
fn llama_error_field_line_declaring_429_is_a_terminal_quota_rep_6() {
    let scenario = format!(
        "responses:\n  - answer:\n      error_event: {{type: rate_limit_error, code: 429}}\n      quirks: [error-field-line]\n{ANSWER}"
    );
    let (code, record, stderr) = openai(&scenario);
    assert_eq!(code, Some(1), "{stderr}");
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(a["providerErrorClass"], "rate-limit");
    assert_eq!(a["httpStatus"], Value::Null);
    assert_eq!(a["failureCategory"], "provider-quota");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(a["turns"][0]["replays"], serde_json::json!([]));
}

/// STP-14, REP-3: the context-overflow refusal of each server dialect is recorded as
/// `context-exhausted` with the counts it gave, terminal on the first attempt, and its
/// remediation names the three levers.
#[test]
fn overflow_refusals_of_five_dialects_are_context_exhausted_with_counts_stp_14() {
    let cases: [(&str, u16, &str, [Option<u64>; 3]); 5] = [
        (
            "openai-chat",
            400,
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            [Some(130000), Some(128000), None],
        ),
        (
            "openai-chat",
            400,
            r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#,
            [Some(5000), Some(4096), None],
        ),
        (
            "openai-chat",
            400,
            r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 3000 tokens (2000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
            [Some(2000), Some(2048), Some(1000)],
        ),
        (
            "anthropic-messages",
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#,
            [Some(208310), Some(200000), None],
        ),
        (
            "openai-chat",
            422,
            r#"{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 512 `max_new_tokens`","error_type":"validation"}"#,
            [Some(4000), Some(4096), Some(512)],
        ),
    ];
    for (api, status, body, [prompt, context, output]) in cases {
        // YAML single quotes: an apostrophe is written twice.
        let quoted = body.replace('\'', "''");
        let scenario = format!("responses:\n  - status: {status}\n    body: '{quoted}'\n{ANSWER}");
        let (code, record, stderr) = run(api, &scenario);
        assert_eq!(code, Some(1), "{body}\n{stderr}");
        let step = &record["steps"][0];
        let failure = &step["failure"];
        assert_eq!(
            failure["category"], "context-exhausted",
            "{body}: {failure}"
        );
        let n = |v: Option<u64>| v.map_or(Value::Null, Value::from);
        let c = &failure["context"];
        assert_eq!(
            [&c["promptTokens"], &c["contextTokens"], &c["outputTokens"]],
            [&n(prompt), &n(context), &n(output)],
            "{body}"
        );
        let remediation = failure["remediation"].as_str().unwrap();
        for lever in [
            "limits.sourceReadBytes",
            "limits.maxOutputTokens",
            "context",
        ] {
            assert!(remediation.contains(lever), "{remediation}");
        }
        // The provider's words are not kept: only the numbers came out of the message.
        assert!(!record.to_string().contains("try increasing it"));
        let attempts = step["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{body}");
        assert_eq!(attempts[0]["retryScheduled"], false);
        assert_eq!(attempts[0]["httpStatus"], status);
        assert_eq!(attempts[0]["providerErrorClass"], "invalid-request");
    }
}

/// Tool calls as real servers stream them: without ids, with the id on every chunk, with
/// `name: ""` on continuations, and whole in one chunk ending `stop`. Each is assembled by its
/// index into the one call the model made, which runs (LSE-1 does not apply: it is valid).
#[test]
fn tool_call_dialects_are_assembled_by_index_and_run() {
    for (quirk, extra) in [
        ("tool-ids-missing", ""),
        ("tool-id-every-chunk", ""),
        ("tool-name-empty-on-continuations", ""),
        ("tool-calls-whole", "      finish_reason: stop\n"),
        (
            "tool-calls-whole, tool-ids-missing",
            "      finish_reason: stop\n",
        ),
    ] {
        let scenario = format!(
            "responses:\n  - answer:\n      tool_calls: [{{name: list_files, arguments: {{path: src}}, deltas: 3}}]\n      quirks: [{quirk}]\n{extra}{ANSWER}"
        );
        let (code, record, stderr) = openai(&scenario);
        assert_eq!(code, Some(0), "{quirk}: {stderr}");
        let turn = &record["steps"][0]["attempts"][0]["turns"][0];
        let calls = turn["toolBatch"]["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{quirk}: {turn}");
        assert_eq!(turn["toolBatch"]["executed"], 1, "{quirk}: {turn}");
    }
}

/// Stream framing real servers add: `: ping` comments, usage with extra members, a
/// `finish_reason: null` chunk after the finish, and a duplicated finish chunk. None changes
/// the answer, and the usage is still read.
#[test]
fn pings_extra_usage_members_and_repeated_finish_chunks_read_as_the_answer() {
    let scenario = "responses:\n  - answer:\n      json: {modules: [lib, count]}\n      usage: {input_tokens: 120, output_tokens: 9}\n      quirks: [ping-comments, usage-extra-members, null-finish-chunk, duplicate-finish]\n";
    let (code, record, stderr) = openai(scenario);
    assert_eq!(code, Some(0), "{stderr}");
    let a = &record["steps"][0]["attempts"][0];
    assert_eq!(a["usage"]["inputTokens"], 120, "{a}");
    assert_eq!(a["usage"]["outputTokens"], 9);
    assert_eq!(a["turns"][0]["replays"], serde_json::json!([]));
}

/// A server that never reports usage (scenario `usage: never`): the answer stands, and its
/// usage is recorded as unknown or estimated, never as a count the server did not give.
#[test]
fn a_server_without_usage_still_answers() {
    let scenario = format!("usage: never\nresponses:\n{ANSWER}");
    let (code, record, stderr) = openai(&scenario);
    assert_eq!(code, Some(0), "{stderr}");
    let usage = &record["steps"][0]["attempts"][0]["usage"];
    assert!(
        usage["inputTokens"].is_null() || usage["estimated"] == true,
        "{usage}"
    );
}

/// CLS-2/CLS-3 as the spec says them: a finish reason without `[DONE]` is a complete answer (only
/// a stream with neither is `stream-incomplete`), and `[DONE]` after a `finish_reason: null`
/// chunk with no finish reason is an answer the runtime judges, not `stream-incomplete`.
#[test]
fn a_finish_reason_without_done_and_done_without_finish_reason_are_answers_cls_2_cls_3() {
    for faults in [
        "      omit_done: true\n",
        "      omit_finish_reason: true\n      quirks: [null-finish-chunk]\n",
    ] {
        let scenario =
            format!("responses:\n  - answer:\n      json: {{modules: [lib, count]}}\n{faults}");
        let (code, record, stderr) = openai(&scenario);
        assert_eq!(code, Some(0), "{faults}: {stderr}");
        let attempts = record["steps"][0]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{faults}");
        assert_eq!(attempts[0]["turns"][0]["replays"], serde_json::json!([]));
    }
}

/// REP-2, CLS-1: Anthropic's 529 `overloaded_error` and a 503 "queue full" without Retry-After
/// are `server` and replayed in the turn (the 503 with the replay's own backoff).
#[test]
fn anthropic_529_and_a_503_queue_full_without_retry_after_are_replayed_rep_2() {
    for (api, entry) in [
        ("anthropic-messages", "  - status: 529\n"),
        (
            "openai-chat",
            "  - status: 503\n    body: '{\"error\":{\"message\":\"server is busy, queue full\",\"type\":\"server_error\",\"code\":503}}'\n",
        ),
    ] {
        let (code, record, stderr) = run(api, &format!("responses:\n{entry}{ANSWER}"));
        assert_eq!(code, Some(0), "{entry}: {stderr}");
        let replay = &record["steps"][0]["attempts"][0]["turns"][0]["replays"][0];
        assert_eq!(replay["providerErrorClass"], "server", "{replay}");
        assert_eq!(replay["retryAfterMs"], Value::Null);
    }
}

/// The route keeps the boundary's rules (BND-8): a body whose error comes on an `error:` field
/// line is refused to the client rather than forwarded, because the client's SDK would read it as
/// an empty answer; only the provider path reads the field (docs/boundary.md).
#[tokio::test]
async fn the_route_still_refuses_an_error_field_line_body_bnd_8() {
    use support::route::{Setup as Route, path_of, request};
    let scenario = "responses:\n  - answer:\n      error_event: {type: rate_limit_error, code: 429}\n      quirks: [error-field-line]\n";
    let s = Route::start("openai-chat", scenario).await;
    let r = s
        .post(path_of("openai-chat"), &request("openai-chat"))
        .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "not-a-stream", "{}", r.text());
    assert!(!r.text().contains("error: {"), "{}", r.text());
    assert_eq!(s.sim.requests().len(), 1, "a declared 429 is not replayed");
}
