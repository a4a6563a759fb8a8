//! Durable runs through the real CLI (issue 22): `docsfab run --reuse` against `docsfab sim
//! serve` with its request log, `docsfab runs resume` after `kill -9` of a fan-out (on SQLite,
//! and on PostgreSQL when `DOCSFAB_TEST_POSTGRES` is set), and the refusals of a resume.

mod support;

use std::path::Path;
use std::time::Duration;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::{FAST_CATALOG, Setup, Sim};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// An outline that lists src/, and one page per module that reads its source and writes it.
fn composition(concurrency: u32) -> String {
    format!(
        r#"name: pages
limits:
  timeoutMs: 60000
steps:
  - id: outline
    access: read-only
    instructions: List the modules under src/.
    tools: [list_files]
    contract:
      schema: {{type: object, required: [modules]}}
  - id: pages
    access: write
    forEach: steps.outline.output.modules
    concurrency: {concurrency}
    instructions: "Read src/{{{{item.name}}}}.rs and write docs/{{{{item.name}}}}.md about [{{{{item.name}}}}]."
    tools: [read_file, write_file]
    writeRoots: [docs/]
"#
    )
}

/// The simulator's script: the outline lists src/ then answers the modules; each page's lane
/// reads its source, writes its page, and ends, each answer after `delay_ms`.
fn scenario(names: &[String], delay_ms: u64) -> String {
    let modules: Vec<String> = names.iter().map(|n| format!("{{name: {n}}}")).collect();
    let mut s = format!(
        "responses:\n  - answer: {{tool_calls: [{{id: l, name: list_files, arguments: {{path: src}}}}]}}\n  - answer: {{json: {{modules: [{}]}}}}\nlanes:\n",
        modules.join(", ")
    );
    for n in names {
        s.push_str(&format!(
            "  - contains: \"[{n}]\"\n    responses:\n      - answer: {{tool_calls: [{{id: r, name: read_file, arguments: {{path: src/{n}.rs}}}}]}}\n        delay_ms: {delay_ms}\n      - answer: {{tool_calls: [{{id: w, name: write_file, arguments: {{path: docs/{n}.md, content: \"page {n}\"}}}}]}}\n        delay_ms: {delay_ms}\n      - answer: {{text: done {n}}}\n        delay_ms: {delay_ms}\n"
        ));
    }
    s
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i:02}")).collect()
}

