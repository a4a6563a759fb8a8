//! End to end on real sockets: every fault kind × phase × API through `HttpTransport` and
//! `run_turn`, against the raw-TCP fault server in `support/`. Real time with lowered delays
//! (base 5 ms), so the suite stays fast. docs/fault-matrix.md lists one row per test here.

mod support;

use std::time::{Duration, Instant};

use docsfab_policy::replay::{ReplayLimits, StopReason, Window};
use docsfab_provider::driver::{TurnEnd, TurnResult, run_turn};
use docsfab_provider::{
    ApiKey, FinishReason, HttpConfig, HttpTransport, Message, Payload, TurnRequest,
};
use docsfab_record::{Api, FaultKind, ProviderErrorClass, ReplayCause, TurnStatus};
use support::{Act, End, FaultServer, Resp, refused_base_url};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-test-e2e-4f1d";

fn limits() -> ReplayLimits {
    ReplayLimits {
        base_delay_ms: 5,
        max_delay_ms: 40,
        max_total_delay_ms: 1_000,
        max_attempts_per_turn: 8,
        max_throttled_attempts_per_turn: 24,
        max_throttled_total_delay_ms: 2_000,
    }
}

fn payload(api: Api) -> Payload {
    Payload::build(
        api,
        &TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "m1".into(),
            max_output_tokens: 64,
            system: Some("be brief".into()),
            messages: vec![Message::User {
                text: "hello".into(),
            }],
            tools: vec![],
        },
    )
    .expect("payload")
}

fn transport(api: Api, base_url: String, limits_ms: u64) -> HttpTransport {
    HttpTransport::new(HttpConfig {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(limits_ms),
        ..HttpConfig::new(api, base_url, Some(ApiKey::new(KEY)))
    })
    .expect("transport")
}

async fn turn_at(api: Api, base_url: String, limits: ReplayLimits) -> TurnResult {
    let p = payload(api);
    let t = transport(api, base_url, 1_000);
    run_turn(&t, &limits, &p, &CancellationToken::new(), None).await
}

async fn turn(api: Api, acts: Vec<Act>) -> (TurnResult, FaultServer) {
    let srv = FaultServer::start(acts).await;
    let r = turn_at(api, srv.base_url(), limits()).await;
    (r, srv)
}

// ---- stream pieces -------------------------------------------------------------------------

/// Events before any answer content.
fn preamble(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => {
            "data: {\"id\":\"c1\",\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        }
        Api::AnthropicMessages => {
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m1\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\":\"ping\"}\n\n"
        }
    }
}

/// The first answer text.
fn content(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => {
            "data: {\"id\":\"c1\",\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
        }
        Api::AnthropicMessages => {
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n"
        }
    }
}

/// The rest of a complete answer: finish reason, usage, end marker.
fn finish(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => {
            "data: {\"id\":\"c1\",\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n"
        }
        Api::AnthropicMessages => {
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        }
    }
}

/// The end marker alone.
fn end_marker(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => "data: [DONE]\n\n",
        Api::AnthropicMessages => "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    }
}

/// A structured error event carrying `error` (a JSON object text).
fn error_event(api: Api, error: &str) -> String {
    match api {
        Api::OpenaiChat => format!("data: {{\"error\":{error}}}\n\n"),
        Api::AnthropicMessages => {
            format!("event: error\ndata: {{\"type\":\"error\",\"error\":{error}}}\n\n")
        }
    }
}

fn answer(api: Api) -> Act {
    Resp::new(200)
        .chunk(preamble(api))
        .chunk(content(api))
        .chunk(finish(api))
        .act()
}

fn status(code: u16) -> Act {
    Resp::new(code)
        .chunk(format!(
            "{{\"error\":{{\"type\":\"e\",\"code\":{code},\"message\":\"upstream said so\"}}}}"
        ))
        .act()
}

// ---- expectations --------------------------------------------------------------------------

