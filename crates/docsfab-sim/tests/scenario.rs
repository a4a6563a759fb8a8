//! Scenario loading (strictness, error messages), order and fallback, the seeded random models,
//! and the request log.

mod support;

use std::path::Path;

use docsfab_sim::{RequestLogEntry, Scenario, SimError, SimServer};
use support::*;

fn error_of(yaml: &str) -> String {
    match Scenario::from_yaml_str(yaml, "bad.yaml") {
        Ok(_) => panic!("expected {yaml:?} to be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_fields_are_refused_with_file_and_line() {
    let e = error_of("responses:\n  - status: 408\n    retry_after: 2\n");
    assert!(
        e.starts_with("scenario bad.yaml, line 3: unknown field `retry_after`"),
        "{e}"
    );
    let e =
        error_of("responses:\n  - status: 200\n  - answer:\n      text: hi\n      colour: red\n");
    assert!(
        e.starts_with("scenario bad.yaml, line 5: unknown field `colour`"),
        "{e}"
    );
    let e = error_of("responses: []\nfalback: cycle\n");
    assert!(e.contains("line 2") && e.contains("falback"), "{e}");
}

/// A duplicate key reads like every other scenario error: one sentence naming the line, without
/// the YAML library's advice about its own options.
#[test]
fn a_duplicate_key_is_refused_with_its_line_in_one_sentence() {
    let e = error_of("responses: []\nresponses: []\n");
    assert!(e.starts_with("scenario bad.yaml, line 2: duplicate"), "{e}");
    assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// Scripts with one broken entry each: the YAML, the line the error names and the reason it
/// gives.
const BROKEN_ENTRIES: &[(&str, &str, &str)] = &[
    (
        "responses:\n  - status: 200\n  - {}\n",
        "line 3",
        "no response kind",
    ),
    (
        "responses:\n  - status: 503\n    drop: reset\n",
        "line 2",
        "several response kinds (status, drop)",
    ),
    (
        "responses:\n  - answer: {text: hi}\n    body: x\n",
        "line 2",
        "body is only allowed with status",
    ),
    (
        "responses:\n  - drop: close\n    cut: {after_bytes: 1, with: reset}\n",
        "line 2",
        "cut is not allowed with drop",
    ),
    (
        "responses:\n  - status: 200\n    repeat: 0\n",
        "line 2",
        "repeat must be at least 1",
    ),
    (
        "responses:\n  - status: 99\n",
        "line 2",
        "not a final HTTP status",
    ),
    (
        "responses:\n  - status: 429\n    headers: {'bad name': x}\n",
        "line 2",
        "not a valid HTTP header name",
    ),
    (
        "responses:\n  - status: 200\n    headers: {content-length: '3'}\n",
        "line 2",
        "set by the simulator",
    ),
    (
        "responses:\n  - answer: {text: a, json: {}}\n",
        "line 2",
        "text or json, not both",
    ),
    (
        "responses:\n  - answer: {text: a, deltas: 0}\n",
        "line 2",
        "deltas must be at least 1",
    ),
    ("responses:\n  - drop: sideways\n", "line 2", "sideways"),
    (
        "responses:\n  - cut: {after_bytes: 3}\n    status: 200\n",
        "line 2",
        "with",
    ),
    ("responses: [\n", "line 1", ""),
    (
        "responses:\n  - status: 200\n    body: x\n    chunks: [y]\n",
        "line 2",
        "body or chunks, not both",
    ),
    (
        "responses:\n  - answer: {text: a}\n    chunks: [y]\n",
        "line 2",
        "chunks is only allowed with status",
    ),
    (
        "responses:\n  - status: 200\n    chunk_delay_ms: 5\n",
        "line 2",
        "chunk_delay_ms needs chunks",
    ),
    (
        "responses:\n  - status: yes\n",
        "line 2",
        "expected a whole number from 0 to 65535",
    ),
    (
        "responses:\n  - status: 200\n    stall: {after_bytes: -1, ms: 3}\n",
        "line 3",
        "expected a whole number, 0 or more",
    ),
    (
        "responses: {status: 200}\n",
        "line 1",
        "expected a list here",
    ),
];

#[test]
fn broken_entries_are_refused_with_their_line_and_reason() {
    for &(yaml, line, reason) in BROKEN_ENTRIES {
        let e = error_of(yaml);
        assert!(e.contains(line) && e.contains(reason), "{yaml:?} gave {e}");
    }
    for yaml in [
        "responses: []\n",
        "fallback: cycle\n",
        "fallback: repeat-last\n",
        "name: x\n",
    ] {
        let e = error_of(yaml);
        assert!(e.contains("responses is empty"), "{yaml:?} gave {e}");
    }
    let nested = "responses:\n  - random:\n      seed: 1\n      episodes: 1\n      burst: {length: [1, 1], statuses: [503]}\n      then:\n        random: {seed: 2, episodes: 1, then: {status: 200}}\n";
    let e = error_of(nested);
    assert!(
        e.contains("line 7") && e.contains("cannot itself be a random model"),
        "{e}"
    );
    let e =
        error_of("fallback:\n  respond: {status: 200, repeat: 2}\nresponses: [{status: 200}]\n");
    assert!(e.contains("takes no repeat"), "{e}");
}

#[test]
fn a_missing_file_is_named_in_the_error() {
    let e = Scenario::load(Path::new("/nonexistent/scenario.yaml")).unwrap_err();
    assert!(matches!(e, SimError::ReadScenario { .. }));
    assert!(e.to_string().contains("/nonexistent/scenario.yaml"), "{e}");
}

#[test]
fn errors_from_a_file_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.yaml");
    std::fs::write(&path, "responses:\n  - status: 200\n    oops: 1\n").unwrap();
    let e = Scenario::load(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("scenario {}, line 3:", path.display())),
        "{e}"
    );
}

#[test]
fn repeat_and_fallback_label_each_request() {
    let s = Scenario::from_yaml_str(
        "responses:\n  - status: 408\n    repeat: 3\n  - name: answer\n    answer: {text: hi}\n",
        "s",
    )
    .unwrap();
    assert_eq!(s.scripted_len(), 4);
    let labels: Vec<String> = (0..6).map(|i| s.entry_label(i)).collect();
    assert_eq!(
        labels,
        [
            "responses[0]#1",
            "responses[0]#2",
            "responses[0]#3",
            "answer",
            "answer (fallback: repeat-last)",
            "answer (fallback: repeat-last)",
        ]
    );
    let s = Scenario::from_yaml_str(
        "responses:\n  - status: 500\n  - status: 200\nfallback: cycle\n",
        "s",
    )
    .unwrap();
    let labels: Vec<String> = (2..5).map(|i| s.entry_label(i)).collect();
    assert_eq!(
        labels,
        [
            "responses[0] (fallback: cycle)",
            "responses[1] (fallback: cycle)",
            "responses[0] (fallback: cycle)"
        ]
    );
    let s = Scenario::from_yaml_str("fallback: {respond: {status: 503}}\n", "s").unwrap();
    assert_eq!(s.scripted_len(), 0);
    assert_eq!(s.entry_label(0), "fallback");
}

#[tokio::test]
async fn the_example_file_plays_seven_408s_then_the_answer() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/seven-408s-then-answer.yaml");
    let scenario = Scenario::load(&path).unwrap();
    assert_eq!(scenario.name(), Some("seven-408s-then-answer"));
    let server = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..9 {
        statuses.push(
            send(server.local_addr(), CHAT, &openai_body("m", true))
                .await
                .parsed()
                .status,
        );
    }
    assert_eq!(statuses, [408, 408, 408, 408, 408, 408, 408, 200, 200]);
    server.shutdown().await;
}

