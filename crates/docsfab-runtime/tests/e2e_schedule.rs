//! The step driver's exact wait schedule at the catalog defaults, on tokio's paused clock with
//! the provider's in-memory scripted transport (real sockets and a paused clock give false
//! timeouts, so timing is proven here and behaviour over HTTP in `e2e_run.rs`). The run store is
//! a real SQLite file.

use std::collections::BTreeMap;
use std::time::Duration;

use docsfab_policy::catalog::resolve;
use docsfab_policy::class::ProviderErrorClass;
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;
use docsfab_provider::scripted::{ScriptStep, ScriptedTransport, status};
use docsfab_provider::{Api, ApiKey};
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{ProviderSettings, RunConfig, run_with_transport};
use docsfab_runtime::record::{RunStatus, validate_against_schema};
use docsfab_runtime::store::RunStore;
use docsfab_runtime::workspace::Workspace;
use serde_json::{Value, json};
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
    let outcome = run_with_transport(
        RunConfig {
            composition: Composition::parse(COMPOSITION, "c.yaml").unwrap(),
            workspace: dir.path().to_path_buf(),
            provider: ProviderSettings {
                api: Api::OpenaiChat,
                base_url: "http://127.0.0.1:9/v1".into(),
                model: "m".into(),
                api_key: Some(ApiKey::new("sk-never-sent")),
            },
            limits,
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            progress: None,
        },
        &workspace,
        &transport,
        &mut store,
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(outcome.status, RunStatus::Failed);

    let record = store.load_run(&outcome.run_id).unwrap().unwrap();
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
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