/// The first request failed with `cause`/`class`, was replayed once with the same bytes, and
/// the replay got the answer.
fn replayed_then_answered(
    api: Api,
    r: &TurnResult,
    srv: &FaultServer,
    cause: ReplayCause,
    class: ProviderErrorClass,
) {
    assert_eq!(r.record.status, TurnStatus::Completed, "{:?}", r.record);
    assert_eq!(r.record.provider_retries, 1, "{:?}", r.record);
    assert_eq!(r.record.replays[0].cause, cause);
    assert_eq!(r.record.replays[0].provider_error_class, class);
    match &r.end {
        TurnEnd::Completed(o) => {
            assert_eq!(o.text, "Hello");
            assert_eq!(o.finish_reason, Some(FinishReason::Stop));
            assert!(o.done);
        }
        other => panic!("expected an answer, got {other:?}"),
    }
    let got = srv.received();
    assert_eq!(got.len(), 2);
    let digest = payload(api).digest().to_hex();
    assert!(got.iter().all(|g| g.body_sha256 == digest), "REP-12");
}

/// The first request failed with `class`, and the turn ended there.
fn ended_at_first(
    r: &TurnResult,
    srv: &FaultServer,
    fault: FaultKind,
    class: ProviderErrorClass,
    stop: StopReason,
) {
    assert_eq!(r.record.status, TurnStatus::Failed, "{:?}", r.record);
    assert_eq!(srv.received().len(), 1, "never sent again");
    assert_eq!(r.record.provider_retries, 0);
    let f = r.record.failure.expect("failure");
    assert_eq!((f.fault, f.class), (fault, class), "{:?}", r.record);
    assert_eq!(r.record.stop_reason, Some(stop));
    let shown = format!("{r:?}");
    assert!(!shown.contains(KEY), "the key never appears");
}

/// Generates one test per API for a case.
macro_rules! both_apis {
    ($name:ident, |$api:ident| $body:block) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn openai_chat() {
                let $api = Api::OpenaiChat;
                $body
            }
            #[tokio::test]
            async fn anthropic_messages() {
                let $api = Api::AnthropicMessages;
                $body
            }
        }
    };
}

// ---- before the response head --------------------------------------------------------------

// Proves REP-2, CLS-1.
both_apis!(refused_connection_is_replayed_rep_2_cls_1, |api| {
    let limits = ReplayLimits {
        max_attempts_per_turn: 3,
        ..limits()
    };
    let r = turn_at(api, refused_base_url().await, limits).await;
    assert_eq!(r.record.status, TurnStatus::Failed);
    assert_eq!(r.record.provider_retries, 2);
    assert_eq!(r.record.requests, 3);
    for e in &r.record.replays {
        assert_eq!(e.cause, ReplayCause::Fault(FaultKind::ConnectRefused));
        assert_eq!(e.provider_error_class, ProviderErrorClass::Network);
    }
    assert_eq!(
        r.record.stop_reason,
        Some(StopReason::AttemptsExhausted {
            window: Window::General,
            attempts: 3
        })
    );
});

// Proves REP-2, CLS-1.
both_apis!(drop_before_head_is_replayed_rep_2_cls_1, |api| {
    let (r, srv) = turn(api, vec![Act::Drop, answer(api)]).await;
    replayed_then_answered(
        api,
        &r,
        &srv,
        ReplayCause::Fault(FaultKind::ConnectionDropped),
        ProviderErrorClass::Network,
    );
});

// Proves REP-2, CLS-1.
// The RST is labelled `reset` (issue 11), with the class a dropped connection has.
both_apis!(reset_before_head_is_replayed_rep_2_cls_1, |api| {
    let (r, srv) = turn(api, vec![Act::Reset, answer(api)]).await;
    replayed_then_answered(
        api,
        &r,
        &srv,
        ReplayCause::Fault(FaultKind::Reset),
        ProviderErrorClass::Network,
    );
});

