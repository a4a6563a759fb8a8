//! Choosing the run store (issue 15): the global `--store URL` flag and `DOCSFAB_STORE` reach
//! the named SQLite file for `run` and `runs`; a value that is not a store URL is refused in one
//! sentence with exit 2 and nothing written.

mod support;

use std::path::Path;

use docsfab_record::RunStatus;
use docsfab_runtime::store::{JobSpec, JobWorkspace, RunStore};
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim};

const ANSWERS: &str = "responses:
  - answer: {json: {modules: [lib]}}
  - answer: {json: {modules: [lib]}}
";

fn run_id(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned()
}

/// The run ids a SQLite store file holds, read straight from it.
fn ids_in(path: &Path) -> Vec<String> {
    RunStore::open(path)
        .unwrap()
        .list_runs()
        .unwrap()
        .into_iter()
        .map(|s| s.run_id)
        .collect()
}

#[test]
fn issue15_store_flag_and_env_reach_the_named_sqlite_file() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWERS);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let by_flag = s.dir.path().join("stores/flag.db");
    let by_env = s.dir.path().join("stores/env.db");

    // The flag before the subcommand.
    let out = s
        .docsfab()
        .arg("--store")
        .arg(format!("sqlite:{}", by_flag.display()))
        .arg("run")
        .arg(&comp)
        .arg("--workspace")
        .arg(s.workspace())
        .output()
        .unwrap();
    let first = run_id(&out);
    assert_eq!(ids_in(&by_flag), vec![first.clone()]);

    // The variable, read by `run` and by `runs show`.
    let out = s
        .run_command(&comp)
        .env("DOCSFAB_STORE", format!("sqlite:{}", by_env.display()))
        .output()
        .unwrap();
    let second = run_id(&out);
    assert_eq!(ids_in(&by_env), vec![second.clone()]);
    let show = s
        .docsfab()
        .env("DOCSFAB_STORE", format!("sqlite:{}", by_env.display()))
        .args(["runs", "show", &second, "--json"])
        .output()
        .unwrap();
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );

    // The flag after the subcommand (global) wins over the variable.
    let list = s
        .docsfab()
        .env("DOCSFAB_STORE", format!("sqlite:{}", by_env.display()))
        .args(["runs", "list", "--json", "--store"])
        .arg(format!("sqlite:{}", by_flag.display()))
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["runId"], first.as_str());

    // Neither run went to the default store, and listing it creates nothing.
    assert!(s.list_json().is_empty());
    assert!(!s.store().exists());
}

#[test]
fn issue15_a_bad_store_url_is_one_sentence_exit_2_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWERS);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    for (how, value) in [
        ("flag", "mysql://admin:hunter2pw@db.example/docs"),
        ("flag", "sqlite:"),
        ("env", "runs.db"),
    ] {
        let mut cmd = s.run_command(&comp);
        match how {
            "flag" => cmd.args(["--store", value]),
            _ => cmd.env("DOCSFAB_STORE", value),
        };
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(out.stdout.is_empty(), "{value}: no run id");
        assert_eq!(err.trim_end().lines().count(), 1, "one sentence: {err}");
        assert!(err.contains("--store (or DOCSFAB_STORE)"), "{err}");
        assert!(err.contains("sqlite:PATH"), "{err}");
        assert!(
            !err.contains("hunter2pw"),
            "a password never reaches stderr: {err}"
        );
        assert!(!s.store().exists(), "{value}: no store created");
    }
    let out = s
        .docsfab()
        .args(["runs", "list", "--store", "mysql://x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"mysql\" is not supported; write sqlite:PATH or postgres://"),
        "{err}"
    );
}

/// A PostgreSQL URL's password never reaches the terminal, whether or not the store can be
/// reached.
#[test]
fn issue15_a_postgres_store_error_hides_the_password() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9", "");
    let _ = tmp;
    let out = s
        .docsfab()
        .args([
            "runs",
            "list",
            "--store",
            "postgres://docsfab:s3cretpw@127.0.0.1:1/docsfab",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("s3cretpw"), "{err}");
}

/// `runs list` shows a queued run like any other, with no steps and no duration yet.
#[test]
fn issue15_runs_list_shows_a_queued_run() {
    let s = Setup::new("http://127.0.0.1:9", "");
    let path = s.dir.path().join("queue.db");
    let id = RunStore::open(&path)
        .unwrap()
        .enqueue(&JobSpec {
            composition_yaml: ONE_STEP.into(),
            composition_name: "small".into(),
            workspace: JobWorkspace::Path {
                path: s.workspace().to_string_lossy().into_owned(),
            },
            resume: None,
            resume_from: None,
        })
        .unwrap();
    let out = s
        .docsfab()
        .args(["runs", "list", "--store"])
        .arg(format!("sqlite:{}", path.display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text.lines().find(|l| l.starts_with(&id)).expect(&text);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], RunStatus::Queued.as_str(), "{row}");
    assert_eq!(&cells[4..], ["-", "0", "0"], "{row}");
    let show = s
        .docsfab()
        .args(["runs", "show", &id, "--json", "--store"])
        .arg(format!("sqlite:{}", path.display()))
        .output()
        .unwrap();
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let record: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(record["status"], "queued");
    assert_eq!(record["steps"], serde_json::json!([]));
    assert_eq!(record["workspace"], serde_json::Value::Null);
}

/// `demo` records into the store `--store` names, and `sim goodput --fault-model store` reads
/// that store (one run is too few to fit, and the refusal names the file).
#[test]
fn issue15_demo_and_sim_goodput_use_the_named_store() {
    let s = Setup::new("http://127.0.0.1:9", "");
    let path = s.dir.path().join("demo-store/runs.db");
    let url = format!("sqlite:{}", path.display());
    let out = support::run::docsfab_at(&s.home())
        .args(["demo", "--store", &url])
        .output()
        .unwrap();
    let id = run_id(&out);
    assert_eq!(ids_in(&path), vec![id]);
    assert!(!s.store().exists());

    let out = s
        .docsfab()
        .env("DOCSFAB_STORE", &url)
        .args(["sim", "goodput", "--fault-model", "store", "--steps", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs at least 3 recorded runs"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
}
