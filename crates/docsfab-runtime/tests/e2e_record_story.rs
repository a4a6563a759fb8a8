//! Issue 11, "the record tells the whole story", at the runtime's level: `run_composition`
//! against the simulator on 127.0.0.1 over real HTTP with a real SQLite store. The run's
//! context (workspace, provider, host, model, version) is in the record from its first moment,
//! the provider's host never carries what the base URL hides in its user information or query,
//! and a failed turn says why, the same words in the record and on its progress event.

mod support;

use std::sync::{Arc, Mutex};

use docsfab_policy::rules::RulesTable;
use docsfab_provider::ApiKey;
use docsfab_record::{Api, RunStatus, TurnStatus};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{Progress, ProviderSettings, RunConfig, run_composition};
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::RunStore;
use support::{OnEvent, RunArgs, harness, limits, run_recorded};
use tokio_util::sync::CancellationToken;

const FAST_HOST: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n  providerAttempt.maxTotalDelayMs: 200\n  retry.maxTransportRetries: 0\n";

const ONE_STEP: &str = "name: small\nlimits:\n  timeoutMs: 20000\n  maxTurns: 4\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Return an object with a modules array.\n    tools: [list_files]\n    contract:\n      schema: {type: object, required: [modules]}\n";

/// Issue 11: a base URL with user information and a query (which host.yaml refuses, but the
/// runtime is a library too) is recorded as its host and port only.
#[tokio::test]
async fn issue11_the_recorded_host_never_holds_userinfo_or_query() {
    let h = harness(
        "responses:\n  - answer: {json: {modules: [lib]}}\n",
        "pub mod count;\n",
    )
    .await;
    let addr = h
        .server
        .base_url()
        .strip_prefix("http://")
        .and_then(|r| r.strip_suffix("/v1"))
        .unwrap()
        .to_owned();
    let base_url = format!("http://user:pw-hidden@{addr}/v1?key=query-hidden");
    let mut store = RunStore::open(&h.db).unwrap();
    let outcome = run_composition(
        RunConfig {
            composition: Composition::parse(ONE_STEP, "c.yaml").unwrap(),
            workspace: h.workspace.clone(),
            provider: ProviderSettings {
                name: "local".into(),
                api: Api::AnthropicMessages,
                base_url,
                model: "sim-model".into(),
                api_key: Some(ApiKey::new("sk-ant-unit-test-key-000000")),
                spend: Default::default(),
                structured_output: docsfab_policy::host::StructuredOutput::JsonSchema,
            },
            limits: limits(FAST_HOST, &[]),
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            progress: None,
            throttle: None,
            carry: None,
            spec: None,
        },
        &mut store,
    )
    .await
    .unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    let record = store.load_run(&outcome.run_id).unwrap().unwrap();
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
    assert_eq!(
        json["provider"],
        serde_json::json!({"name": "local", "api": "anthropic-messages", "host": addr})
    );
    let text = json.to_string();
    for hidden in ["pw-hidden", "query-hidden", "user:"] {
        assert!(
            !text.contains(hidden),
            "{hidden} reached the record: {text}"
        );
    }
    let canonical = std::fs::canonicalize(&h.workspace).unwrap();
    assert_eq!(json["workspace"], canonical.to_string_lossy().as_ref());
    assert_eq!(json["model"], "sim-model");
    assert_eq!(json["docsfabVersion"], env!("CARGO_PKG_VERSION"));
}

/// Issue 11: a turn the provider failed records why in one line built from facts (the status,
/// the class, the requests sent), and its progress event carries the same reason; a completed
/// turn has none.
#[tokio::test]
async fn issue11_a_failed_turn_has_its_reason_in_the_record_and_the_event() {
    let h = harness(
        "responses:\n  - status: 503\nfallback: repeat-last\n",
        "pub mod count;\n",
    )
    .await;
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let on_event: OnEvent = {
        let seen = Arc::clone(&seen);
        Box::new(move |p: &Progress| {
            if let Progress::Turn {
                event: TurnEvent::Finished { reason, .. },
                ..
            } = p
            {
                seen.lock().unwrap().push(reason.clone());
            }
        })
    };
    let r = run_recorded(
        &h,
        ONE_STEP,
        RunArgs {
            api: Api::OpenaiChat,
            limits: limits(FAST_HOST, &[]),
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            on_event,
        },
    )
    .await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let attempt = &r.record.steps[0].attempts[0];
    let turn = &attempt.turns[0];
    assert_eq!(turn.status, TurnStatus::Failed);
    let requests = turn.provider_retries() + 1;
    assert!(requests > 1, "the 503 was replayed in the turn");
    let expected = format!("provider fault: HTTP 503 (server) after {requests} requests");
    assert_eq!(turn.reason.as_deref(), Some(expected.as_str()));
    assert_eq!(
        r.json["steps"][0]["attempts"][0]["turns"][0]["reason"],
        expected
    );
    assert_eq!(*seen.lock().unwrap(), vec![Some(expected)]);
    // No answer was judged: no excerpt.
    assert_eq!(attempt.answer_excerpt, None);
    assert_eq!(
        r.json["steps"][0]["attempts"][0]["answerExcerpt"],
        serde_json::Value::Null
    );
}