/// Every replay of a turn that ended without an answer carries `fault` and `class`, and the
/// turn used all `attempts`.
fn every_replay_was(r: &TurnResult, attempts: u32, fault: FaultKind, class: ProviderErrorClass) {
    assert_eq!(r.record.status, TurnStatus::Failed, "{:?}", r.record);
    assert_eq!(r.record.requests, attempts, "{:?}", r.record);
    assert_eq!(r.record.replays.len() as u32, attempts - 1);
    for e in &r.record.replays {
        assert_eq!(e.cause, ReplayCause::Fault(fault), "{:?}", r.record);
        assert_eq!(e.provider_error_class, class);
    }
    let f = r.record.failure.expect("failure");
    assert_eq!((f.fault, f.class), (fault, class));
}

// Proves CLS-1 for the `tls` label (issue 11): an https:// base URL at a plain-HTTP server fails
// the handshake; the class stays network, so the turn is replayed as before.
both_apis!(issue11_tls_handshake_failure_is_labelled_tls_cls_1, |api| {
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = plain.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        while let Ok((mut s, _)) = plain.accept().await {
            // Plain HTTP where a TLS ServerHello is expected.
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let limits = ReplayLimits {
        max_attempts_per_turn: 2,
        ..limits()
    };
    let r = turn_at(api, format!("https://{addr}/v1"), limits).await;
    server.abort();
    every_replay_was(&r, 2, FaultKind::Tls, ProviderErrorClass::Network);
});

// Proves CLS-1 for the `connect-timeout` label (issue 11). A listener whose accept queue is full
// drops further SYNs, so a connect to it hangs until the client's connect timeout; the class is
// timeout, as it was when this was labelled request-timeout.
both_apis!(
    issue11_connect_timeout_is_labelled_connect_timeout_cls_1,
    |api| {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let addr = socket.local_addr().expect("addr");
        let listener = socket.listen(0).expect("listen");
        // Fill the accept queue: connect until a connect no longer completes.
        let mut held = Vec::new();
        for _ in 0..8 {
            match tokio::time::timeout(
                Duration::from_millis(300),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(Ok(s)) => held.push(s),
                _ => break,
            }
        }
        let t = HttpTransport::new(HttpConfig {
            connect_timeout: Duration::from_millis(200),
            read_timeout: Duration::from_secs(5),
            ..HttpConfig::new(api, format!("http://{addr}/v1"), Some(ApiKey::new(KEY)))
        })
        .expect("transport");
        let limits = ReplayLimits {
            max_attempts_per_turn: 2,
            ..limits()
        };
        let r = run_turn(&t, &limits, &payload(api), &CancellationToken::new(), None).await;
        drop((held, listener));
        every_replay_was(
            &r,
            2,
            FaultKind::ConnectTimeout,
            ProviderErrorClass::Timeout,
        );
    }
);

// Proves REP-2, CLS-1.
both_apis!(
    silence_before_head_is_a_timeout_and_replayed_rep_2_cls_1,
    |api| {
        let (r, srv) = turn(api, vec![Act::Stall, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::RequestTimeout),
            ProviderErrorClass::Timeout,
        );
    }
);

// ---- HTTP statuses -------------------------------------------------------------------------

async fn replayable_status(api: Api, code: u16, class: ProviderErrorClass) {
    let (r, srv) = turn(api, vec![status(code), answer(api)]).await;
    replayed_then_answered(api, &r, &srv, ReplayCause::Status(code), class);
    let window = if code == 429 {
        Window::Throttle
    } else {
        Window::General
    };
    assert_eq!(r.record.replays[0].window, window, "REP-7");
}

async fn terminal_status(api: Api, code: u16, class: ProviderErrorClass) {
    let (r, srv) = turn(api, vec![status(code), answer(api)]).await;
    ended_at_first(
        &r,
        &srv,
        FaultKind::HttpStatus,
        class,
        StopReason::NotReplayable,
    );
    assert_eq!(r.record.failure.and_then(|f| f.http_status), Some(code));
}

// Proves REP-2, CLS-1.
both_apis!(status_408_is_replayed_rep_2_cls_1, |api| {
    replayable_status(api, 408, ProviderErrorClass::Timeout).await;
});
// Proves REP-2.
both_apis!(status_425_is_replayed_rep_2, |api| {
    replayable_status(api, 425, ProviderErrorClass::Server).await;
});
// Proves REP-2, REP-7.
both_apis!(
    status_429_is_replayed_in_the_throttle_window_rep_2_rep_7,
    |api| {
        replayable_status(api, 429, ProviderErrorClass::RateLimit).await;
    }
);
// Proves REP-2, CLS-1.
both_apis!(status_500_is_replayed_rep_2_cls_1, |api| {
    replayable_status(api, 500, ProviderErrorClass::Server).await;
});
// Proves REP-2, CLS-1.
both_apis!(status_503_is_replayed_rep_2_cls_1, |api| {
    replayable_status(api, 503, ProviderErrorClass::Server).await;
});
// Proves REP-2, CLS-1.
both_apis!(status_504_is_replayed_rep_2_cls_1, |api| {
    replayable_status(api, 504, ProviderErrorClass::Timeout).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_400_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 400, ProviderErrorClass::InvalidRequest).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_401_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 401, ProviderErrorClass::Authentication).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_403_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 403, ProviderErrorClass::Authentication).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_404_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 404, ProviderErrorClass::InvalidRequest).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_409_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 409, ProviderErrorClass::InvalidRequest).await;
});
// Proves REP-3, CLS-1.
both_apis!(status_422_is_terminal_rep_3_cls_1, |api| {
    terminal_status(api, 422, ProviderErrorClass::InvalidRequest).await;
});

