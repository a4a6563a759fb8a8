//! The tools in the workspace jail, on real directories.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use docsfab_record::{CallResult, RejectReason};
use docsfab_runtime::composition::Tool;
use docsfab_runtime::supervision::NO_PROGRESS_THRESHOLD;
use docsfab_runtime::tools::{StepTools, ToolPolicy, ToolReply};
use docsfab_runtime::workspace::{PathRefusal, Workspace};

const READ_TOOLS: [Tool; 3] = [Tool::ListFiles, Tool::ReadFile, Tool::SearchText];

fn read_only(budget: u64) -> ToolPolicy {
    ToolPolicy {
        offered: READ_TOOLS.to_vec(),
        write_roots: vec![],
        source_read_bytes: budget,
    }
}

fn write_step() -> ToolPolicy {
    ToolPolicy {
        offered: vec![Tool::ReadFile, Tool::WriteFile],
        write_roots: vec!["docs/".into()],
        source_read_bytes: 1 << 20,
    }
}

/// A workspace with `src/lib.rs` (100 bytes), `README.md` and `docs/old.md`, beside an
/// `outside/secret.txt` that is not in it.
fn fixture() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("src")).unwrap();
    fs::create_dir_all(ws.join("docs")).unwrap();
    fs::create_dir_all(dir.path().join("outside")).unwrap();
    fs::write(dir.path().join("outside/secret.txt"), "secret\n").unwrap();
    let lib = format!("fn main() {{}}\n{}\n", "x".repeat(100 - 14));
    assert_eq!(lib.len(), 100);
    fs::write(ws.join("src/lib.rs"), lib).unwrap();
    fs::write(ws.join("README.md"), "# Title\nfn helper\n").unwrap();
    fs::write(ws.join("docs/old.md"), "old docs\n").unwrap();
    (dir, ws)
}

fn run(tools: &mut StepTools<'_>, name: &str, args: &str) -> ToolReply {
    let call = tools.validate(name, args).unwrap();
    let authorized = tools.authorize(call).unwrap();
    tools.execute(authorized).unwrap()
}

fn refusal(tools: &StepTools<'_>, name: &str, args: &str) -> PathRefusal {
    tools
        .authorize(tools.validate(name, args).unwrap())
        .unwrap_err()
}

