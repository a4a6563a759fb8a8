//! Issue 9, findings 6 and 7: the workspace jail against hard links, special files and names the
//! filesystem cannot hold, on real directories, real hard links and real FIFOs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use docsfab_runtime::composition::Tool;
use docsfab_runtime::ledger::CallResult;
use docsfab_runtime::tools::{StepTools, ToolPolicy, ToolReply};
use docsfab_runtime::workspace::Workspace;

const SECRET: &str = "TOP-SECRET-OUTSIDE-0042";

fn read_only() -> ToolPolicy {
    ToolPolicy {
        offered: vec![Tool::ListFiles, Tool::ReadFile, Tool::SearchText],
        write_roots: vec![],
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
