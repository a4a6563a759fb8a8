//! Issue 9, findings 4 and 5: `docsfab route serve` as a real process, driven over raw TCP
//! sockets on 127.0.0.1. A half-sent request cannot pin a socket, many of them cannot starve
//! the route, SIGTERM and SIGINT stop it with half-sent requests open, and oversized or slow
//! bodies get an HTTP answer in the API's own error shape.
//!
//! The serving limits are scaled down with the `route serve` flags so the tests are fast. No
//! test asserts a duration: each waits for an event (a close, an answer, an exit) under a
//! generous bound that only a hang would reach.

mod support;

use std::time::Duration;

use support::route::{Setup, path_of, request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const APIS: [&str; 2] = ["openai-chat", "anthropic-messages"];
/// Only a hang reaches this.
const GENEROUS: Duration = Duration::from_secs(60);
const ANSWER: &str =
    "responses:\n  - answer: {text: \"The crate has three modules.\", deltas: 1}\n    repeat: 20\n";

/// Short header and body timeouts; the connection cap as given.
fn fast_limits(max_connections: &str) -> Vec<&str> {
    vec![
        "--header-timeout-ms",
        "300",
        "--body-timeout-ms",
        "300",
        "--max-connections",
        max_connections,
        "--shutdown-grace-ms",
        "1000",
    ]
}

const HALF_HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: route\r\ncontent-len";

fn half_body(path: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: route\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"stream\":tr"
    )
    .into_bytes()
}

async fn open_with(addr: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    s
}

/// Everything the server sends until it closes the connection. A reset counts as a close; what
/// arrived before it is kept.
async fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout(GENEROUS, s.read(&mut buf))
            .await
            .expect("the route kept the socket open")
        {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status and JSON body of a raw HTTP/1.1 answer with a content-length.
fn parse(raw: &[u8]) -> (u16, serde_json::Value) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (status, json)
}

