//! One rule at a time, each test naming the requirement it proves.

use docsfab_boundary::{BoundaryConfig, CredentialKind, Pass, Reason, Refusal, Secret, Verdict};
use docsfab_record::Api;

const M: &str = "gpt-4o-mini";

fn openai() -> BoundaryConfig {
    BoundaryConfig::new(Api::OpenaiChat, M, &[]).unwrap()
}

fn anthropic() -> BoundaryConfig {
    BoundaryConfig::new(Api::AnthropicMessages, "claude-sonnet-4-5", &[]).unwrap()
}

fn chunk(model: &str, content: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n"
    )
}

fn refused(v: &Verdict) -> Option<(&str, u64)> {
    v.refusal().map(|r| (r.reason.code(), r.offset))
}

/// BND-1: identity, credentials and structure are all checked.
#[test]
fn body_is_checked_for_identity_credentials_and_structure_bnd_1() {
    let c = openai();
    assert_eq!(
        c.check(chunk(M, "hi").as_bytes()),
        Verdict::Pass(Pass::Stream)
    );
    assert_eq!(
        refused(&c.check(chunk("o1", "hi").as_bytes())),
        Some(("model-mismatch", 0))
    );
    let key = "sk-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123";
    assert_eq!(
        refused(&c.check(chunk(M, key).as_bytes())).map(|r| r.0),
        Some("credential-material")
    );
    assert_eq!(
        refused(&c.check(b"data: {\n\n")),
        Some(("unparsable-data-line", 0))
    );
}

/// BND-2: error-only streams pass without an identity, and are still scanned.
#[test]
fn error_events_only_skip_identity_but_not_the_scan_bnd_2() {
    let body = "data: {\"error\":{\"type\":\"server_error\",\"code\":502}}\n\ndata: [DONE]\n\n";
    assert_eq!(
        openai().check(body.as_bytes()),
        Verdict::Pass(Pass::ErrorEventsOnly)
    );
    let anth =
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    assert_eq!(
        anthropic().check(anth.as_bytes()),
        Verdict::Pass(Pass::ErrorEventsOnly)
    );
    // Without [DONE], and with several error events.
    let two = "data: {\"error\":{\"code\":500}}\n\ndata: {\"error\":null}\n\n";
    assert_eq!(
        openai().check(two.as_bytes()),
        Verdict::Pass(Pass::ErrorEventsOnly)
    );

    let secret = Secret::new("PROVIDER_KEY", "hostkey-5f2a9b7c1d").unwrap();
    let c = BoundaryConfig::new(Api::OpenaiChat, M, &[secret]).unwrap();
    let leak = "data: {\"error\":{\"message\":\"bad key hostkey-5f2a9b7c1d\"}}\n\n";
    let v = c.check(leak.as_bytes());
    assert_eq!(
        v.refusal().map(|r| &r.reason),
        Some(&Reason::CredentialMaterial(CredentialKind::HostSecret(
            "PROVIDER_KEY".into()
        )))
    );
}

/// BND-3: only `error` and an optional `"type": "error"` make a pure error event.
#[test]
fn only_error_and_type_error_make_a_pure_error_event_bnd_3() {
    let c = openai();
    let pure = [
        r#"{"error":{"code":503}}"#,
        r#"{"type":"error","error":{"type":"api_error"}}"#,
        r#"{"error":"text"}"#,
        r#" { "error" : 1 } "#,
    ];
    for p in pure {
        let v = c.check(format!("data: {p}\n\n").as_bytes());
        assert_eq!(v, Verdict::Pass(Pass::ErrorEventsOnly), "{p}");
    }
    let not_pure = [
        r#"{"type":"server_error","error":{}}"#,
        r#"{"type":null,"error":{}}"#,
        r#"{"error":{},"id":"x"}"#,
        r#"{"error":{},"choices":[]}"#,
        r#"{"type":"error"}"#,
        r#"{}"#,
        r#"{"type":"error","type":"x","error":{}}"#,
    ];
    for p in not_pure {
        let v = c.check(format!("data: {p}\n\n").as_bytes());
        assert_eq!(refused(&v), Some(("missing-model-identity", 0)), "{p}");
    }
}

