//! BND-2 on the route, end to end: when a turn ends on a 200 stream's structured error event,
//! the client gets the provider's own stream byte for byte (after the boundary passed it), not a
//! rebuilt event; the in-turn replay still runs first, and only the last failed body goes out.

mod support;

use docsfab_boundary::{BoundaryConfig, Pass, Verdict};
use docsfab_policy::class::classify_error_event;
use docsfab_record::{Api as BApi, ProviderErrorClass};
use docsfab_sim::{Scenario, SimServer};
use support::route::{KEY, KEY_VAR, MODEL, Setup, path_of, post, request};

const APIS: [&str; 2] = ["openai-chat", "anthropic-messages"];

fn boundary(api: &str) -> BoundaryConfig {
    let api = if api == "openai-chat" {
        BApi::OpenaiChat
    } else {
        BApi::AnthropicMessages
    };
    BoundaryConfig::new(api, MODEL, &[]).unwrap()
}

/// What the simulator sends for `scenario` when asked directly, with the model the route sets.
async fn direct_body(api: &str, scenario: &str) -> Vec<u8> {
    let sim = SimServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Scenario::from_yaml_str(scenario, "direct").unwrap(),
        None,
    )
    .await
    .unwrap();
    let body = request(api).replace("client-model", MODEL);
    let r = post(&sim.local_addr().to_string(), path_of(api), &body).await;
    assert_eq!(r.status, 200);
    r.body
}

/// A body with every `"created":SECONDS` member set to 0: the one member of an OpenAI chunk
/// that a second simulator answer writes differently (its wall clock), so bodies from two
/// answers can be compared byte for byte otherwise.
fn without_clock(body: &[u8]) -> Vec<u8> {
    const KEY: &[u8] = b"\"created\":";
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        out.extend_from_slice(&rest[..at + KEY.len()]);
        rest = &rest[at + KEY.len()..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        out.push(b'0');
        rest = &rest[digits..];
    }
    out.extend_from_slice(rest);
    out
}

/// The first error event's class, as the client's step retry would read it.
fn class_of(text: &str) -> (ProviderErrorClass, Option<u16>) {
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .find(|d| d.contains("\"error\""))
        .unwrap_or_else(|| panic!("no error event: {text}"));
    let c = classify_error_event(&serde_json::from_str(data).unwrap()).unwrap();
    (c.class, c.declared_status)
}

#[tokio::test]
async fn an_error_event_stream_reaches_the_client_verbatim_bnd_2_rep_6() {
    // A declared 429 is never replayed (REP-6): the turn ends on the first body.
    let scenario = "responses:\n  - stream_error: {type: insufficient_quota, code: 429, message: the quota of this month is spent}\n";
    for api in APIS {
        let s = Setup::start(api, scenario).await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        assert_eq!(s.sim.requests().len(), 1);
        // Byte for byte what the provider sent, its own message included.
        assert_eq!(
            without_clock(&r.body),
            without_clock(&direct_body(api, scenario).await),
            "{api}"
        );
        assert!(r.text().contains("the quota of this month is spent"));
        assert_eq!(
            boundary(api).check(&r.body),
            Verdict::Pass(Pass::ErrorEventsOnly)
        );
        assert_eq!(
            class_of(&r.text()),
            (ProviderErrorClass::RateLimit, Some(429))
        );
    }
}

#[tokio::test]
async fn the_replay_runs_first_and_only_the_last_failed_body_is_forwarded_cls_7_bnd_2() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - stream_error: {type: service_unavailable, code: 503, message: early burst}\n    repeat: 7\n  - stream_error: {type: service_unavailable, code: 503, message: still down}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        // REP-1: eight identical requests, then the eighth body goes to the client.
        let log = s.sim.requests();
        assert_eq!(log.len(), 8, "{api}");
        assert!(log.iter().all(|e| e.sha256 == log[0].sha256));
        let text = r.text();
        assert!(text.contains("still down"), "{text}");
        assert!(!text.contains("early burst"), "{text}");
        assert_eq!(class_of(&text), (ProviderErrorClass::Server, Some(503)));
    }
}

#[tokio::test]
async fn output_then_an_error_event_is_forwarded_as_the_provider_sent_it_bnd_2_bnd_4() {
    // Content was published, so the turn is not replayed (REP-14); the stream passes the
    // boundary as the selected model's output and reaches the client whole.
    let scenario = "responses:\n  - answer: {text: partial answer, deltas: 1, error_event: {type: service_unavailable, code: 503}, omit_finish_reason: true}\n";
    let api = "openai-chat";
    let s = Setup::start(api, scenario).await;
    let r = s.post(path_of(api), &request(api)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.sim.requests().len(), 1);
    assert_eq!(
        without_clock(&r.body),
        without_clock(&direct_body(api, scenario).await)
    );
    assert_eq!(boundary(api).check(&r.body), Verdict::Pass(Pass::Stream));
    assert!(r.text().contains("partial answer"));
    assert_eq!(class_of(&r.text()), (ProviderErrorClass::Server, Some(503)));
}

#[tokio::test]
async fn an_error_stream_holding_the_key_is_refused_not_forwarded_bnd_2() {
    for api in APIS {
        let s = Setup::start(
            api,
            &format!(
                "responses:\n  - stream_error: {{type: insufficient_quota, code: 429, message: 'bad key {KEY}'}}\n"
            ),
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 422, "{api}: {}", r.text());
        let text = r.text();
        assert!(text.contains(&format!("host-secret {KEY_VAR}")), "{text}");
        assert!(!text.contains(KEY), "{text}");
        assert!(!s.stderr().contains(KEY));
    }
}

#[tokio::test]
async fn an_error_event_after_another_models_chunk_is_refused_bnd_4() {
    let api = "openai-chat";
    let s = Setup::start(
        api,
        "responses:\n  - answer: {text: other words, foreign_model: other-model, error_event: {type: insufficient_quota, code: 429}, omit_finish_reason: true}\n",
    )
    .await;
    let r = s.post(path_of(api), &request(api)).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("model-mismatch"), "{}", r.text());
    assert!(!r.text().contains("other words"));
}
