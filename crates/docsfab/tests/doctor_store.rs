//! `docsfab doctor` checks the run store a run would use (`--store`, `DOCSFAB_STORE`, else the
//! home's `runs.db`): a store that does not exist yet is left uncreated, an open one is counted
//! by status, a server that does not answer is a warning (exit 0), and credentials the server
//! refuses are the one sentence `run` would print (exit 2), without the password. The PostgreSQL
//! half needs `DOCSFAB_TEST_POSTGRES` (skipped without it unless `DOCSFAB_REQUIRE_POSTGRES=1`).

mod support;

use std::process::Output;

use serde_json::Value;
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim};

const ANSWER: &str = "responses:\n  - answer:\n      json: {modules: [lib]}\n";

fn doctor(setup: &Setup, store: Option<&str>, json: bool) -> Output {
    let mut c = setup.docsfab();
    if let Some(url) = store {
        c.args(["--store", url]);
    }
    c.arg("doctor");
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

fn store_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("Run store: "))
        .unwrap_or_else(|| panic!("no store line in: {text}"))
        .to_owned()
}

#[test]
fn issue15_doctor_reports_a_sqlite_store_and_never_creates_one() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let out = doctor(&setup, None, false);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        store_line(&out),
        format!(
            "Run store: {} (SQLite, not created yet: the first run creates it)",
            setup.store().display()
        )
    );
    assert!(!setup.store().exists(), "doctor created the run store");

    let run = setup
        .run_command(&setup.composition(ONE_STEP))
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let out = doctor(&setup, None, false);
    assert_eq!(
        store_line(&out),
        format!(
            "Run store: {} (SQLite; 1 run: 1 succeeded)",
            setup.store().display()
        )
    );
    let out = doctor(&setup, None, true);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["store"],
        serde_json::json!({"place": setup.store().display().to_string(), "backend": "sqlite",
                           "state": "open", "runs": {"succeeded": 1}})
    );

    // A file that is not a run store is refused as `run` refuses it.
    std::fs::write(setup.store(), b"not a database, just text\n".repeat(100)).unwrap();
    let out = doctor(&setup, None, false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(&setup.store().display().to_string()), "{err}");
}

#[test]
fn issue15_doctor_reports_a_postgres_store_reachable_refused_or_down() {
    let Some(db) = docsfab_pg::testing::fresh_database("doctor_store") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let url = db.url.as_str();
    let shown = db.url.to_string(); // the URL as docsfab prints it: no password

    let out = doctor(&setup, Some(url), false);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        store_line(&out),
        format!("Run store: {shown} (PostgreSQL, reachable; no runs yet)")
    );
    let run = setup
        .run_command(&setup.composition(ONE_STEP))
        .env("DOCSFAB_STORE", url)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let out = doctor(&setup, Some(url), true);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["store"]["backend"], "postgres");
    assert_eq!(v["store"]["state"], "open");
    assert_eq!(v["store"]["runs"], serde_json::json!({"succeeded": 1}));
    assert!(!setup.store().exists(), "a PostgreSQL doctor wrote runs.db");

    // A password the server refuses: bad configuration, as `run` says it, password withheld.
    let parsed = reqwest::Url::parse(url).unwrap();
    let mut wrong = parsed.clone();
    wrong.set_username("docsfab_no_such_user").unwrap();
    wrong.set_password(Some("Wr0ng-pw-77")).unwrap();
    let out = doctor(&setup, Some(wrong.as_str()), false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("correct the user, password or database"),
        "{err}"
    );
    assert!(
        !err.contains("Wr0ng-pw-77")
            && !String::from_utf8_lossy(&out.stdout).contains("Wr0ng-pw-77")
    );

    // A server that does not answer (nothing listens on port 1): a warning, exit 0.
    let mut down = parsed;
    down.set_port(Some(1)).unwrap();
    let out = doctor(&setup, Some(down.as_str()), false);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(store_line(&out).ends_with("(cannot be opened now; see the warning below)"));
    assert!(
        text.lines()
            .any(|l| l.starts_with("warning: cannot open the run store") && l.contains(":1/")),
        "{text}"
    );
}
