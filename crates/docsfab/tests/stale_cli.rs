//! `docsfab runs stale ID` through the real CLI (issue 32, docs/grounding.md "Stale claims"): a
//! run against `docsfab sim serve` whose accepted page cites three line ranges; after one file
//! changes and another is deleted, the command names the changed and the gone range and exits
//! 1, and a workspace that is not there is bad input.

mod support;

use serde_json::{Value, json};
use support::run::{FAST_CATALOG, Setup, Sim};

const PAGE: &str = "name: page\nlimits:\n  timeoutMs: 60000\nsteps:\n  - id: page\n    access: read-only\n    instructions: Write the page.\n    contract:\n      schema:\n        type: object\n        required: [markdown]\n        properties: {markdown: {type: string}}\n      grounding: [markdown]\n";

fn scenario() -> String {
    let markdown = "# Code\n\n`alpha()` is `src/alpha.rs:1`; `beta()` is `src/beta.rs:1-2`; `gamma()` is `src/gamma.rs:1`.\n";
    json!({"responses": [{"answer": {"json": {"markdown": markdown}}}]}).to_string()
}

fn stale(s: &Setup, args: &[&str]) -> (Option<i32>, String, String) {
    let out = s
        .docsfab()
        .args(["runs", "stale"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn texts(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect()
}

#[test]
fn issue32_runs_stale_names_the_cited_lines_that_changed_since_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), &scenario());
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let src = s.workspace().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for name in ["alpha", "beta", "gamma"] {
        let text = format!("pub fn {name}() {{}}\n// {name} ends here\n");
        std::fs::write(src.join(format!("{name}.rs")), text).unwrap();
    }
    let out = s.run_command(&s.composition(PAGE)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = stdout.lines().next().unwrap().to_owned();

    // Nothing changed yet: every range is as the run saw it.
    let (code, json_out, stderr) = stale(&s, &[&id, "--json"]);
    assert_eq!(code, Some(0), "{json_out}\n{stderr}");
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(v["checked"], 3, "{v:#}");
    assert_eq!(v["unchanged"], 3, "{v:#}");

    // Line 2 of beta changes; gamma is deleted; alpha is touched but the same.
    std::fs::write(src.join("beta.rs"), "pub fn beta() {}\n// rewritten\n").unwrap();
    std::fs::remove_file(src.join("gamma.rs")).unwrap();
    std::fs::write(
        src.join("alpha.rs"),
        "pub fn alpha() {}\n// alpha ends here\n",
    )
    .unwrap();
    let (code, json_out, stderr) = stale(&s, &[&id, "--json"]);
    assert_eq!(code, Some(1), "{json_out}\n{stderr}");
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(v["unchanged"], 1, "{v:#}");
    assert_eq!(texts(&v["changed"]), ["src/beta.rs:1-2"], "{v:#}");
    assert_eq!(texts(&v["gone"]), ["src/gamma.rs:1"], "{v:#}");
    assert_eq!(v["changed"][0]["step"], "page");
    assert_eq!(v["changed"][0]["member"], "markdown");
    assert!(stderr.contains(&format!("--reuse {id}")), "{stderr}");

    // The readable form names them too.
    let (code, text, _) = stale(&s, &[&id]);
    assert_eq!(code, Some(1));
    assert!(text.contains("1 unchanged, 1 changed, 1 gone"), "{text}");
    assert!(text.contains("changed  src/beta.rs:1-2"), "{text}");
    assert!(text.contains("gone     src/gamma.rs:1"), "{text}");

    // A workspace that is not there, and a run that does not exist: bad input, one sentence.
    let (code, _, stderr) = stale(&s, &[&id, "--workspace", "/nonexistent/tree"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--workspace /nonexistent/tree is not a directory"),
        "{stderr}"
    );
    let (code, _, stderr) = stale(&s, &["run-19700101-000000-000000"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("there is no run"), "{stderr}");
}