/// Requirement: LSE-1.
#[test]
fn calls_are_rejected_before_authorization_with_their_reason_lse_1() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let tools = StepTools::for_attempt(&ws, read_only(1000));
    let reason = |name: &str, args: &str| tools.validate(name, args).unwrap_err().reason;
    assert_eq!(
        reason("read_fil", r#"{"path":"a"}"#),
        RejectReason::UnknownTool
    );
    assert_eq!(
        reason("write_file", r#"{"path":"docs/a","content":""}"#),
        RejectReason::UnknownTool,
        "write_file is not offered to a read-only step"
    );
    assert_eq!(
        reason("read_file", "path=a"),
        RejectReason::InvalidArguments
    );
    assert_eq!(
        reason("read_file", r#"{"path": "src/li"#),
        RejectReason::TruncatedArguments
    );
    for bad in [
        r#"{}"#,
        r#"{"path": 3}"#,
        r#"{"path": "a", "offset": -1}"#,
        r#"{"path": "a", "length": 0}"#,
        r#"{"path": "a", "mode": "rb"}"#,
        r#"["a"]"#,
    ] {
        assert_eq!(
            reason("read_file", bad),
            RejectReason::SchemaMismatch,
            "{bad}"
        );
    }
    assert!(tools.validate("list_files", "").is_ok());
    assert!(tools.validate("search_text", r#"{"pattern":"fn"}"#).is_ok());
}

#[test]
fn paths_outside_the_workspace_are_refused_before_anything_runs() {
    let (d, ws) = fixture();
    symlink(d.path().join("outside"), ws.join("out-dir")).unwrap();
    symlink(d.path().join("outside/secret.txt"), ws.join("secret-link")).unwrap();
    let ws = Workspace::open(&ws).unwrap();
    let tools = StepTools::for_attempt(&ws, read_only(1000));
    assert!(matches!(
        refusal(&tools, "read_file", r#"{"path":"../outside/secret.txt"}"#),
        PathRefusal::ParentComponent(_)
    ));
    assert!(matches!(
        refusal(
            &tools,
            "read_file",
            r#"{"path":"src/../../outside/secret.txt"}"#
        ),
        PathRefusal::ParentComponent(_)
    ));
    let abs = format!(
        r#"{{"path":"{}"}}"#,
        d.path().join("outside/secret.txt").display()
    );
    assert!(matches!(
        refusal(&tools, "read_file", &abs),
        PathRefusal::Absolute(_)
    ));
    for args in [
        r#"{"path":"secret-link"}"#,
        r#"{"path":"out-dir/secret.txt"}"#,
        r#"{"path":"out-dir/not-there"}"#,
    ] {
        assert!(
            matches!(refusal(&tools, "read_file", args), PathRefusal::Escapes(_)),
            "{args}"
        );
    }
    assert!(matches!(
        refusal(&tools, "list_files", r#"{"path":"out-dir"}"#),
        PathRefusal::Escapes(_)
    ));
    assert!(matches!(
        refusal(
            &tools,
            "search_text",
            r#"{"pattern":"secret","path":"out-dir"}"#
        ),
        PathRefusal::Escapes(_)
    ));
}

#[test]
fn a_search_of_the_workspace_never_follows_a_symlink_outside() {
    let (d, ws) = fixture();
    symlink(d.path().join("outside/secret.txt"), ws.join("secret-link")).unwrap();
    let ws = Workspace::open(&ws).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(1000));
    let reply = run(&mut tools, "search_text", r#"{"pattern":"secret"}"#);
    assert_eq!(reply.result, CallResult::Ok);
    assert_eq!(reply.text, "no matches");
}

#[test]
fn writes_go_only_under_write_roots_after_resolving_symlinks() {
    let (_d, ws_path) = fixture();
    // `docs/api` leads back into `src`: writing through it would leave the write root.
    symlink(ws_path.join("src"), ws_path.join("docs/api")).unwrap();
    let ws = Workspace::open(&ws_path).unwrap();
    let tools = StepTools::for_attempt(&ws, write_step());
    for path in [
        "src/lib.rs",
        "README.md",
        "docs",
        "docs2/x.md",
        "docs/api/lib.rs",
    ] {
        let args = format!(r#"{{"path":"{path}","content":"x"}}"#);
        assert!(
            matches!(
                refusal(&tools, "write_file", &args),
                PathRefusal::OutsideWriteRoots { .. } | PathRefusal::NotAFile(_)
            ),
            "{path}"
        );
    }
    assert_eq!(
        fs::read_to_string(ws_path.join("src/lib.rs"))
            .unwrap()
            .len(),
        100
    );
}

#[test]
fn reads_spend_the_budget_and_a_read_past_it_is_a_tool_error() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(150));
    let reply = run(
        &mut tools,
        "read_file",
        r#"{"path":"src/lib.rs","length":60}"#,
    );
    assert_eq!(reply.result, CallResult::Ok);
    assert!(
        reply
            .text
            .starts_with("[src/lib.rs bytes 0..60 of 100]\nfn main()")
    );
    assert_eq!(tools.budget().spent(), 60);
    let reply = run(
        &mut tools,
        "read_file",
        r#"{"path":"./src/lib.rs","offset":60}"#,
    );
    assert_eq!(reply.result, CallResult::Ok);
    assert_eq!(tools.budget().spent(), 100);
    // README.md is 18 bytes; 50 remain.
    let reply = run(&mut tools, "read_file", r#"{"path":"README.md"}"#);
    assert_eq!(reply.result, CallResult::Ok);
    assert_eq!(tools.budget().remaining(), 32);
    fs::write(ws.root().join("big.txt"), "y".repeat(40)).unwrap();
    let reply = run(&mut tools, "read_file", r#"{"path":"big.txt"}"#);
    assert_eq!(reply.result, CallResult::ToolError);
    assert!(
        reply.text.contains("only 32 of this attempt's 150 remain"),
        "{}",
        reply.text
    );
    assert_eq!(
        tools.budget().remaining(),
        32,
        "a refused read spends nothing"
    );
    let reply = run(&mut tools, "read_file", r#"{"path":"big.txt","length":32}"#);
    assert_eq!(reply.result, CallResult::Ok);
    assert_eq!(tools.budget().remaining(), 0);
}

/// Requirement: STP-2.
#[test]
fn every_attempt_gets_the_whole_read_budget_again_stp_2() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let mut first = StepTools::for_attempt(&ws, read_only(100));
    run(&mut first, "read_file", r#"{"path":"src/lib.rs"}"#);
    assert_eq!(first.budget().remaining(), 0);
    let mut retry = StepTools::for_attempt(&ws, read_only(100));
    assert_eq!(retry.budget().remaining(), 100);
    let reply = run(&mut retry, "read_file", r#"{"path":"src/lib.rs"}"#);
    assert_eq!(
        reply.result,
        CallResult::Ok,
        "no notice: supervision is per attempt too"
    );
}

/// Requirement: LSE-4.
#[test]
fn a_reread_gets_a_notice_spends_nothing_and_repeats_stop_as_no_progress_lse_4() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(1000));
    run(
        &mut tools,
        "read_file",
        r#"{"path":"src/lib.rs","length":50}"#,
    );
    let spent = tools.budget().spent();
    for n in 1..=NO_PROGRESS_THRESHOLD {
        let reply = run(
            &mut tools,
            "read_file",
            r#"{"path":"src/lib.rs","offset":10,"length":5}"#,
        );
        assert_eq!(reply.result, CallResult::Notice);
        assert!(
            reply.text.contains("bytes 0..50 were already returned"),
            "{}",
            reply.text
        );
        assert!(!reply.text.contains("fn main"));
        assert_eq!(tools.budget().spent(), spent);
        assert_eq!(tools.supervisor().no_progress(), n == NO_PROGRESS_THRESHOLD);
    }
    // The part not yet read is still fresh.
    let reply = run(
        &mut tools,
        "read_file",
        r#"{"path":"src/lib.rs","offset":50}"#,
    );
    assert_eq!(reply.result, CallResult::Ok);
    assert!(!tools.supervisor().no_progress());
}

#[test]
fn search_returns_matching_lines_and_spends_their_bytes() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(1000));
    let reply = run(&mut tools, "search_text", r#"{"pattern":"^fn \\w+"}"#);
    assert_eq!(reply.result, CallResult::Ok);
    assert_eq!(
        reply.text,
        "README.md:2: fn helper\nsrc/lib.rs:1: fn main() {}"
    );
    assert_eq!(
        tools.budget().spent(),
        ("fn helper".len() + "fn main() {}".len()) as u64
    );
    let again = run(&mut tools, "search_text", r#"{"pattern":"^fn \\w+"}"#);
    assert_eq!(again.result, CallResult::Notice);
    let bad = run(&mut tools, "search_text", r#"{"pattern":"("}"#);
    assert_eq!(bad.result, CallResult::ToolError);
    let mut poor = StepTools::for_attempt(&ws, read_only(5));
    let reply = run(&mut poor, "search_text", r#"{"pattern":"fn"}"#);
    assert_eq!(reply.result, CallResult::ToolError);
    assert_eq!(poor.budget().spent(), 0);
}

#[test]
fn list_files_lists_recursively_and_spends_no_budget() {
    let (_d, ws) = fixture();
    let ws = Workspace::open(&ws).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(10));
    let reply = run(&mut tools, "list_files", "{}");
    assert_eq!(
        reply.text,
        "README.md\ndocs/\ndocs/old.md\nsrc/\nsrc/lib.rs"
    );
    assert_eq!(tools.budget().spent(), 0);
    fs::create_dir_all(ws.root().join("target/debug")).unwrap();
    fs::write(ws.root().join("target/debug/fn.txt"), "fn built").unwrap();
    fs::create_dir_all(ws.root().join(".git")).unwrap();
    fs::write(ws.root().join("src/target"), "a file named target\n").unwrap();
    let reply = run(&mut tools, "list_files", r#"{"path":"."}"#);
    assert_eq!(
        reply.text, "README.md\ndocs/\ndocs/old.md\nsrc/\nsrc/lib.rs\nsrc/target",
        "build output and .git are not listed"
    );
    let missing = run(&mut tools, "list_files", r#"{"path":"nope"}"#);
    assert_eq!(missing.result, CallResult::ToolError);
    assert_eq!(missing.text, "error: nope does not exist");
}

/// Requirement: WRT-1.
#[test]
fn write_is_atomic_and_the_restore_returns_the_workspace_to_its_pre_attempt_state_wrt_1() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());
    let reply = run(
        &mut tools,
        "write_file",
        r#"{"path":"docs/old.md","content":"new"}"#,
    );
    assert_eq!(reply.result, CallResult::Ok);
    run(
        &mut tools,
        "write_file",
        r#"{"path":"docs/old.md","content":"newer"}"#,
    );
    run(
        &mut tools,
        "write_file",
        r#"{"path":"docs/guide/deep/a.md","content":"A"}"#,
    );
    assert_eq!(
        fs::read_to_string(ws_path.join("docs/old.md")).unwrap(),
        "newer"
    );
    assert_eq!(
        fs::read_to_string(ws_path.join("docs/guide/deep/a.md")).unwrap(),
        "A"
    );
    let leftovers: Vec<_> = fs::read_dir(ws_path.join("docs"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".docsfab-write-")
        })
        .collect();
    assert!(leftovers.is_empty(), "a temp file was left behind");

    let snapshots = tools.into_snapshots();
    assert!(
        snapshots.verify().is_err(),
        "before the restore the workspace differs"
    );
    snapshots.restore().unwrap();
    assert_eq!(
        fs::read_to_string(ws_path.join("docs/old.md")).unwrap(),
        "old docs\n"
    );
    assert!(
        !ws_path.join("docs/guide").exists(),
        "created directories are removed"
    );
    snapshots.verify().unwrap();
}

#[test]
fn a_restore_keeps_files_someone_else_put_in_a_created_directory() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, write_step());
    run(
        &mut tools,
        "write_file",
        r#"{"path":"docs/new/a.md","content":"A"}"#,
    );
    fs::write(ws_path.join("docs/new/other.md"), "not the attempt's").unwrap();
    tools.into_snapshots().restore().unwrap();
    assert!(!ws_path.join("docs/new/a.md").exists());
    assert!(ws_path.join("docs/new/other.md").exists());
}

/// Requirement: LSE-2.
#[test]
fn a_vanished_workspace_is_a_host_failure_with_evidence_lse_2() {
    let (_d, ws_path) = fixture();
    let ws = Workspace::open(&ws_path).unwrap();
    let mut tools = StepTools::for_attempt(&ws, read_only(1000));
    tools.preflight().unwrap();
    let call = tools
        .authorize(
            tools
                .validate("read_file", r#"{"path":"src/lib.rs"}"#)
                .unwrap(),
        )
        .unwrap();
    fs::remove_dir_all(&ws_path).unwrap();
    let failure = tools.execute(call).unwrap_err();
    assert!(failure.evidence.contains("is gone"), "{}", failure.evidence);
    let preflight = tools.preflight().unwrap_err();
    assert!(preflight.evidence.contains(&ws_path.display().to_string()));
}

/// Requirement: LSE-2.
#[test]
fn a_write_root_leading_outside_fails_the_preflight_lse_2() {
    let (d, ws_path) = fixture();
    fs::remove_dir(ws_path.join("docs/")).unwrap_or(());
    fs::remove_dir_all(ws_path.join("docs")).unwrap();
    symlink(d.path().join("outside"), ws_path.join("docs")).unwrap();
    let ws = Workspace::open(&ws_path).unwrap();
    let tools = StepTools::for_attempt(&ws, write_step());
    let failure = tools.preflight().unwrap_err();
    assert!(
        failure.evidence.contains("outside the workspace"),
        "{}",
        failure.evidence
    );
    assert!(!Path::new(&d.path().join("outside/x.md")).exists());
}

mod jail_properties {
    use super::*;
    use proptest::prelude::*;

    fn component() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "..",
            ".",
            "src",
            "docs",
            "lib.rs",
            "out-dir",
            "secret-link",
            "loop",
            "",
            "/",
            "new",
        ])
    }

    proptest! {
        // Each case builds a real directory tree: fewer cases keep the suite quick.
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever path the model sends, a resolved path is inside the workspace and a
        /// writable one is inside a write root.
        #[test]
        fn no_path_resolves_outside_the_workspace(parts in prop::collection::vec(component(), 0..6)) {
            let (d, ws_path) = fixture();
            symlink(d.path().join("outside"), ws_path.join("out-dir")).unwrap();
            symlink(d.path().join("outside/secret.txt"), ws_path.join("secret-link")).unwrap();
            symlink(ws_path.join("src"), ws_path.join("docs/loop")).unwrap();
            let ws = Workspace::open(&ws_path).unwrap();
            let path = parts.join("/");
            if let Ok(resolved) = ws.resolve(&path) {
                prop_assert!(resolved.abs.starts_with(ws.root()), "{path} -> {:?}", resolved.abs);
                prop_assert!(!resolved.rel.split('/').any(|p| p == ".."));
            }
            if let Ok(resolved) = ws.resolve_for_write(&path, &["docs/".to_owned()]) {
                prop_assert!(resolved.abs.starts_with(ws.root().join("docs")), "{path}");
                prop_assert!(resolved.abs != ws.root().join("docs"));
            }
        }
    }
}