const RANDOM: &str = r#"
responses:
  - name: storm
    random:
      seed: SEED
      episodes: 40
      burst: {length: [0, 7], statuses: [408, 503]}
      throttle: {chance: 0.3, persistence: 0.7, max_run: 23, retry_after: ["2", ""], retry_after_ms: [150]}
      then: {answer: {text: ok}}
"#;

fn labels(seed: u64) -> Vec<String> {
    let s = Scenario::from_yaml_str(&RANDOM.replace("SEED", &seed.to_string()), "random").unwrap();
    (0..s.scripted_len()).map(|i| s.entry_label(i)).collect()
}

#[test]
fn a_seed_gives_the_same_script_every_time_and_another_seed_another() {
    assert_eq!(labels(42), labels(42));
    assert_ne!(labels(42), labels(43));
}

#[test]
fn bursts_stay_within_their_length_range_and_each_episode_ends_with_then() {
    for seed in 0..20 {
        let labels = labels(seed);
        let thens = labels.iter().filter(|l| l.ends_with(".then")).count();
        assert_eq!(thens, 40);
        assert!(labels.last().unwrap().ends_with("episode[39].then"));
        // Count faults per episode: at most max(7, 23).
        for e in 0..40 {
            let n = labels
                .iter()
                .filter(|l| l.starts_with(&format!("storm.episode[{e}].fault")))
                .count();
            assert!(n <= 23, "seed {seed} episode {e}: {n}");
        }
    }
}

