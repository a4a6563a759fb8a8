//! End-to-end runs of an answer cut at the output limit (STP-10): `run_composition` against the
//! simulator on 127.0.0.1 over real HTTP, with a real SQLite run store. A final text answer that
//! the provider ends with finish reason `length` (OpenAI) or `max_tokens` (Anthropic) is
//! continued inside the attempt; only an answer still cut when the continuations or the lease's
//! turns run out, or completed by a continuation and then refused, is the cut-answer condition.

mod support;

use docsfab_policy::rules::RulesTable;
use docsfab_record::{Api, RunStatus};
use docsfab_runtime::agent::{CONTINUE_INSTRUCTION, MAX_CONTINUATIONS};
use serde_json::{Value, json};
use support::{Harness, RunArgs, limits, requests, run_recorded};
use tokio_util::sync::CancellationToken;

/// Fast replay windows (nothing here should replay, but nothing should wait long either).
const FAST_HOST: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n  providerAttempt.maxTotalDelayMs: 200\n";

/// What a run of one composition left behind.
struct Ran {
    status: RunStatus,
    json: Value,
    /// (step, attempt, turn, digest, body) of every request, in order.
    reqs: Vec<(String, u32, u32, String, String)>,
}

async fn harness(scenario: &str) -> Harness {
    support::harness(scenario, "//! A tiny crate.\npub mod count;\n").await
}

async fn run(h: &Harness, composition: &str, api: Api) -> Ran {
    let r = run_recorded(
        h,
        composition,
        RunArgs {
            api,
            limits: limits(FAST_HOST, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]),
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            on_event: Box::new(|_| {}),
        },
    )
    .await;
    let reqs = requests(&r.events);
    // Every request the run reports reached the simulator byte for byte, so what the tests read
    // from the reported payloads is what went on the wire.
    let log = h.server.requests();
    assert_eq!(log.len(), reqs.len());
    for (entry, req) in log.iter().zip(&reqs) {
        assert_eq!(
            entry.sha256, req.3,
            "request {} was not the reported body",
            entry.index
        );
    }
    Ran {
        status: r.outcome.status,
        json: r.json,
        reqs,
    }
}

/// A read-only step whose contract wants `{"modules": [...]}`, with `extra` limit lines.
fn survey(extra: &str) -> String {
    format!(
        r#"name: survey
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 1024
{extra}steps:
  - id: outline
    access: read-only
    instructions: 'Survey the crate and return {{"modules": [...]}}.'
    tools: [list_files, read_file, search_text]
    contract:
      schema: {{type: object, required: [modules], properties: {{modules: {{type: array}}}}}}
"#
    )
}

/// The finish reason each API uses for the output limit.
fn cut_reason(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => "length",
        Api::AnthropicMessages => "max_tokens",
    }
}

/// The conversation of a request body as (role, text) pairs, whatever the API: OpenAI's system
/// message is left out (Anthropic keeps it outside `messages` too), Anthropic's text blocks are
/// joined, and tool results are marked.
fn conversation(body: &str) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(body).unwrap();
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| {
            let role = m["role"].as_str().unwrap().to_owned();
            let text = match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(blocks) => blocks
                    .iter()
                    .map(|b| match b["type"].as_str() {
                        Some("text") => b["text"].as_str().unwrap().to_owned(),
                        Some(other) => format!("[{other}]"),
                        None => String::new(),
                    })
                    .collect(),
                _ => String::new(),
            };
            (role, text)
        })
        .collect()
}

/// A request body without its conversation: model, system prompt, tools, limits. The
/// structured-output constraint is left out too: a continuation carries none (tests/
/// e2e_structured_output.rs), since it goes on from the middle of the object.
fn without_messages(body: &str) -> Value {
    let mut v: Value = serde_json::from_str(body).unwrap();
    let object = v.as_object_mut().unwrap();
    object.remove("response_format");
    object.remove("output_config");
    let messages = object.remove("messages").unwrap();
    // OpenAI carries the system prompt as the first message; keep it in the comparison.
    if let Some(first) = messages.as_array().and_then(|m| m.first())
        && first["role"] == "system"
    {
        v["systemMessage"] = first.clone();
    }
    v
}

