//! The runtime's own turns meet the response boundary (BND-1) and the terminal conditions of
//! STP-14, end to end: `run_composition` over real HTTP against the simulator on 127.0.0.1, with a
//! real run store, read back from disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;
use docsfab_provider::ApiKey;
use docsfab_record::{Api, RunStatus};
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{Progress, ProviderSettings, RunConfig, run_composition};
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::RunStore;
use docsfab_sim::{Scenario, SimServer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The host's key, as the executor gets it: long enough to be searched for as a host secret.
const SECRET: &str = "e2e-boundary-HOST-key-93817";
const KEY_VAR: &str = "E2E_BOUNDARY_KEY";

const FAST_HOST: &str = "catalog:\n  providerAttempt.baseDelayMs: 5\n  providerAttempt.maxDelayMs: 20\n  providerAttempt.maxTotalDelayMs: 100\n";

const COMPOSITION: &str = r#"name: boundary
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 1024
steps:
  - id: outline
    access: read-only
    instructions: 'Return {"modules": [...]}.'
    tools: [list_files]
    contract:
      schema: {type: object, required: [modules]}
"#;

fn limits() -> EffectiveLimits {
    let host = HostConfig::parse(FAST_HOST, "host.yaml").unwrap();
    let env = BTreeMap::from([("DOCSFAB_RETRY_BASE_DELAY_MS".to_owned(), "5".to_owned())]);
    resolve(&host, &env).unwrap()
}

struct Ran {
    status: RunStatus,
    /// `runs show --json` of the run, as stored.
    json: Value,
    /// Every progress line an operator would have seen.
    shown: String,
    /// Requests the simulator received.
    requests: usize,
}

async fn run(api: Api, scenario: &str, rules: RulesTable) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let workspace: PathBuf = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("lib.rs"), "pub fn f() {}\n").unwrap();
    let scenario = Scenario::from_yaml_str(scenario, "inline").unwrap();
    let server = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .unwrap();
    let shown: Arc<Mutex<String>> = Arc::default();
    let sink = {
        let shown = Arc::clone(&shown);
        Arc::new(move |p: &Progress| {
            if let Some(line) = p.describe() {
                let mut s = shown.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        })
    };
    let db = dir.path().join("runs.db");
    let mut store = RunStore::open(&db).unwrap();
    let outcome = run_composition(
        RunConfig {
            composition: Composition::parse(COMPOSITION, "composition.yaml").unwrap(),
            workspace,
            provider: ProviderSettings {
                name: "sim".into(),
                api,
                base_url: server.base_url(),
                model: "sim-model".into(),
                api_key: Some(ApiKey::new(SECRET).with_label(KEY_VAR)),
                spend: Default::default(),
                structured_output: docsfab_policy::host::StructuredOutput::JsonSchema,
            },
            limits: limits(),
            rules,
            cancel: CancellationToken::new(),
            job_deadline: None,
            progress: Some(sink),
            throttle: None,
            carry: None,
            spec: None,
        },
        &mut store,
    )
    .await
    .unwrap();
    drop(store);
    let record = RunStore::open(&db)
        .unwrap()
        .load_run(&outcome.run_id)
        .unwrap()
        .unwrap();
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
    let shown = shown.lock().unwrap().clone();
    Ran {
        status: outcome.status,
        json,
        shown,
        requests: server.requests().len(),
    }
}

fn attempts(r: &Ran) -> &Vec<Value> {
    r.json["steps"][0]["attempts"].as_array().unwrap()
}

/// BND-1: a clean answer still passes the boundary on both APIs, in one request.
#[tokio::test]
async fn a_clean_answer_passes_the_boundary_bnd_1() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let r = run(
            api,
            "responses:\n  - answer: {json: {modules: [lib]}}\n",
            RulesTable::embedded().unwrap(),
        )
        .await;
        assert_eq!(r.status, RunStatus::Succeeded, "{api}: {}", r.shown);
        assert_eq!(r.requests, 1);
        assert_eq!(attempts(&r).len(), 1);
        assert_eq!(r.json["steps"][0]["output"]["modules"][0], "lib");
    }
}

