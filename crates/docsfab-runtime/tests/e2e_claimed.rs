//! `run_claimed` (issue 15): a queued run claimed from the store runs into that same run, over
//! real HTTP to the simulator on 127.0.0.1, with a real SQLite store.

mod support;

use docsfab_policy::rules::RulesTable;
use docsfab_provider::ApiKey;
use docsfab_record::{Api, RunStatus};
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{ProviderSettings, RunConfig, RunError, run_claimed};
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::{JobSpec, JobWorkspace, RunStore};
use support::{Harness, SECRET, limits};
use tokio_util::sync::CancellationToken;

const COMPOSITION: &str = r#"name: survey
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 1024
steps:
  - id: outline
    access: read-only
    instructions: 'Survey the crate and return {"modules": [...]}.'
    tools: [list_files, read_file]
    contract:
      schema: {type: object, required: [modules]}
"#;

const SCENARIO: &str = "responses:\n  - answer:\n      json: {modules: [lib]}\n";

fn config(h: &Harness, workspace: std::path::PathBuf) -> RunConfig {
    RunConfig {
        composition: Composition::parse(COMPOSITION, "composition.yaml").unwrap(),
        workspace,
        provider: ProviderSettings {
            name: "sim".into(),
            api: Api::OpenaiChat,
            base_url: h.server.base_url(),
            model: "sim-model".into(),
            api_key: Some(ApiKey::new(SECRET)),
            spend: Default::default(),
            structured_output: docsfab_policy::host::StructuredOutput::JsonSchema,
        },
        limits: limits("", &[]),
        rules: RulesTable::embedded().unwrap(),
        cancel: CancellationToken::new(),
        job_deadline: None,
        progress: None,
        throttle: None,
        carry: None,
        spec: None,
    }
}

fn queue_one(h: &Harness, store: &mut RunStore) -> String {
    let id = store
        .enqueue(&JobSpec {
            composition_yaml: COMPOSITION.into(),
            composition_name: "survey".into(),
            workspace: JobWorkspace::Path {
                path: h.workspace.to_string_lossy().into_owned(),
            },
            resume: None,
            resume_from: None,
        })
        .unwrap();
    let claimed = store.claim_next().unwrap().unwrap();
    assert_eq!(claimed.run_id, id);
    id
}

#[tokio::test]
async fn issue15_a_claimed_run_is_run_into_the_same_record_with_its_context() {
    let h = support::harness(SCENARIO, "pub fn lib() {}\n").await;
    let mut store = RunStore::open(&h.db).unwrap();
    let id = queue_one(&h, &mut store);
    let outcome = run_claimed(config(&h, h.workspace.clone()), id.clone(), &mut store)
        .await
        .unwrap();
    assert_eq!(outcome.run_id, id, "no second run is created");
    assert_eq!(outcome.status, RunStatus::Succeeded);
    assert_eq!(store.list_runs().unwrap().len(), 1);

    let record = RunStore::open(&h.db)
        .unwrap()
        .load_run(&id)
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.composition, "survey");
    assert_eq!(record.steps.len(), 1);
    assert_eq!(record.steps[0].attempts.len(), 1);
    assert_eq!(record.model.as_deref(), Some("sim-model"));
    assert_eq!(
        record.provider.as_ref().map(|p| p.name.as_str()),
        Some("sim")
    );
    let canonical = h.workspace.canonicalize().unwrap();
    assert_eq!(record.workspace.as_deref(), canonical.to_str());
    let json = serde_json::to_value(&record).unwrap();
    validate_against_schema(&json).unwrap();
    assert!(!json.to_string().contains(SECRET));
}

#[tokio::test]
async fn issue15_a_claimed_run_that_cannot_start_is_failed_not_left_running() {
    let h = support::harness(SCENARIO, "pub fn lib() {}\n").await;
    let mut store = RunStore::open(&h.db).unwrap();
    let id = queue_one(&h, &mut store);
    let missing = h.dir.path().join("no-such-workspace");
    let err = run_claimed(config(&h, missing), id.clone(), &mut store)
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Workspace(_)), "{err}");
    let record = store.load_run(&id).unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Failed);
    assert!(record.ended_at.is_some());
    assert!(record.steps.is_empty());
}
