//! `docsfab run` under signals, as a real process against `docsfab sim serve`: SIGKILL mid-run
//! leaves a run the next command finds `interrupted` with its finished attempts intact; SIGINT
//! during an in-turn replay wait and SIGTERM during a step backoff cancel the run at once
//! (exit 130, recorded `cancelled`) instead of waiting the wait out.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use docsfab_runtime::record::validate_against_schema;
use support::run::{
    FAST_CATALOG, Lines, ONE_STEP, Setup, Sim, first_line, looks_like_run_id, signal,
};

/// ONE_STEP plus a second read-only step.
fn two_steps() -> String {
    format!(
        "{ONE_STEP}  - id: details\n    access: read-only\n    instructions: Describe each module.\n    tools: [read_file]\n    contract:\n      schema: {{type: object}}\n"
    )
}

/// Killed with SIGKILL while step 2 waits on a stalled provider: the next `runs show` marks the
/// run `interrupted`, and step 1's finished attempt is still in the record.
#[test]
fn sigkill_mid_run_leaves_an_interrupted_run_with_finished_attempts_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer: {json: {modules: [lib, count]}}\n  - answer: {json: {lib: crate root}}\n    delay_ms: 60000\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(&two_steps());
    let mut child = s
        .run_command(&comp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = first_line(child.stdout.as_mut().unwrap());
    assert!(looks_like_run_id(&id), "{id:?}");
    let mut lines = Lines::new(child.stderr.take().unwrap());
    lines.wait_for("step outline succeeded", Duration::from_secs(20));
    lines.wait_for("attempt 1 (initial)", Duration::from_secs(20));
    // Give the request time to reach the stalled simulator.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // The next command to open the store finds the orphan and says so.
    let listed = s.docsfab().args(["runs", "list"]).output().unwrap();
    let note = String::from_utf8_lossy(&listed.stderr);
    assert!(
        note.contains(&format!("run {id} was left running")) && note.contains("interrupted"),
        "{note}"
    );
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "interrupted", "{record:#}");
    assert!(record["endedAt"].is_string());
    let steps = record["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["status"], "succeeded");
    let finished = steps[0]["attempts"].as_array().unwrap();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["status"], "succeeded");
    assert_eq!(steps[0]["output"]["modules"][0], "lib");
    assert_eq!(steps[1]["status"], "interrupted");
    assert_eq!(steps[1]["attempts"].as_array().unwrap().len(), 0);
    let list = s.list_json();
    assert_eq!(list[0]["runId"], id.as_str());
    assert_eq!(list[0]["status"], "interrupted");
}

/// REP-9: SIGINT during an in-turn replay wait (a 429 whose Retry-After asks for 30 s, replay
/// delays at their defaults, so the wait is 20 s) ends the run at once: exit 130, the run, step,
/// attempt and turn recorded `cancelled`, not as a provider failure.
#[test]
fn sigint_during_a_replay_wait_cancels_at_once_with_exit_130() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 429\n    headers: {retry-after: 30}\n",
    );
    let s = Setup::new(&sim.base_url, "");
    let comp = s.composition(ONE_STEP);
    let mut child = s
        .run_command(&comp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = first_line(child.stdout.as_mut().unwrap());
    let mut lines = Lines::new(child.stderr.take().unwrap());
    let line = lines.wait_for("replaying the same request in", Duration::from_secs(20));
    assert!(
        line.contains("HTTP 429") && line.contains("in 20000 ms"),
        "{line}"
    );
    let sent = Instant::now();
    signal(&child, "INT");
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let stderr = lines.rest();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        stderr.contains("SIGINT received: cancelling the run"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("error: run {id} was cancelled")),
        "{stderr}"
    );

    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "cancelled");
    let step = &record["steps"][0];
    assert_eq!(step["status"], "cancelled");
    assert_eq!(step["failure"]["code"], "cancelled");
    let attempt = &step["attempts"][0];
    assert_eq!(attempt["status"], "cancelled");
    assert_eq!(attempt["retryScheduled"], false);
    assert_eq!(attempt["turns"][0]["status"], "cancelled");
}

/// SIGTERM during a step backoff (a stream cut after published text earns a transport retry;
/// DOCSFAB_RETRY_BASE_DELAY_MS=60000 makes its wait 60 s) ends the run at once: exit 130, the
/// finished attempt keeps its scheduled retry and wait, the step is `cancelled`, and no second
/// attempt started.
#[test]
fn sigterm_during_a_step_backoff_cancels_at_once_with_exit_130() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      text: '{\"modules\": [\"li'\n      omit_finish_reason: true\n      omit_done: true\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let mut child = s
        .run_command(&comp)
        .env("DOCSFAB_RETRY_BASE_DELAY_MS", "60000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = first_line(child.stdout.as_mut().unwrap());
    let mut lines = Lines::new(child.stderr.take().unwrap());
    lines.wait_for("attempt 2 starts in", Duration::from_secs(20));
    let sent = Instant::now();
    signal(&child, "TERM");
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let stderr = lines.rest();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "cancelled");
    let step = &record["steps"][0];
    assert_eq!(step["status"], "cancelled");
    let attempts = step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{step:#}");
    assert_eq!(attempts[0]["providerErrorClass"], "stream-incomplete");
    assert_eq!(attempts[0]["retryDecision"], "scheduled");
    assert_eq!(attempts[0]["waitMs"], 60000);
}
