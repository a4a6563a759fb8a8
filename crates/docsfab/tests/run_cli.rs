//! `docsfab run` and `docsfab runs list|show` as real processes against `docsfab sim serve` on
//! 127.0.0.1, with a temporary DOCSFAB_HOME and the real SQLite run store.

mod support;

use std::collections::BTreeSet;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::{FAST_CATALOG, KEY_VAR, ONE_STEP, SECRET, Setup, Sim, looks_like_run_id};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// OPS-1, OPS-3, REP-1, REP-13: a run through a 408 and a tool round trip succeeds; the first
/// stdout line is the id alone; the record validates against the schema, shows the replay and is
/// listed; the key is printed nowhere.
#[test]
fn a_run_prints_its_id_first_and_is_recorded_listed_and_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 408\n  - answer:\n      tool_calls: [{name: list_files, arguments: {path: src}}]\n  - answer:\n      json: {modules: [lib, count]}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap().to_owned();
    assert!(looks_like_run_id(&id), "first line: {id:?}");
    assert!(
        stdout.contains("outline (read-only): succeeded"),
        "{stdout}"
    );
    assert!(stderr.contains("HTTP 408 (timeout), replaying"), "{stderr}");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));

    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["runId"], id.as_str());
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["composition"], "small");
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    let turn = &attempts[0]["turns"][0];
    assert_eq!(turn["providerRetries"], 1);
    assert_eq!(turn["replays"][0]["status"], 408);
    assert_eq!(turn["toolBatch"]["executed"], 1);
    assert_eq!(record["steps"][0]["output"]["modules"][1], "count");

    let list = s.list_json();
    assert_eq!(list.len(), 1);
    let keys: BTreeSet<&str> = list[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["runId", "composition", "status", "startedAt", "endedAt"])
    );
    assert_eq!(list[0]["runId"], id.as_str());
    assert_eq!(list[0]["status"], "succeeded");

    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    assert!(shown.status.success());
    let view = text(&shown.stdout);
    assert!(view.contains(&format!("Run {id}: succeeded")), "{view}");
    assert!(
        view.contains("replay 1: HTTP 408 (timeout), waited 10 ms"),
        "{view}"
    );
    assert!(view.contains("retry decision: none"), "{view}");
    assert!(!view.contains(SECRET));
}

/// `--json` prints the id line, then the run record itself (the same as `runs show --json`).
#[test]
fn run_json_prints_the_id_then_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s
        .docsfab()
        .arg("run")
        .arg(&comp)
        .arg("--json")
        .current_dir(s.workspace())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (id, rest) = stdout.split_once('\n').unwrap();
    assert!(looks_like_run_id(id));
    let printed: Value = serde_json::from_str(rest).unwrap();
    validate_against_schema(&printed).unwrap();
    assert_eq!(printed, s.show_json(id));
}

/// REP-3, STP-3: a terminal 400 fails the run: exit 1, one sentence naming the run, the record
/// says `failed` with `retryDecision: terminal`.
#[test]
fn a_failed_run_exits_1_and_is_recorded_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), "responses:\n  - status: 400\n");
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let id = stdout.lines().next().unwrap();
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with(&format!("error: run {id} failed at step outline")),
        "{stderr}"
    );
    let record = s.show_json(id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "failed");
    let a = &record["steps"][0]["attempts"][0];
    assert_eq!(a["httpStatus"], 400);
    assert_eq!(a["retryDecision"], "terminal");
    assert_eq!(a["retryScheduled"], false);
    assert_eq!(record["steps"][0]["attempts"].as_array().unwrap().len(), 1);
}

/// CFG-6: a composition with a retry field is refused before anything runs: exit 2, one sentence
/// naming the field, and no run store is created.
#[test]
fn a_bad_composition_exits_2_and_writes_nothing() {
    // Nothing listens here: the run must not get as far as a request.
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let comp =
        s.composition(&ONE_STEP.replace("  maxTurns: 6\n", "  maxTurns: 6\n  maxRetries: 2\n"));
    let out = s.run_command(&comp).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("maxRetries"), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(!s.store().exists(), "the run store was created");
}

/// A missing composition, a workspace that is not a directory: exit 2, nothing written.
#[test]
fn a_missing_composition_or_workspace_exits_2_and_writes_nothing() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s
        .docsfab()
        .args(["run", "no-such-composition.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no-such-composition.yaml does not exist"));

    let comp = s.composition(ONE_STEP);
    let out = s
        .docsfab()
        .arg("run")
        .arg(&comp)
        .arg("--workspace")
        .arg(s.dir.path().join("missing"))
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--workspace"), "{stderr}");
    assert!(!s.store().exists());
}

/// The provider's key variable unset: exit 2, the sentence names the variable; nothing written.
#[test]
fn a_missing_key_variable_exits_2_naming_the_variable() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).env_remove(KEY_VAR).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(KEY_VAR), "{stderr}");
    assert!(stderr.contains("not set"), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(!s.store().exists());
}

/// CFG-1: a limit variable out of range is refused at startup, before the store is opened.
#[test]
fn an_out_of_range_limit_variable_exits_2_before_the_store_opens() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let comp = s.composition(ONE_STEP);
    let out = s
        .run_command(&comp)
        .env("DOCSFAB_READ_ONLY_MAX_RETRIES", "4")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("DOCSFAB_READ_ONLY_MAX_RETRIES"), "{stderr}");
    assert!(!s.store().exists());
}

/// `runs show` of an unknown id is exit 2 with a sentence; `runs list` of an empty home lists
/// nothing and creates nothing.
#[test]
fn runs_show_unknown_id_exits_2_and_list_of_nothing_is_empty() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s
        .docsfab()
        .args(["runs", "show", "run-nope"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("run-nope") && stderr.contains("docsfab runs list"));

    assert!(s.list_json().is_empty());
    let out = s.docsfab().args(["runs", "list"]).output().unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("No runs yet"));
    assert!(!s.store().exists());
}

/// The same run against an Anthropic Messages provider: a 529 replayed, then the answer.
#[test]
fn a_run_against_an_anthropic_messages_provider_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 529\n  - answer: {json: {modules: [lib]}}\n",
    );
    let s = Setup::with_api("anthropic-messages", &sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    let turn = &record["steps"][0]["attempts"][0]["turns"][0];
    assert_eq!(turn["replays"][0]["status"], 529);
    assert_eq!(turn["replays"][0]["providerErrorClass"], "server");
}

/// The job deadline (`runtime.deadlineMilliseconds`, lowered in host.yaml) cancels a run whose
/// provider stalls: exit 130, the sentence and the step failure name the deadline.
#[test]
fn the_job_deadline_cancels_the_run_with_exit_130() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n    delay_ms: 30000\n",
    );
    let s = Setup::new(
        &sim.base_url,
        &format!("{FAST_CATALOG}  runtime.deadlineMilliseconds: 300\n"),
    );
    let comp = s.composition(ONE_STEP);
    let started = std::time::Instant::now();
    let out = s.run_command(&comp).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        stderr.contains("cancelled by the job deadline (runtime.deadlineMilliseconds = 300 ms)"),
        "{stderr}"
    );
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "cancelled");
    assert_eq!(record["steps"][0]["failure"]["code"], "job-deadline");
}
