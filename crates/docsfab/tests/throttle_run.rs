//! Issue 12: the shared provider throttle in real runs. Real `docsfab sim serve` and real
//! `docsfab run` processes on one DOCSFAB_HOME; every claim is read from the simulator's request
//! log (`--log`, `time_unix_ms` = when the simulator had read the request), as orderings and
//! counts relative to the scenario's own Retry-After and delays, never as a wall-clock budget.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::run::{SECRET, Setup, Sim, docsfab};

/// The Retry-After of the scripted 429, in ms: the hold every sender must keep.
const HOLD_MS: u64 = 4000;
/// A request the simulator read this close to the 429 may have left before the 429 reached
/// the client (it was in flight, and in-flight requests go on); the hold's own end is exact,
/// so this slack is only for the scheduling of the test machine.
const RACE_MS: u64 = 250;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// (time_unix_ms, entry) of every request the simulator logged, in log order.
fn log(path: &Path) -> Vec<(u64, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                v["time_unix_ms"].as_u64().unwrap(),
                v["entry"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// When the simulator read the request that got the scripted 429.
fn time_of(entries: &[(u64, String)], entry: &str) -> u64 {
    entries
        .iter()
        .find(|(_, e)| e == entry)
        .unwrap_or_else(|| panic!("no {entry:?} in the log: {entries:?}"))
        .0
}

/// An outline step, then a write fan-out step whose instances each answer in one turn; the
/// instance's marker `[NAME]` picks its lane in the simulator.
fn fan(concurrency: u32) -> String {
    format!(
        r#"name: fan
limits:
  timeoutMs: 60000
steps:
  - id: outline
    access: read-only
    instructions: List the modules.
    contract:
      schema: {{type: object, required: [modules]}}
  - id: pages
    access: write
    forEach: steps.outline.output.modules
    concurrency: {concurrency}
    instructions: "Write the page about [{{{{item.name}}}}]."
    tools: [write_file]
    writeRoots: [docs/]
"#
    )
}

/// A scenario: the outline names `names`; lane `hot` (if named) answers its first request with
/// a 429 carrying Retry-After [`HOLD_MS`], every other lane answers after `delay_ms`.
fn storm_scenario(names: &[&str], delay_ms: u64) -> String {
    let modules: Vec<String> = names.iter().map(|n| format!("{{name: {n}}}")).collect();
    let mut s = format!(
        "responses:\n  - answer: {{json: {{modules: [{}]}}}}\nlanes:\n",
        modules.join(", ")
    );
    for n in names {
        s.push_str(&format!("  - contains: \"[{n}]\"\n    responses:\n"));
        if *n == "hot" {
            s.push_str(&format!(
                "      - status: 429\n        headers: {{retry-after-ms: {HOLD_MS}}}\n"
            ));
        }
        s.push_str(&format!(
            "      - answer: {{text: done {n}}}\n        delay_ms: {delay_ms}\n"
        ));
    }
    s
}

/// Runs `comp` to its end; returns (exit code, stdout, stderr).
fn run(s: &Setup, comp: &Path) -> (Option<i32>, String, String) {
    let out = s.run_command(comp).output().unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// Requests the simulator read inside the hold (after the race slack), other than the 429
/// itself.
fn sent_during_hold(entries: &[(u64, String)], t429: u64) -> Vec<(u64, String)> {
    entries
        .iter()
        .filter(|(t, _)| *t > t429 + RACE_MS && *t < t429 + HOLD_MS)
        .cloned()
        .collect()
}

/// Runs the 429 storm; returns the setup, the simulator's log, the run's stderr followed by
/// `runs show`, and the record.
fn storm(throttle: &str) -> (Setup, Vec<(u64, String)>, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("requests.jsonl");
    let names = ["hot", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"];
    let sim = Sim::start_logging(tmp.path(), &storm_scenario(&names, 300), &log_path);
    let s = Setup::new(&sim.base_url, throttle);
    let comp = s.composition(&fan(4));
    let (code, stdout, stderr) = run(&s, &comp);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
    let id = stdout.lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    assert!(shown.status.success());
    drop(sim);
    let stderr = format!("{stderr}\n--- runs show ---\n{}", text(&shown.stdout));
    (s, log(&log_path), stderr, record.to_string())
}

#[test]
fn issue12_a_429_in_a_fan_out_holds_every_instance_until_its_retry_after() {
    let (_s, entries, stderr, record) = storm("");
    let record: Value = serde_json::from_str(&record).unwrap();
    let t429 = time_of(&entries, "lanes[0] responses[0]");
    let during = sent_during_hold(&entries, t429);
    assert!(
        during.is_empty(),
        "requests sent during the hold: {during:?} (429 read at {t429})"
    );
    // Work went on after the hold: every instance was answered.
    let answered = entries
        .iter()
        .filter(|(_, e)| e.starts_with("lanes[") && e.ends_with("responses[0]"))
        .count();
    assert_eq!(answered, 12, "{entries:?}");
    assert!(
        entries
            .iter()
            .any(|(t, e)| e.starts_with("lanes[") && *t >= t429 + HOLD_MS),
        "{entries:?}"
    );
    // A hold is not a replay: only the 429's own turn replayed, and the holds are recorded.
    let turns: Vec<&Value> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["attempts"].as_array().unwrap())
        .flat_map(|a| a["turns"].as_array().unwrap())
        .collect();
    let replays: u64 = turns
        .iter()
        .map(|t| t["providerRetries"].as_u64().unwrap())
        .sum();
    assert_eq!(replays, 1, "{record}");
    assert!(record["heldMs"].as_u64().unwrap() > 0, "{record}");
    let steps_held: u64 = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["heldMs"].as_u64().unwrap())
        .sum();
    assert_eq!(steps_held, record["heldMs"].as_u64().unwrap());
    assert!(
        stderr.contains("by the provider throttle (hold)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("provider retries; held "),
        "runs show names the hold: {stderr}"
    );
}

#[test]
fn issue12_throttle_off_sends_during_a_429_hold_as_before() {
    let (_s, entries, stderr, record) = storm("    throttle: off\n");
    let record: Value = serde_json::from_str(&record).unwrap();
    let t429 = time_of(&entries, "lanes[0] responses[0]");
    let during = sent_during_hold(&entries, t429);
    assert!(
        !during.is_empty(),
        "throttle: off sent nothing during the Retry-After of another request: {entries:?}"
    );
    assert_eq!(record["heldMs"], 0, "{record}");
    assert!(!stderr.contains("provider throttle"), "{stderr}");
}

#[test]
fn issue12_max_concurrent_requests_2_keeps_at_most_2_requests_in_flight() {
    const DELAY_MS: u64 = 400;
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("requests.jsonl");
    let names = ["a", "b", "c", "d", "e", "f"];
    let sim = Sim::start_logging(tmp.path(), &storm_scenario(&names, DELAY_MS), &log_path);
    let s = Setup::new(&sim.base_url, "    maxConcurrentRequests: 2\n");
    let comp = s.composition(&fan(6));
    let (code, stdout, stderr) = run(&s, &comp);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    let mut times: Vec<u64> = log(&log_path)
        .into_iter()
        .filter(|(_, e)| e.starts_with("lanes["))
        .map(|(t, _)| t)
        .collect();
    times.sort_unstable();
    assert_eq!(times.len(), 6, "{times:?}");
    // Each answer takes DELAY_MS after it was read, and a third request can only leave when
    // one of the two before it has been answered: request i+2 is read at least DELAY_MS after
    // request i (1 ms for the log's rounding).
    for w in times.windows(3) {
        assert!(
            w[2] + 1 >= w[0] + DELAY_MS,
            "three requests in flight at once: {times:?}"
        );
    }
}

/// `docsfab run COMPOSITION --workspace WS` on `s`'s home, with its own workspace.
fn run_in(s: &Setup, comp: &Path, ws: &Path) -> Command {
    std::fs::create_dir_all(ws).unwrap();
    let mut cmd = docsfab(&s.home());
    cmd.arg("run").arg(comp).arg("--workspace").arg(ws);
    cmd
}

fn one_step(marker: &str) -> String {
    format!(
        "name: {marker}\nlimits:\n  timeoutMs: 60000\nsteps:\n  - id: pages\n    access: write\n    instructions: Write the page about [{marker}].\n    tools: [write_file]\n    writeRoots: [docs/]\n"
    )
}

/// Waits until the simulator logged `entry`; panics after a minute.
fn wait_for_entry(path: &Path, entry: &str) -> u64 {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((t, _)) = log(path).into_iter().find(|(_, e)| e == entry) {
            return t;
        }
        assert!(Instant::now() < end, "{entry:?} never logged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

/// Two processes on one DOCSFAB_HOME: the first gets a 429; the second, started after it,
/// sends nothing until the first's Retry-After has passed (or, with `throttle: off`, at once).
fn two_processes(throttle: &str) -> (u64, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let log_path = tmp.path().join("requests.jsonl");
    let scenario = format!(
        "responses:\n  - answer: {{text: unused}}\nlanes:\n  - contains: \"[first]\"\n    responses:\n      - status: 429\n        headers: {{retry-after-ms: {HOLD_MS}}}\n      - answer: {{text: done}}\n  - contains: \"[second]\"\n    responses:\n      - answer: {{text: done}}\n"
    );
    let sim = Sim::start_logging(tmp.path(), &scenario, &log_path);
    let s = Setup::new(&sim.base_url, throttle);
    let first_comp = tmp.path().join("first.yaml");
    std::fs::write(&first_comp, one_step("first")).unwrap();
    let second_comp = tmp.path().join("second.yaml");
    std::fs::write(&second_comp, one_step("second")).unwrap();
    let quiet = |mut c: Command| {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let first = quiet(run_in(&s, &first_comp, &tmp.path().join("ws1")));
    let t429 = wait_for_entry(&log_path, "lanes[0] responses[0]");
    let second = quiet(run_in(&s, &second_comp, &tmp.path().join("ws2")));
    finish(second);
    finish(first);
    drop(sim);
    (t429, time_of(&log(&log_path), "lanes[1] responses[0]"))
}

#[test]
fn issue12_two_processes_on_one_home_share_the_hold_of_a_429() {
    let (t429, second) = two_processes("");
    // The hold ends HOLD_MS after the client read the 429, which is after the simulator logged
    // it; 1 ms for the log's rounding.
    assert!(
        second + 1 >= t429 + HOLD_MS,
        "the second process sent at {second}, inside the first's hold from {t429}"
    );
}

#[test]
fn issue12_two_processes_with_throttle_off_do_not_share_a_hold() {
    let (t429, second) = two_processes("    throttle: off\n");
    assert!(
        second < t429 + HOLD_MS,
        "the second process waited for another's 429 with throttle: off ({t429} -> {second})"
    );
}

/// A throttle file that cannot be opened does not stop a run: one warning line naming it, and
/// the run goes on unthrottled (the file holds only soft state).
#[test]
fn issue12_an_unusable_throttle_file_is_one_warning_and_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), &storm_scenario(&["a"], 0));
    let s = Setup::new(&sim.base_url, "");
    // A directory where the SQLite file should be: it cannot be opened as a database.
    std::fs::create_dir_all(s.home().join("throttle.db")).unwrap();
    let comp = s.composition(&fan(1));
    let (code, stdout, stderr) = run(&s, &comp);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("throttle.db"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("warning: ") && warnings[0].contains("go unthrottled"),
        "{stderr}"
    );
}
