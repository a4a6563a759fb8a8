//! Issue 9, finding 11 and the workspace lock: what a write step's writes become when its
//! process is killed (`kill -9`) or cancelled (SIGINT) mid-attempt, and what a second write run
//! on the same workspace does. Real `docsfab run` processes against `docsfab sim serve`.
//!
//! The scenario has the model write two files in turn 1 (one new, one that existed), then
//! stalls the next request for a minute, so the process is caught right after the writes ran.

mod support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use docsfab_runtime::record::validate_against_schema;
use support::run::{Lines, Setup, Sim, first_line, looks_like_run_id, signal};

const WRITE_THEN_STALL: &str = "responses:
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/new.md, content: draft}}
        - {name: write_file, arguments: {path: docs/old.md, content: rewritten}}
  - answer: {text: done}
    delay_ms: 60000
";

const WRITER: &str = "name: writer
limits:
  timeoutMs: 120000
  maxTurns: 6
steps:
  - id: pages
    access: write
    instructions: Write docs/new.md and update docs/old.md.
    tools: [read_file, write_file]
    writeRoots: [docs/]
";

const OLD: &str = "the page as it was\n";

/// A setup whose workspace already has `docs/old.md`.
fn setup(base_url: &str) -> Setup {
    let s = Setup::new(base_url, "");
    std::fs::create_dir_all(s.workspace().join("docs")).unwrap();
    std::fs::write(s.workspace().join("docs/old.md"), OLD).unwrap();
    s
}

/// Starts the write run and returns once both writes of turn 1 have run.
fn start_writer(s: &Setup) -> (Child, String, Lines) {
    let comp = s.composition(WRITER);
    let mut child = s
        .run_command(&comp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = first_line(child.stdout.as_mut().unwrap());
    assert!(looks_like_run_id(&id), "{id:?}");
    let mut lines = Lines::new(child.stderr.take().unwrap());
    lines.wait_for(
        "turn 1: completed; write_file docs/new.md, write_file docs/old.md",
        Duration::from_secs(30),
    );
    (child, id, lines)
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Finding 11: `kill -9` right after `write_file` ran. The next command that opens the store
/// marks the run `interrupted` and lists, under the step's `interruptedAttempt`, every file the
/// killed attempt began writing; the files are left as they are for the operator to check.
#[test]
fn hardening_kill_9_during_a_write_attempt_lists_its_files_in_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), WRITE_THEN_STALL);
    let s = setup(&sim.base_url);
    let (mut child, id, _lines) = start_writer(&s);
    assert_eq!(
        read(&s.workspace().join("docs/new.md")).as_deref(),
        Some("draft")
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    assert!(shown.status.success());
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains(
            "Attempt 1: interrupted (its process died) after it began 2 writes; not restored, check: docs/new.md, docs/old.md"
        ),
        "{text}"
    );
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "interrupted");
    let step = &record["steps"][0];
    assert_eq!(step["status"], "interrupted");
    assert_eq!(step["attempts"].as_array().unwrap().len(), 0);
    let unfinished = &step["interruptedAttempt"];
    assert_eq!(unfinished["attempt"], 1, "{step:#}");
    let intents = unfinished["writeIntents"].as_array().unwrap();
    let paths: Vec<&str> = intents
        .iter()
        .map(|w| w["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["docs/new.md", "docs/old.md"]);
    assert!(intents.iter().all(|w| w["tool"] == "write_file"));
    // Accounted for, not undone: the files are as the killed attempt left them.
    assert_eq!(
        read(&s.workspace().join("docs/new.md")).as_deref(),
        Some("draft")
    );
    assert_eq!(
        read(&s.workspace().join("docs/old.md")).as_deref(),
        Some("rewritten")
    );
}

/// Finding 11: SIGINT during a write attempt whose writes ran. The run is cancelled (exit 130)
/// and the write settlement restores the workspace: the new file is gone, the rewritten one is
/// back as it was, and the attempt records `write-executed` with `writeRestore: restored`.
#[test]
fn hardening_sigint_during_a_write_attempt_restores_the_workspace() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), WRITE_THEN_STALL);
    let s = setup(&sim.base_url);
    let (child, id, mut lines) = start_writer(&s);
    assert_eq!(
        read(&s.workspace().join("docs/old.md")).as_deref(),
        Some("rewritten")
    );
    signal(&child, "INT");
    let mut child = child;
    let status = child.wait().unwrap();
    let stderr = lines.rest();
    assert_eq!(status.code(), Some(130), "{stderr}");

    assert_eq!(read(&s.workspace().join("docs/new.md")), None);
    assert_eq!(
        read(&s.workspace().join("docs/old.md")).as_deref(),
        Some(OLD)
    );
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "cancelled");
    let attempt = &record["steps"][0]["attempts"][0];
    assert_eq!(attempt["status"], "cancelled");
    assert_eq!(attempt["writeSettlement"], "write-executed");
    assert_eq!(attempt["writeRestore"], "restored", "{attempt:#}");
    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("write settlement: write-executed, workspace restored"),
        "{text}"
    );
}

/// A second write run on a workspace a write run holds is refused at once with one sentence
/// and exit 2, before anything is recorded; a read-only run on it goes ahead; once the holder is
/// gone (even by `kill -9`) the workspace takes a write run again.
#[test]
fn hardening_a_second_write_run_on_a_held_workspace_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), WRITE_THEN_STALL);
    let s = setup(&sim.base_url);
    let (mut holder, _id, _lines) = start_writer(&s);

    let refused = s.run_command(&s.composition(WRITER)).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(refused.stdout.is_empty(), "no run id: nothing was recorded");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the workspace {} is in use by another `docsfab run` with a write step",
            s.workspace().display()
        )),
        "{stderr}"
    );
    assert_eq!(s.list_json().len(), 1, "the refused run left no record");

    // Another home and simulator, the same workspace: first a read-only run, beside the holder.
    let tmp2 = tempfile::tempdir().unwrap();
    let sim2 = Sim::start(
        tmp2.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n  - answer: {text: wrote the page}\n",
    );
    let other = Setup::new(&sim2.base_url, "");
    let in_ws = |composition: &Path| {
        let mut cmd = other.docsfab();
        cmd.arg("run")
            .arg(composition)
            .arg("--workspace")
            .arg(s.workspace());
        cmd
    };
    let reader = in_ws(&other.composition(support::run::ONE_STEP))
        .output()
        .unwrap();
    assert_eq!(
        reader.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&reader.stderr)
    );

    holder.kill().unwrap(); // SIGKILL: the lock goes with the process
    holder.wait().unwrap();
    let writer = in_ws(&other.composition(WRITER)).output().unwrap();
    assert_eq!(
        writer.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&writer.stderr)
    );
}
