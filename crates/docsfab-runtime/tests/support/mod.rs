//! Shared by the end-to-end run tests (a directory module, so cargo does not build it as a test
//! of its own): a tempdir with a small workspace, a real SQLite run store and the simulator on
//! 127.0.0.1; limits resolved from host.yaml text and an environment; and one run of a
//! composition, read back from disk and checked against the schema and for the API key.
#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::host::{HostConfig, StructuredOutput};
use docsfab_policy::rules::RulesTable;
use docsfab_provider::ApiKey;
use docsfab_record::{Api, RunRecord};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{
    Progress, ProviderSettings, RunConfig, RunOutcome, run_composition,
};
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::RunStore;
use docsfab_sim::{Scenario, SimServer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The provider key every run sends; it must never reach a record or a progress line.
pub const SECRET: &str = "sk-e2e-SECRET-value-4711";

/// A tempdir holding the workspace `ws/` and the run store, and the simulator serving one
/// scenario.
pub struct Harness {
    /// Owns the directory: it is removed when the harness is dropped.
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub db: PathBuf,
    pub server: SimServer,
}

/// A harness whose workspace holds `src/lib.rs` (with the text `lib_rs`) and `src/count.rs`, and
/// whose simulator serves `scenario`.
pub async fn harness(scenario: &str, lib_rs: &str) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(workspace.join("src")).unwrap();
    std::fs::write(workspace.join("src/lib.rs"), lib_rs).unwrap();
    std::fs::write(
        workspace.join("src/count.rs"),
        "pub fn count() -> usize { 3 }\n",
    )
    .unwrap();
    let scenario = Scenario::from_yaml_str(scenario, "inline").unwrap();
    let server = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .unwrap();
    let db = dir.path().join("runs.db");
    Harness {
        dir,
        workspace,
        db,
        server,
    }
}

/// The limits `host_yaml` and the environment `env` resolve to.
pub fn limits(host_yaml: &str, env: &[(&str, &str)]) -> EffectiveLimits {
    let host = HostConfig::parse(host_yaml, "host.yaml").unwrap();
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    resolve(&host, &env).unwrap()
}

/// A test's own reaction to progress events, called inline as each arrives (after it is
/// collected).
pub type OnEvent = Box<dyn Fn(&Progress) + Send + Sync>;

/// How to run a composition against the harness.
pub struct RunArgs {
    pub api: Api,
    pub limits: EffectiveLimits,
    pub rules: RulesTable,
    pub cancel: CancellationToken,
    pub job_deadline: Option<Duration>,
    pub on_event: OnEvent,
}

/// A finished run: what `run_composition` returned, the record as read back from disk (also as
/// JSON), and every progress event in order.
pub struct Recorded {
    pub outcome: RunOutcome,
    pub record: RunRecord,
    pub json: Value,
    pub events: Vec<Progress>,
}

/// Runs `composition` over the harness, then reads the record back through a fresh connection
/// (what is on disk, not what is in memory) and checks that it meets the JSON Schema and does
/// not hold the API key.
pub async fn run_recorded(h: &Harness, composition: &str, args: RunArgs) -> Recorded {
    run_recorded_with(h, composition, args, StructuredOutput::JsonSchema).await
}

/// [`run_recorded`] with the provider's `structuredOutput` set to `structured_output`.
pub async fn run_recorded_with(
    h: &Harness,
    composition: &str,
    args: RunArgs,
    structured_output: StructuredOutput,
) -> Recorded {
    let composition = Composition::parse(composition, "composition.yaml").unwrap();
    let events: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let events = Arc::clone(&events);
        let on_event = args.on_event;
        Arc::new(move |p: &Progress| {
            events.lock().unwrap().push(p.clone());
            on_event(p);
        })
    };
    let mut store = RunStore::open(&h.db).unwrap();
    let outcome = run_composition(
        RunConfig {
            composition,
            workspace: h.workspace.clone(),
            provider: ProviderSettings {
                name: "sim".into(),
                api: args.api,
                base_url: h.server.base_url(),
                model: "sim-model".into(),
                api_key: Some(ApiKey::new(SECRET)),
                spend: Default::default(),
                structured_output,
            },
            limits: args.limits,
            rules: args.rules,
            cancel: args.cancel,
            job_deadline: args.job_deadline,
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
    let store = RunStore::open(&h.db).unwrap();
    let record = store.load_run(&outcome.run_id).unwrap().unwrap();
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
    assert!(
        !json.to_string().contains(SECRET),
        "the API key leaked into the record"
    );
    let events = events.lock().unwrap().clone();
    Recorded {
        outcome,
        record,
        json,
        events,
    }
}

/// The request bodies the run built, one per turn, in order: (step, attempt, turn, digest, body).
pub fn requests(events: &[Progress]) -> Vec<(String, u32, u32, String, String)> {
    events
        .iter()
        .filter_map(|p| match p {
            Progress::Turn {
                step_id,
                attempt,
                event:
                    TurnEvent::Request {
                        turn,
                        digest,
                        payload,
                    },
            } => Some((
                step_id.clone(),
                *attempt,
                *turn,
                digest.clone(),
                String::from_utf8_lossy(payload).into_owned(),
            )),
            _ => None,
        })
        .collect()
}
