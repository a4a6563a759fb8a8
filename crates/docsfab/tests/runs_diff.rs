//! Issue 11: which files a run wrote (`filesWritten` per attempt) and `docsfab runs diff ID
//! [--stat]`. Real `docsfab run` processes against `docsfab sim serve`; the diff is checked by
//! real peers: `git apply` and `patch -p1` turn a copy of the workspace as it was before the run
//! into the workspace as the run left it.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::run::{Lines, ONE_STEP, Setup, Sim, first_line, looks_like_run_id, signal};

const WRITER: &str = "name: writer
limits:
  timeoutMs: 120000
  maxTurns: 6
steps:
  - id: pages
    access: write
    instructions: Write the pages under docs/.
    tools: [read_file, write_file]
    writeRoots: [docs/]
";

/// Ten lines; the run rewrites the fifth.
const OLD: &str =
    "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\nline 9\nline 10\n";
const NEW_PAGE: &str = "# New\n\nA page.\n";
const DEEP_PAGE: &str = "no trailing newline";

fn old_rewritten() -> String {
    OLD.replace("line 5\n", "line five, rewritten\n")
}

/// A scenario whose model writes `writes` (path, content) in turn 1, then says it is done.
fn writes_then_done(writes: &[(&str, &str)]) -> String {
    let calls: String = writes
        .iter()
        .map(|(path, content)| {
            format!(
                "        - {{name: write_file, arguments: {{path: {path}, content: {}}}}}\n",
                serde_json::to_string(content).unwrap()
            )
        })
        .collect();
    format!("responses:\n  - answer:\n      tool_calls:\n{calls}  - answer: {{text: done}}\n")
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every file under `dir`, by relative path.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn copy_tree(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A finished run: the setup (kept alive), the run id and a copy of the workspace as it was
/// before the run.
struct Ran {
    s: Setup,
    _sim: Sim,
    _tmp: tempfile::TempDir,
    id: String,
    pre: PathBuf,
}

impl Ran {
    fn runs(&self, args: &[&str]) -> Output {
        self.s.docsfab().arg("runs").args(args).output().unwrap()
    }

    /// `runs diff ID [extra]`, checked to exit 0, as text.
    fn diff(&self, extra: &[&str]) -> String {
        let mut args = vec!["diff", self.id.as_str()];
        args.extend_from_slice(extra);
        let out = self.runs(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
        text(&out.stdout)
    }

    fn attempts(&self) -> Vec<Value> {
        let record = self.s.show_json(&self.id);
        validate_against_schema(&record).unwrap();
        record["steps"][0]["attempts"].as_array().unwrap().clone()
    }
}

/// Runs `composition` over a workspace prepared by `prepare`, against `scenario`; expects
/// `exit`.
fn run(composition: &str, scenario: &str, prepare: impl FnOnce(&Path), exit: i32) -> Ran {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), scenario);
    let s = Setup::new(&sim.base_url, "");
    prepare(&s.workspace());
    let pre = s.dir.path().join("pre");
    copy_tree(&s.workspace(), &pre);
    let comp = s.composition(composition);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(out.status.code(), Some(exit), "{}", text(&out.stderr));
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    assert!(looks_like_run_id(&id), "{id:?}");
    Ran {
        s,
        _sim: sim,
        _tmp: tmp,
        id,
        pre,
    }
}

/// A write run that creates docs/new.md, rewrites one line of docs/old.md and creates
/// docs/guide/deep.md (without a final newline).
fn three_writes() -> Ran {
    let scenario = writes_then_done(&[
        ("docs/new.md", NEW_PAGE),
        ("docs/old.md", &old_rewritten()),
        ("docs/guide/deep.md", DEEP_PAGE),
    ]);
    run(
        WRITER,
        &scenario,
        |ws| {
            std::fs::create_dir_all(ws.join("docs")).unwrap();
            std::fs::write(ws.join("docs/old.md"), OLD).unwrap();
        },
        0,
    )
}

/// Applies `patch` with `program args` inside a fresh copy of the pre-run workspace and returns
/// the copy.
fn apply(r: &Ran, name: &str, patch: &str, program: &str, args: &[&str]) -> PathBuf {
    let copy = r.s.dir.path().join(name);
    copy_tree(&r.pre, &copy);
    let file = r.s.dir.path().join(format!("{name}.patch"));
    std::fs::write(&file, patch).unwrap();
    let out = Command::new(program)
        .args(args)
        .arg(&file)
        .current_dir(&copy)
        // Outside any repository: git apply works on the plain directory.
        .env("GIT_CEILING_DIRECTORIES", r.s.dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} failed: {}{}\n{patch}",
        text(&out.stdout),
        text(&out.stderr)
    );
    copy
}