/// The error has the API's own shape and names `code`: OpenAI `{"error":{message,type,code}}`,
/// Anthropic `{"type":"error","error":{type,message}}` with the code in the message.
fn assert_api_error(api: &str, v: &serde_json::Value, code: &str) {
    let e = &v["error"];
    assert!(
        e["message"].is_string() && e["type"].is_string(),
        "{api}: {v}"
    );
    if api == "openai-chat" {
        assert_eq!(e["code"], code, "{v}");
    } else {
        assert_eq!(v["type"], "error", "{v}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(&format!("({code})")), "{v}");
    }
}

#[tokio::test]
async fn hardening_half_sent_head_and_idle_socket_are_closed_after_the_header_timeout() {
    let s = Setup::start_with("openai-chat", ANSWER, &fast_limits("64")).await;
    let mut half = open_with(&s.addr, HALF_HEAD).await;
    let mut idle = TcpStream::connect(&s.addr).await.unwrap();
    // No request to answer (the head never ended): the route closes without a response.
    assert_eq!(read_until_closed(&mut half).await, b"");
    assert_eq!(read_until_closed(&mut idle).await, b"");
    // The route still serves.
    let r = s
        .post("/v1/chat/completions", &request("openai-chat"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn hardening_half_sent_body_gets_a_408_in_the_api_shape() {
    for api in APIS {
        let s = Setup::start_with(api, ANSWER, &fast_limits("64")).await;
        let mut sock = open_with(&s.addr, &half_body(path_of(api))).await;
        let (status, v) = parse(&read_until_closed(&mut sock).await);
        assert_eq!(status, 408, "{api}: {v}");
        assert_api_error(api, &v, "request-body-timeout");
        assert!(s.sim.requests().is_empty(), "{api}: nothing went upstream");
    }
}

#[tokio::test]
async fn hardening_200_half_sent_sockets_do_not_exhaust_the_route() {
    let api = "openai-chat";
    // A cap below the 200 sockets, so the refusal past it is exercised too.
    let s = Setup::start_with(api, ANSWER, &fast_limits("50")).await;
    let mut socks = Vec::new();
    for i in 0..200 {
        let bytes = if i % 2 == 0 {
            HALF_HEAD.to_vec()
        } else {
            half_body(path_of(api))
        };
        socks.push(open_with(&s.addr, &bytes).await);
    }
    // While they are open, a real request is served or refused in the API's shape.
    let r = s.post(path_of(api), &request(api)).await;
    match r.status {
        200 => {}
        503 => assert_api_error(api, &r.json(), "route-busy"),
        other => panic!("{other}: {}", r.text()),
    }
    // Every one of the 200 ends: closed (head), 408 (body) or 503 (past the cap).
    let mut busy = 0;
    for sock in &mut socks {
        let raw = read_until_closed(sock).await;
        if raw.is_empty() {
            continue;
        }
        let (status, v) = parse(&raw);
        match status {
            408 => assert_api_error(api, &v, "request-body-timeout"),
            503 => {
                busy += 1;
                // Sent before the request is read: both APIs' shapes at once.
                assert_api_error("openai-chat", &v, "route-busy");
                assert_api_error("anthropic-messages", &v, "route-busy");
            }
            other => panic!("{other}: {v}"),
        }
    }
    assert!(busy > 0, "the connection cap of 50 was never reached");
    // Once they are gone, a real request is served.
    let r = s.post(path_of(api), &request(api)).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Sends `signal` with a half-sent head, a half-sent body and an idle socket open, and header
/// and body timeouts far beyond the wait: only the shutdown can end them.
async fn signal_stops_the_route_with_half_sent_requests(signal: &str) {
    let mut s = Setup::start_with(
        "openai-chat",
        ANSWER,
        &[
            "--header-timeout-ms",
            "3600000",
            "--body-timeout-ms",
            "3600000",
            "--shutdown-grace-ms",
            "1000",
        ],
    )
    .await;
    let mut socks = vec![
        open_with(&s.addr, HALF_HEAD).await,
        open_with(&s.addr, &half_body("/v1/chat/completions")).await,
        TcpStream::connect(&s.addr).await.unwrap(),
    ];
    // A request served after them: the route has accepted the sockets above before the signal.
    let r = s
        .post("/v1/chat/completions", &request("openai-chat"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let pid = s.route.id().unwrap().to_string();
    let kill = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::time::timeout(GENEROUS, s.route.wait())
        .await
        .unwrap_or_else(|_| panic!("{signal}: the route did not exit ({})", s.stderr()))
        .unwrap();
    assert!(status.success(), "{signal}: {status} ({})", s.stderr());
    assert!(s.stderr().contains("route: stopped"), "{}", s.stderr());
    for sock in &mut socks {
        read_until_closed(sock).await;
    }
}

#[tokio::test]
async fn hardening_sigterm_with_half_sent_requests_open_stops_the_route() {
    signal_stops_the_route_with_half_sent_requests("-TERM").await;
}

#[tokio::test]
async fn hardening_sigint_with_half_sent_requests_open_stops_the_route() {
    signal_stops_the_route_with_half_sent_requests("-INT").await;
}

/// Writes the whole body before reading, as simple clients do, then reads the answer.
async fn post_body_of(addr: &str, path: &str, len: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: route\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        // A broken pipe here is the bug: the route hung up before the client could finish.
        s.write_all(&chunk[..n])
            .await
            .unwrap_or_else(|e| panic!("{path} {len}: the route hung up mid-body ({e})"));
        left -= n;
    }
    read_until_closed(&mut s).await
}

#[tokio::test]
async fn hardening_33_and_50_mib_bodies_get_a_413_in_the_api_shape() {
    for api in APIS {
        let s = Setup::start(api, ANSWER).await;
        for mib in [33, 50] {
            let raw = post_body_of(&s.addr, path_of(api), mib << 20).await;
            let (status, v) = parse(&raw);
            assert_eq!(status, 413, "{api} {mib} MiB: {v}");
            assert_api_error(api, &v, "request-too-large");
        }
        assert!(s.sim.requests().is_empty(), "{api}: nothing went upstream");
        // The route still serves.
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
    }
}

#[tokio::test]
async fn hardening_serving_limits_out_of_range_are_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let composition = support::route::write_composition(dir.path());
    for (flag, value) in [
        ("--max-connections", "0"),
        ("--header-timeout-ms", "0"),
        ("--body-timeout-ms", "soon"),
    ] {
        let out = support::route::docsfab()
            .args(["route", "serve", "--composition"])
            .arg(&composition)
            .args([flag, value])
            .env("DOCSFAB_HOME", dir.path())
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{flag}: {err}");
        assert!(out.stdout.is_empty(), "{flag}: nothing served");
    }
}

#[tokio::test]
async fn hardening_other_methods_and_paths_are_refused_in_the_api_shape() {
    let s = Setup::start_with("openai-chat", ANSWER, &fast_limits("64")).await;
    for (head, api, status, code) in [
        (
            "GET /v1/messages",
            "anthropic-messages",
            405,
            "method-not-allowed",
        ),
        (
            "GET /v1/chat/completions",
            "openai-chat",
            405,
            "method-not-allowed",
        ),
        (
            "POST /v1/messages/count",
            "anthropic-messages",
            404,
            "not-found",
        ),
        ("POST /v2/other", "openai-chat", 404, "not-found"),
    ] {
        let mut sock = open_with(
            &s.addr,
            format!(
                "{head} HTTP/1.1\r\nhost: route\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        let (got, v) = parse(&read_until_closed(&mut sock).await);
        assert_eq!(got, status, "{head}: {v}");
        assert_api_error(api, &v, code);
    }
}

/// The header timeout runs only while the route waits for a head: a turn that takes longer than
/// it (here a stream of 20 events 50 ms apart against a 300 ms timeout) is answered in full.
#[tokio::test]
async fn hardening_header_and_body_timeouts_do_not_cut_a_slow_answer() {
    for api in APIS {
        let s = Setup::start_with(
            api,
            "responses:\n  - answer: {text: \"one two three four five six seven eight nine ten\", deltas: 20, event_delay_ms: 50}\n",
            &fast_limits("64"),
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert!(r.text().contains("ten"), "{api}: {}", r.text());
    }
}
