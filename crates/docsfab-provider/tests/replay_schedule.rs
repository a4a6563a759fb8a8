//! Exact replay schedules on tokio's paused clock against the in-memory scripted transport.
//! (A paused clock with real sockets gives false timeouts: real HTTP is in `e2e_*.rs`.)

use std::time::Duration;

use bytes::Bytes;
use docsfab_policy::class::{ErrorEventClass, ProviderFailure};
use docsfab_policy::replay::{ReplayLimits, StopReason, Window};
use docsfab_provider::driver::{EndKind, PayloadSource, TurnEnd, run_turn, run_turn_observed};
use docsfab_provider::scripted::{ScriptStep, ScriptedTransport, status};
use docsfab_provider::{Message, Payload, PayloadDigest, TurnRequest};
use docsfab_record::{Api, FaultKind, ProviderErrorClass, ReplayCause, TurnStatus};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn payload() -> Payload {
    Payload::build(
        Api::OpenaiChat,
        &TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "m".into(),
            max_output_tokens: 100,
            system: None,
            messages: vec![Message::User {
                text: "hello".into(),
            }],
            tools: vec![],
        },
    )
    .expect("payload")
}

fn s408() -> ScriptStep {
    ScriptStep::fail(status(408, ProviderErrorClass::Timeout))
}
fn s429() -> ScriptStep {
    ScriptStep::fail(status(429, ProviderErrorClass::RateLimit))
}
fn s429_after(retry_after_ms: u64) -> ScriptStep {
    ScriptStep::fail(ProviderFailure {
        retry_after_ms: Some(retry_after_ms),
        ..status(429, ProviderErrorClass::RateLimit)
    })
}

/// Gaps between consecutive sends, in ms.
fn gaps(t: &ScriptedTransport) -> Vec<u64> {
    let sent = t.sent();
    sent.windows(2)
        .map(|w| (w[1].at - w[0].at).as_millis() as u64)
        .collect()
}

// Proves REP-1, REP-13.
#[tokio::test(start_paused = true)]
async fn seven_408s_then_answer_rep_1_rep_13() {
    let mut script: Vec<_> = (0..7).map(|_| s408()).collect();
    script.push(ScriptStep::answer("done"));
    let t = ScriptedTransport::new(script);
    let p = payload();
    let start = Instant::now();
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &p,
        &CancellationToken::new(),
        None,
    )
    .await;

    assert!(matches!(&r.end, TurnEnd::Completed(o) if o.text == "done"));
    assert_eq!(
        gaps(&t),
        vec![500, 1000, 2000, 4000, 8000, 16000, 20000],
        "doubling from 500 ms, capped at 20,000 ms"
    );
    assert_eq!(start.elapsed(), Duration::from_millis(51_500));
    assert_eq!(r.record.status, TurnStatus::Completed);
    assert_eq!(r.record.provider_retries, 7);
    assert_eq!(r.record.requests, 8);
    // One payload digest for all eight requests (REP-12).
    assert!(t.sent().iter().all(|s| s.digest == p.digest()));
    assert_eq!(r.record.payload_digest, p.digest().to_hex());
    let waits: Vec<u64> = r.record.replays.iter().map(|e| e.wait_ms).collect();
    assert_eq!(waits, vec![500, 1000, 2000, 4000, 8000, 16000, 20000]);
    for e in &r.record.replays {
        assert_eq!(e.cause, ReplayCause::Status(408));
        assert_eq!(e.provider_error_class, ProviderErrorClass::Timeout);
        assert_eq!(e.window, Window::General);
    }
    // Usage sums the eight requests' reports (only the answer reported any here).
    assert_eq!(r.record.usage.output_tokens, Some(5));
    assert_eq!(r.record.duration_ms, 51_500);
}

// Proves REP-1.
#[tokio::test(start_paused = true)]
async fn eight_408s_fail_after_eight_attempts_rep_1() {
    let t = ScriptedTransport::new((0..9).map(|_| s408()));
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(t.sent().len(), 8);
    assert_eq!(r.record.status, TurnStatus::Failed);
    assert_eq!(r.record.provider_retries, 7);
    assert_eq!(
        r.record.stop_reason,
        Some(StopReason::AttemptsExhausted {
            window: Window::General,
            attempts: 8
        })
    );
    assert_eq!(r.record.failure.map(|f| f.http_status), Some(Some(408)));
    assert!(matches!(r.end, TurnEnd::Failed { .. }));
}