// Proves REP-4.
both_apis!(a_502_wrapping_an_upstream_400_is_replayed_rep_4, |api| {
    let wrapped = Resp::new(502)
        .chunk("{\"error\":{\"type\":\"invalid_request_error\",\"code\":400}}")
        .act();
    let (r, srv) = turn(api, vec![wrapped, answer(api)]).await;
    replayed_then_answered(
        api,
        &r,
        &srv,
        ReplayCause::Status(502),
        ProviderErrorClass::Server,
    );
});

// Proves REP-4.
both_apis!(a_400_whose_body_says_503_is_terminal_rep_4, |api| {
    let wrapped = Resp::new(400)
        .chunk("{\"error\":{\"type\":\"service_unavailable\",\"code\":503}}")
        .act();
    let (r, srv) = turn(api, vec![wrapped, answer(api)]).await;
    ended_at_first(
        &r,
        &srv,
        FaultKind::HttpStatus,
        ProviderErrorClass::InvalidRequest,
        StopReason::NotReplayable,
    );
});

// Proves REP-5.
both_apis!(a_401_mentioning_a_timeout_is_still_terminal_rep_5, |api| {
    let auth = Resp::new(401)
        .chunk("{\"error\":{\"type\":\"authentication_error\",\"message\":\"connection timeout\"}}")
        .act();
    let (r, srv) = turn(api, vec![auth, answer(api)]).await;
    ended_at_first(
        &r,
        &srv,
        FaultKind::HttpStatus,
        ProviderErrorClass::Authentication,
        StopReason::NotReplayable,
    );
});

// ---- Retry-After ---------------------------------------------------------------------------

// Proves REP-8.
both_apis!(retry_after_ms_lengthens_the_wait_rep_8, |api| {
    let throttled = Resp::new(429).header("retry-after-ms", "150").act();
    let srv = FaultServer::start(vec![throttled, answer(api)]).await;
    let limits = ReplayLimits {
        max_delay_ms: 1_000,
        ..limits()
    };
    let started = Instant::now();
    let r = turn_at(api, srv.base_url(), limits).await;
    assert_eq!(r.record.status, TurnStatus::Completed);
    assert_eq!(r.record.replays[0].retry_after_ms, Some(150));
    assert_eq!(r.record.replays[0].wait_ms, 150, "not the 5 ms base");
    assert!(started.elapsed() >= Duration::from_millis(150));
});