/// Proves STP-10: a cut answer is continued in the same attempt, the pieces are joined and the
/// joined answer meets the contract. The continuation request is the first request's
/// conversation plus the partial text and the instruction to continue, and nothing else changes.
async fn cut_then_continued_to_a_valid_answer(api: Api) {
    let h = harness(&format!(
        r#"responses:
  - answer:
      text: '{{"modules": ["li'
      finish_reason: {}
  - answer:
      text: 'b", "count"]}}'
"#,
        cut_reason(api)
    ))
    .await;
    let r = run(&h, &survey(""), api).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let step = &r.json["steps"][0];
    assert_eq!(step["output"], json!({"modules": ["lib", "count"]}));
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        1,
        "the continuation stays inside the attempt"
    );
    let a = &attempts[0];
    assert_eq!(a["turns"].as_array().unwrap().len(), 2);
    assert_eq!(a["lease"]["turnsUsed"], 2);
    assert_eq!(a["lease"]["stopReason"], "answered");
    assert_eq!(a["retryDecision"], "none");

    assert_eq!(r.reqs.len(), 2);
    assert_eq!((r.reqs[1].1, r.reqs[1].2), (1, 2), "attempt 1, turn 2");
    let first = conversation(&r.reqs[0].4);
    let second = conversation(&r.reqs[1].4);
    assert!(!r.reqs[0].4.contains("Continue it exactly"));
    let mut expected = first.clone();
    expected.push(("assistant".into(), r#"{"modules": ["li"#.into()));
    expected.push(("user".into(), CONTINUE_INSTRUCTION.into()));
    assert_eq!(second, expected);
    assert_eq!(
        without_messages(&r.reqs[0].4),
        without_messages(&r.reqs[1].4)
    );
}

#[tokio::test]
async fn a_cut_answer_is_continued_to_a_valid_answer_openai_stp_10() {
    cut_then_continued_to_a_valid_answer(Api::OpenaiChat).await;
}

#[tokio::test]
async fn a_cut_answer_is_continued_to_a_valid_answer_anthropic_stp_10() {
    cut_then_continued_to_a_valid_answer(Api::AnthropicMessages).await;
}

/// Proves STP-10, STP-13: an answer still cut after every continuation has no continuation left:
/// the attempt ends as cut-answer, and the step retries it once (the default condition budget)
/// with the feedback to answer completely and well inside the limit.
#[tokio::test]
async fn continuations_run_out_then_the_cut_answer_is_retried_once_stp_10_stp_13() {
    // Every request gets the same cut answer (the simulator repeats the last entry).
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": ["lib", '
      finish_reason: length
"#,
    )
    .await;
    let r = run(&h, &survey(""), Api::OpenaiChat).await;
    assert_eq!(r.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    assert_eq!(step["failure"]["category"], "cut-answer");
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "retried once");
    let turns = 1 + MAX_CONTINUATIONS as usize;
    for (k, a) in attempts.iter().enumerate() {
        assert_eq!(a["code"], "cut-answer", "attempt {}", k + 1);
        assert_eq!(a["retryRule"], "condition-cut-answer");
        assert_eq!(a["turns"].as_array().unwrap().len(), turns);
        assert_eq!(a["lease"]["stopReason"], "answered");
        let message = a["message"].as_str().unwrap();
        assert!(
            message.contains("after 2 continuations with no continuation left"),
            "{message}"
        );
    }
    assert_eq!(attempts[0]["retryDecision"], "scheduled");
    assert_eq!(attempts[1]["budget"], "contract");
    assert_eq!(attempts[1]["retryDecision"], "exhausted");

    // Each attempt: the answer, then MAX_CONTINUATIONS continuations; the retry alone carries
    // the feedback, in its first request.
    assert_eq!(r.reqs.len(), 2 * turns);
    let feedback = "well inside the limit of 1024 tokens";
    for (k, req) in r.reqs.iter().enumerate() {
        assert_eq!(req.1 == 2, req.4.contains(feedback), "request {k}");
        assert_eq!(
            req.2 > 1,
            req.4.contains("Continue it exactly"),
            "request {k}"
        );
    }
    // The last continuation asked for more of all the pieces joined so far, not of the last.
    let last = conversation(&r.reqs[turns - 1].4);
    assert_eq!(
        last[last.len() - 2],
        (
            "assistant".to_owned(),
            r#"{"modules": ["lib", {"modules": ["lib", "#.to_owned()
        )
    );
}