/// BND-1, STP-14: the host's key value in the model's content ends the step on its first attempt
/// as a terminal validator refusal, although both budgets are full; the record and the operator's
/// lines name the variable, never the value.
#[tokio::test]
async fn the_keys_value_in_content_is_a_terminal_credential_refusal_stp_14_bnd_1() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let r = run(
            api,
            &format!("responses:\n  - answer: {{text: 'the key is {SECRET} ok'}}\n  - answer: {{json: {{modules: [lib]}}}}\n"),
            RulesTable::embedded().unwrap(),
        )
        .await;
        assert_eq!(r.status, RunStatus::Failed, "{api}");
        assert_eq!(r.requests, 1, "{api}: never asked again");
        let a = attempts(&r);
        assert_eq!(a.len(), 1);
        let a = &a[0];
        assert_eq!(a["failureCategory"], "validator-terminal");
        assert_eq!(a["code"], "credential-material");
        assert_eq!(a["retryRule"], "terminal-validator-refusal");
        assert_eq!(a["retryDecision"], "terminal");
        assert_eq!(a["retryScheduled"], false);
        assert_eq!(a["providerErrorClass"], Value::Null);
        assert_eq!(a["turns"][0]["status"], "failed");
        let message = a["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("credential-material (host-secret {KEY_VAR})")),
            "{message}"
        );
        assert_eq!(r.json["steps"][0]["failure"]["code"], "credential-material");
        assert!(
            !r.json.to_string().contains(SECRET),
            "the key is in the record"
        );
        assert!(!r.shown.contains(SECRET), "the key was shown: {}", r.shown);
        assert!(r.shown.contains("credential-material"), "{}", r.shown);
    }
}

/// BND-1: a key of a known shape (not the host's) is refused the same way, by its kind.
#[tokio::test]
async fn a_known_key_shape_in_content_is_refused_by_kind_bnd_1() {
    let key = "ghp_Q3xZ8kLm0pR7sT2vW9yB4nD6fH1jK5gA3cE8";
    let r = run(
        Api::OpenaiChat,
        &format!("responses:\n  - answer: {{text: 'token {key}'}}\n"),
        RulesTable::embedded().unwrap(),
    )
    .await;
    let a = &attempts(&r)[0];
    assert_eq!(a["code"], "credential-material");
    assert_eq!(a["retryScheduled"], false);
    assert!(a["message"].as_str().unwrap().contains("github-token"));
    assert!(!r.json.to_string().contains(key));
}

/// BND-4: a chunk from another model is refused before the answer is judged, and recorded as a
/// provider fault of class `unknown`, which is never retried (one request).
#[tokio::test]
async fn a_chunk_from_another_model_is_refused_and_recorded_bnd_4() {
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let r = run(
            api,
            "responses:\n  - answer: {json: {modules: [lib]}, foreign_model: other-model}\n  - answer: {json: {modules: [lib]}}\n",
            RulesTable::embedded().unwrap(),
        )
        .await;
        assert_eq!(r.status, RunStatus::Failed, "{api}");
        assert_eq!(r.requests, 1);
        let a = &attempts(&r)[0];
        assert_eq!(a["providerErrorClass"], "unknown");
        assert_eq!(a["httpStatus"], Value::Null);
        assert_eq!(a["retryRule"], "class-unknown");
        assert_eq!(a["retryDecision"], "terminal");
        assert_eq!(a["retryScheduled"], false);
        assert_eq!(a["failureCategory"], "provider-refused");
        assert_eq!(a["turns"][0]["status"], "failed");
        let message = a["message"].as_str().unwrap();
        assert!(message.contains("model-mismatch"), "{message}");
        // The answer was never judged: no contract failure, no output.
        assert_eq!(r.json["steps"][0]["output"], Value::Null);
    }
}

