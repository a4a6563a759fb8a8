//! The run record of `docsfab demo` is pinned: `runs show --json` must print the same record,
//! field for field, as the checked-in fixture, once the values that differ between two runs of
//! the same scenario (the run id, wall-clock times, measured durations) are replaced by
//! placeholders. Refactors of the record's types must leave this test green.
//!
//! To regenerate the fixture after an intended change of the record:
//! `DOCSFAB_BLESS=1 cargo test -p docsfab --test record_golden` (then review the diff).

mod support;

use serde_json::Value;
use support::run::docsfab_at as docsfab;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/demo-record.golden.json"
);

/// Replaces what differs between runs: keys holding ids, times, measured durations, the
/// workspace path, the simulator's port and the version.
fn normalise(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                let placeholder = match key.as_str() {
                    "runId" => Some("<run-id>"),
                    "startedAt" | "endedAt" | "intendedAt" if v.is_string() => Some("<time>"),
                    "durationMs" => Some("<duration>"),
                    // A fresh temporary workspace, the simulator's port, the crate's version.
                    "workspace" => Some("<workspace>"),
                    "host" => Some("127.0.0.1:<port>"),
                    "docsfabVersion" => Some("<version>"),
                    _ => None,
                };
                match placeholder {
                    Some(p) => *v = Value::String(p.to_owned()),
                    None => normalise(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        _ => {}
    }
}

#[test]
fn record_golden_demo_runs_show_json_is_unchanged() {
    let home = tempfile::tempdir().unwrap();
    let out = docsfab(home.path()).arg("demo").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = stdout.lines().next().unwrap();
    let shown = docsfab(home.path())
        .args(["runs", "show", id, "--json"])
        .output()
        .unwrap();
    assert!(shown.status.success());
    let mut record: Value = serde_json::from_slice(&shown.stdout).unwrap();
    normalise(&mut record);
    let pretty = serde_json::to_string_pretty(&record).unwrap() + "\n";

    if std::env::var_os("DOCSFAB_BLESS").is_some() {
        std::fs::write(FIXTURE, &pretty).unwrap();
    }
    let expected = std::fs::read_to_string(FIXTURE).unwrap();
    let expected: Value = serde_json::from_str(&expected).unwrap();
    // Compared as JSON values: every field, every array entry in order; object keys unordered.
    assert_eq!(record, expected, "runs show --json changed; see {FIXTURE}");
}