/// Proves STP-10: an answer completed by a continuation and then refused by the contract is the
/// cut-answer condition ("completed by a continuation and then refused"), not contract-schema:
/// the same object uncut is a contract failure (the second test), so only the cut decides.
#[tokio::test]
async fn a_continued_answer_the_contract_refuses_is_a_cut_answer_stp_10() {
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": "li'
      finish_reason: max_tokens
  - answer:
      text: 'b"}'
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &survey(""), Api::AnthropicMessages).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let a = &attempts[0];
    assert_eq!(a["code"], "cut-answer");
    assert_eq!(a["failureCategory"], "cut-answer");
    assert_eq!(a["retryRule"], "condition-cut-answer");
    assert_eq!(a["turns"].as_array().unwrap().len(), 2);
    let message = a["message"].as_str().unwrap();
    assert!(
        message.contains("completed by 1 continuation, and then refused by the contract"),
        "{message}"
    );
    assert!(message.contains("schema-invalid"), "{message}");
    // The retry is the cut-answer retry, with its feedback.
    assert!(r.reqs[2].4.contains("well inside the limit of 1024 tokens"));
}

#[tokio::test]
async fn the_same_object_uncut_is_a_contract_failure() {
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": "lib"}'
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &survey(""), Api::AnthropicMessages).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let a = &r.json["steps"][0]["attempts"][0];
    assert_eq!(a["code"], "contract-schema-invalid");
    assert_eq!(a["retryRule"], "contract-schema-invalid");
    assert_eq!(a["turns"].as_array().unwrap().len(), 1);
}

/// Proves STP-10, LSE-3: each continuation is a provider turn of the lease; when maxTurns is
/// reached while the answer is still cut, no further turn is requested and the attempt ends as
/// cut-answer ("no continuation left"), not as the no-progress a used-up lease otherwise means.
#[tokio::test]
async fn max_turns_reached_during_continuations_is_a_cut_answer_stp_10() {
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": ['
      finish_reason: length
    repeat: 2
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &survey("  maxTurns: 2\n"), Api::OpenaiChat).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let a = &attempts[0];
    assert_eq!(a["code"], "cut-answer");
    assert_eq!(a["retryRule"], "condition-cut-answer");
    assert_eq!(a["lease"]["maxTurns"], 2);
    assert_eq!(a["lease"]["turnsUsed"], 2);
    assert_eq!(a["lease"]["stopReason"], "max-turns");
    let message = a["message"].as_str().unwrap();
    assert!(
        message.contains("after 1 continuation with no continuation left"),
        "{message}"
    );
    assert!(message.contains("maxTurns 2"), "{message}");
    // Two turns in attempt 1 (the answer and one continuation), then the retry's one turn.
    let turns: Vec<(u32, u32)> = r.reqs.iter().map(|q| (q.1, q.2)).collect();
    assert_eq!(turns, [(1, 1), (1, 2), (2, 1)]);
}