#[test]
fn issue11_files_written_name_each_created_and_modified_file_with_sizes_and_hashes() {
    let r = three_writes();
    let attempts = r.attempts();
    assert_eq!(attempts.len(), 1);
    let files = attempts[0]["filesWritten"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    // In first-write order.
    assert_eq!(paths, ["docs/new.md", "docs/old.md", "docs/guide/deep.md"]);
    for f in files {
        let on_disk = std::fs::read(r.s.workspace().join(f["path"].as_str().unwrap())).unwrap();
        assert_eq!(f["bytes"], on_disk.len(), "{f}");
        assert_eq!(f["sha256After"], sha256(&on_disk), "{f}");
    }
    assert_eq!(files[0]["sha256Before"], Value::Null);
    assert_eq!(files[1]["sha256Before"], sha256(OLD.as_bytes()));
    assert_eq!(files[2]["sha256Before"], Value::Null);
    let shown = r.runs(&["show", &r.id]);
    assert!(
        text(&shown.stdout).contains(&format!(
            "    files written: docs/new.md (new, 15 bytes), docs/old.md (changed, {} bytes), docs/guide/deep.md (new, 19 bytes)\n",
            old_rewritten().len()
        )),
        "{}",
        text(&shown.stdout)
    );
}

#[test]
fn issue11_runs_diff_applies_with_git_and_patch_to_the_pre_run_workspace() {
    let r = three_writes();
    let diff = r.diff(&[]);
    assert!(
        diff.starts_with(
            "--- /dev/null\n+++ b/docs/new.md\n@@ -0,0 +1,3 @@\n+# New\n+\n+A page.\n"
        ),
        "{diff}"
    );
    // Three lines of context either side of the rewritten line.
    assert!(
        diff.contains(
            "--- a/docs/old.md\n+++ b/docs/old.md\n@@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+line five, rewritten\n line 6\n line 7\n line 8\n"
        ),
        "{diff}"
    );
    assert!(
        diff.ends_with(
            "--- /dev/null\n+++ b/docs/guide/deep.md\n@@ -0,0 +1 @@\n+no trailing newline\n\\ No newline at end of file\n"
        ),
        "{diff}"
    );
    let after = tree(&r.s.workspace());
    assert_ne!(tree(&r.pre), after);
    let by_git = apply(&r, "git-copy", &diff, "git", &["apply", "-p1"]);
    assert_eq!(tree(&by_git), after, "git apply did not reproduce the run");
    let by_patch = apply(&r, "patch-copy", &diff, "patch", &["-p1", "-s", "-i"]);
    assert_eq!(
        tree(&by_patch),
        after,
        "patch -p1 did not reproduce the run"
    );
}

#[test]
fn issue11_runs_diff_stat_counts_lines_per_file_like_git() {
    let r = three_writes();
    assert_eq!(
        r.diff(&["--stat"]),
        " docs/new.md        | 3 +++\n docs/old.md        | 2 +-\n docs/guide/deep.md | 1 +\n 3 files changed, 5 insertions(+), 1 deletion(-)\n"
    );
}

#[test]
fn issue11_runs_diff_of_an_unknown_run_is_one_sentence_and_exit_2() {
    let r = three_writes();
    let out = r.runs(&["diff", "run-20000101-000000-nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: there is no run \"run-20000101-000000-nosuch\"")
            && err.contains("docsfab runs list"),
        "{err}"
    );
}

#[test]
fn issue11_a_read_only_run_records_no_files_and_its_diff_says_so() {
    let scenario = "responses:\n  - answer: {text: '{\"modules\": [\"count\"]}'}\n";
    let r = run(ONE_STEP, scenario, |_| {}, 0);
    let attempts = r.attempts();
    assert_eq!(attempts[0]["filesWritten"], serde_json::json!([]));
    assert_eq!(r.diff(&[]), format!("Run {} wrote no files.\n", r.id));
    assert_eq!(
        r.diff(&["--stat"]),
        format!("Run {} wrote no files.\n", r.id)
    );
}

/// A file over the 1 MiB a side that docsfab keeps: the record still has its hashes and size;
/// the diff and the stat say in one line that it is too large, and the rest of the diff applies.
#[test]
fn issue11_a_file_over_the_per_file_cap_is_one_line_in_the_diff_and_stat() {
    let big = "x\n".repeat(786_432); // 1.5 MiB
    let scenario = writes_then_done(&[("docs/big.md", "small\n"), ("docs/new.md", NEW_PAGE)]);
    let r = run(
        WRITER,
        &scenario,
        |ws| {
            std::fs::create_dir_all(ws.join("docs")).unwrap();
            std::fs::write(ws.join("docs/big.md"), &big).unwrap();
        },
        0,
    );
    let files = r.attempts()[0]["filesWritten"].clone();
    assert_eq!(files[0]["path"], "docs/big.md");
    assert_eq!(files[0]["bytes"], 6);
    assert_eq!(files[0]["sha256Before"], sha256(big.as_bytes()));
    let diff = r.diff(&[]);
    assert!(
        diff.starts_with(
            "File docs/big.md: too large to diff (1572864 bytes -> 6 bytes; docsfab keeps at most 1 MiB of each side).\n--- /dev/null\n+++ b/docs/new.md\n"
        ),
        "{diff}"
    );
    assert_eq!(
        r.diff(&["--stat"]),
        " docs/big.md | too large to diff\n docs/new.md | 3 +++\n 2 files changed, 3 insertions(+)\n"
    );
    // The note line is not part of any patch: git applies the rest and leaves big.md alone.
    let by_git = apply(&r, "git-copy", &diff, "git", &["apply", "-p1"]);
    assert_eq!(
        std::fs::read_to_string(by_git.join("docs/new.md")).unwrap(),
        NEW_PAGE
    );
    assert_eq!(
        std::fs::read_to_string(by_git.join("docs/big.md")).unwrap(),
        big
    );
}

/// Proves WRT-1 with the record: attempt 1 writes docs/draft.md, then its stream is reset after
/// answer text was published, so the attempt fails and its writes are restored before the
/// retry. Its `filesWritten` still says what it wrote (`writeRestore` says it was undone); the
/// diff holds only what the succeeded attempt 2 wrote.
#[test]
fn issue11_a_failed_then_restored_attempt_lists_its_files_but_the_diff_has_only_the_kept_writes() {
    let scenario = r##"responses:
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/draft.md, content: "# Draft\n"}}
  - answer:
      text: "I wrote the draft, the guide and updated the existing page; all three pages are now in place under docs and ready for review by the team."
      deltas: 2
    cut: {after_bytes: 600, with: reset}
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/final.md, content: "# Final\n"}}
  - answer: {text: done}
