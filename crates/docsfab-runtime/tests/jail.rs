//! Issue 9, findings 6 and 7: the workspace jail against hard links, special files and names the
//! filesystem cannot hold, on real directories, real hard links and real FIFOs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use docsfab_record::CallResult;
use docsfab_runtime::composition::Tool;
use docsfab_runtime::tools::{StepTools, ToolPolicy, ToolReply};
use docsfab_runtime::workspace::{MAX_WRITE_DEPTH, PathRefusal, Workspace};

const SECRET: &str = "TOP-SECRET-OUTSIDE-0042";

fn read_only() -> ToolPolicy {
    ToolPolicy {
        offered: vec![Tool::ListFiles, Tool::ReadFile, Tool::SearchText],
        write_roots: vec![],
        source_read_bytes: 1 << 20,
    }
}

fn write_step() -> ToolPolicy {
    ToolPolicy {
        offered: vec![Tool::ReadFile, Tool::WriteFile],
        write_roots: vec!["docs/".into()],
        source_read_bytes: 1 << 20,
    }
}

/// A workspace `ws/` with `src/lib.rs` and `docs/`, beside `outside/secret.txt`.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("src")).unwrap();
    fs::create_dir_all(ws.join("docs")).unwrap();
    fs::create_dir_all(dir.path().join("outside")).unwrap();
    fs::write(
        dir.path().join("outside/secret.txt"),
        format!("key = {SECRET}\n"),
    )
    .unwrap();
    fs::write(ws.join("src/lib.rs"), "pub fn visible() {}\n").unwrap();
    (dir, ws)
}

/// Validates, authorizes and runs a call; a refusal comes back as the error the model sees.
fn call(tools: &mut StepTools<'_>, name: &str, args: &str) -> ToolReply {
    let valid = tools.validate(name, args).unwrap();
    match tools.authorize(valid) {
        Ok(authorized) => tools.execute(authorized).unwrap(),
        Err(refusal) => ToolReply {
            result: CallResult::ToolError,
            text: format!("error: {refusal}"),
        },
    }
}

fn refusal(tools: &StepTools<'_>, args: &str) -> PathRefusal {
    tools
        .authorize(tools.validate("write_file", args).unwrap())
        .unwrap_err()
}

