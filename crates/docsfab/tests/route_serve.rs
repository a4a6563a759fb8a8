//! `docsfab route serve` as a real process, in front of the simulator, over real HTTP on
//! 127.0.0.1: answers pass the response boundary verbatim, refusals reach the client as errors
//! in its API's shape, and the in-turn replay acts as on a direct endpoint (CLS-7). Replay waits
//! are lowered in host.yaml (5 ms base, 20 ms cap) so the tests stay fast.

mod support;

use docsfab_boundary::{BoundaryConfig, Pass, Verdict};
use docsfab_policy::class::classify_error_event;
use docsfab_record::{Api as BApi, ProviderErrorClass};
use support::route::{KEY, KEY_VAR, MODEL, Setup, path_of, request};

const APIS: [&str; 2] = ["openai-chat", "anthropic-messages"];

fn boundary(api: &str) -> BoundaryConfig {
    let api = if api == "openai-chat" {
        BApi::OpenaiChat
    } else {
        BApi::AnthropicMessages
    };
    BoundaryConfig::new(api, MODEL, &[]).unwrap()
}

/// The error's code: OpenAI `error.code`; Anthropic names it in the message, in parentheses.
fn error_names(api: &str, v: &serde_json::Value, code: &str) -> bool {
    if api == "openai-chat" {
        v["error"]["code"] == code && v["error"]["message"].is_string()
    } else {
        v["type"] == "error"
            && v["error"]["type"].is_string()
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("({code})")))
    }
}

#[tokio::test]
async fn an_answer_passes_through_verbatim_for_both_apis_bnd_1() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - answer: {text: \"The crate has three modules.\", deltas: 1}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        // The provider got the selected model, not the client's.
        let log = s.sim.requests();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].model.as_deref(), Some(MODEL), "{api}");
        assert!(log[0].stream);
        // The body is the simulator's stream of the selected model, and it passes the boundary.
        assert_eq!(
            boundary(api).check(&r.body),
            Verdict::Pass(Pass::Stream),
            "{api}"
        );
        let text = r.text();
        assert!(text.contains(&format!("\"{MODEL}\"")), "{text}");
        assert!(text.contains("three"), "{text}");
        assert!(!text.contains("client-model"));
    }
}

#[tokio::test]
async fn a_chunk_from_another_model_is_refused_with_a_clear_error_bnd_4() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - answer: {text: \"secret plans of another model\", foreign_model: other-model}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 502, "{api}: {}", r.text());
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json")
        );
        let v = r.json();
        assert!(error_names(api, &v, "model-mismatch"), "{api}: {v}");
        // Not a byte of the refused stream reaches the client.
        assert!(!r.text().contains("plans"), "{}", r.text());
        assert!(!r.text().contains("data:"));
        // A model mismatch is no provider fault: one request, no replay.
        assert_eq!(s.sim.requests().len(), 1);
    }
}

#[tokio::test]
async fn a_host_key_in_content_is_refused_naming_the_kind_not_the_value_bnd_1() {
    for api in APIS {
        let s = Setup::start(
            api,
            &format!("responses:\n  - answer: {{text: \"the key is {KEY} ok\", deltas: 1}}\n"),
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        // 422, not 5xx: a credential refusal is terminal, so no client replays it.
        assert_eq!(r.status, 422, "{api}: {}", r.text());
        let v = r.json();
        assert!(error_names(api, &v, "credential-material"), "{api}: {v}");
        let text = r.text();
        assert!(text.contains(&format!("host-secret {KEY_VAR}")), "{text}");
        assert!(!text.contains(KEY), "{text}");
        assert!(!r.head.contains(KEY));
        let log = s.stderr();
        assert!(log.contains("422 credential-material"), "{log}");
        assert!(!log.contains(KEY), "{log}");
    }
}

#[tokio::test]
async fn an_error_event_only_stream_passes_to_the_client_bnd_2_rep_6() {
    for api in APIS {
        // A quota error inside a 200 stream: a rate limit without an HTTP status, never
        // replayed (REP-6), and handed to the client to classify.
        let s = Setup::start(
            api,
            "responses:\n  - stream_error: {type: insufficient_quota, code: 429}\n  - answer: {text: never}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        assert_eq!(
            boundary(api).check(&r.body),
            Verdict::Pass(Pass::ErrorEventsOnly),
            "{api}: {}",
            r.text()
        );
        let text = r.text();
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
            .unwrap();
        let class = classify_error_event(&serde_json::from_str(data).unwrap()).unwrap();
        assert_eq!(class.class, ProviderErrorClass::RateLimit, "{text}");
        assert_eq!(class.declared_status, Some(429));
        assert_eq!(s.sim.requests().len(), 1, "{api}: not replayed");
    }
}

#[tokio::test]
async fn seven_408s_then_an_answer_reach_the_client_as_one_clean_200_rep_1_cls_7() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - status: 408\n    repeat: 7\n  - answer: {text: recovered, deltas: 1}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert_eq!(boundary(api).check(&r.body), Verdict::Pass(Pass::Stream));
        assert!(r.text().contains("recovered"));
        let log = s.sim.requests();
        assert_eq!(log.len(), 8, "{api}: 8 attempts, the REP-1 bound");
        // Every replay sent the identical bytes (REP-12).
        assert!(log.iter().all(|e| e.sha256 == log[0].sha256));
        assert_eq!(
            s.stderr().matches("replaying in").count(),
            7,
            "{}",
            s.stderr()
        );
    }
}

