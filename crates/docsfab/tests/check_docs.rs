//! `docsfab check-docs` (issue 32, docs/grounding.md), through the real binary: planted fakes
//! are found with their line and nearest real names, real names pass, and bad input is one
//! sentence with exit 2.

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::run::{Setup, Sim};

fn docsfab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_docsfab"))
}

/// A small crate: three modules, one dependency.
fn tree(dir: &Path) {
    let write = |rel: &str, text: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "Cargo.toml",
        "[package]\nname = \"wc\"\n\n[dependencies]\nserde = \"1\"\n",
    );
    write("src/lib.rs", "pub mod count;\npub mod report;\n");
    write(
        "src/count.rs",
        "pub struct Counts { pub words: usize }\npub fn count_words(s: &str) -> Counts {\n    Counts { words: s.split_whitespace().count() }\n}\n",
    );
    write(
        "src/report.rs",
        "pub fn render_line(c: &crate::count::Counts) -> String {\n    format!(\"{}\", c.words)\n}\n",
    );
}

fn check(dir: &Path, page: &str, json: bool) -> (i32, String, String) {
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/page.md"), page).unwrap();
    let mut cmd = docsfab();
    cmd.arg("check-docs")
        .arg(dir.join("docs/page.md"))
        .arg("--workspace")
        .arg(dir);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn issue32_a_true_page_passes() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let (code, out, err) = check(
        dir.path(),
        "# wc\n\n`count_words` in `src/count.rs` returns `Counts`; `render_line()` prints it \
         (`src/report.rs:1-3`). Built on `serde::Serialize`. See [the crate root](../src/lib.rs).\n",
        false,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.ends_with("5 of 5 cited grounded (100.0 %)\n"), "{out}");
}

#[test]
fn issue32_planted_fakes_are_named_with_line_kind_and_nearest() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let page = "# wc\n\nThe outline named `src/src.rb` and `count.js`.\n\n\
                `count_word` is called by `render_line`.\n\nSee [missing](missing.md) and `src/count.rs:3-40`.\n";
    let (code, out, _) = check(dir.path(), page, true);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["cited"].as_u64(), v["grounded"].as_u64()),
        (Some(6), Some(1))
    );
    let file = &v["files"][0];
    assert_eq!(file["path"], "docs/page.md");
    let unknown: Vec<(String, String, u64)> = file["unknown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["text"].as_str().unwrap().to_owned(),
                u["kind"].as_str().unwrap().to_owned(),
                u["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        unknown,
        vec![
            ("src/src.rb".into(), "path".into(), 3),
            ("count.js".into(), "path".into(), 3),
            ("count_word".into(), "identifier".into(), 5),
            ("missing.md".into(), "link".into(), 7),
            ("src/count.rs:3-40".into(), "line-range".into(), 7),
        ]
    );
    assert_eq!(file["unknown"][2]["nearest"][0], "count_words");
}

#[test]
fn issue32_bad_input_is_one_sentence_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = docsfab()
        .args(["check-docs", "no-such-page.md", "--workspace"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-page.md cannot be read"), "{err}");
    let out = docsfab()
        .args(["check-docs", "README.md", "--workspace", "/no/such/dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The same check inside a run: `runs show` prints what each judged attempt cited and each
/// unknown name with its nearest real one, beside the `contract-ungrounded` retry it caused.
#[test]
fn issue32_runs_show_lists_what_each_attempt_cited() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      json: {markdown: \"`counts()` is in `src/count.rs`.\"}\n  - answer:\n      json: {markdown: \"`count()` is in `src/count.rs`.\"}\n",
    );
    let s = Setup::new(&sim.base_url, "");
    let comp = s.composition(
        "name: page\nmodel: sim-model\nlimits:\n  timeoutMs: 20000\nsteps:\n  - id: page\n    access: read-only\n    instructions: Write it.\n    tools: [read_file]\n    contract:\n      schema: {type: object, required: [markdown]}\n      grounding: [markdown]\n",
    );
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let id = stdout.lines().next().unwrap();
    let show = s.docsfab().args(["runs", "show", id]).output().unwrap();
    let show = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(show.contains("grounding: 1 of 2 cited grounded"), "{show}");
    assert!(
        show.contains("unknown identifier counts() in markdown, line 1 (nearest: count)"),
        "{show}"
    );
    assert!(show.contains("contract-ungrounded"), "{show}");
    assert!(show.contains("grounding: 2 of 2 cited grounded"), "{show}");
}

/// A cited line range keeps the SHA-256 of its lines in the JSON report, so a later check can
/// say which claims went stale (issue 32).
#[test]
fn issue32_a_line_range_is_reported_with_the_hash_of_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let (code, out, err) = check(dir.path(), "See `src/report.rs:1-3`.\n", true);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let lines = &v["files"][0]["lines"];
    assert_eq!(lines[0]["text"], "src/report.rs:1-3", "{v:#}");
    let text = std::fs::read_to_string(dir.path().join("src/report.rs")).unwrap();
    let cited: Vec<&str> = text.lines().take(3).collect();
    let digest = <sha2::Sha256 as sha2::Digest>::digest(cited.join("\n"));
    assert_eq!(lines[0]["sha256"], hex::encode(digest));
}