/// BND-4: every other event needs the selected model, per API; a mismatch is refused even
/// when an error event follows.
#[test]
fn every_event_needs_the_selected_model_bnd_4() {
    let c = openai();
    // Other model, even when an error event follows.
    let body = format!(
        "{}data: {{\"error\":{{\"code\":503}}}}\n\n",
        chunk("gpt-4o", "x")
    );
    assert_eq!(
        refused(&c.check(body.as_bytes())),
        Some(("model-mismatch", 0))
    );
    // A later chunk without a model is refused where it starts.
    let first = chunk(M, "a");
    let body = format!("{first}data: {{\"choices\":[]}}\n\n");
    assert_eq!(
        refused(&c.check(body.as_bytes())),
        Some(("missing-model-identity", first.len() as u64))
    );
    // Anthropic: the identity comes from message_start and covers the events after it.
    let a = anthropic();
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-5\"}}\n\n";
    let delta = "data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n";
    assert_eq!(
        a.check(format!("{start}{delta}").as_bytes()),
        Verdict::Pass(Pass::Stream)
    );
    assert_eq!(
        refused(&a.check(format!("{delta}{start}").as_bytes())),
        Some(("missing-model-identity", 0))
    );
    // A model named anywhere the API puts one must match, in either API.
    let nested = "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4\"}}\n\n";
    assert_eq!(
        refused(&a.check(nested.as_bytes())),
        Some(("model-mismatch", 0))
    );
    let top = format!("{start}data: {{\"type\":\"ping\",\"model\":\"x\"}}\n\n");
    assert_eq!(
        refused(&a.check(top.as_bytes())),
        Some(("model-mismatch", start.len() as u64))
    );
}

/// BND-5: data after [DONE] keeps the identity check.
#[test]
fn data_after_done_keeps_the_identity_check_bnd_5() {
    let err = "data: {\"error\":{\"code\":503}}\n\n";
    let body = format!("{err}data: [DONE]\n\n{err}");
    let after = (err.len() + "data: [DONE]\n\n".len()) as u64;
    assert_eq!(
        refused(&openai().check(body.as_bytes())),
        Some(("missing-model-identity", after))
    );
    let body = format!("{err}data: [DONE]\n\ndata: [DONE]\n\n");
    assert_eq!(
        refused(&openai().check(body.as_bytes())),
        Some(("missing-model-identity", after))
    );
    let body = format!("{}data: [DONE]\n\n{}", chunk(M, "a"), chunk("other", "b"));
    assert_eq!(
        refused(&openai().check(body.as_bytes())).map(|r| r.0),
        Some("model-mismatch")
    );
}

/// BND-6: CR, LF and CRLF end lines; every leading BOM is dropped.
#[test]
fn line_endings_and_boms_bnd_6() {
    let c = openai();
    let good = chunk(M, "a");
    let good = good.trim_end();
    let bad = chunk("other", "b");
    let bad = bad.trim_end();
    for sep in ["\r", "\n", "\r\n"] {
        let body = format!("{good}{sep}{bad}{sep}");
        let at = (good.len() + sep.len()) as u64;
        assert_eq!(
            refused(&c.check(body.as_bytes())),
            Some(("model-mismatch", at)),
            "{sep:?}"
        );
    }
    // One, two and three BOMs: the line is still read as data, and the offset is the line's.
    for boms in 1..=3 {
        let body = format!("{good}\n\n{}{bad}\n\n", "\u{FEFF}".repeat(boms));
        let at = (good.len() + 2) as u64;
        assert_eq!(
            refused(&c.check(body.as_bytes())),
            Some(("model-mismatch", at))
        );
    }
    // A BOM in the middle of a line is not dropped: here it breaks the JSON.
    let body = "data: \u{FEFF}{\"model\":\"gpt-4o-mini\"}\n\n";
    assert_eq!(
        refused(&c.check(body.as_bytes())),
        Some(("unparsable-data-line", 0))
    );
}

/// BND-7: each data line is parsed alone; one that does not parse refuses the body.
#[test]
fn each_data_line_parses_alone_bnd_7() {
    let c = openai();
    for bad in [
        "data: {\"model\":\"gpt-4o-mini\"} x",
        "data: {\"model\":\"gpt-4o-mini\"",
        "data:",
        "data",
        "data: [DONE] ",
        "data: {\"model\":\"gpt-4o-mini\",\"s\":\"\\ud800\"}",
    ] {
        assert_eq!(
            refused(&c.check(bad.as_bytes())),
            Some(("unparsable-data-line", 0)),
            "{bad}"
        );
    }
    // Non-UTF-8 inside a string is not JSON.
    let mut body = b"data: {\"model\":\"gpt-4o-mini\",\"s\":\"".to_vec();
    body.extend_from_slice(b"\xff\"}\n\n");
    assert_eq!(refused(&c.check(&body)), Some(("unparsable-data-line", 0)));
    // Deep nesting is refused, not a stack overflow.
    let deep = format!("data: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        refused(&c.check(deep.as_bytes())),
        Some(("unparsable-data-line", 0))
    );
    // `data:` with no space and with two spaces are the same field.
    let tight = "data:{\"model\":\"gpt-4o-mini\"}\n\ndata:  {\"model\":\"gpt-4o-mini\"}\n\n";
    assert_eq!(c.check(tight.as_bytes()), Verdict::Pass(Pass::Stream));
}

