//! Issue 11, "the record tells the whole story", end to end: `docsfab run` against a real
//! `docsfab sim serve` process, then `runs show` (text and `--json`) and the store's raw bytes.
//!
//! - A read step whose answers are prose fails, and each failed attempt keeps the start of the
//!   answer the contract judged, redacted and escaped; a canary key split over a cut answer and
//!   its continuation (each half passes the response boundary, the joined answer holds the
//!   whole key) is redacted in the excerpt and appears nowhere.
//! - A long answer is kept to its first 2,048 bytes.
//! - The record names the canonical workspace, the provider (name, API, host and port only),
//!   the model and the docsfab version, for both APIs.

mod support;

use std::process::Output;

use serde_json::Value;
use support::run::{FAST_CATALOG, KEY_VAR, ONE_STEP, Setup, Sim, looks_like_run_id};

/// The hardening tests' short canary (redacted whole): here it is the provider key.
const CANARY: &str = "CnryK3y-7h2Qx9";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs ONE_STEP on `s` with the canary as the key and `retries` contract retries.
fn run(s: &Setup, retries: &str) -> (Output, String) {
    let out = s
        .run_command(&s.composition(ONE_STEP))
        .env(KEY_VAR, CANARY)
        .env("DOCSFAB_READ_ONLY_MAX_RETRIES", retries)
        .output()
        .unwrap();
    let id = text(&out.stdout).lines().next().unwrap_or("").to_owned();
    assert!(
        looks_like_run_id(&id),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    (out, id)
}

fn show_text(s: &Setup, id: &str) -> String {
    let out = s.docsfab().args(["runs", "show", id]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Issue 11: a contract failure can be debugged: each failed attempt of a read step whose
/// answer is prose carries an excerpt of that answer, and `runs show` prints it.
#[test]
fn issue11_prose_answers_leave_a_redacted_excerpt_on_each_failed_attempt() {
    let dir = tempfile::tempdir().unwrap();
    // Attempt 1: prose with a line break and a terminal escape. Attempt 2: an answer cut at
    // the output limit with the first half of the key, continued with the second half.
    let scenario = format!(
        "responses:\n  - answer: {{text: \"The crate has modules.\\n\\e[31m and it counts.\"}}\n  - answer: {{text: 'The modules are lib and {}', finish_reason: length}}\n  - answer: {{text: '{}, and count.'}}\n",
        &CANARY[..7],
        &CANARY[7..]
    );
    let sim = Sim::start(dir.path(), &scenario);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let (out, id) = run(&s, "1");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    let record = s.show_json(&id);
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["status"], "failed");
    assert_eq!(
        attempts[0]["answerExcerpt"],
        "The crate has modules.\\n\\u{1b}[31m and it counts."
    );
    assert_eq!(
        attempts[0]["answerBytes"],
        "The crate has modules.\n\u{1b}[31m and it counts.".len()
    );
    let joined = format!("The modules are lib and {CANARY}, and count.");
    assert_eq!(
        attempts[1]["answerExcerpt"],
        "The modules are lib and <redacted>, and count."
    );
    assert_eq!(attempts[1]["answerBytes"], joined.len());

    let shown = show_text(&s, &id);
    assert!(
        shown.contains(&format!(
            "    answer ({} bytes in all): The modules are lib and <redacted>, and count.\n",
            joined.len()
        )),
        "{shown}"
    );
    let first = "The crate has modules.\n\u{1b}[31m and it counts.";
    assert!(
        shown.contains(&format!(
            "    answer ({} bytes in all): The crate has modules.\\n\\u{{1b}}[31m and it counts.\n",
            first.len()
        )),
        "{shown}"
    );
    assert!(!shown.contains('\u{1b}'), "{shown}");

    // The key, whole, is nowhere a person or a tool could read it.
    let mut places = vec![
        ("run stdout", out.stdout.clone()),
        ("run stderr", out.stderr.clone()),
        ("runs show", shown.into_bytes()),
        ("runs show --json", record.to_string().into_bytes()),
    ];
    for file in ["runs.db", "runs.db-wal"] {
        if let Ok(bytes) = std::fs::read(s.home().join(file)) {
            places.push((file, bytes));
        }
    }
    for (what, bytes) in places {
        assert!(
            !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
            "the canary reached {what}"
        );
    }
}

/// Issue 11: an answer longer than 2 KiB is kept to its first 2,048 bytes, cut between
/// characters and marked with `…`; `answerBytes` says how long it was.
#[test]
fn issue11_a_long_answer_is_cut_at_2_kib() {
    let dir = tempfile::tempdir().unwrap();
    // Two-byte characters: 2,048 bytes would end in the middle of one if cut blindly.
    let answer = format!("x{}", "é".repeat(3000));
    let scenario = format!("responses:\n  - answer: {{text: '{answer}'}}\n");
    let sim = Sim::start(dir.path(), &scenario);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let (out, id) = run(&s, "0");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let record = s.show_json(&id);
    let attempt = &record["steps"][0]["attempts"][0];
    let excerpt = attempt["answerExcerpt"].as_str().unwrap();
    assert!(excerpt.len() <= 2048, "{}", excerpt.len());
    assert!(excerpt.len() >= 2040, "{}", excerpt.len());
    let kept = excerpt
        .strip_suffix('…')
        .expect("a cut excerpt ends in the mark");
    assert!(answer.starts_with(kept));
    assert_eq!(attempt["answerBytes"], answer.len());
    let shown = show_text(&s, &id);
    assert!(shown.contains(&format!("    answer ({} bytes in all): x", answer.len())));
}

/// The record's context as `runs show --json` prints it, checked for a provider at `sim`.
fn check_context(record: &Value, s: &Setup, api: &str, sim: &Sim) {
    let workspace = std::fs::canonicalize(s.workspace()).unwrap();
    assert_eq!(record["workspace"], workspace.to_string_lossy().as_ref());
    assert_eq!(
        record["provider"],
        serde_json::json!({"name": "default", "api": api, "host": sim.addr()})
    );
    assert_eq!(record["model"], "sim-model");
    assert_eq!(record["docsfabVersion"], env!("CARGO_PKG_VERSION"));
}

/// Issue 11: the record says which workspace, provider, API, host and model a run used, and
/// which docsfab ran it, for both APIs; `runs show` prints them in its header. A query in the
/// base URL (allowed when it carries no credential) is not part of the host.
#[test]
fn issue11_the_record_names_workspace_provider_host_model_and_version() {
    for api in ["openai-chat", "anthropic-messages"] {
        let dir = tempfile::tempdir().unwrap();
        let sim = Sim::start(
            dir.path(),
            "responses:\n  - answer: {json: {modules: [lib]}}\n",
        );
        let base_url = format!("{}?api-version=2024-10", sim.base_url);
        let s = Setup::with_api(api, &base_url, FAST_CATALOG);
        let (out, id) = run(&s, "0");
        assert_eq!(out.status.code(), Some(0), "{api}: {}", text(&out.stderr));
        let record = s.show_json(&id);
        check_context(&record, &s, api, &sim);
        assert!(!record.to_string().contains("api-version"), "{record}");
        // A succeeded attempt keeps the answer it was accepted on; no turn failed.
        let attempt = &record["steps"][0]["attempts"][0];
        assert_eq!(attempt["answerExcerpt"], "{\"modules\":[\"lib\"]}");
        assert_eq!(attempt["turns"][0]["reason"], Value::Null);

        let shown = show_text(&s, &id);
        let workspace = std::fs::canonicalize(s.workspace()).unwrap();
        let header = format!(
            "  composition: small\n  workspace: {}\n  provider: default ({api} at {}), model sim-model\n  docsfab {}\n",
            workspace.display(),
            sim.addr(),
            env!("CARGO_PKG_VERSION")
        );
        assert!(shown.contains(&header), "{api}:\n{shown}");
    }
}

/// Issue 11: a base URL with user information or a credential in its query never gets as far
/// as a record: `run` refuses it as bad configuration (exit 2) and records nothing.
#[test]
fn issue11_a_base_url_with_userinfo_and_key_query_is_refused_before_any_record() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "responses:\n  - answer: {json: {modules: [lib]}}\n",
    );
    let base_url = format!("http://user:pw-hidden@{}/v1?key=query-hidden", sim.addr());
    let s = Setup::new(&base_url, FAST_CATALOG);
    let out = s.run_command(&s.composition(ONE_STEP)).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        !err.contains("pw-hidden") && !err.contains("query-hidden"),
        "{err}"
    );
    assert!(s.list_json().is_empty());
}

/// Issue 11: a turn the provider failed says why, in the record and in `runs show`.
#[test]
fn issue11_a_failed_turn_shows_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "responses:\n  - status: 503\nfallback: repeat-last\n",
    );
    let s = Setup::new(
        &sim.base_url,
        &format!("{FAST_CATALOG}  retry.maxTransportRetries: 0\n"),
    );
    let (out, id) = run(&s, "0");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let record = s.show_json(&id);
    let turn = &record["steps"][0]["attempts"][0]["turns"][0];
    let requests = turn["providerRetries"].as_u64().unwrap() + 1;
    let reason = format!("provider fault: HTTP 503 (server) after {requests} requests");
    assert_eq!(turn["reason"], reason.as_str());
    let shown = show_text(&s, &id);
    assert!(
        shown.contains(&format!("    Turn 1: failed ({reason}), ")),
        "{shown}"
    );
}