/// STP-14: an OpenAI-style 400 whose error code says the context window was exceeded ends the
/// step as `context-exhausted` on the first attempt, keeping the provider's class and status.
#[tokio::test]
async fn context_length_exceeded_is_context_exhausted_stp_14() {
    let body = r#"{"error":{"message":"The maximum context length is 8192 tokens","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let r = run(
        Api::OpenaiChat,
        &format!("responses:\n  - status: 400\n    body: '{body}'\n  - answer: {{json: {{modules: [lib]}}}}\n"),
        RulesTable::embedded().unwrap(),
    )
    .await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.requests, 1);
    let a = &attempts(&r)[0];
    assert_eq!(a["failureCategory"], "context-exhausted");
    assert_eq!(a["code"], "context-exhausted");
    assert_eq!(a["retryRule"], "terminal-context-exhausted");
    assert_eq!(a["retryDecision"], "terminal");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(a["providerErrorClass"], "invalid-request");
    assert_eq!(a["httpStatus"], 400);
    assert_eq!(
        r.json["steps"][0]["failure"]["category"],
        "context-exhausted"
    );
    // The provider's message is never read or kept.
    assert!(!r.json.to_string().contains("maximum context length"));
}

/// STP-14: the same code in a structured error event inside a 200 stream.
#[tokio::test]
async fn context_length_exceeded_in_a_stream_is_context_exhausted_stp_14() {
    let r = run(
        Api::OpenaiChat,
        "responses:\n  - stream_error: {type: invalid_request_error, code: context_length_exceeded}\n",
        RulesTable::embedded().unwrap(),
    )
    .await;
    let a = &attempts(&r)[0];
    assert_eq!(a["failureCategory"], "context-exhausted");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(r.requests, 1);
}

/// STP-14: Anthropic's `model_context_window_exceeded` stop reason ends the step the same way.
#[tokio::test]
async fn an_anthropic_context_window_stop_is_context_exhausted_stp_14() {
    let r = run(
        Api::AnthropicMessages,
        "responses:\n  - answer: {text: '{\"modules\": [', finish_reason: model_context_window_exceeded}\n  - answer: {json: {modules: [lib]}}\n",
        RulesTable::embedded().unwrap(),
    )
    .await;
    assert_eq!(r.status, RunStatus::Failed, "{}", r.shown);
    assert_eq!(r.requests, 1);
    let a = &attempts(&r)[0];
    assert_eq!(a["failureCategory"], "context-exhausted");
    assert_eq!(a["retryRule"], "terminal-context-exhausted");
    assert_eq!(a["retryScheduled"], false);
}

/// STP-14 in Anthropic's dialect: "prompt is too long" is said only in the message, which the
/// bounded overflow matcher reads for the name and the counts; the class stays `invalid-request`.
#[tokio::test]
async fn an_anthropic_prompt_too_long_is_context_exhausted_stp_14() {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
    let r = run(
        Api::AnthropicMessages,
        &format!("responses:\n  - status: 400\n    body: '{body}'\n"),
        RulesTable::embedded().unwrap(),
    )
    .await;
    let a = &attempts(&r)[0];
    assert_eq!(a["failureCategory"], "context-exhausted");
    assert_eq!(a["providerErrorClass"], "invalid-request");
    assert_eq!(a["retryRule"], "terminal-context-exhausted");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(r.requests, 1);
}

/// REP-4 holds with the words: a 503 that says context_length_exceeded stays a retryable server
/// fault, never context-exhausted.
#[tokio::test]
async fn context_words_never_make_a_server_fault_terminal_rep_4() {
    let body = r#"{"error":{"type":"server_error","code":"context_length_exceeded"}}"#;
    let r = run(
        Api::OpenaiChat,
        &format!("responses:\n  - status: 503\n    body: '{body}'\n  - answer: {{json: {{modules: [lib]}}}}\n"),
        RulesTable::embedded().unwrap(),
    )
    .await;
    assert_eq!(r.status, RunStatus::Succeeded, "{}", r.shown);
    assert_eq!(r.requests, 2, "replayed in the turn");
}
