//! What the HTTP transport keeps of a failed 200 stream (BND-2) and of an error body (STP-14),
//! over real HTTP against the simulator on 127.0.0.1.

use bytes::Bytes;
use docsfab_provider::{HttpConfig, HttpTransport, Transport, TransportFailure};
use docsfab_record::{Api, FaultKind, ProviderErrorClass};
use docsfab_sim::{Scenario, SimServer};

async fn send(scenario: &str, keep_raw_body: bool) -> TransportFailure {
    let sim = SimServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Scenario::from_yaml_str(scenario, "inline").unwrap(),
        None,
    )
    .await
    .unwrap();
    let t = HttpTransport::new(HttpConfig {
        keep_raw_body,
        ..HttpConfig::new(Api::OpenaiChat, sim.base_url(), None)
    })
    .unwrap();
    let body = Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#);
    t.send(body).await.expect_err("the stream fails")
}

const ERROR: &str = "data: {\"error\":{\"type\":\"insufficient_quota\",\"code\":429}}\n\n";
const TAIL: &str = ": closing\n\ndata: [DONE]\n\n";

/// BND-2: after the error event the transport reads the stream to its end, so the whole body,
/// what followed the event included, is kept for the route to judge and forward.
#[tokio::test]
async fn a_failed_stream_is_kept_whole_when_raw_bodies_are_kept_bnd_2() {
    let scenario = format!(
        "responses:\n  - status: 200\n    headers: {{content-type: text/event-stream}}\n    chunks: [{:?}, {:?}]\n    chunk_delay_ms: 20\n",
        ERROR, TAIL
    );
    let f = send(&scenario, true).await;
    assert_eq!(f.failure.fault, FaultKind::ErrorEvent);
    assert_eq!(f.failure.class, ProviderErrorClass::RateLimit);
    assert_eq!(f.body.error_type.as_deref(), Some("insufficient_quota"));
    assert_eq!(f.body.error_code.as_deref(), Some("429"));
    assert_eq!(
        f.body.raw.as_deref(),
        Some(format!("{ERROR}{TAIL}").as_bytes())
    );
    // Not asked to keep bodies: nothing is kept, and nothing more is read.
    let f = send(&scenario, false).await;
    assert_eq!(f.body.raw, None);
    assert_eq!(f.body.error_type.as_deref(), Some("insufficient_quota"));
}

/// BND-2's bound: a provider that keeps sending after the error event does not hold the failure;
/// past 64 KiB the body is given up (the route then rebuilds the event).
#[tokio::test]
async fn a_tail_past_the_bound_is_not_kept_bnd_2() {
    let filler = format!(": {}\n", "x".repeat(70 * 1024));
    let scenario = format!(
        "responses:\n  - status: 200\n    headers: {{content-type: text/event-stream}}\n    chunks: [{:?}, {:?}, {:?}]\n",
        ERROR, filler, TAIL
    );
    let f = send(&scenario, true).await;
    assert_eq!(f.failure.class, ProviderErrorClass::RateLimit);
    assert_eq!(f.body.raw, None);
}

/// STP-14: an error body's type and code are kept (never its message), and
/// `context_length_exceeded` on a 400 reads as context exhausted.
#[tokio::test]
async fn an_error_bodys_words_are_kept_without_its_message_stp_14() {
    let scenario = "responses:\n  - status: 400\n    body: '{\"error\":{\"message\":\"secret words\",\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\"}}'\n";
    let f = send(scenario, true).await;
    assert_eq!(f.failure.http_status, Some(400));
    assert_eq!(
        f.body.error_code.as_deref(),
        Some("context_length_exceeded")
    );
    assert!(f.context_exhausted());
    assert!(!f.detail.contains("secret words"), "{}", f.detail);
    assert_eq!(f.body.raw, None, "a non-2xx body is never kept");
}