/// Issue 11: a completed turn's reason is null, and a read step's accepted answer is kept as
/// its excerpt with its size.
#[tokio::test]
async fn issue11_a_completed_turn_has_no_reason_and_the_accepted_answer_its_excerpt() {
    let h = harness(
        "responses:\n  - answer: {text: '{\"modules\": [\"lib\"]}'}\n",
        "pub mod count;\n",
    )
    .await;
    let r = run_recorded(
        &h,
        ONE_STEP,
        RunArgs {
            api: Api::OpenaiChat,
            limits: limits(FAST_HOST, &[]),
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            on_event: Box::new(|_| {}),
        },
    )
    .await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let a = &r.json["steps"][0]["attempts"][0];
    assert_eq!(a["turns"][0]["reason"], serde_json::Value::Null);
    let answer = "{\"modules\": [\"lib\"]}";
    assert_eq!(a["answerExcerpt"], answer);
    assert_eq!(a["answerBytes"], answer.len());
}

/// Runs ONE_STEP (with `timeout_ms`) against a provider that holds each request for 5 s,
/// cancelling the run at the first request when `cancel_at_request`; returns the first turn's
/// status and reason in the record, and the reason its progress event carried.
async fn stalled_turn(
    timeout_ms: u32,
    cancel_at_request: bool,
) -> (TurnStatus, Option<String>, Option<String>) {
    let h = harness(
        "responses:\n  - delay_ms: 5000\n    answer: {json: {modules: [lib]}}\n",
        "pub mod count;\n",
    )
    .await;
    let cancel = CancellationToken::new();
    let seen: Arc<Mutex<Option<String>>> = Arc::default();
    let on_event: OnEvent = {
        let (seen, cancel) = (Arc::clone(&seen), cancel.clone());
        Box::new(move |p: &Progress| match p {
            Progress::Turn {
                event: TurnEvent::Request { .. },
                ..
            } if cancel_at_request => cancel.cancel(),
            Progress::Turn {
                event: TurnEvent::Finished { reason, .. },
                ..
            } => *seen.lock().unwrap() = reason.clone(),
            _ => {}
        })
    };
    let composition = ONE_STEP.replace("timeoutMs: 20000", &format!("timeoutMs: {timeout_ms}"));
    let r = run_recorded(
        &h,
        &composition,
        RunArgs {
            api: Api::OpenaiChat,
            limits: limits(FAST_HOST, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")]),
            rules: RulesTable::embedded().unwrap(),
            cancel,
            job_deadline: None,
            on_event,
        },
    )
    .await;
    let turn = &r.record.steps[0].attempts[0].turns[0];
    let event = seen.lock().unwrap().clone();
    (turn.status, turn.reason.clone(), event)
}

/// Issue 11: a turn the attempt timer ended says so, and a turn the caller cancelled says
/// `cancelled`; the progress event carries the same words.
#[tokio::test]
async fn issue11_deadline_and_cancelled_turns_have_their_reasons() {
    let (status, reason, event) = stalled_turn(300, false).await;
    assert_eq!(status, TurnStatus::Failed);
    assert_eq!(reason.as_deref(), Some("attempt deadline after 1 request"));
    assert_eq!(event, reason);

    let (status, reason, event) = stalled_turn(20_000, true).await;
    assert_eq!(status, TurnStatus::Cancelled);
    assert_eq!(reason.as_deref(), Some("cancelled"));
    assert_eq!(event, reason);
}
