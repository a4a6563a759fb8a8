//! Issue 9, finding 3: many `docsfab run` processes on one DOCSFAB_HOME. Twenty real runs
//! against one `docsfab sim serve` in a 429/503 storm (waits scaled down to milliseconds) write
//! to one run store at once while `docsfab runs list` reads it. Every run must exit 0, every
//! `runs list` must succeed, and every attempt a run started must be in its record.
//!
//! Each run surveys (read-only) and then writes a page (write step, so each run has a workspace
//! of its own: a write run locks its workspace). The writes add write intents to the store
//! traffic, and a stream cut after a write costs a restore and a retry.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use docsfab_runtime::record::validate_against_schema;
use support::run::{FAST_CATALOG, Lines, Setup, Sim, first_line, looks_like_run_id};

const RUNS: usize = 20;

/// A storm that cycles for every client: throttles and overloads the in-turn replay absorbs, a
/// stream cut mid-answer that costs a step transport retry (so runs record several attempts),
/// and a write tool call (refused in the read-only step, run in the write step). One answer in
/// five is cut, so no run plausibly exhausts its transport budget.
const STORM: &str = "responses:
  - status: 429
    headers: {retry-after-ms: 5}
  - status: 503
  - answer:
      text: '{\"modules\": [\"li'
      omit_finish_reason: true
      omit_done: true
  - answer: {json: {modules: [lib, count]}}
  - answer:
      tool_calls: [{name: write_file, arguments: {path: docs/page.md, content: a page}}]
  - status: 503
  - answer: {json: {modules: [lib]}}
  - status: 429
  - answer: {json: {modules: [count]}}
  - answer:
      tool_calls: [{name: write_file, arguments: {path: docs/other.md, content: another}}]
fallback: cycle
";

/// Survey, then write.
const SURVEY_AND_WRITE: &str = "name: survey-and-write
limits:
  timeoutMs: 60000
  maxTurns: 12
steps:
  - id: outline
    access: read-only
    instructions: Survey src/ and return an object with a modules array.
    tools: [list_files, read_file]
    contract:
      schema: {type: object, required: [modules]}
  - id: pages
    access: write
    instructions: Write a page per module under docs/.
    tools: [read_file, write_file]
    writeRoots: [docs/]
";

struct Running {
    child: Child,
    id: String,
    lines: Lines,
}

#[test]
fn hardening_concurrent_runs_on_one_store_lose_no_attempt() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STORM);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(SURVEY_AND_WRITE);

    // Readers hammer the store while the runs go, from the moment the first run starts.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = list_until_stopped(s.home(), Arc::clone(&stop));

    let mut runs = start_runs(&s, tmp.path(), &comp);
    for r in &mut runs {
        r.id = first_line(r.child.stdout.as_mut().unwrap());
    }
    let mut failed_runs = Vec::new();
    let mut outcomes = Vec::new();
    for r in &mut runs {
        let status = r.child.wait().unwrap();
        let stderr = r.lines.rest();
        if status.code() != Some(0) || !looks_like_run_id(&r.id) {
            failed_runs.push(format!("{:?} {:?}: {stderr}", r.id, status.code()));
        }
        outcomes.push((r.id.clone(), stderr));
    }
    stop.store(true, Ordering::SeqCst);
    let (calls, list_failures) = reader.join().unwrap();
    assert!(
        failed_runs.is_empty() && list_failures.is_empty(),
        "{} of {RUNS} runs did not exit 0, {} of {calls} `runs list` calls failed:\n{}\n---\n{}",
        failed_runs.len(),
        list_failures.len(),
        failed_runs.join("\n---\n"),
        list_failures.join("\n")
    );

    // Every attempt a run announced on stderr is in its record, numbered 1..n per step.
    let mut total_attempts = 0;
    let mut restored = 0;
    for (id, stderr) in &outcomes {
        let (recorded, restores) = attempts_announced_and_recorded(&s, id, stderr);
        total_attempts += recorded;
        restored += restores;
    }
    let listed = s.list_json();
    assert_eq!(listed.len(), RUNS);
    assert!(listed.iter().all(|r| r["status"] == "succeeded"));
    // The storm made some runs retry a step: more attempts than steps.
    assert!(total_attempts > 2 * RUNS, "{total_attempts} attempts");
    eprintln!(
        "{RUNS} runs, {total_attempts} attempts ({restored} write restores before a retry), {calls} `runs list` calls"
    );
}

/// `docsfab runs list --json` in `home`, over and over until `stop` (and at least 60 times): how
/// many calls were made and the stderr of each that failed.
fn list_until_stopped(home: PathBuf, stop: Arc<AtomicBool>) -> JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let mut failures = Vec::new();
        let mut calls = 0;
        while !stop.load(Ordering::SeqCst) || calls < 60 {
            let out = support::run::docsfab(&home)
                .args(["runs", "list", "--json"])
                .output()
                .unwrap();
            calls += 1;
            if !out.status.success() {
                failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
            }
        }
        (calls, failures)
    })
}

/// Starts the `RUNS` runs of `comp` at once, each in a workspace of its own under `dir`.
fn start_runs(s: &Setup, dir: &Path, comp: &Path) -> Vec<Running> {
    (0..RUNS)
        .map(|i| {
            let ws = dir.join(format!("ws{i}"));
            std::fs::create_dir_all(ws.join("src")).unwrap();
            std::fs::write(ws.join("src/lib.rs"), "pub mod count;\n").unwrap();
            let mut child = s
                .docsfab()
                .arg("run")
                .arg(comp)
                .arg("--workspace")
                .arg(&ws)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let stderr = child.stderr.take().unwrap();
            Running {
                child,
                id: String::new(),
                lines: Lines::new(stderr),
            }
        })
        .collect()
}

/// Checks that every attempt run `id` announced on `stderr` is in its (valid, succeeded)
/// record, numbered 1..n per step; how many attempts it recorded and how many of them restored
/// a write.
fn attempts_announced_and_recorded(s: &Setup, id: &str, stderr: &str) -> (usize, usize) {
    let started = stderr
        .lines()
        .filter(|l| {
            // "  attempt 2 (transport budget)": an attempt starting.
            let words: Vec<&str> = l.split_whitespace().collect();
            words.len() >= 3 && words[0] == "attempt" && words[2].starts_with('(')
        })
        .count();
    let record = s.show_json(id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    let steps = record["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{record:#}");
    let mut recorded = 0;
    let mut restored = 0;
    for step in steps {
        let attempts = step["attempts"].as_array().unwrap();
        for (i, a) in attempts.iter().enumerate() {
            assert_eq!(a["attempt"], i + 1);
            restored += usize::from(a["writeRestore"] == "restored");
        }
        assert_eq!(attempts.last().unwrap()["status"], "succeeded");
        recorded += attempts.len();
    }
    assert_eq!(recorded, started, "run {id}: {stderr}\n{record:#}");
    (recorded, restored)
}
