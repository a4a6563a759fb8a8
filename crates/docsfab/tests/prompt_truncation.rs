//! Issue 31: a server that cut a large prompt to its context and answered 200 anyway (Ollama's
//! way) is flagged. The simulator reports 512 prompt tokens for a request of about 40 KB; the
//! turn records a `prompt-truncated` warning, which the progress line, `runs show` and the
//! HTML report's record carry, and the step still succeeds on its first attempt (a warning
//! decides nothing). The simulator's own count (bytes / 4) raises none.

mod support;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::{FAST_CATALOG, Setup, Sim};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A write step without tools whose instructions are about 40 KB of prose.
fn composition() -> String {
    let line = "Describe the crate for a new contributor, plainly and briefly. ";
    let body = line.repeat(640);
    format!(
        "name: big\nlimits:\n  timeoutMs: 60000\n  maxTurns: 2\nsteps:\n  - id: notes\n    access: write\n    instructions: |\n      {body}\n"
    )
}

/// Runs the composition against a simulator answering `answer`; exit code, record, stderr,
/// `runs show` text and HTML report.
fn run(answer: &str) -> (Value, String, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), &format!("responses:\n  - answer: {answer}\n"));
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(&composition());
    let out = s.run_command(&comp).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{stderr}",
        text(&out.stdout)
    );
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    let show = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    let html = s
        .docsfab()
        .args(["runs", "show", &id, "--html", "-"])
        .output()
        .unwrap();
    (record, stderr, text(&show.stdout), text(&html.stdout))
}

#[test]
fn issue31_a_prompt_counted_far_below_its_bytes_is_flagged_and_decides_nothing() {
    let (record, stderr, show, html) =
        run("{text: done, usage: {input_tokens: 512, output_tokens: 2}}");
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "a warning retries nothing: {record}");
    let turn = &attempts[0]["turns"][0];
    let warnings = turn["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{turn}");
    let w = &warnings[0];
    assert_eq!(w["kind"], "prompt-truncated");
    assert_eq!(w["inputTokens"], 512);
    let sent = w["sentBytes"].as_u64().unwrap();
    assert!(sent > 40_000, "sentBytes {sent}");
    let said = "warning: the provider counted 512 prompt tokens for a";
    assert!(stderr.contains(said), "progress: {stderr}");
    assert!(show.contains(said), "runs show: {show}");
    assert!(html.contains("prompt-truncated"), "the report's record");
}

#[test]
fn issue31_an_honest_count_raises_no_warning() {
    // The simulator counts bytes / 4, as a real tokenizer roughly does.
    let (record, stderr, show, _) = run("{text: done}");
    let turn = &record["steps"][0]["attempts"][0]["turns"][0];
    assert!(turn.get("warnings").is_none(), "{turn}");
    assert!(
        !stderr.contains("warning: the provider counted"),
        "{stderr}"
    );
    assert!(!show.contains("warning:"), "{show}");
}