// Proves REP-7.
#[tokio::test(start_paused = true)]
async fn ten_429s_then_503_ends_at_the_503_rep_7() {
    let mut script: Vec<_> = (0..10).map(|_| s429()).collect();
    script.push(ScriptStep::fail(status(503, ProviderErrorClass::Server)));
    script.push(ScriptStep::answer("never reached"));
    let t = ScriptedTransport::new(script);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(
        t.sent().len(),
        11,
        "the 503 is attempt 11 and ends the turn"
    );
    assert_eq!(
        gaps(&t),
        vec![
            500, 1000, 2000, 4000, 8000, 16000, 20000, 20000, 20000, 20000
        ]
    );
    assert_eq!(r.record.provider_retries, 10);
    assert!(
        r.record
            .replays
            .iter()
            .all(|e| e.window == Window::Throttle)
    );
    assert_eq!(
        r.record.stop_reason,
        Some(StopReason::AttemptsExhausted {
            window: Window::General,
            attempts: 11
        })
    );
    assert_eq!(r.record.failure.and_then(|f| f.http_status), Some(503));
}

// Proves REP-7.
#[tokio::test(start_paused = true)]
async fn throttle_window_allows_24_attempts_rep_7() {
    let t = ScriptedTransport::new((0..30).map(|_| s429()));
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(t.sent().len(), 24);
    assert_eq!(r.record.provider_retries, 23);
    let total: u64 = gaps(&t).iter().sum();
    assert!(total <= 380_000, "{total}");
    assert_eq!(
        r.record.stop_reason,
        Some(StopReason::AttemptsExhausted {
            window: Window::Throttle,
            attempts: 24
        })
    );
}

// Proves REP-8.
#[tokio::test(start_paused = true)]
async fn retry_after_lengthens_and_is_clamped_rep_8() {
    let t = ScriptedTransport::new([
        s429_after(3_000),
        s429_after(90_000),
        ScriptStep::answer("ok"),
    ]);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(r.record.status, TurnStatus::Completed);
    // 3,000 ms lengthens the 500 ms wait; 90,000 ms is clamped to the 20,000 ms per-wait cap.
    assert_eq!(gaps(&t), vec![3_000, 20_000]);
    assert_eq!(r.record.replays[0].retry_after_ms, Some(3_000));
    assert_eq!(r.record.replays[1].retry_after_ms, Some(90_000));
    assert_eq!(r.record.replays[1].wait_ms, 20_000);
}

// Proves REP-1.
#[tokio::test(start_paused = true)]
async fn summed_wait_is_clamped_to_what_remains_rep_1() {
    // More attempts than the default, so the 60,000 ms summed bound is what stops the turn.
    let limits = ReplayLimits {
        max_attempts_per_turn: 20,
        ..ReplayLimits::default()
    };
    let t = ScriptedTransport::new((0..20).map(|_| s408()));
    let r = run_turn(&t, &limits, &payload(), &CancellationToken::new(), None).await;
    assert_eq!(
        gaps(&t),
        vec![500, 1000, 2000, 4000, 8000, 16000, 20000, 8500]
    );
    assert_eq!(
        r.record.stop_reason,
        Some(StopReason::DelayExhausted {
            window: Window::General
        })
    );
}

// Proves REP-10.
#[tokio::test(start_paused = true)]
async fn a_wait_that_would_cross_the_deadline_is_not_started_rep_10() {
    let t = ScriptedTransport::new((0..8).map(|_| s408()));
    let start = Instant::now();
    let deadline = start + Duration::from_millis(3_000);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        Some(deadline),
    )
    .await;
    // Waits 500 and 1,000 fit; the 2,000 ms wait at t = 1,500 would end at 3,500.
    assert_eq!(gaps(&t), vec![500, 1000]);
    assert_eq!(start.elapsed(), Duration::from_millis(1_500));
    assert_eq!(r.record.stop_reason, Some(StopReason::Deadline));
    assert_eq!(r.record.status, TurnStatus::Failed);
}

// Proves REP-10.
#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_request_in_flight_rep_10() {
    let t = ScriptedTransport::new([
        s408(),
        ScriptStep::answer("late").after(Duration::from_secs(60)),
    ]);
    let start = Instant::now();
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        Some(start + Duration::from_millis(2_000)),
    )
    .await;
    assert_eq!(start.elapsed(), Duration::from_millis(2_000));
    assert_eq!(r.record.end, EndKind::Deadline);
    assert_eq!(r.record.status, TurnStatus::Failed);
    assert!(matches!(
        r.end,
        TurnEnd::DeadlineReached {
            last_failure: Some(_)
        }
    ));
}