/// BND-7: a second data line in one event is refused even when each line is a whole chunk of
/// the selected model, because every consumer joins them and cannot parse the result. A
/// credential in that line still outranks it; a comment does not end the event; a blank line
/// does.
#[test]
fn a_second_data_line_in_one_event_is_refused_bnd_7() {
    let c = openai();
    let obj = |content: &str| {
        format!("{{\"model\":\"{M}\",\"choices\":[{{\"delta\":{{\"content\":\"{content}\"}}}}]}}")
    };
    let a = obj("a");
    let two = format!("data: {a}\ndata: {a}\n\ndata: [DONE]\n\n");
    let second = (a.len() + 7) as u64;
    assert_eq!(
        refused(&c.check(two.as_bytes())),
        Some(("multi-line-data-event", second))
    );
    let with_done = format!("data: {a}\ndata: [DONE]\n\n");
    assert_eq!(
        refused(&c.check(with_done.as_bytes())),
        Some(("multi-line-data-event", second))
    );
    let commented = format!("data: {a}\n: keep-alive\ndata: {a}\n\n");
    assert_eq!(
        refused(&c.check(commented.as_bytes())).map(|r| r.0),
        Some("multi-line-data-event")
    );
    // What outranks it on the line: a credential, and another model.
    let keyed = format!(
        "data: {a}\ndata: {}\n\n",
        obj("sk-proj-Q3xZ8kLm0pR7sT2vW9yB4nD6fH1jK5gA")
    );
    assert_eq!(
        refused(&c.check(keyed.as_bytes())).map(|r| r.0),
        Some("credential-material")
    );
    let other = format!("data: {a}\ndata: {}\n\n", a.replace(M, "other-model"));
    assert_eq!(
        refused(&c.check(other.as_bytes())).map(|r| r.0),
        Some("model-mismatch")
    );
    let separate = format!("data: {a}\n\ndata: {a}\n\ndata: [DONE]\n\n");
    assert_eq!(c.check(separate.as_bytes()), Verdict::Pass(Pass::Stream));
}

/// BND-8: a body that is not a stream, or a stream with no event, is refused.
#[test]
fn not_a_stream_or_no_event_is_refused_bnd_8() {
    let c = openai();
    assert_eq!(refused(&c.check(b"")), Some(("no-event", 0)));
    assert_eq!(refused(&c.check(b"\n\r\n\r")), Some(("no-event", 4)));
    assert_eq!(
        refused(&c.check(b"{\"model\":\"gpt-4o-mini\"}")),
        Some(("not-a-stream", 0))
    );
    assert_eq!(
        refused(&c.check(b"id: 1\nretry: 5\nevent: x\n\n")),
        Some(("no-event", 25))
    );
    assert_eq!(
        refused(&c.check(b": hi\nDATA: {}\n")),
        Some(("not-a-stream", 5))
    );
}

/// BND-9: the last line is read without an ending; a CRLF split across reads is one ending.
#[test]
fn last_line_without_ending_is_inspected_bnd_9() {
    let c = openai();
    let good = chunk(M, "a");
    let body = format!("{good}data: {{\"model\":\"other\"}}");
    assert_eq!(
        refused(&c.check(body.as_bytes())),
        Some(("model-mismatch", good.len() as u64))
    );
    // A CR that ends one read and an LF that starts the next are one ending: no extra line.
    let mut b = c.start();
    b.feed(b"data: {\"model\":\"gpt-4o-mini\"}\r");
    b.feed(b"\n");
    b.feed(b"\rdata: [DONE]\r");
    assert_eq!(b.finish(), Verdict::Pass(Pass::Stream));
}

#[test]
fn refusal_is_final_and_reported_by_feed() {
    let c = openai();
    let mut b = c.start();
    assert_eq!(b.feed(chunk(M, "a").as_bytes()), None);
    let r = b.feed(chunk("other", "b").as_bytes()).cloned();
    assert_eq!(r.as_ref().map(|r| r.reason.code()), Some("model-mismatch"));
    assert_eq!(b.feed(chunk(M, "c").as_bytes()).cloned(), r);
    assert_eq!(b.finish().refusal().cloned(), r);
}

