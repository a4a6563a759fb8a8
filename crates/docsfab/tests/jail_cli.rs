//! Issue 9, finding 7 end to end: `docsfab run` as a real process against `docsfab sim serve`,
//! where the scripted model asks write_file for names the filesystem cannot hold, is told so as
//! a tool error, then writes a good file and the step succeeds.

mod support;

use docsfab_runtime::record::validate_against_schema;
use support::run::{FAST_CATALOG, Setup, Sim};

const WRITE_STEP: &str = "name: jail\nlimits:\n  timeoutMs: 60000\n  maxTurns: 6\nsteps:\n  - id: pages\n    access: write\n    instructions: Write the docs under docs/.\n    tools: [read_file, write_file]\n    writeRoots: [docs/]\n";

#[test]
fn hardening_write_file_with_an_unholdable_name_is_a_tool_error_and_the_step_recovers() {
    let long = format!("docs/{}.md", "a".repeat(300));
    let deep = format!("docs/{}x.md", "dd/".repeat(2_000));
    let scenario = format!(
        "responses:\n  - answer:\n      tool_calls: [{{id: w1, name: write_file, arguments: {{path: \"{long}\", content: \"# Long\\n\"}}}}]\n  - answer:\n      tool_calls: [{{id: w2, name: write_file, arguments: {{path: \"{deep}\", content: \"# Deep\\n\"}}}}]\n  - answer:\n      tool_calls: [{{id: w3, name: write_file, arguments: {{path: docs/overview.md, content: \"# Overview\\n\"}}}}]\n  - answer:\n      text: Wrote docs/overview.md.\n"
    );
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), &scenario);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    std::fs::create_dir_all(s.workspace().join("docs")).unwrap();
    let comp = s.composition(WRITE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Before the fix: exit 1, "host preflight failed: could not snapshot docs/aaa…: File name
    // too long (os error 36); not retried (rule default-terminal)".
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("pages (write): succeeded"), "{stdout}");

    let id = stdout.lines().next().unwrap();
    let record = s.show_json(id);
    validate_against_schema(&record).unwrap();
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "no retry was needed");
    let a = &attempts[0];
    assert_eq!(a["lease"]["stopReason"], "answered");
    assert_eq!(a["lease"]["toolCounters"]["write_file"], 1);
    let call = |turn: usize| &a["turns"][turn]["toolBatch"]["calls"][0];
    assert_eq!(call(0)["outcome"], "refused");
    let detail = call(0)["detail"].as_str().unwrap();
    assert!(
        detail.contains("has a name of 303 bytes, but a file or directory name holds at most 255"),
        "{detail}"
    );
    assert!(!detail.contains(&"a".repeat(100)), "the name is shown cut");
    assert_eq!(call(1)["outcome"], "refused");
    let detail = call(1)["detail"].as_str().unwrap();
    assert!(detail.contains("use a shorter path"), "{detail}");
    assert_eq!(call(2)["outcome"], "executed");
    assert_eq!(call(2)["result"], "ok");

    // Only the good file is in docs/: no directory of the deep path was left behind.
    let docs: Vec<String> = std::fs::read_dir(s.workspace().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(docs, ["overview.md"]);
    assert_eq!(
        std::fs::read_to_string(s.workspace().join("docs/overview.md")).unwrap(),
        "# Overview\n"
    );
}