#[tokio::test]
async fn eight_408s_end_the_turn_and_the_client_gets_the_408_rep_1() {
    let api = "openai-chat";
    let s = Setup::start(
        api,
        "responses:\n  - status: 408\n    repeat: 8\n  - answer: {text: too late}\n",
    )
    .await;
    let r = s.post(path_of(api), &request(api)).await;
    assert_eq!(r.status, 408, "{}", r.text());
    let v = r.json();
    assert!(error_names(api, &v, "timeout"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("8 request(s)"),
        "{v}"
    );
    assert_eq!(s.sim.requests().len(), 8);
}

#[tokio::test]
async fn a_200_stream_ending_in_a_503_error_event_is_replayed_by_the_route_cls_5_cls_7() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - stream_error: {type: service_unavailable, code: 503}\n  - answer: {text: second time lucky, deltas: 1}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 200, "{api}: {}", r.text());
        assert_eq!(boundary(api).check(&r.body), Verdict::Pass(Pass::Stream));
        assert!(r.text().contains("lucky"));
        assert!(!r.text().contains("service_unavailable"));
        let log = s.sim.requests();
        assert_eq!(log.len(), 2, "{api}");
        assert_eq!(log[0].sha256, log[1].sha256);
    }
}

#[tokio::test]
async fn a_400_upstream_passes_to_the_client_unreplayed_rep_3() {
    for api in APIS {
        let s = Setup::start(
            api,
            "responses:\n  - status: 400\n    body: '{\"error\":{\"message\":\"bad field; your key is routekey-5f2b9c1d7e3a8h4q\",\"type\":\"invalid_request_error\"}}'\n  - answer: {text: never}\n",
        )
        .await;
        let r = s.post(path_of(api), &request(api)).await;
        assert_eq!(r.status, 400, "{api}: {}", r.text());
        let v = r.json();
        assert!(error_names(api, &v, "invalid-request"), "{api}: {v}");
        // The provider's message is not copied: it may echo the key.
        assert!(!r.text().contains(KEY), "{}", r.text());
        assert!(!s.stderr().contains(KEY));
        assert_eq!(s.sim.requests().len(), 1, "{api}: never replayed");
    }
}

#[tokio::test]
async fn requests_the_route_cannot_forward_are_refused_before_sending() {
    let s = Setup::start("openai-chat", "responses:\n  - answer: {text: hi}\n").await;
    // The other API: no translation.
    let r = s.post("/v1/messages", &request("anthropic-messages")).await;
    assert_eq!(r.status, 400);
    assert!(
        error_names("anthropic-messages", &r.json(), "api-mismatch"),
        "{}",
        r.text()
    );
    // Not a stream: the boundary judges event streams only (BND-8).
    let r = s
        .post("/v1/chat/completions", r#"{"model":"m","messages":[]}"#)
        .await;
    assert_eq!(r.status, 400);
    assert!(
        error_names("openai-chat", &r.json(), "stream-required"),
        "{}",
        r.text()
    );
    let r = s.post("/v1/chat/completions", "{not json").await;
    assert_eq!(r.status, 400);
    assert!(error_names("openai-chat", &r.json(), "invalid-json"));
    let r = s.post("/v1/other", "{}").await;
    assert_eq!(r.status, 404);
    assert!(s.sim.requests().is_empty(), "nothing was sent upstream");
}

#[tokio::test]
async fn a_non_loopback_address_or_a_missing_key_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("host.yaml"),
        format!("providers:\n  default:\n    api: openai-chat\n    baseUrl: http://127.0.0.1:9/v1\n    apiKeyEnv: {KEY_VAR}\n    model: {MODEL}\n"),
    )
    .unwrap();
    let composition = support::route::write_composition(dir.path());
    let out = support::route::docsfab()
        .args(["route", "serve", "--listen", "0.0.0.0:0", "--composition"])
        .arg(&composition)
        .env("DOCSFAB_HOME", dir.path())
        .env(KEY_VAR, KEY)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");

    let out = support::route::docsfab()
        .args(["route", "serve", "--listen", "127.0.0.1:0", "--composition"])
        .arg(&composition)
        .env("DOCSFAB_HOME", dir.path())
        .env_remove(KEY_VAR)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(KEY_VAR) && err.contains("not set"), "{err}");
}

#[tokio::test]
async fn a_client_that_hangs_up_ends_the_turn_and_its_replays_rep_9() {
    use tokio::io::AsyncWriteExt;
    let api = "openai-chat";
    // Each 503 comes after 300 ms; replaying them all would take over a second.
    let s = Setup::start(
        api,
        "responses:\n  - status: 503\n    delay_ms: 300\n    repeat: 5\n  - answer: {text: late}\n",
    )
    .await;
    let mut c = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    let body = request(api);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(c);
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_eq!(
        s.sim.requests().len(),
        1,
        "the route kept replaying for a client that left"
    );
}
