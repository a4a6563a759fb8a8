//! Issue 12: the replay driver behind the shared provider throttle. A real `Throttle` on a
//! temporary `throttle.db` and the in-memory scripted transport, on the real clock (the
//! throttle's shared state is kept in wall-clock time). Holds are a few hundred ms; nothing here
//! asserts how long anything took, only what was sent, recorded and reported.

use std::sync::Arc;
use std::time::Duration;

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::ReplayLimits;
use docsfab_provider::driver::{DriverEvent, EndKind, Gate, TurnEnd, run_turn_gated};
use docsfab_provider::scripted::{ScriptStep, ScriptedTransport, status};
use docsfab_provider::{Message, Payload, TurnRequest};
use docsfab_record::{Api, ProviderErrorClass};
use docsfab_throttle::{Outcome, RateHeaders, Reason, Throttle};
use tokio::sync::Notify;
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

fn throttle(dir: &tempfile::TempDir) -> Throttle {
    Throttle::open(&dir.path().join("throttle.db"), []).expect("throttle")
}

/// Another sender of the same provider got a 429 and reported a hold of `ms`.
async fn hold(t: &Throttle, ms: u64) {
    let permit = t
        .acquire("p", &CancellationToken::new(), None)
        .await
        .expect("permit");
    let head = RateHeaders {
        retry_after_ms: Some(ms),
        ..RateHeaders::none()
    };
    permit.finish(Outcome::RateLimited, &head).expect("finish");
}

/// Runs one gated turn, collecting the hold reasons the driver reported.
async fn gated(
    t: &Throttle,
    transport: &ScriptedTransport,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
) -> (docsfab_provider::TurnResult, Vec<Option<Reason>>) {
    let mut held = Vec::new();
    let mut on_event = |e: DriverEvent<'_>| {
        if let DriverEvent::Held { reason, .. } = e {
            held.push(reason);
        }
    };
    let gate = Gate {
        throttle: t,
        provider: "p",
        first_patience: None,
    };
    let r = run_turn_gated(
        transport,
        &ReplayLimits::default(),
        &payload(),
        cancel,
        deadline,
        Some(gate),
        None,
        &mut on_event,
    )
    .await;
    (r, held)
}

#[tokio::test]
async fn issue12_a_throttle_hold_is_held_ms_not_a_replay_rep_13() {
    let dir = tempfile::tempdir().unwrap();
    let t = throttle(&dir);
    hold(&t, 300).await;
    let transport = ScriptedTransport::new([ScriptStep::answer("ok")]);
    let (r, held) = gated(&t, &transport, &CancellationToken::new(), None).await;
    assert!(matches!(r.end, TurnEnd::Completed(_)), "{:?}", r.end);
    assert_eq!(held, vec![Some(Reason::Hold)]);
    assert!(r.record.held_ms > 0, "{:?}", r.record);
    assert_eq!(r.record.provider_retries, 0);
    assert!(r.record.replays.is_empty());
    assert_eq!(r.record.requests, 1);
    assert_eq!(transport.sent().len(), 1);
}

#[tokio::test]
async fn issue12_a_hold_past_the_attempt_deadline_ends_the_turn_unsent_rep_10() {
    let dir = tempfile::tempdir().unwrap();
    let t = throttle(&dir);
    hold(&t, 60_000).await;
    let transport = ScriptedTransport::new([ScriptStep::answer("ok")]);
    let deadline = Instant::now() + Duration::from_millis(200);
    let (r, _) = gated(&t, &transport, &CancellationToken::new(), Some(deadline)).await;
    assert!(
        matches!(r.end, TurnEnd::DeadlineReached { last_failure: None }),
        "{:?}",
        r.end
    );
    assert_eq!(r.record.end, EndKind::Deadline);
    assert_eq!(r.record.requests, 0);
    assert!(transport.sent().is_empty());
    let detail = r.record.detail.unwrap();
    assert!(
        detail.contains("provider throttle (hold)"),
        "detail: {detail}"
    );
}