#[tokio::test]
async fn random_faults_are_served_with_their_statuses_and_retry_after_values() {
    let yaml = r#"
responses:
  - random:
      seed: 7
      episodes: 30
      burst: {length: [1, 3], statuses: [408, 503]}
      throttle: {chance: 0.5, persistence: 0.7, retry_after: ["2"], retry_after_ms: [150]}
      then: {status: 204}
"#;
    let scenario = Scenario::from_yaml_str(yaml, "r").unwrap();
    let total = scenario.scripted_len();
    let server = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .unwrap();
    let mut seen = std::collections::BTreeMap::new();
    let mut run = 0;
    for _ in 0..total {
        let p = send(server.local_addr(), CHAT, "{}").await.parsed();
        let key = match p.status {
            429 => {
                let ra = p.header("retry-after").map(|v| format!("retry-after {v}"));
                let ms = p
                    .header("retry-after-ms")
                    .map(|v| format!("retry-after-ms {v}"));
                assert!(ra.is_some() != ms.is_some(), "one header per 429");
                ra.or(ms).unwrap()
            }
            s => s.to_string(),
        };
        run = if p.status == 204 { 0 } else { run + 1 };
        assert!(run <= 23);
        *seen.entry(key).or_insert(0) += 1;
    }
    let keys: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["204", "408", "503", "retry-after 2", "retry-after-ms 150"]
    );
    assert_eq!(seen["204"], 30);
    server.shutdown().await;
}

#[test]
fn random_model_mistakes_are_refused() {
    let base = "responses:\n  - random:\n      seed: 1\n      episodes: 2\n";
    let cases = [
        (
            format!("{base}      then: {{status: 200}}\n"),
            "needs burst, throttle or both",
        ),
        (
            format!(
                "{base}      burst: {{length: [3, 1], statuses: [503]}}\n      then: {{status: 200}}\n"
            ),
            "min is above max",
        ),
        (
            format!("{base}      throttle: {{persistence: 1.5}}\n      then: {{status: 200}}\n"),
            "between 0 and 1",
        ),
        (
            format!(
                "{base}      burst: {{length: [1, 2], statuses: [503]}}\n      throttle: {{persistence: 0.5}}\n      then: {{status: 200}}\n"
            ),
            "chance is required",
        ),
        (
            format!("{base}      burst: {{length: [1, 2], statuses: [503]}}\n"),
            "missing field `then`",
        ),
        (
            format!(
                "{base}      burst: {{length: [1, 2], statuses: [503]}}\n      then: {{status: 200}}\n    repeat: 2\n"
            ),
            "repeat is not allowed next to random",
        ),
    ];
    for (yaml, reason) in cases {
        let e = error_of(&yaml);
        assert!(e.contains(reason), "{yaml} gave {e}");
    }
}