// Proves REP-8.
both_apis!(
    retry_after_seconds_is_clamped_to_the_wait_cap_rep_8,
    |api| {
        let throttled = Resp::new(429).header("retry-after", "3").act();
        let (r, _srv) = turn(api, vec![throttled, answer(api)]).await;
        assert_eq!(r.record.status, TurnStatus::Completed);
        assert_eq!(r.record.replays[0].retry_after_ms, Some(3_000));
        assert_eq!(r.record.replays[0].wait_ms, 40, "clamped to max_delay_ms");
    }
);

// Proves REP-8.
both_apis!(retry_after_http_date_is_read_rep_8, |api| {
    let at = std::time::SystemTime::now() + Duration::from_secs(3);
    let throttled = Resp::new(429)
        .header("retry-after", &httpdate::fmt_http_date(at))
        .act();
    let (r, _srv) = turn(api, vec![throttled, answer(api)]).await;
    assert_eq!(r.record.status, TurnStatus::Completed);
    let seen = r.record.replays[0]
        .retry_after_ms
        .expect("a Retry-After date is read");
    assert!((1_000..=3_000).contains(&seen), "{seen}");
    assert_eq!(r.record.replays[0].wait_ms, 40, "clamped to max_delay_ms");
});

// ---- after the head, before content --------------------------------------------------------

// Proves REP-2, CLS-3.
both_apis!(
    reset_mid_body_before_content_is_replayed_rep_2_cls_3,
    |api| {
        let cut = Resp::new(200).chunk(preamble(api)).end(End::Reset).act();
        let (r, srv) = turn(api, vec![cut, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::BodyCut),
            ProviderErrorClass::Network,
        );
    }
);

// Proves REP-2, CLS-3.
both_apis!(cut_mid_body_before_content_is_replayed_rep_2_cls_3, |api| {
    let cut = Resp::new(200).chunk(preamble(api)).end(End::Cut).act();
    let (r, srv) = turn(api, vec![cut, answer(api)]).await;
    replayed_then_answered(
        api,
        &r,
        &srv,
        ReplayCause::Fault(FaultKind::BodyCut),
        ProviderErrorClass::Network,
    );
});

// Proves REP-2.
both_apis!(
    silence_mid_body_before_content_is_a_timeout_and_replayed_rep_2,
    |api| {
        let stall = Resp::new(200).chunk(preamble(api)).end(End::Stall).act();
        let (r, srv) = turn(api, vec![stall, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::RequestTimeout),
            ProviderErrorClass::Timeout,
        );
    }
);

// Proves CLS-2, CLS-4.
both_apis!(
    clean_close_before_content_is_stream_incomplete_and_replayed_cls_2_cls_4,
    |api| {
        let short = Resp::new(200).chunk(preamble(api)).act();
        let (r, srv) = turn(api, vec![short, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::StreamIncomplete),
            ProviderErrorClass::StreamIncomplete,
        );
    }
);

// Proves CLS-5, CLS-6.
both_apis!(
    error_event_declaring_503_is_server_and_replayed_cls_5_cls_6,
    |api| {
        let ev = Resp::new(200)
            .chunk(error_event(
                api,
                "{\"type\":\"service_unavailable\",\"code\":503}",
            ))
            .chunk(end_marker(api))
            .act();
        let (r, srv) = turn(api, vec![ev, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::ErrorEvent),
            ProviderErrorClass::Server,
        );
    }
);

// Proves CLS-6.
both_apis!(
    error_event_declaring_504_is_timeout_and_replayed_cls_6,
    |api| {
        let ev = Resp::new(200)
            .chunk(error_event(
                api,
                "{\"type\":\"gateway_timeout\",\"code\":504}",
            ))
            .act();
        let (r, srv) = turn(api, vec![ev, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::ErrorEvent),
            ProviderErrorClass::Timeout,
        );
    }
);

// Proves CLS-6.
both_apis!(
    error_event_server_type_without_code_is_server_cls_6,
    |api| {
        let ev = Resp::new(200)
            .chunk(preamble(api))
            .chunk(error_event(
                api,
                "{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}",
            ))
            .act();
        let (r, srv) = turn(api, vec![ev, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::ErrorEvent),
            ProviderErrorClass::Server,
        );
    }
);

