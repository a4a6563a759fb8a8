//! The step driver's exact wait schedule at the catalog defaults, on tokio's paused clock with
//! the provider's in-memory scripted transport (real sockets and a paused clock give false
//! timeouts, so timing is proven here and behaviour over HTTP in `e2e_run.rs`). The run store is
//! a real SQLite file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;
use docsfab_provider::ApiKey;
use docsfab_provider::scripted::{ScriptStep, ScriptedTransport, status};
use docsfab_record::{Api, ProviderErrorClass, RunStatus};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{
    Progress, ProgressSink, ProviderSettings, RunConfig, RunOutcome, run_with_transport,
};
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::RunStore;
use docsfab_runtime::workspace::Workspace;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const COMPOSITION: &str = r#"name: schedule
model: m
steps:
  - id: outline
    access: read-only
    instructions: Return an object.
    contract:
      schema: {type: object}
"#;

/// STP-6, STP-7, CFG-3, REP-1, REP-11: a provider that answers 503 to everything. Each attempt's
/// one turn replays 7 times (500 .. 20,000 ms, 51,500 ms in total) below the turn governor; the
/// step then retries from the transport budget after 1,000, 2,000, 4,000, 8,000, 16,000 and
/// 32,000 ms, and the seventh attempt (1 + 0 + 6) ends the step naming the bound. Every attempt
/// is committed before the wait that follows it.
#[tokio::test(start_paused = true)]
async fn the_transport_retry_schedule_at_the_catalog_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    let failures = (0..7 * 8).map(|_| ScriptStep::fail(status(503, ProviderErrorClass::Server)));
    let transport = ScriptedTransport::new(failures);
    let limits = resolve(&HostConfig::empty("host.yaml"), &BTreeMap::new()).unwrap();
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let started = Instant::now();
    let config = scripted_config(dir.path(), limits, Some(ApiKey::new("sk-never-sent")), None);
    let outcome = run_with_transport(config, &workspace, &transport, &mut store)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(outcome.status, RunStatus::Failed);

    let json = read_back(&store, &outcome);
    let step = &json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 7);
    let waits: Vec<Value> = attempts.iter().map(|a| a["waitMs"].clone()).collect();
    assert_eq!(
        waits,
        [
            json!(1000),
            json!(2000),
            json!(4000),
            json!(8000),
            json!(16000),
            json!(32000),
            Value::Null
        ]
    );
    for a in attempts {
        assert_eq!(a["turns"].as_array().unwrap().len(), 1, "REP-11: one turn");
        assert_eq!(a["turns"][0]["providerRetries"], 7);
        assert_eq!(a["lease"]["turnsUsed"], 1);
        let replay_waits: Vec<u64> = a["turns"][0]["replays"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["waitMs"].as_u64().unwrap())
            .collect();
        assert_eq!(replay_waits, [500, 1000, 2000, 4000, 8000, 16000, 20000]);
    }
    assert_eq!(attempts[6]["retryDecision"], "exhausted");
    assert_eq!(
        step["failure"]["message"],
        "retry-max-transport-retries-bound: 7 exceeds retry.maxTransportRetries = 6 count."
    );

    // The requests went out exactly on schedule: 8 per attempt, and between the last request of
    // one attempt and the first of the next, exactly the step wait.
    let sent = transport.sent();
    assert_eq!(sent.len(), 56);
    for (k, wait) in [1000u64, 2000, 4000, 8000, 16000, 32000].iter().enumerate() {
        let gap = sent[(k + 1) * 8].at - sent[k * 8 + 7].at;
        assert_eq!(
            gap,
            Duration::from_millis(*wait),
            "before attempt {}",
            k + 2
        );
    }
    assert_eq!(elapsed, Duration::from_millis(7 * 51_500 + 63_000));
}

/// The run of `COMPOSITION` in the workspace `dir`, for a scripted transport (the base URL is
/// never dialled).
fn scripted_config(
    dir: &Path,
    limits: EffectiveLimits,
    api_key: Option<ApiKey>,
    progress: Option<ProgressSink>,
) -> RunConfig {
    RunConfig {
        composition: Composition::parse(COMPOSITION, "c.yaml").unwrap(),
        workspace: dir.to_path_buf(),
        provider: ProviderSettings {
            name: "sim".into(),
            api: Api::OpenaiChat,
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key,
            spend: Default::default(),
            structured_output: docsfab_policy::host::StructuredOutput::JsonSchema,
        },
        limits,
        rules: RulesTable::embedded().unwrap(),
        cancel: CancellationToken::new(),
        job_deadline: None,
        progress,
        throttle: None,
        carry: None,
        spec: None,
    }
}

/// The run's record as stored, as JSON, checked against the schema.
fn read_back(store: &RunStore, outcome: &RunOutcome) -> Value {
    let record = store.load_run(&outcome.run_id).unwrap().unwrap();
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
    json
}

/// Runs `COMPOSITION` over `transport` with `host_yaml` and `env`; returns the outcome, the
/// record as JSON and the request bodies in order.
async fn run_scripted(
    transport: &ScriptedTransport,
    host_yaml: &str,
    env: &[(&str, &str)],
) -> (RunOutcome, Value, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    let host = HostConfig::parse(host_yaml, "host.yaml").unwrap();
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink: ProgressSink = {
        let bodies = Arc::clone(&bodies);
        Arc::new(move |p: &Progress| {
            if let Progress::Turn {
                event: TurnEvent::Request { payload, .. },
                ..
            } = p
            {
                bodies
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(payload).into_owned());
            }
        })
    };
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let config = scripted_config(dir.path(), resolve(&host, &env).unwrap(), None, Some(sink));
    let outcome = run_with_transport(config, &workspace, transport, &mut store)
        .await
        .unwrap();
    let json = read_back(&store, &outcome);
    let bodies = bodies.lock().unwrap().clone();
    (outcome, json, bodies)
}

