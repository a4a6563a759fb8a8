//! What a real HTTP client (reqwest, as docsfab's provider uses it) sees of each connection fault.

mod support;

use std::error::Error as _;
use std::io::ErrorKind;

use support::*;

fn client() -> reqwest::Client {
    // reqwest is built without a default TLS provider; plain http needs one installed all the same.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .build()
        .expect("client")
}

fn io_kinds(e: &reqwest::Error) -> Vec<ErrorKind> {
    let mut kinds = Vec::new();
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            kinds.push(io.kind());
        }
        source = s.source();
    }
    kinds
}

async fn post(server: &docsfab_sim::SimServer, body: String) -> reqwest::Result<reqwest::Response> {
    client()
        .post(format!("{}/chat/completions", server.base_url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
}

#[tokio::test]
async fn a_cut_body_is_an_error_while_reading_the_body() {
    let server = start("responses:\n  - answer: {text: 'some text to cut'}\n    cut: {after_bytes: 40, with: close}\n").await;
    let response = post(&server, openai_body("m", true))
        .await
        .expect("the head arrives");
    assert_eq!(response.status(), 200);
    let e = response.bytes().await.expect_err("the body is incomplete");
    assert!(e.is_body() || e.is_decode(), "{e:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_reset_body_is_a_connection_reset_in_the_error_chain() {
    let server = start("responses:\n  - answer: {text: 'some text to cut'}\n    cut: {after_bytes: 40, with: reset}\n").await;
    let response = post(&server, openai_body("m", true))
        .await
        .expect("the head arrives");
    let e = response.bytes().await.expect_err("the body is reset");
    assert!(io_kinds(&e).contains(&ErrorKind::ConnectionReset), "{e:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_drop_fails_the_send() {
    let server = start("responses:\n  - drop: close\n  - drop: reset\n").await;
    let e = post(&server, openai_body("m", true))
        .await
        .expect_err("no response");
    assert!(e.is_request(), "{e:?}");
    let e = post(&server, openai_body("m", true))
        .await
        .expect_err("no response");
    assert!(io_kinds(&e).contains(&ErrorKind::ConnectionReset), "{e:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_stream_without_finish_or_done_reads_to_a_clean_end() {
    let server = start(
        "responses:\n  - answer: {text: 'half', omit_finish_reason: true, omit_done: true}\n",
    )
    .await;
    let response = post(&server, openai_body("m", true)).await.unwrap();
    let body = response.bytes().await.expect("a complete chunked body");
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));
    server.shutdown().await;
}