// Proves REP-9.
#[tokio::test(start_paused = true)]
async fn cancellation_in_backoff_ends_the_turn_at_once_rep_9() {
    let t = ScriptedTransport::new([s408(), s408(), ScriptStep::answer("never")]);
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.cancel();
    });
    let start = Instant::now();
    let r = run_turn(&t, &ReplayLimits::default(), &payload(), &cancel, None).await;
    // The second wait (1,000 ms from t = 500) is interrupted at 700, not run to 1,500.
    assert_eq!(start.elapsed(), Duration::from_millis(700));
    assert_eq!(t.sent().len(), 2);
    assert_eq!(r.end, TurnEnd::Cancelled);
    assert_eq!(r.record.status, TurnStatus::Cancelled);
    assert_eq!(
        r.record.failure, None,
        "a cancelled turn is no provider failure"
    );
}

// Proves REP-9.
#[tokio::test(start_paused = true)]
async fn cancellation_during_a_request_ends_the_turn_rep_9() {
    let t = ScriptedTransport::new([ScriptStep::answer("slow").after(Duration::from_secs(30))]);
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        c.cancel();
    });
    let start = Instant::now();
    let r = run_turn(&t, &ReplayLimits::default(), &payload(), &cancel, None).await;
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(r.record.status, TurnStatus::Cancelled);
}

/// Hands the driver different bytes from the second request on.
struct Drifting(Payload);

impl PayloadSource for Drifting {
    fn digest(&self) -> PayloadDigest {
        self.0.digest()
    }
    fn bytes_for_attempt(&self, attempt: u32) -> Bytes {
        if attempt == 1 {
            self.0.bytes().clone()
        } else {
            let mut v = self.0.bytes().to_vec();
            v.push(b' ');
            Bytes::from(v)
        }
    }
}

// Proves REP-12.
#[tokio::test(start_paused = true)]
async fn digest_mismatch_fails_closed_before_sending_rep_12() {
    let t = ScriptedTransport::new([s408(), ScriptStep::answer("must not be sent")]);
    let p = payload();
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &Drifting(p.clone()),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert_eq!(t.sent().len(), 1, "the replay was never sent");
    assert_eq!(r.record.status, TurnStatus::Failed);
    assert_eq!(r.record.end, EndKind::DigestMismatch);
    match r.end {
        TurnEnd::DigestMismatch { expected, actual } => {
            assert_eq!(expected, p.digest());
            assert_ne!(actual, expected);
        }
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
}

// Proves REP-12.
#[tokio::test(start_paused = true)]
async fn digest_mismatch_on_the_first_request_sends_nothing_rep_12() {
    struct Wrong(Payload);
    impl PayloadSource for Wrong {
        fn digest(&self) -> PayloadDigest {
            PayloadDigest::of(b"something else")
        }
        fn bytes_for_attempt(&self, _: u32) -> Bytes {
            self.0.bytes().clone()
        }
    }
    let t = ScriptedTransport::new([ScriptStep::answer("x")]);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &Wrong(payload()),
        &CancellationToken::new(),
        None,
    )
    .await;
    assert!(t.sent().is_empty());
    assert_eq!(r.record.end, EndKind::DigestMismatch);
}

async fn one_failure(f: ProviderFailure) -> (usize, Option<StopReason>) {
    let t = ScriptedTransport::new([ScriptStep::fail(f), ScriptStep::answer("x")]);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    (t.sent().len(), r.record.stop_reason)
}

// Proves REP-3.
#[tokio::test(start_paused = true)]
async fn terminal_statuses_are_never_replayed_rep_3() {
    for (code, class) in [
        (400, ProviderErrorClass::InvalidRequest),
        (401, ProviderErrorClass::Authentication),
        (403, ProviderErrorClass::Authentication),
        (404, ProviderErrorClass::InvalidRequest),
        (409, ProviderErrorClass::InvalidRequest),
        (422, ProviderErrorClass::InvalidRequest),
    ] {
        assert_eq!(
            one_failure(status(code, class)).await,
            (1, Some(StopReason::NotReplayable)),
            "{code}"
        );
    }
}