/// The `entry` of every request in the simulator's log.
fn entries(log: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["entry"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// A workspace with one source file per module.
fn seed(s: &Setup, names: &[String]) {
    for n in names {
        std::fs::write(
            s.workspace().join(format!("src/{n}.rs")),
            format!("pub fn {n}() {{}}\n"),
        )
        .unwrap();
    }
}

fn run(s: &Setup, comp: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = s.run_command(comp).args(extra).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn resume(s: &Setup, id: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = s
        .docsfab()
        .args(["runs", "resume", id])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn issue22_reuse_on_an_unchanged_tree_sends_no_request_and_a_one_file_edit_reruns_only_its_reader()
{
    let tmp = tempfile::tempdir().unwrap();
    let mods: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
    let first_log = tmp.path().join("first.jsonl");
    let sim = Sim::start_logging(tmp.path(), &scenario(&mods, 0), &first_log);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    seed(&s, &mods);
    let comp = s.composition(&composition(2));
    let (code, stdout, stderr) = run(&s, &comp, &[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let first = stdout.lines().next().unwrap().to_owned();
    drop(sim);
    assert_eq!(entries(&first_log).len(), 2 + 3 * 3);

    // Unchanged tree: every step is reused, no request reaches the provider.
    let dir = tmp.path().join("second");
    std::fs::create_dir(&dir).unwrap();
    let second_log = dir.join("second.jsonl");
    let sim = Sim::start_logging(&dir, &scenario(&mods, 0), &second_log);
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = run(&s, &comp, &["--reuse"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    assert_eq!(entries(&second_log), Vec::<String>::new(), "{stderr}");
    let second = stdout.lines().next().unwrap().to_owned();
    let record = s.show_json(&second);
    validate_against_schema(&record).unwrap();
    for step in record["steps"].as_array().unwrap() {
        assert_eq!(step["status"], "succeeded", "{step}");
        assert_eq!(step["reusedFrom"]["runId"], first.as_str(), "{step}");
        assert_eq!(step["attempts"].as_array().unwrap().len(), 0, "{step}");
    }
    assert_eq!(
        record["steps"][2]["filesWritten"][0]["path"],
        "docs/beta.md"
    );
    assert!(stderr.contains("step pages[1] reused from run"), "{stderr}");

    // One source edited: only the instance that read it runs again.
    std::fs::write(
        s.workspace().join("src/beta.rs"),
        "pub fn beta() { changed() }\n",
    )
    .unwrap();
    let dir = tmp.path().join("third");
    std::fs::create_dir(&dir).unwrap();
    let third_log = dir.join("third.jsonl");
    let sim = Sim::start_logging(&dir, &scenario(&mods, 0), &third_log);
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = run(&s, &comp, &["--reuse"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    let sent = entries(&third_log);
    assert_eq!(sent.len(), 3, "only beta's three turns: {sent:?}");
    assert!(sent.iter().all(|e| e.starts_with("lanes[1]")), "{sent:?}");
    let record = s.show_json(stdout.lines().next().unwrap());
    let steps = record["steps"].as_array().unwrap();
    assert!(steps[2]["reusedFrom"].is_null(), "{}", steps[2]);
    assert_eq!(steps[2]["attempts"].as_array().unwrap().len(), 1);
    // Reused from the run that last ran them, which is the second run's source: the first.
    assert_eq!(steps[1]["reusedFrom"]["runId"], first.as_str());
}

#[test]
fn issue22_a_changed_file_refuses_a_resume_naming_it_and_rerun_changed_runs_it_again() {
    changed_file_refuses_a_resume(None);
}

#[test]
fn issue22_the_same_resume_on_a_postgresql_store() {
    let Some(db) = docsfab_pg::testing::fresh_database("resume_cli") else {
        return;
    };
    changed_file_refuses_a_resume(Some(db.url.as_str()));
}

fn changed_file_refuses_a_resume(store: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let mods: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
    // gamma's lane fails for good: its page fails and the run fails after alpha and beta.
    let broken = scenario(&mods, 0).replace(
        "      - answer: {tool_calls: [{id: r, name: read_file, arguments: {path: src/gamma.rs}}]}\n",
        "      - status: 400\n        body: '{\"error\": {\"message\": \"bad\", \"type\": \"invalid_request_error\"}}'\n      - answer: {tool_calls: [{id: r, name: read_file, arguments: {path: src/gamma.rs}}]}\n",
    );
    let sim = Sim::start(tmp.path(), &broken);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    if let Some(url) = store {
        s.use_store(url);
    }
    seed(&s, &mods);
    let comp = s.composition(&composition(1));
    let (code, stdout, stderr) = run(&s, &comp, &[]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let failed = stdout.lines().next().unwrap().to_owned();
    drop(sim);

    std::fs::write(
        s.workspace().join("src/alpha.rs"),
        "pub fn alpha() { edited() }\n",
    )
    .unwrap();
    let (code, stdout, stderr) = resume(&s, &failed, &[]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("src/alpha.rs (step pages[0])"), "{stderr}");
    assert!(stderr.contains("--rerun-changed"), "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(s.list_json().len(), 1, "a refused resume records nothing");

    let dir = tmp.path().join("again");
    std::fs::create_dir(&dir).unwrap();
    let log = dir.join("requests.jsonl");
    let sim = Sim::start_logging(&dir, &scenario(&mods, 0), &log);
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = resume(&s, &failed, &["--rerun-changed"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    let sent = entries(&log);
    // alpha (changed) and gamma (failed) run; outline and beta are carried over.
    assert_eq!(sent.len(), 6, "{sent:?}");
    assert!(
        sent.iter()
            .all(|e| e.starts_with("lanes[0]") || e.starts_with("lanes[2]")),
        "{sent:?}"
    );
    let record = s.show_json(stdout.lines().next().unwrap());
    validate_against_schema(&record).unwrap();
    assert_eq!(record["resumedFrom"]["runId"], failed.as_str());
    assert_eq!(record["steps"][2]["reusedFrom"]["stepId"], "pages[1]");
    // The lineage in `runs list`, both forms, and in `runs show`.
    assert_eq!(s.list_json()[0]["resumedFrom"]["runId"], failed.as_str());
    let table = s.docsfab().args(["runs", "list"]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains(&format!("(resumes {failed})")), "{table}");
    let resumed_id = record["runId"].as_str().unwrap();
    let shown = s
        .docsfab()
        .args(["runs", "show", resumed_id])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains(&format!("resumed from run {failed}")),
        "{shown}"
    );
    assert!(shown.contains("reused from run"), "{shown}");

    // A succeeded run has nothing to resume.
    let done = stdout.lines().next().unwrap().to_owned();
    let (code, _, stderr) = resume(&s, &done, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("succeeded, so there is nothing to resume"),
        "{stderr}"
    );
    if store.is_some() {
        assert!(!s.store().exists(), "a PostgreSQL run wrote runs.db");
    }
}

#[test]
fn issue22_kill_9_of_a_40_instance_fan_out_then_resume_finishes_each_instance_exactly_once() {
    kill_9_then_resume(None);
}

/// The same on a PostgreSQL store: the killed run's owner is a worker whose heartbeat stops,
/// so the run is marked interrupted once the heartbeat is stale (five beats, 1 s here).
#[test]
fn issue22_the_same_kill_9_and_resume_on_a_postgresql_store() {
    let Some(db) = docsfab_pg::testing::fresh_database("resume_cli_kill") else {
        return;
    };
    kill_9_then_resume(Some(db.url.as_str()));
}

/// Beat every 200 ms on PostgreSQL: a killed run is found after about a second.
const HEARTBEAT_MS: &str = "200";

/// `docsfab runs list --json` judging heartbeats as the killed run's process beat, until the
/// newest run is no longer running; its id.
fn wait_interrupted(s: &Setup) -> String {
    let started = std::time::Instant::now();
    loop {
        let runs = s.list_json_judging(Some(HEARTBEAT_MS));
        let newest = &runs[0];
        if newest["status"] != "running" || started.elapsed() > Duration::from_secs(60) {
            return newest["runId"].as_str().unwrap().to_owned();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kill_9_then_resume(store: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let mods = names(40);
    let first_log = tmp.path().join("first.jsonl");
    let sim = Sim::start_logging(tmp.path(), &scenario(&mods, 15), &first_log);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    if let Some(url) = store {
        s.use_store(url);
    }
    seed(&s, &mods);
    let comp = s.composition(&composition(8));
    let mut child = s
        .run_command(&comp)
        .env("DOCSFAB_HEARTBEAT_MS", HEARTBEAT_MS)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Somewhere in the fan-out: after a varying number of instance requests.
    let seed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let kill_after = 10 + seed_ms % 60;
    let started = std::time::Instant::now();
    while entries(&first_log).len() < kill_after && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    drop(sim);
    let first = wait_interrupted(&s);
    let killed = s.show_json(&first);
    assert_eq!(killed["status"], "interrupted", "{killed}");
    let finished: Vec<String> = succeeded_ids(&killed);

    let dir = tmp.path().join("resume");
    std::fs::create_dir(&dir).unwrap();
    let log = dir.join("requests.jsonl");
    let sim = Sim::start_logging(&dir, &scenario(&mods, 0), &log);
    s.repoint(&sim.base_url);
    // A kill mid-write may leave a page its record cannot account for: the operator accepts it.
    let (code, stdout, stderr) = resume(&s, &first, &["--accept-workspace"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    let resumed = s.show_json(stdout.lines().next().unwrap());
    validate_against_schema(&resumed).unwrap();
    assert_eq!(resumed["resumedFrom"]["runId"], first.as_str());

    // Across the two records every instance succeeded exactly once by running.
    let ran_again = succeeded_ids(&resumed);
    for id in std::iter::once("outline".to_owned()).chain((0..40).map(|i| format!("pages[{i}]"))) {
        let times = finished.iter().filter(|f| **f == id).count()
            + ran_again.iter().filter(|f| **f == id).count();
        assert_eq!(times, 1, "{id}: {finished:?} then {ran_again:?}");
    }
    // The resume sent only the requests of the instances the killed run did not finish.
    let sent = entries(&log);
    let expected: usize = ran_again
        .iter()
        .map(|id| if id == "outline" { 2 } else { 3 })
        .sum();
    assert_eq!(sent.len(), expected, "{sent:?}");
    for (i, n) in mods.iter().enumerate() {
        let page = std::fs::read_to_string(s.workspace().join(format!("docs/{n}.md"))).unwrap();
        assert_eq!(page, format!("page {n}"), "page {i}");
    }
    if store.is_some() {
        assert!(!s.store().exists(), "a PostgreSQL run wrote runs.db");
    }
}

/// The steps of a record that succeeded by running (not carried over).
fn succeeded_ids(record: &Value) -> Vec<String> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "succeeded" && s["reusedFrom"].is_null())
        .map(|s| s["stepId"].as_str().unwrap().to_owned())
        .collect()
}
