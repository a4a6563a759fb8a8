//! Issue 24: what the transport takes from a response that came through LiteLLM's proxy,
//! with the simulator answering exactly as LiteLLM 1.108.7 was seen to answer (the real proxy
//! is tested end to end in `crates/docsfab/tests/gateway_litellm.rs`).
//!
//! - The gateway is recognised from its `x-litellm-*` headers and named on the outcome and on
//!   the failure, with the version when the head states one.
//! - REP-8: the provider's Retry-After that LiteLLM relayed as `llm_provider-retry-after(-ms)`
//!   is the provider's, for the replay policy (`retry_after_ms`) and the throttle alike; the
//!   same names without LiteLLM's own headers are ignored.
//! - CLS-5/CLS-6: LiteLLM's replacement of a provider's error event
//!   (`{"error":{"type":null,"code":"500",...}}`) after published text is a declared 500,
//!   `server`, as the provider's own `{"type":"service_unavailable","code":503}` is.

use std::time::Duration;

use bytes::Bytes;
use docsfab_provider::{
    HttpConfig, HttpTransport, Message, Payload, StreamOutcome, Transport as _, TransportFailure,
    TurnRequest,
};
use docsfab_record::{Api, GatewayName, ProviderErrorClass};
use docsfab_sim::{Scenario, SimServer};

fn payload() -> Bytes {
    Payload::build(
        Api::OpenaiChat,
        &TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "sim-model".into(),
            max_output_tokens: 64,
            system: None,
            messages: vec![Message::User { text: "hi".into() }],
            tools: vec![],
        },
    )
    .expect("payload")
    .bytes()
    .clone()
}

/// Sends one request to a simulator playing `yaml` and returns what the transport made of it.
async fn send(yaml: &str) -> Result<StreamOutcome, TransportFailure> {
    let scenario = Scenario::from_yaml_str(yaml, "test scenario").expect("scenario");
    let sim = SimServer::start("127.0.0.1:0".parse().expect("addr"), scenario, None)
        .await
        .expect("simulator");
    let transport = HttpTransport::new(HttpConfig {
        read_timeout: Duration::from_millis(2_000),
        ..HttpConfig::new(Api::OpenaiChat, sim.base_url(), None)
    })
    .expect("transport");
    let sent = transport.send(payload()).await;
    sim.shutdown().await;
    sent
}

/// LiteLLM's 429 for a provider 429 with `retry-after: 3` (as seen from 1.108.7): no
/// `x-litellm-version` on an error, the provider's head relayed with a prefix.
const LITELLM_429: &str = r#"responses:
  - status: 429
    headers:
      x-litellm-call-id: 35120f09-405e-4b67-9f60-58ad2fe803dd
      x-litellm-response-cost: "0"
      llm_provider-retry-after: "3"
    body: '{"error":{"message":"litellm.RateLimitError: RateLimitError: OpenAIException - simulated HTTP 429","type":"throttling_error","param":null,"code":"429"}}'
"#;

#[tokio::test]
async fn issue24_rep_8_litellm_relayed_retry_after_is_the_providers() {
    let f = send(LITELLM_429).await.expect_err("a 429");
    assert_eq!(f.failure.http_status, Some(429));
    assert_eq!(f.failure.class, ProviderErrorClass::RateLimit);
    assert_eq!(f.failure.retry_after_ms, Some(3_000), "{f:?}");
    // The throttle reads the same wait (its hold after a 429).
    assert_eq!(f.body.rate_headers.retry_after_ms, Some(3_000));
    let g = f.body.gateway.as_ref().expect("the gateway is recognised");
    assert_eq!(g.name, GatewayName::Litellm);
    assert_eq!(g.version, None, "LiteLLM states no version on an error");
}

#[tokio::test]
async fn issue24_rep_8_relayed_retry_after_ms_is_read_and_own_retry_after_wins() {
    let ms = LITELLM_429.replace(
        "llm_provider-retry-after: \"3\"",
        "llm_provider-retry-after-ms: \"1500\"",
    );
    let f = send(&ms).await.expect_err("a 429");
    assert_eq!(f.failure.retry_after_ms, Some(1_500));
    assert_eq!(f.body.rate_headers.retry_after_ms, Some(1_500));

    let own = LITELLM_429.replace(
        "llm_provider-retry-after: \"3\"",
        "llm_provider-retry-after: \"3\"\n      retry-after: \"1\"",
    );
    let f = send(&own).await.expect_err("a 429");
    assert_eq!(
        f.failure.retry_after_ms,
        Some(1_000),
        "the hop's own speaks first"
    );
    assert_eq!(f.body.rate_headers.retry_after_ms, Some(1_000));
}

#[tokio::test]
async fn issue24_rep_8_a_relayed_name_without_the_gateway_is_nobodys_retry_after() {
    let stray = LITELLM_429
        .replace(
            "      x-litellm-call-id: 35120f09-405e-4b67-9f60-58ad2fe803dd\n",
            "",
        )
        .replace("      x-litellm-response-cost: \"0\"\n", "");
    let f = send(&stray).await.expect_err("a 429");
    assert_eq!(f.failure.retry_after_ms, None);
    assert_eq!(f.body.rate_headers.retry_after_ms, None);
    assert_eq!(f.body.gateway, None);
}

#[tokio::test]
async fn issue24_an_answer_through_litellm_names_it_and_its_version() {
    let yaml = "responses:\n  - answer:\n      text: hello\n    headers:\n      x-litellm-version: 1.108.7\n      x-litellm-call-id: c\n";
    let outcome = send(yaml).await.expect("an answer");
    let g = *outcome.gateway.expect("the gateway is recognised");
    assert_eq!(g.name, GatewayName::Litellm);
    assert_eq!(g.version.as_deref(), Some("1.108.7"));
    // Straight from the provider: no gateway.
    let outcome = send("responses:\n  - answer: {text: hello}\n")
        .await
        .expect("an answer");
    assert_eq!(outcome.gateway, None);
}

#[tokio::test]
async fn issue24_cls_5_cls_6_litellms_error_event_is_a_declared_500_after_published_text() {
    // What LiteLLM 1.108.7 sent for a provider stream of text then
    // {"error":{"type":"service_unavailable","code":503}}: the same text, then its own event.
    let yaml = r#"responses:
  - status: 200
    headers:
      content-type: text/event-stream; charset=utf-8
      x-litellm-version: 1.108.7
    chunks:
      - "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"sim-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n"
      - "data: {\"error\": {\"message\": \"litellm.APIConnectionError: APIConnectionError: OpenAIException - An error occurred during streaming\", \"type\": null, \"param\": null, \"code\": \"500\"}}\n\n"
"#;
    let f = send(yaml)
        .await
        .expect_err("the error event fails the request");
    assert_eq!(f.failure.class, ProviderErrorClass::Server, "{f:?}");
    assert_eq!(f.failure.declared_status, Some(500));
    assert_eq!(f.failure.http_status, None);
    assert!(f.failure.content_published);
    assert!(f.failure.is_transport_retryable());
    assert!(
        !f.detail.contains("APIConnectionError"),
        "the message is never read: {}",
        f.detail
    );
    assert_eq!(f.body.gateway.map(|g| g.name), Some(GatewayName::Litellm));
}