"##;
    let r = run(WRITER, scenario, |_| {}, 0);
    let attempts = r.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!(attempts[0]["status"], "failed");
    assert_eq!(attempts[0]["writeRestore"], "restored");
    let first = &attempts[0]["filesWritten"];
    assert_eq!(first[0]["path"], "docs/draft.md", "{first}");
    assert_eq!(first[0]["sha256After"], sha256(b"# Draft\n"));
    assert_eq!(first[0]["sha256Before"], Value::Null);
    assert_eq!(attempts[1]["filesWritten"][0]["path"], "docs/final.md");
    assert!(!r.s.workspace().join("docs/draft.md").exists());
    assert_eq!(
        r.diff(&[]),
        "--- /dev/null\n+++ b/docs/final.md\n@@ -0,0 +1 @@\n+# Final\n"
    );
}

/// A file that held a credential before the run rewrote it: the run store keeps only its hashes
/// and sizes, and the diff says so in one line instead of printing the key.
#[test]
fn issue11_a_file_holding_a_credential_is_not_kept_or_shown() {
    const KEYED: &str = "aws: ASIAY34FZKBOKMUTVV7A\n";
    let scenario = writes_then_done(&[("docs/notes.md", "cleaned\n")]);
    let r = run(
        WRITER,
        &scenario,
        |ws| {
            std::fs::create_dir_all(ws.join("docs")).unwrap();
            std::fs::write(ws.join("docs/notes.md"), KEYED).unwrap();
        },
        0,
    );
    let diff = r.diff(&[]);
    assert_eq!(
        diff,
        format!(
            "File docs/notes.md: not shown, it holds text shaped like a credential ({} bytes -> 8 bytes).\n",
            KEYED.len()
        )
    );
    assert_eq!(
        r.diff(&["--stat"]),
        " docs/notes.md | not shown (credential)\n 1 file changed, 0 insertions(+), 0 deletions(-)\n"
    );
    for entry in std::fs::read_dir(r.s.home()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            let found = bytes.windows(20).any(|w| w == b"ASIAY34FZKBOKMUTVV7A");
            assert!(!found, "the key is in {}", path.display());
        }
    }
}

