//! End-to-end runs of compositions: `run_composition` against the simulator on 127.0.0.1 over
//! real HTTP, with a real SQLite run store and a real workspace directory in a tempdir. Delays
//! are lowered through host.yaml's `catalog:` and the environment map, so the tests run fast in
//! real time.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use docsfab_policy::catalog::EffectiveLimits;
use docsfab_policy::rules::RulesTable;
use docsfab_record::{Api, RunRecord, RunStatus};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{
    CancelReason, Progress, ProviderSettings, RunConfig, RunOutcome, run_composition,
};
use docsfab_runtime::store::RunStore;
use serde_json::{Value, json};
use support::{Harness, OnEvent, RunArgs, limits, requests, run_recorded};
use tokio_util::sync::CancellationToken;

const LIB_MARKER: &str = "pub fn marker_e2e_lib() {}";

/// Fast replay windows for every test: 10 ms base, small caps.
const FAST_HOST: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n  providerAttempt.maxTotalDelayMs: 200\n";

/// The harness with [`LIB_MARKER`] in `src/lib.rs`, so a test can tell which request carried
/// the file.
async fn harness(scenario: &str) -> Harness {
    support::harness(
        scenario,
        &format!("//! A tiny crate.\n{LIB_MARKER}\npub mod count;\n"),
    )
    .await
}

struct Ran {
    outcome: RunOutcome,
    record: RunRecord,
    json: Value,
    events: Vec<Progress>,
}

struct Options {
    limits: EffectiveLimits,
    cancel: CancellationToken,
    job_deadline: Option<Duration>,
    /// Cancel the run when this progress event arrives.
    cancel_on: Option<fn(&Progress) -> bool>,
    /// Called with every progress event (after it is collected).
    on_event: Option<OnEvent>,
    api: Api,
}

impl Options {
    fn fast() -> Options {
        Options::with(limits(FAST_HOST, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]))
    }
    fn with(limits: EffectiveLimits) -> Options {
        Options {
            limits,
            cancel: CancellationToken::new(),
            job_deadline: None,
            cancel_on: None,
            on_event: None,
            api: Api::OpenaiChat,
        }
    }
}

async fn run(h: &Harness, composition: &str, opts: Options) -> Ran {
    let on_event: OnEvent = {
        let cancel = opts.cancel.clone();
        let cancel_on = opts.cancel_on;
        let on_event = opts.on_event;
        Box::new(move |p: &Progress| {
            if cancel_on.is_some_and(|f| f(p)) {
                cancel.cancel();
            }
            if let Some(f) = &on_event {
                f(p);
            }
        })
    };
    let r = run_recorded(
        h,
        composition,
        RunArgs {
            api: opts.api,
            limits: opts.limits,
            rules: RulesTable::embedded().unwrap(),
            cancel: opts.cancel,
            job_deadline: opts.job_deadline,
            on_event,
        },
    )
    .await;
    Ran {
        outcome: r.outcome,
        record: r.record,
        json: r.json,
        events: r.events,
    }
}

fn read_only_composition(extra_limits: &str) -> String {
    format!(
        r#"name: survey
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 1024
{extra_limits}steps:
  - id: outline
    access: read-only
    instructions: 'Survey the crate and return {{"modules": [...]}}.'
    tools: [list_files, read_file, search_text]
    contract:
      schema: {{type: object, required: [modules], properties: {{modules: {{type: array}}}}}}
"#
    )
}

