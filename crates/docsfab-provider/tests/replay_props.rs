//! Invariants of the replay driver over arbitrary fault sequences, each run on a paused clock.

use std::time::Duration;

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::{ReplayLimits, StopReason};
use docsfab_provider::driver::{TurnEnd, run_turn};
use docsfab_provider::scripted::{ScriptStep, ScriptedTransport};
use docsfab_provider::{Message, Payload, TurnRequest};
use docsfab_record::{Api, FaultKind, TurnStatus};
use proptest::prelude::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn payload() -> Payload {
    Payload::build(
        Api::AnthropicMessages,
        &TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "m".into(),
            max_output_tokens: 10,
            system: None,
            messages: vec![Message::User { text: "x".into() }],
            tools: vec![],
        },
    )
    .expect("payload")
}

fn arb_failure() -> impl Strategy<Value = ProviderFailure> {
    let status = prop_oneof![
        Just(400u16),
        Just(401),
        Just(404),
        Just(408),
        Just(422),
        Just(425),
        Just(429),
        Just(500),
        Just(502),
        Just(503),
        Just(504),
    ];
    let by_status = (status, proptest::option::of(0u64..100_000))
        .prop_map(|(s, ra)| ProviderFailure::from_http_status(s, ra));
    let fault = prop_oneof![
        Just(FaultKind::ConnectRefused),
        Just(FaultKind::ConnectionDropped),
        Just(FaultKind::RequestTimeout),
        Just(FaultKind::BodyCut),
        Just(FaultKind::StreamIncomplete),
        Just(FaultKind::ContentFilter),
    ]
    .prop_map(ProviderFailure::from_fault);
    (
        prop_oneof![3 => by_status, 1 => fault],
        prop::bool::weighted(0.1),
    )
        .prop_map(|(f, published)| ProviderFailure {
            content_published: published,
            ..f
        })
}

fn arb_step() -> impl Strategy<Value = Option<ProviderFailure>> {
    // `None` is an answer.
    prop_oneof![1 => Just(None), 6 => arb_failure().prop_map(Some)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_driver_keeps_the_replay_bounds(
        steps in prop::collection::vec(arb_step(), 1..40),
        deadline_ms in proptest::option::of(0u64..500_000),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let limits = ReplayLimits::default();
            // The script always ends with an answer, so it never runs dry.
            let mut steps = steps.clone();
            steps.push(None);
            let t = ScriptedTransport::new(steps.iter().map(|s| match s {
                None => ScriptStep::answer("ok"),
                Some(f) => ScriptStep::fail(*f),
            }));
            let p = payload();
            let start = Instant::now();
            let deadline = deadline_ms.map(|ms| start + Duration::from_millis(ms));
            let r = run_turn(&t, &limits, &p, &CancellationToken::new(), deadline).await;
            let sent = t.sent();
            let n = sent.len();

            // Every request sent the first request's bytes (REP-12).
            prop_assert!(sent.iter().all(|s| s.digest == p.digest()));
            prop_assert_eq!(r.record.requests as usize, n);
            prop_assert_eq!(r.record.provider_retries as usize, r.record.replays.len());
            prop_assert!(n <= r.record.replays.len() + 1);
            // No turn exceeds the widest window, and no wait exceeds its caps (REP-1, REP-7).
            prop_assert!(n as u32 <= limits.max_throttled_attempts_per_turn);
            let waits: Vec<u64> = r.record.replays.iter().map(|e| e.wait_ms).collect();
            prop_assert!(waits.iter().all(|w| *w <= limits.max_delay_ms));
            prop_assert!(waits.iter().sum::<u64>() <= limits.max_throttled_total_delay_ms);
            // Time passes only in waits; no wait crosses the deadline (REP-10).
            prop_assert_eq!(start.elapsed(), Duration::from_millis(waits.iter().sum()));
            if let Some(d) = deadline_ms {
                prop_assert!(waits.iter().sum::<u64>() <= d);
            }
            // Only the last request may have failed with published content or a terminal
            // class; everything before it was a replayable fault (REP-3, REP-5, REP-6, REP-14).
            for s in &steps[..n.saturating_sub(1)] {
                let f = s.expect("only failures come before the last request");
                prop_assert!(!f.content_published);
                prop_assert!(f.is_transport_retryable());
            }
            // The failure being decided picks the bound (REP-7): replay k followed request k,
            // which its window allowed; a turn that ran out did so at its own window's bound.
            for (k, e) in r.record.replays.iter().enumerate() {
                prop_assert!((k as u32 + 1) < limits.max_attempts(e.window));
            }
            if let Some(StopReason::AttemptsExhausted { window, attempts }) = r.record.stop_reason {
                prop_assert_eq!(attempts as usize, n);
                prop_assert!(attempts >= limits.max_attempts(window));
            }
            match (&r.end, n.checked_sub(1).map(|i| steps[i])) {
                (TurnEnd::Completed(_), Some(None)) => {
                    prop_assert_eq!(r.record.status, TurnStatus::Completed)
                }
                (TurnEnd::Failed { failure, .. }, Some(Some(f))) => {
                    prop_assert_eq!(failure.failure, f);
                    prop_assert_eq!(r.record.status, TurnStatus::Failed);
                }
                // The last wait ended exactly at the deadline: nothing more is sent.
                (TurnEnd::DeadlineReached { .. }, _) => {
                    prop_assert_eq!(Some(waits.iter().sum::<u64>()), deadline_ms);
                    prop_assert_eq!(r.record.status, TurnStatus::Failed);
                }
                (end, last) => prop_assert!(false, "unexpected end {:?} after {:?}", end, last),
            }
            Ok(())
        })?;
    }
}