/// Proves STP-10 for write steps: a cut final text is continued and joined the same way; the
/// joined text is the step's output that a later step's instructions receive.
#[tokio::test]
async fn a_write_steps_cut_final_text_is_continued_stp_10() {
    let h = harness(
        r##"responses:
  - answer:
      tool_calls: [{id: w1, name: write_file, arguments: {path: docs/overview.md, content: "# Overview\n"}}]
  - answer:
      text: 'Wrote docs/'
      finish_reason: max_tokens
  - answer:
      text: 'overview.md, one page.'
  - answer:
      json: {ok: true}
"##,
    )
    .await;
    let composition = r#"name: pages
model: sim-model
limits:
  timeoutMs: 20000
  maxTurns: 4
  maxOutputTokens: 1024
steps:
  - id: pages
    access: write
    instructions: Write docs/overview.md.
    tools: [read_file, write_file]
    writeRoots: [docs/]
  - id: check
    access: read-only
    instructions: "Confirm this summary: {{steps.pages.output}}"
    tools: [read_file]
    contract:
      schema: {type: object}
"#;
    let r = run(&h, composition, Api::AnthropicMessages).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let pages = &r.json["steps"][0];
    let attempts = pages["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["turns"].as_array().unwrap().len(), 3);
    assert_eq!(attempts[0]["lease"]["turnsUsed"], 3);
    assert_eq!(attempts[0]["lease"]["executedToolCalls"], 1);
    // The continuation request came after the tool round trip, and kept it.
    let third = conversation(&r.reqs[2].4);
    assert!(third.iter().any(|(_, t)| t.contains("[tool_result]")));
    assert_eq!(third.last().unwrap().1, CONTINUE_INSTRUCTION);
    assert_eq!(r.reqs[3].0, "check");
    assert!(
        r.reqs[3]
            .4
            .contains("Confirm this summary: Wrote docs/overview.md, one page."),
        "{}",
        r.reqs[3].4
    );
}

/// Proves STP-10, LSE-1: a tool batch cut at the output limit is not continued; its truncated
/// arguments are rejected before authorization and the model reissues within the lease.
#[tokio::test]
async fn a_cut_tool_batch_is_not_continued_lse_1() {
    let h = harness(
        r#"responses:
  - answer:
      text: 'Reading.'
      tool_calls:
        - {id: c1, name: read_file, arguments: {path: src/lib.rs}, truncate_arguments: 6}
      finish_reason: length
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &survey(""), Api::OpenaiChat).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let a = &r.json["steps"][0]["attempts"][0];
    assert_eq!(a["turns"][0]["toolBatch"]["rejected"], 1);
    assert_eq!(
        a["turns"][0]["toolBatch"]["calls"][0]["reason"],
        "truncated-arguments"
    );
    assert_eq!(r.reqs.len(), 2);
    assert!(!r.reqs[1].4.contains("Continue it exactly"));
}

/// A continuation that answers with tool calls leaves the cut answer: the tools run, and the
/// next final answer is judged on its own, not joined to the abandoned piece.
#[tokio::test]
async fn a_continuation_that_calls_tools_leaves_the_cut_answer() {
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": ["li'
      finish_reason: length
  - answer:
      tool_calls: [{id: r1, name: read_file, arguments: {path: src/count.rs}}]
  - answer:
      json: {modules: [count]}
"#,
    )
    .await;
    let r = run(&h, &survey(""), Api::OpenaiChat).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let step = &r.json["steps"][0];
    assert_eq!(step["output"], json!({"modules": ["count"]}));
    let a = &step["attempts"][0];
    assert_eq!(a["turns"].as_array().unwrap().len(), 3);
    assert_eq!(a["lease"]["executedToolCalls"], 1);
    // The model's history keeps the piece it wrote and the instruction it was given.
    let third = conversation(&r.reqs[2].4);
    assert!(third.contains(&("assistant".to_owned(), r#"{"modules": ["li"#.to_owned())));
    assert!(third.contains(&("user".to_owned(), CONTINUE_INSTRUCTION.to_owned())));
}
