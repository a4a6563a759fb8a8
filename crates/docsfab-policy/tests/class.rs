//! Provider error classes: HTTP statuses, wire faults and structured error events.

use docsfab_policy::class::{
    ErrorEventClass, ProviderFailure, classify_error_event, classify_http_status,
    declared_status_of, is_replayable_status,
};
use docsfab_record::{FaultKind, ProviderErrorClass as C};
use serde_json::json;

// Proves CLS-1.
#[test]
fn statuses_map_to_classes_cls_1() {
    assert_eq!(classify_http_status(408), C::Timeout);
    assert_eq!(classify_http_status(504), C::Timeout);
    assert_eq!(classify_http_status(429), C::RateLimit);
    for s in [500, 501, 502, 503, 507, 520, 599] {
        assert_eq!(classify_http_status(s), C::Server, "{s}");
    }
    assert_eq!(classify_http_status(401), C::Authentication);
    assert_eq!(classify_http_status(403), C::Authentication);
    for s in [400, 404, 409, 413, 422] {
        assert_eq!(classify_http_status(s), C::InvalidRequest, "{s}");
    }
}

// Proves CLS-1.
#[test]
fn statuses_the_spec_leaves_open_cls_1() {
    // 425 asks for a repeat: transient, like a 5xx.
    assert_eq!(classify_http_status(425), C::Server);
    for s in [402, 405, 410, 418, 451, 499] {
        assert_eq!(classify_http_status(s), C::InvalidRequest, "{s}");
    }
    for s in [0, 99, 100, 200, 204, 302, 600, 999, u16::MAX] {
        assert_eq!(classify_http_status(s), C::Unknown, "{s}");
    }
}

// Proves CLS-1.
#[test]
fn faults_map_to_classes_cls_1() {
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::ConnectRefused).class,
        C::Network
    );
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::ConnectionDropped).class,
        C::Network
    );
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::BodyCut).class,
        C::Network
    );
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::RequestTimeout).class,
        C::Timeout
    );
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::StreamIncomplete).class,
        C::StreamIncomplete
    );
    assert_eq!(
        ProviderFailure::from_fault(FaultKind::ContentFilter).class,
        C::ContentFilter
    );
}

// Proves CLS-1 for the finer labels of issue 11: each keeps the class (and so the retry
// decision) the coarser label it replaces had.
#[test]
fn issue11_fine_fault_labels_keep_their_classes_cls_1() {
    for (fault, class) in [
        (FaultKind::Dns, C::Network),
        (FaultKind::Tls, C::Network),
        (FaultKind::Reset, C::Network),
        (FaultKind::ConnectTimeout, C::Timeout),
    ] {
        let failure = ProviderFailure::from_fault(fault);
        assert_eq!(failure.class, class, "{fault:?}");
        assert!(failure.is_transport_retryable(), "{fault:?}");
    }
}

// Proves REP-2, REP-3.
#[test]
fn replayable_statuses_are_408_425_429_and_5xx_rep_2_rep_3() {
    for s in 0..=u16::MAX {
        let expected = matches!(s, 408 | 425 | 429 | 500..=599);
        assert_eq!(is_replayable_status(s), expected, "{s}");
        let f = ProviderFailure::from_http_status(s, None);
        if (400..=599).contains(&s) {
            assert_eq!(f.is_transport_retryable(), expected, "{s}");
        }
    }
}

// Proves REP-4.
#[test]
fn head_status_wins_over_inconsistent_class_rep_4() {
    // A class recorded as server cannot make a 400 head retryable.
    let mut f = ProviderFailure::from_http_status(400, None);
    f.class = C::Server;
    assert!(!f.is_transport_retryable());
}

// Proves REP-6.
#[test]
fn rate_limit_needs_http_429_rep_6() {
    assert!(ProviderFailure::from_http_status(429, None).is_transport_retryable());
    assert!(ProviderFailure::from_http_status(429, None).is_throttled());
    let event = classify_error_event(&json!({"error":{"type":"rate_limit_error","code":429}}))
        .expect("an error event");
    let f = ProviderFailure::from_error_event(event);
    assert_eq!(f.class, C::RateLimit);
    assert!(!f.is_transport_retryable());
    assert!(!f.is_throttled());
}

// Proves CLS-5, CLS-6.
#[test]
fn structured_error_event_reads_declared_status_cls_5_cls_6() {
    let ev = |v: serde_json::Value| classify_error_event(&v).expect("an error event");
    assert_eq!(
        ev(json!({"error":{"type":"service_unavailable","code":503}})),
        ErrorEventClass {
            class: C::Server,
            declared_status: Some(503)
        }
    );
    assert_eq!(
        ev(json!({"error":{"code":504,"message":"bad request"}})),
        ErrorEventClass {
            class: C::Timeout,
            declared_status: Some(504)
        }
    );
    assert_eq!(ev(json!({"error":{"code":500}})).class, C::Server);
    assert_eq!(
        ev(json!({"error":{"type":"whatever","code":429}})),
        ErrorEventClass {
            class: C::RateLimit,
            declared_status: Some(429)
        }
    );
    // The declared status wins over the type.
    assert_eq!(
        ev(json!({"error":{"type":"server_error","code":400}})).class,
        C::InvalidRequest
    );
}