/// STP-5: the correction a contract failure earned is carried across a transport retry that
/// comes between, and the transport retry does not spend the contract budget.
#[tokio::test(start_paused = true)]
async fn feedback_is_carried_across_a_transport_retry_stp_5() {
    let transport = ScriptedTransport::new([
        ScriptStep::answer("Two modules."),
        ScriptStep::fail(status(503, ProviderErrorClass::Server)),
        ScriptStep::answer("{\"modules\": []}"),
    ]);
    let host = "catalog:\n  providerAttempt.maxAttemptsPerTurn: 1\n";
    let (outcome, json, bodies) =
        run_scripted(&transport, host, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "1")]).await;
    assert_eq!(outcome.status, RunStatus::Succeeded);
    let attempts = json["steps"][0]["attempts"].as_array().unwrap();
    let budgets: Vec<&str> = attempts
        .iter()
        .map(|a| a["budget"].as_str().unwrap())
        .collect();
    assert_eq!(budgets, ["initial", "contract", "transport"]);
    assert_eq!(attempts[1]["waitMs"], 1000);
    assert_eq!(bodies.len(), 3);
    assert!(!bodies[0].contains("Return only the JSON object"));
    assert!(bodies[1].contains("Return only the JSON object"));
    assert!(bodies[2].contains("Return only the JSON object"));
}

/// STP-6: transport-failed attempts plus their waits may use retry.transportMaxElapsedMs in
/// total; the attempt running when the bound is crossed finishes, then the step ends naming it.
#[tokio::test(start_paused = true)]
async fn the_transport_elapsed_bound_ends_the_step_stp_6() {
    let slow_503 = || {
        ScriptStep::fail(status(503, ProviderErrorClass::Server))
            .after(Duration::from_millis(1_000_000))
    };
    let transport = ScriptedTransport::new([slow_503(), slow_503(), slow_503(), slow_503()]);
    let host = "catalog:\n  providerAttempt.maxAttemptsPerTurn: 1\n";
    let (outcome, json, _) = run_scripted(&transport, host, &[]).await;
    assert_eq!(outcome.status, RunStatus::Failed);
    let step = &json["steps"][0];
    let attempts = step["attempts"].as_array().unwrap();
    // 1,000,000 + 1,000 + 1,000,000 + 2,000 + 1,000,000 + 4,000 stays inside 3,600,000; the
    // fourth attempt ran past it and finished, and no fifth follows.
    assert_eq!(attempts.len(), 4);
    assert_eq!(attempts[3]["retryDecision"], "exhausted");
    for a in attempts {
        assert_eq!(a["durationMs"], 1_000_000);
    }
    assert_eq!(
        step["failure"]["message"],
        "retry-transport-max-elapsed-bound: 4015000 exceeds retry.transportMaxElapsedMs = 3600000 ms."
    );
    assert_eq!(transport.sent().len(), 4);
}

/// STP-6 and the throttle's gap rule (docs/throttle.md): a step retry's wait counts from the end
/// of the failed attempt, so the time spent recording it (a durable commit, here a progress
/// sink that takes 200 ms as a slow disk would) is part of the wait, not added to it: the gap
/// between the two requests is the recorded `waitMs`. On the real clock, because the slow part
/// is synchronous and a paused clock would not see it; the margins are 100 ms either way.
#[tokio::test]
async fn the_step_wait_counts_from_the_attempt_end_not_from_after_its_commit_stp_6() {
    const SLOW_MS: u64 = 200;
    const WAIT_MS: u64 = 400;
    let transport = ScriptedTransport::new([
        ScriptStep::fail(status(503, ProviderErrorClass::Server)),
        ScriptStep::answer("{\"modules\": []}"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    let host = HostConfig::parse(
        "catalog:\n  providerAttempt.maxAttemptsPerTurn: 1\n",
        "host.yaml",
    )
    .unwrap();
    let env = BTreeMap::from([(
        "DOCSFAB_RETRY_BASE_DELAY_MS".to_owned(),
        WAIT_MS.to_string(),
    )]);
    let sink: ProgressSink = Arc::new(|p: &Progress| {
        if let Progress::AttemptFinished { attempt: 1, .. } = p {
            std::thread::sleep(Duration::from_millis(SLOW_MS));
        }
    });
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let config = scripted_config(dir.path(), resolve(&host, &env).unwrap(), None, Some(sink));
    let outcome = run_with_transport(config, &workspace, &transport, &mut store)
        .await
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Succeeded);
    let json = read_back(&store, &outcome);
    assert_eq!(json["steps"][0]["attempts"][0]["waitMs"], WAIT_MS);
    let sent = transport.sent();
    assert_eq!(sent.len(), 2);
    let gap = sent[1].at.duration_since(sent[0].at);
    assert!(
        gap >= Duration::from_millis(WAIT_MS) && gap < Duration::from_millis(WAIT_MS + 100),
        "the retry went {gap:?} after the failed request; the wait is {WAIT_MS} ms and the slow record {SLOW_MS} ms"
    );
}