#[tokio::test]
async fn issue12_a_cancelled_hold_ends_the_turn_cancelled_unsent_rep_9() {
    let dir = tempfile::tempdir().unwrap();
    let t = throttle(&dir);
    hold(&t, 60_000).await;
    let transport = ScriptedTransport::new([ScriptStep::answer("ok")]);
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.cancel();
    });
    let (r, _) = gated(&t, &transport, &cancel, None).await;
    assert!(matches!(r.end, TurnEnd::Cancelled), "{:?}", r.end);
    assert_eq!(r.record.requests, 0);
    assert!(transport.sent().is_empty());
}

/// The 429 reaches the throttle before the turn's own backoff starts: a sender that starts when
/// the replay is scheduled is already held, and the 429's turn records one replay, as without
/// the throttle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue12_a_429_holds_other_senders_from_before_its_replay_wait() {
    let dir = tempfile::tempdir().unwrap();
    let t = throttle(&dir);
    let scheduled = Arc::new(Notify::new());
    let first = {
        let (t, scheduled) = (t.clone(), scheduled.clone());
        tokio::spawn(async move {
            let asked = ProviderFailure {
                retry_after_ms: Some(300),
                ..status(429, ProviderErrorClass::RateLimit)
            };
            let transport =
                ScriptedTransport::new([ScriptStep::fail(asked), ScriptStep::answer("ok")]);
            let mut on_event = |e: DriverEvent<'_>| {
                if let DriverEvent::Replay(_) = e {
                    scheduled.notify_one();
                }
            };
            let gate = Gate {
                throttle: &t,
                provider: "p",
                first_patience: None,
            };
            run_turn_gated(
                &transport,
                &ReplayLimits::default(),
                &payload(),
                &CancellationToken::new(),
                None,
                Some(gate),
                None,
                &mut on_event,
            )
            .await
        })
    };
    scheduled.notified().await;
    let transport = ScriptedTransport::new([ScriptStep::answer("ok")]);
    let (second, held) = gated(&t, &transport, &CancellationToken::new(), None).await;
    // Held by the 429's Retry-After (300 ms), not by the first turn's own backoff.
    assert_eq!(held, vec![Some(Reason::Hold)], "{held:?}");
    assert!(second.record.held_ms > 0);
    assert_eq!(second.record.provider_retries, 0);
    let first = first.await.unwrap();
    assert!(
        matches!(first.end, TurnEnd::Completed(_)),
        "{:?}",
        first.end
    );
    assert_eq!(first.record.provider_retries, 1);
    assert_eq!(first.record.requests, 2);
}

/// The HTTP transport keeps the rate-limit headers of the response head, on an answer and on a
/// 429 alike, so the throttle can pace from them (real HTTP against the in-process simulator).
#[tokio::test]
async fn issue12_the_transport_keeps_rate_limit_headers_on_answers_and_429s() {
    use docsfab_provider::{HttpConfig, HttpTransport, Transport as _};
    use docsfab_sim::{Scenario, SimServer};
    let yaml = "capacity: {requestsPerMinute: 60, burst: 1}\nresponses:\n  - answer: {text: ok}\n";
    let scenario = Scenario::from_yaml_str(yaml, "capacity").expect("scenario");
    let sim = SimServer::start("127.0.0.1:0".parse().expect("addr"), scenario, None)
        .await
        .expect("sim");
    let t = HttpTransport::new(HttpConfig::new(Api::OpenaiChat, sim.base_url(), None))
        .expect("transport");
    let bytes = payload().bytes().clone();
    let answer = t.send(bytes.clone()).await.expect("answer");
    assert!(
        !answer.rate_headers.observations.is_empty(),
        "{:?}",
        answer.rate_headers
    );
    // The bucket held one request: the next is refused with Retry-After.
    let refused = t.send(bytes).await.expect_err("429");
    assert_eq!(refused.failure.http_status, Some(429));
    assert!(
        refused.body.rate_headers.retry_after_ms.is_some(),
        "{:?}",
        refused.body.rate_headers
    );
}
