//! Issue 15: the same CLI commands on both stores. One write run through `docsfab run`, then
//! `runs list`, `runs show`, `runs diff` and `runs stats`, once with the default SQLite store
//! and once with `--store postgres://...` (a fresh database from `DOCSFAB_TEST_POSTGRES`; that
//! half is skipped without it unless `DOCSFAB_REQUIRE_POSTGRES=1`). The two must agree on
//! everything that is not an id, a time or a duration.

mod support;

use serde_json::Value;
use support::run::{Setup, Sim};

const WRITER: &str = "name: writer
limits:
  timeoutMs: 120000
  maxTurns: 6
steps:
  - id: pages
    access: write
    instructions: Write the pages under docs/.
    tools: [read_file, write_file]
    writeRoots: [docs/]
";

/// A 503 first (one replay on record), then the page, then done.
const SCENARIO: &str = r##"responses:
  - status: 503
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/new.md, content: "# New\n\nA page.\n"}}
  - answer: {text: done}
"##;

/// What the commands printed for one run, with ids, times and durations blanked.
struct Seen {
    list: Value,
    show: Value,
    diff: String,
    stats: Value,
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replaces every value whose key names an id, a time, a duration or a place (the workspace
/// directory and the simulator's port differ between the two halves).
fn blank(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                let lk = k.to_ascii_lowercase();
                if lk.ends_with("id") && lk != "stepid"
                    || lk.ends_with("at")
                    || lk.ends_with("ms")
                    || lk == "workspace"
                    || lk == "host"
                {
                    *x = Value::Null;
                } else {
                    blank(x);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(blank),
        _ => {}
    }
}

fn exercise(store: Option<&str>) -> Seen {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), SCENARIO);
    let setup = Setup::new(
        &sim.base_url,
        "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n",
    );
    let cmd = || {
        let mut c = setup.docsfab();
        if let Some(url) = store {
            c.args(["--store", url]);
        }
        c
    };
    let composition = setup.composition(WRITER);
    let out = ok(cmd()
        .arg("run")
        .arg(&composition)
        .arg("--workspace")
        .arg(setup.workspace())
        .output()
        .unwrap());
    let id = out.lines().next().unwrap().trim().to_owned();
    let json = |args: &[&str]| -> Value {
        let mut v: Value = serde_json::from_str(&ok(cmd().args(args).output().unwrap())).unwrap();
        blank(&mut v);
        v
    };
    let seen = Seen {
        list: json(&["runs", "list", "--json"]),
        show: json(&["runs", "show", &id, "--json"]),
        diff: ok(cmd().args(["runs", "diff", &id]).output().unwrap()),
        stats: json(&["runs", "stats", "--json"]),
    };
    if store.is_some() {
        // Nothing went to the SQLite file of the home.
        assert!(!setup.store().exists(), "a PostgreSQL run wrote runs.db");
    }
    seen
}

#[test]
fn issue15_run_and_runs_commands_agree_on_sqlite_and_postgres() {
    let sqlite = exercise(None);
    assert_eq!(sqlite.show["status"], "succeeded", "{:#}", sqlite.show);
    assert!(sqlite.diff.contains("+# New"), "{}", sqlite.diff);
    let Some(db) = docsfab_pg::testing::fresh_database("cli_backends") else {
        return;
    };
    let pg = exercise(Some(db.url.as_str()));
    assert_eq!(pg.show, sqlite.show);
    assert_eq!(pg.list, sqlite.list);
    assert_eq!(pg.diff, sqlite.diff);
    assert_eq!(pg.stats, sqlite.stats);
}
