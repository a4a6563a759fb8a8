//! Issue 11: a run's progress lines and record name a fault for what it was (`reset`,
//! `connect-refused`, ...), with the class the retry spec gives it; a real `docsfab run` against
//! `docsfab sim serve`.

mod support;

use docsfab_runtime::record::validate_against_schema;
use support::run::{FAST_CATALOG, ONE_STEP, SECRET, Setup, Sim};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// Proves REP-2 with the finer labels: a reset and a close before the response head are replayed
// (class network), the progress lines name `reset` and `connection-dropped`, and the record
// (schema-valid) stores the same labels.
#[test]
fn issue11_progress_and_record_label_reset_and_dropped_connections_rep_2() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - drop: reset\n  - drop: close\n  - answer:\n      json: {modules: [lib, count]}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("turn 1: reset (network), replaying the same request in "),
        "{stderr}"
    );
    assert!(
        stderr.contains("turn 1: connection-dropped (network), replaying the same request in "),
        "{stderr}"
    );
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));

    let id = stdout.lines().next().unwrap();
    let record = s.show_json(id);
    validate_against_schema(&record).unwrap();
    let replays = &record["steps"][0]["attempts"][0]["turns"][0]["replays"];
    assert_eq!(replays[0]["fault"], "reset");
    assert_eq!(replays[0]["providerErrorClass"], "network");
    assert_eq!(replays[1]["fault"], "connection-dropped");
}