// Proves CLS-6.
#[test]
fn server_fault_types_without_status_are_server_cls_6() {
    for t in [
        "server_error",
        "service_unavailable",
        "internal_server_error",
        "internal_error",
        "api_error",
        "overloaded_error",
        "bad_gateway",
        "gateway_timeout",
        "timeout_error",
    ] {
        let got = classify_error_event(&json!({"error":{"type":t}})).expect("an error event");
        assert_eq!(
            got,
            ErrorEventClass {
                class: C::Server,
                declared_status: None
            },
            "{t}"
        );
        assert!(
            ProviderFailure::from_error_event(got).is_transport_retryable(),
            "{t}"
        );
    }
}

// Proves CLS-5.
#[test]
fn message_is_never_read_cls_5() {
    let got = classify_error_event(
        &json!({"error":{"type":"mystery","message":"503 service_unavailable timeout"}}),
    )
    .expect("an error event");
    assert_eq!(got.class, C::Unknown);
    assert!(!ProviderFailure::from_error_event(got).is_transport_retryable());
}

// Proves CLS-5.
#[test]
fn anthropic_error_event_shape_cls_5() {
    let got = classify_error_event(
        &json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
    )
    .expect("an error event");
    assert_eq!(got.class, C::Server);
    let got = classify_error_event(
        &json!({"type":"error","error":{"type":"authentication_error","message":"x"}}),
    )
    .expect("an error event");
    assert_eq!(got.class, C::Authentication);
}

// Proves CLS-5.
#[test]
fn only_error_and_type_error_make_an_event_cls_5() {
    for v in [
        json!({"choices":[]}),
        json!({"error":null}),
        json!({"type":"message","error":{"type":"server_error"}}),
        json!({"error":{"type":"server_error"},"model":"m"}),
        json!([{"error":{}}]),
        json!("error"),
    ] {
        assert_eq!(classify_error_event(&v), None, "{v}");
    }
}

// Proves CLS-5.
#[test]
fn odd_codes_are_not_declared_statuses_cls_5() {
    for v in [
        json!({"error":{"type":"server_error","code":" 503"}}),
        json!({"error":{"type":"server_error","code":"0503"}}),
        json!({"error":{"type":"server_error","code":"503.0"}}),
        json!({"error":{"type":"server_error","code":"5e2"}}),
        json!({"error":{"type":"server_error","code":"099"}}),
        json!({"error":{"type":"server_error","code":"600"}}),
        json!({"error":{"type":"server_error","code":503.5}}),
        json!({"error":{"type":"server_error","code":-503}}),
        json!({"error":{"type":"server_error","code":70000}}),
        json!({"error":{"type":"server_error","code":99}}),
    ] {
        let got = classify_error_event(&v).expect("an error event");
        assert_eq!(
            got,
            ErrorEventClass {
                class: C::Server,
                declared_status: None
            },
            "{v}"
        );
    }
    let got = classify_error_event(&json!({"error":{"code":"content_filter"}})).expect("event");
    assert_eq!(got.class, C::ContentFilter);
}

#[test]
fn class_names_are_kebab_case() {
    assert_eq!(C::StreamIncomplete.to_string(), "stream-incomplete");
    assert_eq!(
        serde_json::to_value(C::RateLimit).expect("serializes"),
        json!("rate-limit")
    );
}

// Proves CLS-5.
#[test]
fn string_error_is_an_event_of_unknown_class_cls_5() {
    let got = classify_error_event(&json!({"error":"upstream said 503 server_error"}))
        .expect("an error event");
    assert_eq!(
        got,
        ErrorEventClass {
            class: C::Unknown,
            declared_status: None
        }
    );
}

// Proves CLS-5 and CLS-6 for the event LiteLLM's proxy sends in place of the provider's
// (issue 24): `{"error":{"message":"litellm.APIConnectionError: ...","type":null,"code":"500"}}`.
// A decimal string of a status is that declared status, and a null type is no type, so the
// event is `server` (retryable) exactly as `{"error":{"type":"service_unavailable","code":503}}`
// is; the message is never read.
#[test]
fn issue24_a_decimal_string_code_is_a_declared_status_and_a_null_type_is_no_type_cls_5_cls_6() {
    let litellm = json!({"error":{
        "message":"litellm.APIConnectionError: APIConnectionError: OpenAIException - quota exceeded 429",
        "type":null,"param":null,"code":"500"}});
    assert_eq!(
        classify_error_event(&litellm),
        Some(ErrorEventClass {
            class: C::Server,
            declared_status: Some(500)
        })
    );
    for (code, class) in [
        ("504", C::Timeout),
        ("503", C::Server),
        ("429", C::RateLimit),
        ("401", C::Authentication),
        ("400", C::InvalidRequest),
    ] {
        let got = classify_error_event(&json!({"error":{"type":null,"code":code}})).expect("event");
        assert_eq!(got.class, class, "{code}");
        assert_eq!(got.declared_status, code.parse().ok(), "{code}");
    }
    // A declared 429 written as a string is still a rate limit without an HTTP status (REP-6):
    // terminal, never replayed.
    let quota = ProviderFailure::from_error_event(
        classify_error_event(&json!({"error":{"type":"insufficient_quota","code":"429"}})).unwrap(),
    );
    assert!(!quota.is_transport_retryable());
    let server = ProviderFailure::from_error_event(classify_error_event(&litellm).unwrap());
    assert!(server.is_transport_retryable());
    // A null type with no code names nothing: unknown, as an event with no type at all.
    assert_eq!(
        classify_error_event(&json!({"error":{"type":null,"message":"503 server_error"}})),
        Some(ErrorEventClass {
            class: C::Unknown,
            declared_status: None
        })
    );
    // The integer form is unchanged.
    assert_eq!(
        declared_status_of(&json!(503)),
        declared_status_of(&json!("503"))
    );
}