// Proves REP-2.
#[tokio::test(start_paused = true)]
async fn replayable_faults_are_replayed_rep_2() {
    for f in [
        ProviderFailure::from_fault(FaultKind::ConnectRefused),
        ProviderFailure::from_fault(FaultKind::ConnectionDropped),
        ProviderFailure::from_fault(FaultKind::RequestTimeout),
        ProviderFailure::from_fault(FaultKind::BodyCut),
        ProviderFailure::from_fault(FaultKind::StreamIncomplete),
        status(425, ProviderErrorClass::Server),
        status(500, ProviderErrorClass::Server),
        status(599, ProviderErrorClass::Server),
    ] {
        assert_eq!(one_failure(f).await, (2, None), "{f:?}");
    }
}

// Proves REP-14, CLS-4.
#[tokio::test(start_paused = true)]
async fn published_content_is_never_replayed_rep_14_cls_4() {
    let f = ProviderFailure {
        content_published: true,
        ..ProviderFailure::from_fault(FaultKind::StreamIncomplete)
    };
    assert_eq!(
        one_failure(f).await,
        (1, Some(StopReason::ContentPublished))
    );
    let f = ProviderFailure {
        content_published: true,
        ..ProviderFailure::from_fault(FaultKind::BodyCut)
    };
    assert_eq!(
        one_failure(f).await,
        (1, Some(StopReason::ContentPublished))
    );
}

// Proves REP-6.
#[tokio::test(start_paused = true)]
async fn rate_limit_without_http_status_is_never_replayed_rep_6() {
    let f = ProviderFailure::from_error_event(ErrorEventClass {
        class: ProviderErrorClass::RateLimit,
        declared_status: Some(429),
    });
    assert_eq!(one_failure(f).await, (1, Some(StopReason::NotReplayable)));
}

// Proves REP-5.
#[tokio::test(start_paused = true)]
async fn content_filter_is_never_replayed_rep_5() {
    let f = ProviderFailure::from_fault(FaultKind::ContentFilter);
    assert_eq!(one_failure(f).await, (1, Some(StopReason::NotReplayable)));
}

#[tokio::test(start_paused = true)]
async fn observer_sees_each_replay_before_its_wait() {
    let t = ScriptedTransport::new([s408(), s408(), ScriptStep::answer("ok")]);
    let mut seen = Vec::new();
    let start = Instant::now();
    let r = run_turn_observed(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
        &mut |e| seen.push((Instant::now() - start, e.wait_ms)),
    )
    .await;
    assert_eq!(r.record.provider_retries, 2);
    assert_eq!(
        seen,
        vec![(Duration::ZERO, 500), (Duration::from_millis(500), 1000)]
    );
}

// Proves REP-11.
#[test]
fn the_driver_cannot_reach_the_turn_governor_rep_11() {
    // REP-11 holds by construction: `run_turn` takes only a transport, the replay limits, the
    // payload, a cancellation token and a deadline. The turn governor, turn ledger and
    // execution lease live in docsfab-runtime, which depends on this crate; this crate must
    // never depend on it, or a replay could reach them. This test fails if someone adds it.
    let manifest = include_str!("../Cargo.toml");
    assert!(!manifest.contains("docsfab-runtime"));
    assert!(manifest.contains("docsfab-policy"));
}

// Proves REP-13.
#[tokio::test(start_paused = true)]
async fn record_serializes_with_the_run_record_names_rep_13() {
    let t = ScriptedTransport::new([
        s429_after(1_000),
        ScriptStep::fail(ProviderFailure::from_fault(FaultKind::ConnectionDropped)),
        ScriptStep::answer("ok"),
    ]);
    let r = run_turn(
        &t,
        &ReplayLimits::default(),
        &payload(),
        &CancellationToken::new(),
        None,
    )
    .await;
    let v = serde_json::to_value(&r.record).expect("json");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["providerRetries"], 2);
    assert_eq!(
        v["replays"][0],
        serde_json::json!({"status": 429, "providerErrorClass": "rate-limit", "waitMs": 1000, "retryAfterMs": 1000, "window": "throttle", "heldMs": 0})
    );
    assert_eq!(
        v["replays"][1],
        serde_json::json!({"fault": "connection-dropped", "providerErrorClass": "network", "waitMs": 1000, "retryAfterMs": null, "window": "general", "heldMs": 0})
    );
    let back: docsfab_provider::TurnAccount = serde_json::from_value(v).expect("round trip");
    assert_eq!(back, r.record);
}