// Proves REP-6, CLS-6.
both_apis!(error_event_declaring_429_is_terminal_rep_6_cls_6, |api| {
    let ev = Resp::new(200)
        .chunk(error_event(
            api,
            "{\"type\":\"insufficient_quota\",\"code\":429}",
        ))
        .act();
    let (r, srv) = turn(api, vec![ev, answer(api)]).await;
    ended_at_first(
        &r,
        &srv,
        FaultKind::ErrorEvent,
        ProviderErrorClass::RateLimit,
        StopReason::NotReplayable,
    );
    assert_eq!(r.record.failure.and_then(|f| f.http_status), None);
    assert_eq!(r.record.failure.and_then(|f| f.declared_status), Some(429));
});

// Proves REP-5.
both_apis!(
    content_filter_error_code_mentioning_a_connection_is_terminal_rep_5,
    |api| {
        let ev = Resp::new(200)
        .chunk(error_event(
            api,
            "{\"type\":\"content_filter\",\"code\":\"content_filter\",\"message\":\"connection reset\"}",
        ))
        .act();
        let (r, srv) = turn(api, vec![ev, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::ContentFilter,
            ProviderErrorClass::ContentFilter,
            StopReason::NotReplayable,
        );
    }
);

// Proves CLS-1.
both_apis!(
    a_400_with_content_filter_code_is_content_filter_cls_1,
    |api| {
        let refused = Resp::new(400)
            .chunk("{\"error\":{\"type\":\"invalid_request_error\",\"code\":\"content_filter\"}}")
            .act();
        let (r, srv) = turn(api, vec![refused, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::ContentFilter,
            ProviderErrorClass::ContentFilter,
            StopReason::NotReplayable,
        );
    }
);

// ---- after content -------------------------------------------------------------------------

// Proves REP-14.
both_apis!(reset_after_content_is_not_replayed_rep_14, |api| {
    let cut = Resp::new(200)
        .chunk(preamble(api))
        .chunk(content(api))
        .end(End::Reset)
        .act();
    let (r, srv) = turn(api, vec![cut, answer(api)]).await;
    ended_at_first(
        &r,
        &srv,
        FaultKind::BodyCut,
        ProviderErrorClass::Network,
        StopReason::ContentPublished,
    );
    assert!(r.record.failure.is_some_and(|f| f.content_published));
});

// Proves REP-14, CLS-3.
both_apis!(
    cut_after_content_keeps_network_class_and_is_not_replayed_rep_14_cls_3,
    |api| {
        let cut = Resp::new(200)
            .chunk(preamble(api))
            .chunk(content(api))
            .end(End::Cut)
            .act();
        let (r, srv) = turn(api, vec![cut, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::BodyCut,
            ProviderErrorClass::Network,
            StopReason::ContentPublished,
        );
    }
);

// Proves CLS-2, CLS-4.
both_apis!(
    clean_close_after_content_is_stream_incomplete_not_replayed_cls_2_cls_4,
    |api| {
        let short = Resp::new(200)
            .chunk(preamble(api))
            .chunk(content(api))
            .act();
        let (r, srv) = turn(api, vec![short, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::StreamIncomplete,
            ProviderErrorClass::StreamIncomplete,
            StopReason::ContentPublished,
        );
    }
);

// Proves CLS-3.
both_apis!(end_marker_without_finish_reason_is_an_answer_cls_3, |api| {
    let ok = Resp::new(200)
        .chunk(preamble(api))
        .chunk(content(api))
        .chunk(end_marker(api))
        .act();
    let (r, srv) = turn(api, vec![ok]).await;
    assert_eq!(r.record.status, TurnStatus::Completed);
    assert_eq!(srv.received().len(), 1);
    match r.end {
        TurnEnd::Completed(o) => {
            assert!(o.done);
            assert_eq!(o.finish_reason, None);
            assert_eq!(o.text, "Hel");
        }
        other => panic!("expected an answer, got {other:?}"),
    }
});

// Proves REP-14, CLS-5.
both_apis!(
    error_event_after_content_is_not_replayed_rep_14_cls_5,
    |api| {
        let ev = Resp::new(200)
            .chunk(preamble(api))
            .chunk(content(api))
            .chunk(error_event(api, "{\"type\":\"server_error\",\"code\":500}"))
            .act();
        let (r, srv) = turn(api, vec![ev, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::ErrorEvent,
            ProviderErrorClass::Server,
            StopReason::ContentPublished,
        );
    }
);

// Proves CLS-1, REP-5.
both_apis!(content_filter_finish_is_terminal_cls_1_rep_5, |api| {
    let filtered = match api {
        Api::OpenaiChat => Resp::new(200)
            .chunk(preamble(api))
            .chunk(content(api))
            .chunk("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\ndata: [DONE]\n\n"),
        Api::AnthropicMessages => Resp::new(200)
            .chunk(preamble(api))
            .chunk(content(api))
            .chunk("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
    }
    .act();
    let (r, srv) = turn(api, vec![filtered, answer(api)]).await;
    // Published content and the filter both forbid a replay; the filter is not replayable at all.
    ended_at_first(
        &r,
        &srv,
        FaultKind::ContentFilter,
        ProviderErrorClass::ContentFilter,
        StopReason::NotReplayable,
    );
});

// ---- the wire itself -----------------------------------------------------------------------

both_apis!(request_goes_to_the_api_path_with_its_auth_headers, |api| {
    let (r, srv) = turn(api, vec![answer(api)]).await;
    assert_eq!(r.record.status, TurnStatus::Completed);
    let got = &srv.received()[0];
    assert_eq!(got.method, "POST");
    assert_eq!(got.header("content-type"), Some("application/json"));
    match api {
        Api::OpenaiChat => {
            assert_eq!(got.path, "/v1/chat/completions");
            assert_eq!(
                got.header("authorization"),
                Some(format!("Bearer {KEY}").as_str())
            );
            assert_eq!(got.header("x-api-key"), None);
        }
        Api::AnthropicMessages => {
            assert_eq!(got.path, "/v1/messages");
            assert_eq!(got.header("x-api-key"), Some(KEY));
            assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(got.header("authorization"), None);
        }
    }
    match r.end {
        TurnEnd::Completed(o) => {
            assert_eq!(o.models, vec!["m1".to_string()]);
            assert_eq!(o.usage.output_tokens, Some(2));
        }
        other => panic!("expected an answer, got {other:?}"),
    }
});

// Proves REP-1, REP-12.
both_apis!(
    seven_faults_then_answer_sends_eight_identical_requests_rep_1_rep_12,
    |api| {
        let mut acts: Vec<Act> = (0..7).map(|_| status(408)).collect();
        acts.push(answer(api));
        let (r, srv) = turn(api, acts).await;
        assert_eq!(r.record.status, TurnStatus::Completed);
        assert_eq!(r.record.provider_retries, 7);
        let waits: Vec<u64> = r.record.replays.iter().map(|e| e.wait_ms).collect();
        assert_eq!(
            waits,
            vec![5, 10, 20, 40, 40, 40, 40],
            "doubling, capped at 40 ms"
        );
        let got = srv.received();
        assert_eq!(got.len(), 8);
        let digest = payload(api).digest().to_hex();
        assert!(got.iter().all(|g| g.body_sha256 == digest));
    }
);

// Proves CLS-5.
both_apis!(
    a_200_json_error_body_is_classified_like_an_error_event_cls_5,
    |api| {
        let json = Resp::new(200)
            .header("content-type", "application/json")
            .chunk("{\"error\":{\"type\":\"overloaded_error\",\"code\":503}}")
            .act();
        let (r, srv) = turn(api, vec![json, answer(api)]).await;
        replayed_then_answered(
            api,
            &r,
            &srv,
            ReplayCause::Fault(FaultKind::ErrorEvent),
            ProviderErrorClass::Server,
        );
    }
);

both_apis!(
    a_200_json_body_that_is_no_error_is_unknown_and_terminal,
    |api| {
        let json = Resp::new(200)
            .header("content-type", "application/json")
            .chunk("{\"id\":\"x\",\"choices\":[]}")
            .act();
        let (r, srv) = turn(api, vec![json, answer(api)]).await;
        ended_at_first(
            &r,
            &srv,
            FaultKind::ErrorEvent,
            ProviderErrorClass::Unknown,
            StopReason::NotReplayable,
        );
    }
);

both_apis!(the_raw_200_body_is_kept_byte_for_byte_when_asked, |api| {
    let srv = FaultServer::start(vec![answer(api)]).await;
    let t = HttpTransport::new(HttpConfig {
        keep_raw_body: true,
        ..HttpConfig::new(api, srv.base_url(), None)
    })
    .expect("transport");
    let p = payload(api);
    let r = run_turn(&t, &limits(), &p, &CancellationToken::new(), None).await;
    let expected = format!("{}{}{}", preamble(api), content(api), finish(api));
    match r.end {
        TurnEnd::Completed(o) => {
            assert_eq!(o.raw_body.as_deref(), Some(expected.as_bytes()));
        }
        other => panic!("expected an answer, got {other:?}"),
    }
});

// ---- cancellation and deadline over real HTTP ----------------------------------------------

/// A request dropped in flight was sent and may be billed: its prompt is estimated from the
/// bytes sent, its output is unknown (what had arrived is dropped with it), never a known 0.
fn dropped_in_flight_is_never_zero(r: &TurnResult) {
    let usage = r.record.usage;
    assert!(usage.estimated, "{usage:?}");
    assert!(usage.input_tokens.is_some_and(|n| n > 0), "{usage:?}");
    assert_eq!(usage.output_tokens, None, "{usage:?}");
    assert_eq!(usage.total(), None, "{usage:?}");
}

// Proves REP-9.
both_apis!(
    cancelling_a_stalled_request_ends_the_turn_at_once_rep_9,
    |api| {
        let srv = FaultServer::start(vec![Act::Stall]).await;
        let p = payload(api);
        let t = HttpTransport::new(HttpConfig::new(api, srv.base_url(), None)).expect("transport");
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.cancel();
        });
        let started = Instant::now();
        let r = run_turn(&t, &limits(), &p, &cancel, None).await;
        assert_eq!(r.end, TurnEnd::Cancelled);
        assert_eq!(r.record.status, TurnStatus::Cancelled);
        assert_eq!(r.record.failure, None);
        dropped_in_flight_is_never_zero(&r);
        // The default read timeout is 120 s: only the cancellation can have ended it this soon.
        assert!(started.elapsed() < Duration::from_secs(5));
    }
);

// Proves REP-10.
both_apis!(the_deadline_ends_a_stalled_request_rep_10, |api| {
    let srv = FaultServer::start(vec![Act::Stall]).await;
    let p = payload(api);
    let t = HttpTransport::new(HttpConfig::new(api, srv.base_url(), None)).expect("transport");
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(150);
    let r = run_turn(&t, &limits(), &p, &CancellationToken::new(), Some(deadline)).await;
    assert!(matches!(r.end, TurnEnd::DeadlineReached { .. }));
    assert_eq!(r.record.status, TurnStatus::Failed);
    dropped_in_flight_is_never_zero(&r);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(started.elapsed() < Duration::from_secs(5));
});

#[tokio::test]
async fn credentials_in_the_base_url_never_reach_the_record() {
    let refused = refused_base_url().await;
    // Some providers take the key as a query parameter; reqwest would print it in its error.
    let with_key = format!("{refused}?key=sk-in-url-secret");
    let r = turn_at(
        Api::OpenaiChat,
        with_key,
        ReplayLimits {
            max_attempts_per_turn: 1,
            ..limits()
        },
    )
    .await;
    assert_eq!(r.record.status, TurnStatus::Failed);
    let shown = format!("{r:?}{}", serde_json::to_string(&r.record).expect("json"));
    assert!(!shown.contains("sk-in-url-secret"), "{shown}");
    assert!(!shown.contains(KEY));
}
