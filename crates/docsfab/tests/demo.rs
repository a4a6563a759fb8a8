//! `docsfab demo` as a real process: the bundled example against the in-process simulator, with a
//! temporary DOCSFAB_HOME whose run store keeps the run for `docsfab runs show`.

mod support;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::docsfab_at as docsfab;

/// REP-1, REP-8, CLS-4, STP-5, STP-9, OPS-3: the demo exits 0, prints the run id first, shows
/// each replay and retry on stderr as it happens, ends with the run view, and its record (in the
/// real run store) validates against the schema and holds what the scenario provoked: replays of
/// 408, 408, 503 and a 429 honouring Retry-After, a transport retry after a stream cut short, a
/// contract retry after a prose answer, then the page. The operator's limit variables do not
/// change it (a transport budget of 0 here would end the demo at the cut stream).
#[test]
fn the_demo_runs_the_example_for_real_and_leaves_an_inspectable_record() {
    let home = tempfile::tempdir().unwrap();
    let out = docsfab(home.path())
        .env("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "0")
        .arg("demo")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap();
    assert!(id.starts_with("run-") && !id.contains(' '), "{id:?}");
    assert!(stdout.contains(&format!("Run {id}: succeeded")), "{stdout}");
    assert!(stdout.contains("# tally: an overview"), "{stdout}");
    for line in [
        "turn 1: HTTP 408 (timeout), replaying the same request in 100 ms",
        "turn 1: HTTP 503 (server), replaying the same request in 400 ms",
        "turn 2: HTTP 429 (rate-limit), replaying the same request in 1000 ms",
        "retry scheduled by rule class-stream-incomplete after 500 ms",
        "attempt 2 (transport budget)",
        "attempt 3 (contract budget)",
        "step pages succeeded",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in:\n{stderr}");
    }

    let shown = docsfab(home.path())
        .args(["runs", "show", id, "--json"])
        .output()
        .unwrap();
    assert!(shown.status.success());
    let record: Value = serde_json::from_slice(&shown.stdout).unwrap();
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["composition"], "quickstart");
    let outline = &record["steps"][0];
    let budgets: Vec<&str> = outline["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["budget"].as_str().unwrap())
        .collect();
    assert_eq!(budgets, ["initial", "transport", "contract"]);
    let a1 = &outline["attempts"][0];
    assert_eq!(a1["providerErrorClass"], "stream-incomplete");
    assert_eq!(a1["turns"][0]["providerRetries"], 3);
    assert_eq!(a1["turns"][1]["replays"][0]["status"], 429);
    assert_eq!(a1["turns"][1]["replays"][0]["retryAfterMs"], 1000);
    assert_eq!(outline["attempts"][1]["code"], "contract-prose");
    assert_eq!(outline["transportRetry"]["maxTransportRetries"], 6);
    assert_eq!(record["steps"][1]["status"], "succeeded");
    assert_eq!(record["steps"][1]["access"], "write");

    // The readable view is the one `runs show` prints.
    let view = docsfab(home.path())
        .args(["runs", "show", id])
        .output()
        .unwrap();
    let view = String::from_utf8_lossy(&view.stdout);
    assert!(stdout.contains(view.as_ref()), "{view}");
}