/// SIGINT while a write attempt's writes have run: the attempt is cancelled and restored, its
/// `filesWritten` still names what it wrote (read before the restore), and the diff says the run
/// kept nothing, pointing at `runs show`.
#[test]
fn issue11_a_cancelled_and_restored_attempt_lists_its_files_and_the_run_has_no_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = "responses:
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/new.md, content: draft}}
  - answer: {text: done}
    delay_ms: 60000
";
    let sim = Sim::start(tmp.path(), scenario);
    let s = Setup::new(&sim.base_url, "");
    let comp = s.composition(WRITER);
    let mut child = s
        .run_command(&comp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = first_line(child.stdout.as_mut().unwrap());
    let mut lines = Lines::new(child.stderr.take().unwrap());
    lines.wait_for(
        "turn 1: completed; write_file docs/new.md",
        Duration::from_secs(30),
    );
    signal(&child, "INT");
    assert_eq!(child.wait().unwrap().code(), Some(130), "{}", lines.rest());
    assert!(!s.workspace().join("docs/new.md").exists());

    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    let attempt = &record["steps"][0]["attempts"][0];
    assert_eq!(attempt["status"], "cancelled");
    assert_eq!(attempt["writeRestore"], "restored");
    assert_eq!(
        attempt["filesWritten"],
        serde_json::json!([{"path": "docs/new.md", "bytes": 5, "sha256Before": null, "sha256After": sha256(b"draft")}])
    );
    let out = s.docsfab().args(["runs", "diff", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        format!(
            "Run {id} has no diff: only attempts that did not succeed wrote files, and docsfab keeps the contents of succeeded ones; `docsfab runs show {id}` lists those files.\n"
        )
    );
}

/// Two write steps rewrite one page: the diff shows it once, from before the run to the last
/// write, and applies.
#[test]
fn issue11_a_page_two_steps_wrote_shows_once_from_before_the_run_to_its_last_write() {
    let two_steps = format!(
        "{WRITER}  - id: again\n    access: write\n    instructions: Extend the page.\n    tools: [write_file]\n    writeRoots: [docs/]\n"
    );
    let scenario = "responses:
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/old.md, content: \"line 1\\nfirst\\n\"}}
  - answer: {text: done}
  - answer:
      tool_calls:
        - {name: write_file, arguments: {path: docs/old.md, content: \"line 1\\nfirst\\nsecond\\n\"}}
  - answer: {text: done}
";
    let r = run(
        &two_steps,
        scenario,
        |ws| {
            std::fs::create_dir_all(ws.join("docs")).unwrap();
            std::fs::write(ws.join("docs/old.md"), "line 1\n").unwrap();
        },
        0,
    );
    let diff = r.diff(&[]);
    assert_eq!(
        diff,
        "--- a/docs/old.md\n+++ b/docs/old.md\n@@ -1 +1,3 @@\n line 1\n+first\n+second\n"
    );
    let by_git = apply(&r, "git-copy", &diff, "git", &["apply", "-p1"]);
    assert_eq!(tree(&by_git), tree(&r.s.workspace()));
}
