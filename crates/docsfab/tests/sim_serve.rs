//! `docsfab sim serve` as a real process: it prints its address first, answers on loopback from
//! the scenario, writes the request log, stops cleanly on SIGTERM, and refuses a bad scenario
//! with exit code 2.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use support::run::Sim;

fn docsfab() -> Command {
    Command::new(support::run::bin())
}

fn post(addr: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the simulator");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the response");
    out
}

#[test]
fn sim_serve_answers_from_the_scenario_and_logs_each_request() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let sim = Sim::start_logging(
        dir.path(),
        "responses:\n  - status: 408\n    repeat: 2\n  - answer: {text: hello}\n",
        &log,
    );
    let addr = sim.addr();

    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let r = post(addr, "/v1/chat/completions", body);
        assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    }
    let r = post(addr, "/v1/chat/completions", body);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("chat.completion.chunk") && r.contains("[DONE]"),
        "{r}"
    );

    // SIGTERM ends the server cleanly.
    let status = sim.terminate();
    assert!(status.success(), "{status:?}");

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    // Identical request bodies have one digest.
    assert!(lines.iter().all(|l| l["sha256"] == lines[0]["sha256"]));
}

#[test]
fn sim_serve_refuses_a_bad_scenario_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("bad.yaml");
    std::fs::write(&scenario, "responses:\n  - bogus: 1\n").unwrap();
    let out = docsfab()
        .args(["sim", "serve", "--scenario"])
        .arg(&scenario)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("line 2") && err.contains("bogus"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn sim_serve_refuses_a_non_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, "responses:\n  - answer: {text: hi}\n").unwrap();
    let out = docsfab()
        .args(["sim", "serve", "--listen", "0.0.0.0:0", "--scenario"])
        .arg(&scenario)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}
