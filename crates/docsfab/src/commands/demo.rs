//! `docsfab demo`: the bundled example, run for real against the in-process simulator.
//!
//! Everything it needs is compiled in: `examples/quickstart/composition.yaml`, the files of
//! `examples/quickstart/workspace/` and the provider script `examples/quickstart/scenario.yaml`
//! (a 408 burst and a 503 replayed in the turn, a 429 whose Retry-After the replay honours, a
//! tool round trip, a stream cut short that costs a transport retry, a prose answer that costs a
//! contract retry, then the outline and the page). The simulator listens on 127.0.0.1 on a free
//! port and the workspace is copied to a fresh temporary directory, removed afterwards.
//!
//! Nothing is faked: the run goes through the same executor, HTTP transport, replay driver, step
//! retry and run store as `docsfab run`; only the delays are scaled down (the demo's own host
//! catalog and retry base delay below), so it ends in a few seconds. The demo ignores host.yaml
//! and the `DOCSFAB_` limit variables, so an operator's settings cannot change what it shows,
//! but it records the run in the real `DOCSFAB_HOME/runs.db`, so `docsfab runs show ID` works
//! afterwards.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_policy::catalog::resolve;
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;
use docsfab_record::Api;
use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::{ProviderSettings, RunConfig};
use docsfab_sim::{Scenario, SimServer};
use tokio_util::sync::CancellationToken;

use crate::app::error::{CliError, emit};
use crate::app::execute::{conclude, execute, runtime};
use crate::app::home::Home;
use crate::app::print::render_run;
use crate::app::progress::ColorChoice;
use crate::app::store::load_record;
use crate::app::store::{open_store_url, store_place, store_url};

const COMPOSITION: &str = include_str!("../../quickstart/composition.yaml");
const SCENARIO: &str = include_str!("../../quickstart/scenario.yaml");
const WORKSPACE: [(&str, &str); 4] = [
    (
        "Cargo.toml",
        include_str!("../../quickstart/workspace/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../quickstart/workspace/src/lib.rs"),
    ),
    (
        "src/count.rs",
        include_str!("../../quickstart/workspace/src/count.rs"),
    ),
    (
        "src/report.rs",
        include_str!("../../quickstart/workspace/src/report.rs"),
    ),
];

/// The demo's host settings: replay waits start at 100 ms and a single wait is capped at 2 s, so
/// the 429's one-second Retry-After is honoured in full and the 408 burst takes 0.7 s.
const DEMO_HOST: &str =
    "catalog:\n  providerAttempt.baseDelayMs: 100\n  providerAttempt.maxDelayMs: 2000\n";
/// The step retry's base delay, as `DOCSFAB_RETRY_BASE_DELAY_MS` would set it.
const DEMO_ENV: [(&str, &str); 1] = [("DOCSFAB_RETRY_BASE_DELAY_MS", "500")];
/// Any model name will do: the simulator answers in whatever model it is asked for.
const DEMO_MODEL: &str = "demo-model";
/// The provider name the demo's record gives its in-process simulator (there is no host.yaml).
const DEMO_PROVIDER: &str = "demo-simulator";

pub fn run(color: ColorChoice, store: Option<&str>) -> Result<(), CliError> {
    crate::app::telemetry::check_env()?;
    // The embedded files are part of the binary; a problem with them is a build defect.
    let bug = |what: &str, e: &dyn std::fmt::Display| {
        CliError::failed(format!(
            "the demo's embedded {what} is invalid ({e}); this is a bug in this build of docsfab, please report it."
        ))
    };
    let composition = Composition::parse(COMPOSITION, "examples/quickstart/composition.yaml")
        .map_err(|e| bug("composition", &e))?;
    let scenario = Scenario::from_yaml_str(SCENARIO, "examples/quickstart/scenario.yaml")
        .map_err(|e| bug("scenario", &e))?;
    let host = HostConfig::parse(DEMO_HOST, "the demo's host settings")
        .map_err(|e| bug("host settings", &e))?;
    let env: BTreeMap<String, String> = DEMO_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let limits = resolve(&host, &env).map_err(|e| bug("limits", &e))?;
    let rules = RulesTable::embedded().map_err(|e| bug("rules table", &e))?;

    let home = Home::locate()?;
    let store_path = store_url(&home.dir, store)?;
    let workspace = TempDir::create()?;
    for (name, text) in WORKSPACE {
        write_file(&workspace.path.join(name), text)?;
    }
    let mut store = open_store_url(&store_path)?;

    let rt = runtime()?;
    let outcome = rt.block_on(async {
        let server = SimServer::start(([127, 0, 0, 1], 0).into(), scenario, None)
            .await
            .map_err(|e| {
                CliError::failed(format!(
                    "cannot start the demo's simulator on 127.0.0.1 ({e}); check that loopback networking works."
                ))
            })?;
        let _ = writeln!(
            std::io::stderr(),
            "docsfab demo: running examples/quickstart against the built-in fault-injecting simulator at {}\n  (scenario examples/quickstart/scenario.yaml; delays scaled down; run recorded in {})",
            server.base_url(),
            store_place(&store_path)
        );
        let config = RunConfig {
            composition,
            workspace: workspace.path.clone(),
            provider: ProviderSettings {
                name: DEMO_PROVIDER.to_owned(),
                api: Api::OpenaiChat,
                base_url: server.base_url(),
                model: DEMO_MODEL.to_owned(),
                api_key: None,
                spend: Default::default(),
                structured_output: docsfab_policy::host::StructuredOutput::JsonSchema,
            },
            job_deadline: Some(Duration::from_millis(limits.deadline_ms())),
            limits,
            rules,
            cancel: CancellationToken::new(),
            progress: None,
            // The demo's provider is its own in-process simulator, not a shared key: a hold or
            // a learnt budget of it must not reach real runs on the same DOCSFAB_HOME.
            throttle: None,
        carry: None,
        spec: None,
        };
        let outcome = execute(config, &mut store, color).await;
        server.shutdown().await;
        outcome
    })?;

    let record = load_record(&store, &outcome.run_id)?;
    emit(&format!("\n{}", render_run(&record)))?;
    if let Ok(page) = std::fs::read_to_string(workspace.path.join("docs/overview.md")) {
        emit(&format!(
            "\nThe pages step wrote docs/overview.md (in the temporary workspace copy, now removed):\n\n{page}"
        ))?;
    }
    conclude(&outcome, &record)
}

fn write_file(path: &Path, text: &str) -> Result<(), CliError> {
    let fail = |e: std::io::Error| {
        CliError::failed(format!(
            "cannot write the demo workspace file {} ({e}); check that the temporary directory is writable (TMPDIR).",
            path.display()
        ))
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::write(path, text).map_err(fail)
}

/// A fresh directory under the system temporary directory, removed when dropped.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create() -> Result<TempDir, CliError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let path =
            std::env::temp_dir().join(format!("docsfab-demo-{}-{nanos}", std::process::id()));
        // create_dir, not create_dir_all: never adopt a directory that already exists.
        std::fs::create_dir(&path).map_err(|e| {
            CliError::failed(format!(
                "cannot create the demo workspace {} ({e}); check that the temporary directory is writable (TMPDIR).",
                path.display()
            ))
        })?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