#[tokio::test]
async fn the_request_log_records_each_request_with_a_body_digest() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("requests.jsonl");
    let scenario =
        Scenario::from_yaml_str("responses:\n  - status: 503\n  - answer: {text: hi}\n", "s")
            .unwrap();
    let server = SimServer::start(
        "127.0.0.1:0".parse().unwrap(),
        scenario,
        Some(log_path.clone()),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let body = openai_body("gpt-a", true);
    send(addr, CHAT, &body).await;
    send(addr, CHAT, &body).await;
    send(addr, MESSAGES, &anthropic_body("claude-b", false)).await;
    send(addr, CHAT, "not json").await;
    let log = server.requests();
    assert_eq!(log.len(), 4);
    assert_eq!(
        log.iter().map(|e| e.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert_eq!(
        log[0].sha256, log[1].sha256,
        "identical bodies, identical digests"
    );
    assert_ne!(log[0].sha256, log[2].sha256);
    // SHA-256 of the exact bytes: "not json".
    assert_eq!(log[3].sha256, sha256_hex(b"not json"));
    assert_eq!(
        (log[0].model.as_deref(), log[0].stream),
        (Some("gpt-a"), true)
    );
    assert_eq!(
        (log[2].model.as_deref(), log[2].stream),
        (Some("claude-b"), false)
    );
    assert_eq!((log[3].model.as_deref(), log[3].stream), (None, false));
    assert_eq!(log[2].path, "/v1/messages");
    assert!(log.iter().all(|e| e.method == "POST"));
    assert!(
        log.windows(2)
            .all(|w| w[0].time_unix_ms <= w[1].time_unix_ms)
    );
    let entries: Vec<&str> = log.iter().map(|e| e.entry.as_str()).collect();
    assert_eq!(
        entries,
        [
            "responses[0]",
            "responses[1]",
            "responses[1] (fallback: repeat-last)",
            "responses[1] (fallback: repeat-last)"
        ]
    );
    server.shutdown().await;
    let from_file: Vec<RequestLogEntry> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_file, log);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    // Computed here rather than trusted from the server; the helper is checked against a known
    // vector below.
    let digest = <sha2::Sha256 as sha2::Digest>::digest(bytes);
    digest.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[test]
fn the_digest_helper_matches_a_known_vector() {
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[tokio::test]
async fn non_loopback_addresses_are_refused() {
    let scenario = Scenario::from_yaml_str("responses:\n  - status: 200\n", "s").unwrap();
    let Err(e) = SimServer::start("0.0.0.0:0".parse().unwrap(), scenario, None).await else {
        panic!("0.0.0.0 must be refused");
    };
    assert!(matches!(e, SimError::NotLoopback { .. }), "{e}");
}

#[tokio::test]
async fn base_url_ends_in_v1_on_the_bound_port() {
    let server = start("responses:\n  - status: 200\n").await;
    assert_eq!(
        server.base_url(),
        format!("http://127.0.0.1:{}/v1", server.local_addr().port())
    );
    assert_ne!(server.local_addr().port(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn serve_command_names_a_missing_scenario_file() {
    let e = docsfab_sim::serve_command(
        "127.0.0.1:0".parse().unwrap(),
        Path::new("/nope/s.yaml"),
        None,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("/nope/s.yaml"), "{e}");
}

#[test]
fn every_yaml_example_in_the_docs_is_a_valid_scenario() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/simulator.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut blocks = 0;
    let mut rest = doc.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").expect("closed block");
        if let Err(e) = Scenario::from_yaml_str(&body[..end], "docs/simulator.md") {
            panic!("example {blocks} does not parse: {e}\n{}", &body[..end]);
        }
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 10, "found only {blocks} examples");

    // The sample error in the docs is what the simulator really says.
    let e = Scenario::from_yaml_str(
        "responses:\n  - status: 408\n    retry_after: 2\n",
        "s.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        doc.contains(&format!("```text\n{e}\n```")),
        "docs lack: {e}"
    );
}

#[tokio::test]
async fn subscribers_see_each_request_as_it_arrives() {
    let server = start("responses:\n  - status: 503\n  - answer: {text: hi}\n").await;
    let mut feed = server.subscribe();
    send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    let first = feed.recv().await.unwrap();
    let second = feed.recv().await.unwrap();
    assert_eq!((first.index, first.entry.as_str()), (0, "responses[0]"));
    assert_eq!((second.index, second.entry.as_str()), (1, "responses[1]"));
    assert_eq!(server.requests(), vec![first, second]);
    server.shutdown().await;
}

#[test]
fn every_bundled_scenario_file_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut loaded = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let scenario = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(scenario.scripted_len() > 0, "{}", path.display());
            loaded += 1;
        }
    }
    assert!(loaded >= 4, "{loaded}");
}

#[tokio::test]
async fn concurrent_requests_each_take_one_script_entry() {
    let yaml: String = std::iter::once("responses:\n".to_owned())
        .chain((0..24).map(|i| format!("  - status: {}\n    body: '{i}'\n", 500 + i)))
        .chain(std::iter::once(
            "fallback: {respond: {status: 418}}\n".to_owned(),
        ))
        .collect();
    let server = start(&yaml).await;
    let addr = server.local_addr();
    let replies: Vec<_> = (0..24)
        .map(|_| tokio::spawn(async move { send(addr, CHAT, "{}").await.parsed().status }))
        .collect();
    let mut statuses = Vec::new();
    for reply in replies {
        statuses.push(reply.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, (500..524).collect::<Vec<u16>>());
    let log = server.requests();
    assert_eq!(log.len(), 24);
    assert!(
        log.iter().enumerate().all(|(i, e)| e.index == i),
        "arrival order"
    );
    let mut labels: Vec<String> = log.into_iter().map(|e| e.entry).collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), 24, "every entry answered exactly once");
    assert_eq!(send(addr, CHAT, "{}").await.parsed().status, 418);
    server.shutdown().await;
}

#[tokio::test]
async fn start_errors_name_the_address_or_the_log_file() {
    let taken = start("responses:\n  - status: 200\n").await;
    let scenario = Scenario::from_yaml_str("responses:\n  - status: 200\n", "s").unwrap();
    let Err(e) = SimServer::start(taken.local_addr(), scenario.clone(), None).await else {
        panic!("the port is taken");
    };
    assert!(matches!(e, SimError::Bind { .. }));
    assert!(
        e.to_string().contains(&taken.local_addr().to_string()),
        "{e}"
    );
    let missing = Path::new("/nonexistent-dir/log.jsonl").to_path_buf();
    let Err(e) = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, Some(missing)).await
    else {
        panic!("the log directory does not exist");
    };
    assert!(e.to_string().contains("/nonexistent-dir/log.jsonl"), "{e}");
    taken.shutdown().await;
}

#[test]
fn an_oversized_random_model_is_refused_not_expanded_without_end() {
    let e = error_of(
        "responses:\n  - random:\n      seed: 1\n      episodes: 4000000000\n      burst: {length: [5, 5], statuses: [503]}\n      then: {status: 200}\n",
    );
    assert!(
        e.contains("line 2") && e.contains("more than 100000 entries"),
        "{e}"
    );
}