/// Runs `f` on a thread and fails the test if it has not returned after a generous wait: a read
/// that blocks on a FIFO would otherwise hang the suite instead of failing it. The wait is a
/// hang guard, not a measurement.
fn without_hanging<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the tool call blocked")
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Every entry under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(&path, root, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn hardening_hardlink_read_file_refuses_a_file_linked_outside() {
    let (d, ws_path) = fixture();
    fs::hard_link(
        d.path().join("outside/secret.txt"),
        ws_path.join("src/notes.txt"),
    )
    .unwrap();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only());
    let reply = call(&mut tools, "read_file", r#"{"path":"src/notes.txt"}"#);
    assert_eq!(reply.result, CallResult::ToolError, "{}", reply.text);
    assert!(!reply.text.contains(SECRET), "{}", reply.text);
    assert!(
        reply.text.contains("src/notes.txt has 2 hard links"),
        "{}",
        reply.text
    );
    assert_eq!(tools.budget().spent(), 0, "nothing was returned");
    // A byte range of it is refused the same way.
    let ranged = call(
        &mut tools,
        "read_file",
        r#"{"path":"src/notes.txt","offset":6,"length":10}"#,
    );
    assert_eq!(ranged.result, CallResult::ToolError);
    assert!(!ranged.text.contains(&SECRET[..10]), "{}", ranged.text);
    // A file with a single link is still read.
    let ok = call(&mut tools, "read_file", r#"{"path":"src/lib.rs"}"#);
    assert_eq!(ok.result, CallResult::Ok);
    assert!(ok.text.contains("pub fn visible"));
}

#[test]
fn hardening_hardlink_search_text_skips_linked_files_and_says_how_many() {
    let (d, ws_path) = fixture();
    let outside = d.path().join("outside/secret.txt");
    fs::hard_link(&outside, ws_path.join("src/notes.txt")).unwrap();
    fs::hard_link(&outside, ws_path.join("docs/copy.txt")).unwrap();
    fs::write(ws_path.join("src/plain.txt"), "key = workspace value\n").unwrap();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only());

    let reply = call(&mut tools, "search_text", r#"{"pattern":"key = "}"#);
    assert_eq!(reply.result, CallResult::Ok, "{}", reply.text);
    assert!(!reply.text.contains(SECRET), "{}", reply.text);
    assert!(
        reply
            .text
            .contains("src/plain.txt:1: key = workspace value"),
        "{}",
        reply.text
    );
    assert!(
        reply
            .text
            .contains("[skipped 2 files with more than one hard link"),
        "{}",
        reply.text
    );
    assert_eq!(
        tools.budget().spent(),
        "key = workspace value".len() as u64,
        "only the unlinked match is source"
    );

    // The linked file named on its own is refused with the reason.
    let single = call(
        &mut tools,
        "search_text",
        r#"{"pattern":"TOP","path":"src/notes.txt"}"#,
    );
    assert_eq!(single.result, CallResult::ToolError, "{}", single.text);
    assert!(!single.text.contains(SECRET));
    assert!(single.text.contains("hard links"), "{}", single.text);

    // Nothing skipped, nothing said.
    let clean = call(
        &mut tools,
        "search_text",
        r#"{"pattern":"visible","path":"src/lib.rs"}"#,
    );
    assert_eq!(clean.text, "src/lib.rs:1: pub fn visible() {}");
}

#[test]
fn hardening_fifo_read_tools_refuse_special_files_without_blocking() {
    let (_d, ws_path) = fixture();
    mkfifo(&ws_path.join("src/pipe.rs"));
    let replies = without_hanging(move || {
        let ws = Workspace::open(&ws_path).unwrap();
        let mut tools = StepTools::for_attempt(&ws, read_only());
        [
            call(&mut tools, "read_file", r#"{"path":"src/pipe.rs"}"#),
            call(
                &mut tools,
                "search_text",
                r#"{"pattern":"fn","path":"src/pipe.rs"}"#,
            ),
            call(&mut tools, "search_text", r#"{"pattern":"fn"}"#),
        ]
    });
    let [read, search_one, search_all] = replies;
    assert_eq!(read.result, CallResult::ToolError);
    assert_eq!(
        read.text,
        "error: src/pipe.rs is a named pipe (FIFO), not a regular file; the read tools read \
         regular files only"
    );
    assert_eq!(search_one.result, CallResult::ToolError);
    assert!(
        search_one.text.contains("named pipe"),
        "{}",
        search_one.text
    );
    assert_eq!(search_all.result, CallResult::Ok);
    assert_eq!(search_all.text, "src/lib.rs:1: pub fn visible() {}");
}

/// A character device like /dev/zero inside the workspace would be an endless read. Making one
/// needs root (mknod); without it the case cannot be set up and the test says so.
#[test]
fn hardening_device_read_file_refuses_a_character_device() {
    let (_d, ws_path) = fixture();
    let made = std::process::Command::new("mknod")
        .arg(ws_path.join("src/zero"))
        .args(["c", "1", "5"])
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mknod needs root");
        return;
    }
    let reply = without_hanging(move || {
        let ws = Workspace::open(&ws_path).unwrap();
        let mut tools = StepTools::for_attempt(&ws, read_only());
        call(&mut tools, "read_file", r#"{"path":"src/zero"}"#)
    });
    assert_eq!(reply.result, CallResult::ToolError);
    assert!(reply.text.contains("a character device"), "{}", reply.text);
}

#[test]
fn hardening_long_name_write_is_a_tool_error_and_a_valid_write_then_succeeds() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());
    let name = format!("docs/{}.md", "a".repeat(300));
    let args = format!(r#"{{"path":"{name}","content":"x"}}"#);
    assert!(matches!(
        refusal(&tools, &args),
        PathRefusal::NameTooLong { bytes: 303, .. }
    ));
    let reply = call(&mut tools, "write_file", &args);
    assert_eq!(reply.result, CallResult::ToolError);
    assert!(
        reply
            .text
            .contains("has a name of 303 bytes, but a file or directory name holds at most 255"),
        "{}",
        reply.text
    );
    assert!(reply.text.len() < 400, "the path is not echoed whole");
    // A 300-character directory name is refused the same way, before it is created.
    let dir_args = format!(
        r#"{{"path":"docs/{}/a.md","content":"x"}}"#,
        "b".repeat(300)
    );
    assert!(matches!(
        refusal(&tools, &dir_args),
        PathRefusal::NameTooLong { bytes: 300, .. }
    ));
    assert!(tools.snapshots().is_empty(), "nothing was touched");
    // A name of exactly 255 bytes is fine.
    let longest = format!("docs/{}.md", "c".repeat(252));
    let ok = call(
        &mut tools,
        "write_file",
        &format!(r#"{{"path":"{longest}","content":"x"}}"#),
    );
    assert_eq!(ok.result, CallResult::Ok, "{}", ok.text);
    assert_eq!(fs::read_to_string(ws_path.join(&longest)).unwrap(), "x");
}

#[test]
fn hardening_deep_path_write_is_a_tool_error_and_leaves_no_directory() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());
    // 2,000 levels of one-letter names fit under PATH_MAX (and were written before the fix);
    // of two letters they do not (and left 1,354 directories behind).
    for (segment, says) in [("d/", "is 2002 names deep"), ("dd/", "use a shorter path")] {
        let path = format!("docs/{}x.md", segment.repeat(2_000));
        let args = format!(r#"{{"path":"{path}","content":"deep"}}"#);
        let refused = refusal(&tools, &args);
        assert!(
            matches!(
                refused,
                PathRefusal::TooDeep { depth: 2_002, .. } | PathRefusal::PathTooLong { .. }
            ),
            "{segment}: {refused}"
        );
        let reply = call(&mut tools, "write_file", &args);
        assert_eq!(reply.result, CallResult::ToolError);
        assert!(reply.text.contains(says), "{}", reply.text);
        assert!(reply.text.len() < 400, "the path is not echoed whole");
    }
    assert_eq!(tree(&ws_path.join("docs")), Vec::<String>::new());
    assert!(tools.snapshots().is_empty());

    // The deepest allowed path is written; one more level is refused.
    let deepest = format!("docs/{}x.md", "d/".repeat(MAX_WRITE_DEPTH - 2));
    let ok = call(
        &mut tools,
        "write_file",
        &format!(r#"{{"path":"{deepest}","content":"ok"}}"#),
    );
    assert_eq!(ok.result, CallResult::Ok, "{}", ok.text);
    let too_deep = format!("docs/{}x.md", "e/".repeat(MAX_WRITE_DEPTH - 1));
    let refused = refusal(
        &tools,
        &format!(r#"{{"path":"{too_deep}","content":"no"}}"#),
    );
    assert!(matches!(refused, PathRefusal::TooDeep { .. }), "{refused}");
    assert!(!ws_path.join("docs/e").exists());
}

#[test]
fn hardening_long_path_write_is_a_tool_error_before_anything_is_created() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());
    // 20 names of 250 bytes: each name fits, the path does not.
    let path = format!("docs/{}x.md", format!("{}/", "p".repeat(250)).repeat(20));
    let args = format!(r#"{{"path":"{path}","content":"x"}}"#);
    assert!(matches!(
        refusal(&tools, &args),
        PathRefusal::PathTooLong { .. }
    ));
    let reply = call(&mut tools, "write_file", &args);
    assert_eq!(reply.result, CallResult::ToolError);
    assert!(reply.text.contains("use a shorter path"), "{}", reply.text);
    assert_eq!(tree(&ws_path.join("docs")), Vec::<String>::new());
    // Reading such a path is refused the same way, without touching the filesystem.
    let mut reader = StepTools::for_attempt(&ws, read_only());
    let read = call(
        &mut reader,
        "read_file",
        &format!(r#"{{"path":"{}"}}"#, &path[5..]),
    );
    assert_eq!(read.result, CallResult::ToolError);
    assert!(read.text.contains("use a shorter path"), "{}", read.text);
}

#[test]
fn hardening_control_characters_in_a_written_name_are_refused() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let tools = StepTools::for_attempt(&ws, write_step());
    for args in [
        r#"{"path":"docs/a\nb.md","content":"x"}"#,
        r#"{"path":"docs/tab\there/a.md","content":"x"}"#,
        r#"{"path":"docs/esc\u001b[31m.md","content":"x"}"#,
    ] {
        assert!(
            matches!(refusal(&tools, args), PathRefusal::ControlCharacter(_)),
            "{args}"
        );
    }
    assert!(matches!(
        refusal(&tools, r#"{"path":"docs/a\u0000b.md","content":"x"}"#),
        PathRefusal::Nul(_)
    ));
    assert_eq!(tree(&ws_path.join("docs")), Vec::<String>::new());
}

/// Issue 21: a write to a workspace name that is a hard link to a file outside leaves the
/// outside file as it was, and docsfab keeps nothing of that file's content: the snapshot
/// keeps its hash and size only, the diff store is told `hard-linked`, the tool result says
/// why, and the attempt cannot be undone by copying the outside content into the workspace.
#[test]
fn issue21_a_write_through_a_hard_link_keeps_only_the_hash_and_size_of_the_outside_file() {
    use docsfab_runtime::snapshot::RestoreError;
    use docsfab_runtime::written::{Kept, classify};
    let (d, ws_path) = fixture();
    let outside = d.path().join("outside/secret.txt");
    let secret = fs::read(&outside).unwrap();
    fs::hard_link(&outside, ws_path.join("docs/hard.md")).unwrap();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());

    let reply = call(
        &mut tools,
        "write_file",
        r##"{"path":"docs/hard.md","content":"# Mine\n"}"##,
    );
    assert_eq!(reply.result, CallResult::Ok, "{}", reply.text);
    assert!(reply.text.contains("it had 2 hard links"), "{}", reply.text);
    assert!(reply.text.contains("cannot be undone"), "{}", reply.text);
    assert!(!reply.text.contains(SECRET), "{}", reply.text);
    assert_eq!(
        fs::read(&outside).unwrap(),
        secret,
        "the outside file is unchanged"
    );
    assert_eq!(fs::read(ws_path.join("docs/hard.md")).unwrap(), b"# Mine\n");

    let files = tools.snapshots().written_files();
    assert_eq!(files.len(), 1);
    let file = &files[0];
    assert_eq!(file.before, None, "no content of the outside file is kept");
    assert_eq!(file.linked_before, Some(secret.len() as u64));
    assert_eq!(file.bytes_before(), secret.len() as u64);
    assert!(file.sha256_before.is_some());
    assert_eq!(classify(file, |_| false), Kept::HardLinked);

    let restored = tools.snapshots().restore();
    assert!(
        matches!(restored, Err(RestoreError::HardLinked { links: 2, .. })),
        "{restored:?}"
    );
    assert_eq!(
        fs::read(ws_path.join("docs/hard.md")).unwrap(),
        b"# Mine\n",
        "the refused restore copied nothing into the workspace"
    );
    assert_eq!(fs::read(&outside).unwrap(), secret);
}