#[test]
fn long_lines_are_refused_at_the_limit_whatever_the_reads() {
    let c = openai().max_line_bytes(100);
    let long = format!(
        "data: {{\"model\":\"gpt-4o-mini\",\"x\":\"{}\"}}\n",
        "a".repeat(200)
    );
    let want = Some(Refusal {
        reason: Reason::LineTooLong,
        offset: 0,
    });
    assert_eq!(c.check(long.as_bytes()).refusal().cloned(), want);
    let mut b = c.start();
    for byte in long.as_bytes() {
        b.feed(std::slice::from_ref(byte));
    }
    assert_eq!(b.finish().refusal().cloned(), want);
}

#[test]
fn credential_shapes_and_lookalikes() {
    let c = openai();
    let kind = |text: &str| {
        c.check(chunk(M, text).as_bytes())
            .refusal()
            .and_then(|r| match &r.reason {
                Reason::CredentialMaterial(k) => Some(k.code().to_owned()),
                _ => None,
            })
    };
    let found = [
        ("sk-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123", "openai-api-key"),
        (
            "x sk-svcacct-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123 y",
            "openai-api-key",
        ),
        (
            "(sk-ant-api03-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123)",
            "anthropic-api-key",
        ),
        (
            "nvapi-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123abcdefghij",
            "nvidia-api-key",
        ),
        ("ASIAY34FZKBOKMUTVV7A", "aws-access-key-id"),
        ("gho_Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123", "github-token"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB",
            "pem-private-key",
        ),
    ];
    for (text, want) in found {
        assert_eq!(kind(text).as_deref(), Some(want), "{text}");
    }
    let prose = [
        "task-management-for-documentation-teams-and-writers",
        "sk-learn",
        "sk-this-is-a-very-long-hyphenated-phrase-without-digits-at-all",
        "AKIAIOSFODNN7EXAMPLEX",
        "xAKIAIOSFODNN7EXAMPLE",
        "AKIAiosfodnn7example",
        "ghp_short",
        "my-nvapi-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123abcdefghij",
        "-----BEGIN PRIVATE KEY-----\\n...your key here...\\n-----END PRIVATE KEY-----",
        "-----BEGIN CERTIFICATE-----\\nMIIEowIBAAKCAQEAfakeDOCSFABtestKEYmaterialQ8x2Nc4Vb6Xz8",
    ];
    for text in prose {
        assert_eq!(kind(text), None, "{text}");
    }
}

#[test]
fn configuration_rejects_what_could_never_work() {
    assert!(BoundaryConfig::new(Api::OpenaiChat, "", &[]).is_err());
    assert!(Secret::new("K", "short").is_err());
    let s = Secret::new("OPENAI_API_KEY", "sk-very-secret-value").unwrap();
    assert!(!format!("{s:?}").contains("very-secret"));
}

#[test]
fn the_checker_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<BoundaryConfig>();
    send_sync::<docsfab_boundary::Boundary>();
    send_sync::<Verdict>();
}

/// Issue 9, finding 1: a provider that cuts a long key (at 64 characters, say) or splits it
/// across deltas still sends key material. Any 16-byte piece of a host secret of 16 bytes or
/// more is refused, fed whole or a byte at a time; 15 bytes are not a piece.
#[test]
fn hardening_key_leak_a_16_byte_piece_of_a_long_host_secret_is_refused() {
    let key: String = (0..160)
        .map(|i| char::from(b"Qw7Er2Ty9Ui4Op1As6Df3Gh8Jk5Lz0Xc"[(i * 7 + i / 3) % 32]))
        .collect();
    let secret = Secret::new("LONG_KEY", &key).unwrap();
    let c = BoundaryConfig::new(Api::OpenaiChat, M, &[secret]).unwrap();
    let refused = Some(Reason::CredentialMaterial(CredentialKind::HostSecret(
        "LONG_KEY".into(),
    )));
    // 20 bytes of the key, split across two content deltas.
    let split = format!(
        "{}{}data: [DONE]\n\n",
        chunk(M, &key[40..52]),
        chunk(M, &key[52..60])
    );
    let cut = format!("{}data: [DONE]\n\n", chunk(M, &key[..64]));
    for body in [&split, &cut] {
        assert_eq!(
            c.check(body.as_bytes()).refusal().map(|r| r.reason.clone()),
            refused,
            "{body}"
        );
        let mut b = c.start();
        for byte in body.as_bytes() {
            b.feed(std::slice::from_ref(byte));
        }
        assert_eq!(b.finish().refusal().map(|r| r.reason.clone()), refused);
    }
    let short = format!("{}data: [DONE]\n\n", chunk(M, &key[40..55]));
    assert_eq!(c.check(short.as_bytes()), Verdict::Pass(Pass::Stream));
}