/// STP-2, OPS-1: a run that does not fail makes exactly one attempt per step; a tool round trip,
/// a JSON answer meeting the contract, then a write step that writes docs/overview.md.
#[tokio::test]
async fn two_steps_succeed_with_one_attempt_each_stp_2() {
    let h = harness(
        r##"responses:
  - answer:
      tool_calls: [{id: call_r1, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      json: {modules: [lib, count]}
  - answer:
      tool_calls: [{id: call_w1, name: write_file, arguments: {path: docs/overview.md, content: "# Overview\n\nTwo modules.\n"}}]
  - answer:
      text: Wrote docs/overview.md.
"##,
    )
    .await;
    let composition = r#"name: quickstart
model: sim-model
limits:
  timeoutMs: 20000
  maxTurns: 6
  maxOutputTokens: 1024
steps:
  - id: outline
    access: read-only
    instructions: 'Survey the crate and return {"modules": [...]}.'
    tools: [list_files, read_file, search_text]
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: write
    instructions: "Write docs/overview.md for these modules: {{steps.outline.output}}"
    tools: [read_file, write_file]
    writeRoots: [docs/]
"#;
    let r = run(&h, composition, Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    assert_eq!(r.record.status, RunStatus::Succeeded);
    assert!(matches!(&r.events[0], Progress::RunStarted { run_id } if *run_id == r.outcome.run_id));
    assert!(r.record.ended_at.is_some());
    assert_eq!(r.record.steps.len(), 2);
    for step in &r.record.steps {
        assert_eq!(step.status, RunStatus::Succeeded, "{}", step.step_id);
        assert_eq!(step.attempts.len(), 1, "STP-2: one attempt per step");
        assert!(step.failure.is_none());
    }
    let j = &r.json["steps"];
    assert_eq!(j[0]["output"], json!({"modules": ["lib", "count"]}));
    let a = &j[0]["attempts"][0];
    assert_eq!(a["budget"], "initial");
    assert_eq!(a["retryDecision"], "none");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(a["lease"]["turnsUsed"], 2);
    assert_eq!(a["lease"]["executedToolCalls"], 1);
    assert_eq!(a["lease"]["stopReason"], "answered");
    assert_eq!(a["lease"]["disposition"], "completed");
    assert_eq!(a["turns"][0]["toolBatch"]["requested"], 1);
    assert_eq!(a["turns"][0]["toolBatch"]["executed"], 1);
    assert_eq!(a["turns"][0]["providerRetries"], 0);
    let w = &j[1]["attempts"][0];
    assert_eq!(w["lease"]["executedToolCalls"], 1);
    assert_eq!(w["lease"]["toolCounters"]["write_file"], 1);

    // The file was written inside the write root.
    let written = std::fs::read_to_string(h.workspace.join("docs/overview.md")).unwrap();
    assert_eq!(written, "# Overview\n\nTwo modules.\n");

    // The tool round trip: the read file's content went back to the model in turn 2, and the
    // first step's output was substituted into the second step's instructions.
    let reqs = requests(&r.events);
    assert_eq!(reqs.len(), 4);
    assert!(!reqs[0].4.contains(LIB_MARKER));
    assert!(reqs[1].4.contains(LIB_MARKER));
    assert_eq!(reqs[2].0, "pages");
    assert!(
        reqs[2].4.contains(r#"{\"modules\":[\"lib\",\"count\"]}"#),
        "{}",
        reqs[2].4
    );
    // Every request the run made reached the simulator, byte for byte.
    let log = h.server.requests();
    assert_eq!(log.len(), 4);
    for (entry, req) in log.iter().zip(&reqs) {
        assert_eq!(entry.sha256, req.3);
    }
}

/// LSE-1: a batch rejected before host authorization (unknown tool, truncated arguments) still
/// uses a provider turn, executes nothing, and the model answers in what remains.
#[tokio::test]
async fn a_rejected_tool_batch_still_consumes_a_turn_lse_1() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls:
        - {id: c1, name: delete_everything, arguments: {}}
        - {id: c2, name: read_file, arguments: {path: src/lib.rs}, truncate_arguments: 6}
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let a = &r.json["steps"][0]["attempts"][0];
    assert_eq!(r.record.steps[0].attempts.len(), 1);
    let batch = &a["turns"][0]["toolBatch"];
    assert_eq!(batch["requested"], 2);
    assert_eq!(batch["rejected"], 2);
    assert_eq!(batch["executed"], 0);
    assert_eq!(batch["calls"][0]["reason"], "unknown-tool");
    assert_eq!(batch["calls"][1]["reason"], "truncated-arguments");
    // The rejected turn counted, nothing executed, and the model could answer in what remained.
    assert_eq!(a["lease"]["turnsUsed"], 2);
    assert_eq!(a["lease"]["executedToolCalls"], 0);
    assert_eq!(a["lease"]["stopReason"], "answered");
    let reqs = requests(&r.events);
    assert!(reqs[1].4.contains("delete_everything"));
    assert!(reqs[1].4.contains("rejected") || reqs[1].4.contains("error"));
}

/// LSE-4, STP-12: notice-only re-reads without new evidence stop the attempt as no-progress; the
/// retry (contract budget) asks for the answer at the first notice.
#[tokio::test]
async fn repeated_rereads_stop_as_no_progress_then_retry_lse_4_stp_12() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls: [{id: r1, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      tool_calls:
        - {id: r2, name: read_file, arguments: {path: src/lib.rs}}
        - {id: r3, name: read_file, arguments: {path: src/lib.rs}}
  - answer:
      tool_calls: [{id: r4, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let attempts = &r.json["steps"][0]["attempts"];
    assert_eq!(attempts.as_array().unwrap().len(), 2);
    let first = &attempts[0];
    assert_eq!(first["status"], "failed");
    assert_eq!(first["lease"]["stopReason"], "no-progress");
    assert_eq!(first["lease"]["disposition"], "stopped");
    // Three notice-only re-reads in a row (two in turn 2, one in turn 3) stop the attempt.
    assert_eq!(first["lease"]["turnsUsed"], 3);
    assert_eq!(first["turns"][1]["toolBatch"]["executed"], 2);
    assert_eq!(
        first["turns"][1]["toolBatch"]["calls"][0]["result"],
        "notice"
    );
    assert_eq!(
        first["turns"][2]["toolBatch"]["calls"][0]["result"],
        "notice"
    );
    assert_eq!(first["retryRule"], "condition-no-progress");
    assert_eq!(first["retryDecision"], "scheduled");
    assert_eq!(first["code"], "no-progress");
    assert_eq!(attempts[1]["budget"], "contract");
    assert_eq!(attempts[1]["status"], "succeeded");
    // The notice-only re-reads never sent the content again: the marker is in the conversation
    // once (from the first read), not four times.
    let reqs = requests(&r.events);
    let third = &reqs[2];
    assert_eq!((third.1, third.2), (1, 3));
    assert_eq!(third.4.matches(LIB_MARKER).count(), 1);
    // The retry asks for the answer at the first notice (STP-12).
    let retry = reqs.iter().find(|q| q.1 == 2).unwrap();
    assert!(retry.4.contains("answer at once"), "{}", retry.4);
}

/// LSE-3: when the checkpoint does not renew (maxTurns used), the host stops without requesting
/// another provider turn and the terminal lease keeps its stop reason and disposition.
#[tokio::test]
async fn max_turns_stops_without_another_provider_turn_lse_3() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls: [{name: list_files, arguments: {}}]
"#,
    )
    .await;
    let opts = Options::with(limits(
        FAST_HOST,
        &[
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", "0"),
            ("DOCSFAB_RETRY_BASE_DELAY_MS", "20"),
        ],
    ));
    let r = run(&h, &read_only_composition("  maxTurns: 2\n"), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    assert_eq!(step["status"], "failed");
    assert_eq!(step["effectiveMaxRetries"], 0);
    let a = &step["attempts"][0];
    assert_eq!(step["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(a["lease"]["turnsUsed"], 2);
    assert_eq!(a["lease"]["maxTurns"], 2);
    assert_eq!(a["lease"]["executedToolCalls"], 2);
    assert_eq!(a["lease"]["stopReason"], "max-turns");
    assert_eq!(a["lease"]["disposition"], "exhausted");
    assert_eq!(a["retryDecision"], "exhausted");
    // The host stopped at the checkpoint: exactly maxTurns requests reached the provider.
    assert_eq!(h.server.requests().len(), 2);
    assert!(
        step["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("retry.maxRetries = 0"),
        "{}",
        step["failure"]
    );
}

/// STP-9, STP-8, STP-5: prose where the contract asks for an object is retried within maxRetries
/// and the retry's request (as the simulator received it) tells the model to return only the
/// object.
#[tokio::test]
async fn prose_then_object_retries_from_the_contract_budget_with_feedback_stp_9() {
    let h = harness(
        r#"responses:
  - answer:
      text: "The crate has two modules, lib and count."
  - answer:
      json: {modules: [lib, count]}
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let step = &r.json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["status"], "failed");
    assert_eq!(attempts[0]["budget"], "initial");
    assert_eq!(attempts[0]["retryRule"], "contract-prose");
    assert_eq!(attempts[0]["retryDecision"], "scheduled");
    assert_eq!(attempts[0]["retryScheduled"], true);
    assert_eq!(attempts[0]["failureCategory"], "contract-violation");
    assert_eq!(attempts[0]["code"], "contract-prose");
    assert_eq!(attempts[0]["waitMs"], 0);
    assert_eq!(attempts[0]["providerErrorClass"], Value::Null);
    assert_eq!(attempts[1]["budget"], "contract");
    assert_eq!(attempts[1]["status"], "succeeded");
    assert_eq!(step["output"], json!({"modules": ["lib", "count"]}));

    // The second attempt's request, as the simulator received it (same SHA-256), carries the
    // correction; the first did not.
    let reqs = requests(&r.events);
    assert_eq!(reqs.len(), 2);
    let log = h.server.requests();
    assert_eq!(log[1].sha256, reqs[1].3);
    assert_eq!(reqs[1].1, 2);
    assert!(
        reqs[1].4.contains("Return only the JSON object"),
        "{}",
        reqs[1].4
    );
    assert!(!reqs[0].4.contains("Return only the JSON object"));
}

/// STP-3, STP-5, REP-1, REP-13: a 503 burst longer than the turn's replay window ends the turn;
/// the step retries from the transport budget (class decides, rule class-server).
#[tokio::test]
async fn a_503_burst_that_ends_a_turn_is_retried_from_the_transport_budget_stp_3() {
    let h = harness(
        r#"responses:
  - status: 503
    repeat: 2
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let host = format!("{FAST_HOST}  providerAttempt.maxAttemptsPerTurn: 2\n");
    let opts = Options::with(limits(&host, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]));
    let r = run(&h, &read_only_composition(""), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let step = &r.json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let first = &attempts[0];
    assert_eq!(first["status"], "failed");
    assert_eq!(first["providerErrorClass"], "server");
    assert_eq!(first["httpStatus"], 503);
    assert_eq!(first["failureCategory"], "provider-transient");
    assert_eq!(first["retryRule"], "class-server");
    assert_eq!(first["retryDecision"], "scheduled");
    assert_eq!(first["waitMs"], 20);
    assert_eq!(first["lease"]["stopReason"], "provider-failed");
    // The burst was replayed once inside the turn (REP-13), then the turn ended.
    assert_eq!(first["turns"][0]["status"], "failed");
    assert_eq!(first["turns"][0]["providerRetries"], 1);
    assert_eq!(first["turns"][0]["replays"][0]["status"], 503);
    assert_eq!(attempts[1]["budget"], "transport");
    assert_eq!(attempts[1]["status"], "succeeded");
    assert_eq!(step["transportRetry"]["baseDelayMs"], 20);
    // The operator saw the replay and the step retry as they happened.
    let lines: Vec<String> = r.events.iter().filter_map(Progress::describe).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("turn 1: HTTP 503 (server), replaying")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("attempt 1 failed") && l.contains("rule class-server after 20 ms")),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l == "  attempt 2 (transport budget)"));
    assert_eq!(h.server.requests().len(), 3);
}

/// REP-9 at the step layer: Ctrl-C during a step backoff ends the run as cancelled at once; the
/// failed attempt was already durable with its scheduled wait.
#[tokio::test]
async fn cancel_during_a_step_backoff_ends_the_run_at_once() {
    let h = harness(
        r#"responses:
  - status: 503
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    // A one-minute step backoff that the cancellation must cut short.
    let host = format!("{FAST_HOST}  providerAttempt.maxAttemptsPerTurn: 1\n");
    let mut opts = Options::with(limits(&host, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "60000")]));
    opts.cancel_on = Some(|p| matches!(p, Progress::Backoff { .. }));
    let started = std::time::Instant::now();
    let r = run(&h, &read_only_composition(""), opts).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(r.outcome.status, RunStatus::Cancelled);
    assert_eq!(r.outcome.cancel_reason, Some(CancelReason::Caller));
    let step = &r.json["steps"][0];
    assert_eq!(step["status"], "cancelled");
    assert_eq!(step["failure"]["code"], "cancelled");
    let attempts = step["attempts"].as_array().unwrap();
    // The failed attempt was committed with its scheduled wait before the backoff began.
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["retryScheduled"], true);
    assert_eq!(attempts[0]["waitMs"], 60000);
    assert_eq!(h.server.requests().len(), 1);
}

/// OPS-2: the job deadline (runtime.deadlineMilliseconds) cancels the run at once, mid-request,
/// and the record names it.
#[tokio::test]
async fn the_job_deadline_cancels_the_run_and_names_itself() {
    let h = harness(
        r#"responses:
  - answer:
      json: {modules: [lib]}
    delay_ms: 5000
"#,
    )
    .await;
    let mut opts = Options::fast();
    opts.job_deadline = Some(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let r = run(&h, &read_only_composition(""), opts).await;
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(r.outcome.status, RunStatus::Cancelled);
    assert_eq!(
        r.outcome.cancel_reason,
        Some(CancelReason::JobDeadline { deadline_ms: 300 })
    );
    let step = &r.json["steps"][0];
    assert_eq!(step["failure"]["code"], "job-deadline");
    let a = &step["attempts"][0];
    assert_eq!(a["status"], "cancelled");
    assert_eq!(a["retryDecision"], "none");
    assert_eq!(a["lease"]["stopReason"], "cancelled");
    assert_eq!(a["turns"][0]["status"], "cancelled");
}

/// Configuration is checked before any provider call: a missing workspace is an error, no run
/// is created and nothing is sent.
#[tokio::test]
async fn a_workspace_that_is_not_a_directory_is_an_error_before_any_request() {
    let h = harness("responses:\n  - answer: {json: {modules: []}}\n").await;
    let composition = Composition::parse(&read_only_composition(""), "c.yaml").unwrap();
    let mut store = RunStore::open(&h.db).unwrap();
    let missing: &Path = &h.workspace.join("nope");
    let err = run_composition(
        RunConfig {
            composition,
            workspace: missing.to_path_buf(),
            provider: ProviderSettings {
                name: "sim".into(),
                api: Api::OpenaiChat,
                base_url: h.server.base_url(),
                model: "m".into(),
                api_key: None,
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
    .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    assert!(h.server.requests().is_empty());
    assert!(store.list_runs().unwrap().is_empty());
}

fn write_composition() -> &'static str {
    r#"name: pages
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
"#
}

/// WRT-1, WRT-2, WRT-3, STP-1: a write step's transport failure after a write is retried only
/// after the workspace is restored and verified; the attempt records write-executed.
#[tokio::test]
async fn a_write_step_restores_its_writes_before_a_transport_retry_wrt_1_wrt_3() {
    let h = harness(
        r##"responses:
  - answer:
      tool_calls: [{id: w1, name: write_file, arguments: {path: docs/overview.md, content: "# Draft\n"}}]
  - status: 502
  - answer:
      tool_calls: [{id: w2, name: write_file, arguments: {path: docs/overview.md, content: "# Final\n"}}]
  - answer:
      text: Done.
"##,
    )
    .await;
    let host = format!("{FAST_HOST}  providerAttempt.maxAttemptsPerTurn: 1\n");
    let mut opts = Options::with(limits(&host, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]));
    // When the retry starts, the first attempt's write must already be undone.
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (seen2, docs) = (Arc::clone(&seen), h.workspace.join("docs"));
    opts.on_event = Some(Box::new(move |p| {
        if let Progress::AttemptStarted { attempt: 2, .. } = p {
            seen2.lock().unwrap().push(docs.exists());
        }
    }));
    let r = run(&h, write_composition(), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["status"], "failed");
    assert_eq!(attempts[0]["httpStatus"], 502);
    assert_eq!(attempts[0]["writeSettlement"], "write-executed");
    assert_eq!(attempts[0]["retryDecision"], "scheduled");
    assert_eq!(attempts[0]["retryRule"], "class-server");
    assert_eq!(attempts[1]["budget"], "transport");
    // The restore removed the file and the directory the attempt created.
    assert_eq!(*seen.lock().unwrap(), vec![false]);
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("docs/overview.md")).unwrap(),
        "# Final\n"
    );
}

/// STP-1, WRT-3: a write step's non-transport failure is terminal on its first attempt.
#[tokio::test]
async fn a_write_step_without_a_transport_failure_stays_single_attempt_stp_1() {
    let h = harness(
        r##"responses:
  - answer:
      tool_calls: [{id: w1, name: write_file, arguments: {path: docs/overview.md, content: "# Draft\n"}}]
  - answer:
      text: "cut"
      finish_reason: length
"##,
    )
    .await;
    let r = run(&h, write_composition(), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["retryRule"], "write-step-single-attempt");
    assert_eq!(attempts[0]["retryDecision"], "terminal");
    assert_eq!(attempts[0]["writeSettlement"], "write-executed");
    assert_eq!(step["failure"]["category"], "cut-answer");
    // A terminal failure leaves the partial write in place for inspection.
    assert!(h.workspace.join("docs/overview.md").exists());
}

/// LSE-2, STP-4: a host preflight failure is not a rejected batch: the attempt fails with its
/// evidence, as a refusal before sending that no provider class decides.
#[tokio::test]
async fn a_host_preflight_failure_ends_the_attempt_with_its_evidence_lse_2() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls: [{id: l1, name: list_files, arguments: {}}]
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let mut opts = Options::fast();
    // The workspace disappears after the first turn: the next turn's preflight must fail.
    let ws = h.workspace.clone();
    opts.on_event = Some(Box::new(move |p| {
        if let Progress::Turn {
            event: TurnEvent::Finished { turn: 1, .. },
            ..
        } = p
        {
            let _ = std::fs::remove_dir_all(&ws);
        }
    }));
    let r = run(&h, &read_only_composition(""), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    let a = &step["attempts"][0];
    assert_eq!(step["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(a["lease"]["stopReason"], "preflight-failed");
    assert_eq!(a["lease"]["disposition"], "failed");
    let evidence = a["lease"]["evidence"].as_str().unwrap();
    assert!(evidence.contains("workspace"), "{evidence}");
    assert!(a["message"].as_str().unwrap().contains(evidence));
    assert_eq!(a["providerErrorClass"], Value::Null);
    assert_eq!(a["retryDecision"], "terminal");
    assert_eq!(step["failure"]["category"], "request-refused");
    // Not a rejected batch: the failed preflight opened no turn and sent nothing more.
    assert_eq!(a["lease"]["turnsUsed"], 1);
    assert_eq!(h.server.requests().len(), 1);
}

/// STP-11, REP-10: the host attempt timer ends the turn in flight; the attempt records
/// attempt-deadline and the retry tells the model to read only what it needs.
#[tokio::test]
async fn the_attempt_timer_is_a_timeout_condition_retried_once_stp_11() {
    let h = harness(
        r#"responses:
  - answer:
      json: {modules: [slow]}
    delay_ms: 3000
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(
        &h,
        &read_only_composition("  timeoutMs: 400\n").replace("  timeoutMs: 20000\n", ""),
        Options::fast(),
    )
    .await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["timeoutKind"], "attempt-deadline");
    assert_eq!(attempts[0]["retryRule"], "condition-attempt-deadline");
    assert_eq!(attempts[0]["lease"]["stopReason"], "deadline");
    assert!(attempts[0]["durationMs"].as_u64().unwrap() < 2000);
    assert_eq!(attempts[1]["budget"], "contract");
    let reqs = requests(&r.events);
    assert!(reqs[1].4.contains("Read only what the answer needs"));
}

/// STP-10: an answer cut at the output limit is retried with feedback to answer inside it.
#[tokio::test]
async fn a_cut_answer_is_retried_with_feedback_stp_10() {
    let h = harness(
        r#"responses:
  - answer:
      text: '{"modules": ["li'
      finish_reason: length
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts[0]["retryRule"], "condition-cut-answer");
    assert_eq!(attempts[0]["code"], "cut-answer");
    // The retry's first request carries the feedback, however many turns attempt 1 used.
    let reqs = requests(&r.events);
    let retry = reqs.iter().find(|q| q.1 == 2).unwrap();
    assert_eq!(retry.2, 1);
    assert!(retry.4.contains("well inside the limit of 1024 tokens"));
}

/// OPS-4: the same loop on the Anthropic Messages API; usage is recorded per turn and
/// summed per attempt.
#[tokio::test]
async fn the_anthropic_messages_api_runs_a_tool_round_trip_too() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls: [{id: toolu_1, name: read_file, arguments: {path: src/count.rs}}]
      usage: {input_tokens: 30, output_tokens: 5}
  - answer:
      json: {modules: [count]}
      usage: {input_tokens: 50, output_tokens: 7}
"#,
    )
    .await;
    let mut opts = Options::fast();
    opts.api = Api::AnthropicMessages;
    let r = run(&h, &read_only_composition(""), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let log = h.server.requests();
    assert!(log.iter().all(|e| e.path == "/v1/messages"));
    let a = &r.json["steps"][0]["attempts"][0];
    assert_eq!(
        a["usage"],
        json!({"inputTokens": 80, "outputTokens": 12, "cacheWriteTokens": 0, "cacheReadTokens": 0})
    );
    assert_eq!(a["turns"][1]["usage"]["inputTokens"], 50);
    let reqs = requests(&r.events);
    assert!(reqs[1].4.contains("tool_result"));
}

/// OPS-1: a finished attempt is committed to the run store before the next attempt starts.
#[tokio::test]
async fn a_failed_attempt_is_durable_before_the_next_attempt_starts() {
    let h = harness(
        r#"responses:
  - answer:
      text: "prose"
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let mut opts = Options::fast();
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (seen2, db) = (Arc::clone(&seen), h.db.clone());
    opts.on_event = Some(Box::new(move |p| {
        if let Progress::AttemptStarted { attempt: 2, .. } = p {
            // Another connection, as another process would read it.
            let store = RunStore::open(&db).unwrap();
            let runs = store.list_runs().unwrap();
            let record = store.load_run(&runs[0].run_id).unwrap().unwrap();
            seen2.lock().unwrap().push(record.steps[0].attempts.len());
        }
    }));
    let r = run(&h, &read_only_composition(""), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    assert_eq!(*seen.lock().unwrap(), vec![1]);
}

/// STP-7, STP-6, CFG-2, CFG-3: the transport budget allows 1 + maxTransportRetries attempts with
/// exponential waits, then fails naming the bound.
#[tokio::test]
async fn an_exhausted_transport_budget_names_its_bound_stp_7_cfg_3() {
    let h = harness("responses:\n  - status: 500\n").await;
    let host = format!("{FAST_HOST}  providerAttempt.maxAttemptsPerTurn: 1\n");
    let opts = Options::with(limits(
        &host,
        &[
            ("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "2"),
            ("DOCSFAB_RETRY_BASE_DELAY_MS", "10"),
        ],
    ));
    let r = run(&h, &read_only_composition(""), opts).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    // 1 + maxTransportRetries attempts, then the bound refuses.
    assert_eq!(attempts.len(), 3);
    let budgets: Vec<&str> = attempts
        .iter()
        .map(|a| a["budget"].as_str().unwrap())
        .collect();
    assert_eq!(budgets, ["initial", "transport", "transport"]);
    let waits: Vec<&Value> = attempts.iter().map(|a| &a["waitMs"]).collect();
    assert_eq!(waits, [&json!(10), &json!(20), &Value::Null]);
    assert_eq!(attempts[2]["retryDecision"], "exhausted");
    assert_eq!(attempts[2]["retryScheduled"], false);
    assert_eq!(step["transportRetry"]["maxTransportRetries"], 2);
    assert_eq!(step["failure"]["category"], "provider-transient");
    assert_eq!(
        step["failure"]["message"],
        "retry-max-transport-retries-bound: 3 exceeds retry.maxTransportRetries = 2 count."
    );
    assert!(
        step["failure"]["remediation"]
            .as_str()
            .unwrap()
            .contains("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES")
    );
    assert_eq!(h.server.requests().len(), 3);
}

/// STP-15, REP-7: a 429 with Retry-After ends the throttle window; the step waits at least the
/// recorded Retry-After and shows the countdown.
#[tokio::test]
async fn a_recorded_retry_after_lengthens_the_step_wait_stp_15() {
    let h = harness(
        r#"responses:
  - status: 429
    headers: {retry-after: 1}
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let host = format!("{FAST_HOST}  providerAttempt.maxThrottledAttemptsPerTurn: 1\n");
    let opts = Options::with(limits(&host, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "10")]));
    let started = std::time::Instant::now();
    let r = run(&h, &read_only_composition(""), opts).await;
    assert!(started.elapsed() >= Duration::from_millis(1000));
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let first = &r.json["steps"][0]["attempts"][0];
    assert_eq!(first["providerErrorClass"], "rate-limit");
    assert_eq!(first["httpStatus"], 429);
    assert_eq!(first["retryAfterMs"], 1000);
    assert_eq!(first["failureCategory"], "provider-throttled");
    assert_eq!(first["retryRule"], "class-rate-limit-throttled");
    assert_eq!(first["waitMs"], 1000);
    // The countdown was shown while the step waited.
    assert!(r.events.iter().any(|p| matches!(
        p,
        Progress::Backoff {
            next_attempt: 2,
            remaining_ms,
            ..
        } if *remaining_ms > 500
    )));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// STP-2: the shipped quickstart example (the demo's composition and workspace) runs end to end,
/// one attempt per step, with a search, a read and a write.
#[tokio::test]
async fn the_quickstart_example_runs_end_to_end() {
    let h = harness(
        r##"responses:
  - answer:
      tool_calls:
        - {id: s1, name: list_files, arguments: {path: src}}
        - {id: s2, name: search_text, arguments: {pattern: "pub fn", path: src}}
  - answer:
      tool_calls: [{id: s3, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      json: {modules: [{name: count, purpose: counting}, {name: report, purpose: reporting}]}
  - answer:
      tool_calls: [{id: w1, name: write_file, arguments: {path: docs/overview.md, content: "# Overview\n"}}]
  - answer:
      text: Wrote the overview.
"##,
    )
    .await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart");
    let example = h.workspace.parent().unwrap().join("example");
    copy_dir(&root.join("workspace"), &example);
    let composition = std::fs::read_to_string(root.join("composition.yaml")).unwrap();
    let h = Harness {
        workspace: example,
        ..h
    };
    let r = run(&h, &composition, Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded, "{:#}", r.json);
    assert_eq!(r.json["steps"][0]["output"]["modules"][1]["name"], "report");
    assert_eq!(
        r.json["steps"][0]["attempts"][0]["turns"][0]["toolBatch"]["executed"],
        2
    );
    assert!(h.workspace.join("docs/overview.md").is_file());
    // The model of host.yaml's provider was used: the composition names none.
    assert!(
        h.server
            .requests()
            .iter()
            .all(|e| e.model.as_deref() == Some("sim-model"))
    );
    let reqs = requests(&r.events);
    assert!(
        reqs[1].4.contains("pub fn"),
        "the search results went back to the model"
    );
}

/// A cancellation between steps is recorded on the step that did not start, with its reason.
#[tokio::test]
async fn a_cancel_between_steps_records_the_next_step_as_cancelled() {
    let h = harness("responses:\n  - answer: {json: {modules: [lib]}}\n").await;
    let composition = format!(
        "{}  - id: again\n    access: read-only\n    instructions: Say it again.\n",
        read_only_composition("")
    );
    let mut opts = Options::fast();
    opts.cancel_on = Some(|p| matches!(p, Progress::StepFinished { .. }));
    let r = run(&h, &composition, opts).await;
    assert_eq!(r.outcome.status, RunStatus::Cancelled);
    let steps = r.json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["status"], "succeeded");
    assert_eq!(steps[1]["status"], "cancelled");
    assert_eq!(steps[1]["attempts"], json!([]));
    assert_eq!(steps[1]["failure"]["code"], "cancelled");
    assert_eq!(h.server.requests().len(), 1);
}

/// STP-12: in the retry of an attempt stopped as no-progress, the first notice-only re-read also
/// asks the model for its final answer.
#[tokio::test]
async fn the_retry_after_no_progress_asks_for_the_answer_at_its_first_notice_stp_12() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls: [{id: r1, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      tool_calls:
        - {id: r2, name: read_file, arguments: {path: src/lib.rs}}
        - {id: r3, name: read_file, arguments: {path: src/lib.rs}}
  - answer:
      tool_calls: [{id: r4, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      tool_calls: [{id: s1, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      tool_calls: [{id: s2, name: read_file, arguments: {path: src/lib.rs}}]
  - answer:
      json: {modules: [lib]}
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded, "{:#}", r.json);
    let reqs = requests(&r.events);
    let last = reqs.iter().rfind(|q| q.1 == 2).unwrap();
    assert!(last.4.contains("final answer now"), "{}", last.4);
}

/// Issue 11: the turn-finished event names each call's tool, target and outcome, with the
/// model's text passed through the redactor (a path holding a terminal escape shows it escaped;
/// an answer holding the key never gets that far, the boundary refuses it), and a failed turn
/// carries its reason; the progress lines read the same data.
#[tokio::test]
async fn issue11_turn_events_name_tools_targets_and_a_failed_turns_reason() {
    let h = harness(
        r#"responses:
  - answer:
      tool_calls:
        - {id: c1, name: read_file, arguments: {path: "src/\e[2Jx.rs"}}
        - {id: c2, name: search_text, arguments: {pattern: marker, path: src}}
  - status: 400
"#,
    )
    .await;
    let r = run(&h, &read_only_composition(""), Options::fast()).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let finished: Vec<&TurnEvent> = r
        .events
        .iter()
        .filter_map(|p| match p {
            Progress::Turn {
                event: e @ TurnEvent::Finished { .. },
                ..
            } => Some(e),
            _ => None,
        })
        .collect();
    let [
        TurnEvent::Finished {
            calls,
            reason: None,
            ..
        },
        TurnEvent::Finished {
            calls: no_calls,
            reason: Some(reason),
            ..
        },
    ] = finished.as_slice()
    else {
        panic!("two turns, the second failed with a reason: {finished:?}");
    };
    let names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(names, ["read_file", "search_text"]);
    let first = calls[0].target.as_deref().unwrap();
    assert_eq!(first, "src/\\u{1b}[2Jx.rs");
    assert_eq!(calls[1].target.as_deref(), Some("\"marker\" in src"));
    assert!(no_calls.is_empty());
    assert!(reason.contains("400"), "{reason}");
    let lines: Vec<String> = r.events.iter().filter_map(Progress::describe).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("    turn 2: failed: ") && l.contains("400")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains('\u{1b}')), "{lines:#?}");
}
