//! The in-turn replay decision (REP-*, CLS-4).

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::{
    PastReplay, ReplayDecision, ReplayLimits, StopReason, Window, decide,
};
use docsfab_record::{FaultKind, ProviderErrorClass};

fn http(status: u16) -> ProviderFailure {
    ProviderFailure::from_http_status(status, None)
}

fn past_of(failures: &[(ProviderFailure, u64)]) -> Vec<PastReplay> {
    failures
        .iter()
        .map(|&(failure, wait_ms)| PastReplay { failure, wait_ms })
        .collect()
}

/// Runs a turn where every attempt fails with `failure`, returning the waits and the stop.
fn run(limits: &ReplayLimits, failure: ProviderFailure) -> (Vec<u64>, StopReason) {
    let mut past = Vec::new();
    loop {
        match decide(limits, &past, &failure, 0, None) {
            ReplayDecision::Replay { wait_ms, .. } => past.push(PastReplay { failure, wait_ms }),
            ReplayDecision::Stop { reason } => {
                return (past.iter().map(|p| p.wait_ms).collect(), reason);
            }
        }
    }
}

// Proves REP-1.
#[test]
fn seven_waits_double_to_cap_rep_1() {
    let limits = ReplayLimits::default();
    let (waits, stop) = run(&limits, http(503));
    assert_eq!(waits, vec![500, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000]);
    assert_eq!(waits.iter().sum::<u64>(), 51_500);
    assert_eq!(
        stop,
        StopReason::AttemptsExhausted {
            window: Window::General,
            attempts: 8
        }
    );
    assert_eq!(limits.schedule(Window::General), waits);
}

// Proves REP-1.
#[test]
fn summed_wait_clamps_last_wait_rep_1() {
    let limits = ReplayLimits {
        max_total_delay_ms: 10_000,
        ..ReplayLimits::default()
    };
    let (waits, stop) = run(&limits, http(500));
    // 500+1000+2000+4000 = 7500, then 8000 clamped to the 2500 left; then nothing remains.
    assert_eq!(waits, vec![500, 1_000, 2_000, 4_000, 2_500]);
    assert_eq!(
        stop,
        StopReason::DelayExhausted {
            window: Window::General
        }
    );
}

// Proves REP-2.
#[test]
fn replayed_faults_and_statuses_rep_2() {
    let limits = ReplayLimits::default();
    let mut failures = vec![
        ProviderFailure::from_fault(FaultKind::ConnectRefused),
        ProviderFailure::from_fault(FaultKind::ConnectionDropped),
        ProviderFailure::from_fault(FaultKind::RequestTimeout),
        ProviderFailure::from_fault(FaultKind::BodyCut),
        ProviderFailure::from_fault(FaultKind::StreamIncomplete),
    ];
    failures.extend([408, 425, 429, 500, 502, 503, 504, 599].map(http));
    for f in failures {
        assert!(
            matches!(
                decide(&limits, &[], &f, 0, None),
                ReplayDecision::Replay { wait_ms: 500, .. }
            ),
            "{f:?}"
        );
    }
}

// Proves REP-3.
#[test]
fn other_4xx_are_never_replayed_rep_3() {
    let limits = ReplayLimits::default();
    for s in (400..=499).filter(|s| ![408, 425, 429].contains(s)) {
        assert_eq!(
            decide(&limits, &[], &http(s), 0, None),
            ReplayDecision::Stop {
                reason: StopReason::NotReplayable
            },
            "{s}"
        );
    }
}

// Proves REP-4.
#[test]
fn head_status_wins_both_directions_rep_4() {
    let limits = ReplayLimits::default();
    // A 502 whose body wraps an upstream 400: the head says 502, so it is replayed.
    let wrapped = http(502);
    assert!(matches!(
        decide(&limits, &[], &wrapped, 0, None),
        ReplayDecision::Replay { .. }
    ));
    // A 400 whose body says 503: the head says 400, so it is not.
    let mut lying = http(400);
    lying.declared_status = Some(503);
    assert_eq!(
        decide(&limits, &[], &lying, 0, None),
        ReplayDecision::Stop {
            reason: StopReason::NotReplayable
        }
    );
}

// Proves REP-5.
#[test]
fn terminal_classes_are_never_replayed_rep_5() {
    let limits = ReplayLimits::default();
    for class in [
        ProviderErrorClass::ContentFilter,
        ProviderErrorClass::Authentication,
        ProviderErrorClass::InvalidRequest,
        ProviderErrorClass::Unknown,
    ] {
        // Even recorded on a connection fault ("text mentions a connection"), the class decides.
        let mut f = ProviderFailure::from_fault(FaultKind::ConnectionDropped);
        f.class = class;
        assert_eq!(
            decide(&limits, &[], &f, 0, None),
            ReplayDecision::Stop {
                reason: StopReason::NotReplayable
            },
            "{class:?}"
        );
    }
}

// Proves REP-6.
#[test]
fn rate_limit_without_status_is_not_replayed_rep_6() {
    let mut quota = ProviderFailure::from_fault(FaultKind::ErrorEvent);
    quota.class = ProviderErrorClass::RateLimit;
    quota.declared_status = Some(429);
    assert_eq!(
        decide(&ReplayLimits::default(), &[], &quota, 0, None),
        ReplayDecision::Stop {
            reason: StopReason::NotReplayable
        }
    );
}

// Proves REP-7.
#[test]
fn throttle_window_is_24_attempts_380s_rep_7() {
    let limits = ReplayLimits::default();
    let (waits, stop) = run(&limits, http(429));
    assert_eq!(waits.len(), 23);
    assert_eq!(
        &waits[..7],
        &[500, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000]
    );
    assert!(waits.iter().all(|&w| w <= 20_000));
    assert_eq!(waits.iter().sum::<u64>(), 371_500);
    assert_eq!(
        stop,
        StopReason::AttemptsExhausted {
            window: Window::Throttle,
            attempts: 24
        }
    );
    assert_eq!(limits.schedule(Window::Throttle), waits);
}

// Proves REP-7.
#[test]
fn throttle_summed_wait_bound_rep_7() {
    let limits = ReplayLimits {
        max_throttled_total_delay_ms: 100_000,
        ..ReplayLimits::default()
    };
    let (waits, stop) = run(&limits, http(429));
    assert_eq!(waits.iter().sum::<u64>(), 100_000);
    assert_eq!(
        stop,
        StopReason::DelayExhausted {
            window: Window::Throttle
        }
    );
}

// Proves REP-7.
#[test]
fn a_503_after_ten_429s_ends_the_turn_rep_7() {
    let limits = ReplayLimits::default();
    let past = past_of(&[(http(429), 500); 10]);
    assert_eq!(
        decide(&limits, &past, &http(503), 0, None),
        ReplayDecision::Stop {
            reason: StopReason::AttemptsExhausted {
                window: Window::General,
                attempts: 11
            }
        }
    );
    // ...while another 429 at the same point is still replayed, continuing the shared counter.
    assert_eq!(
        decide(&limits, &past, &http(429), 0, None),
        ReplayDecision::Replay {
            wait_ms: 20_000,
            window: Window::Throttle
        }
    );
}

// Proves REP-7.
#[test]
fn general_window_counts_throttle_waits_rep_7() {
    // Three 429s waited 59,000 ms; a 503 now gets only the 1,000 ms left of the general window.
    let limits = ReplayLimits::default();
    let past = past_of(&[
        (http(429), 20_000),
        (http(429), 20_000),
        (http(429), 19_000),
    ]);
    assert_eq!(
        decide(&limits, &past, &http(503), 0, None),
        ReplayDecision::Replay {
            wait_ms: 1_000,
            window: Window::General
        }
    );
    let past = past_of(&[
        (http(429), 20_000),
        (http(429), 20_000),
        (http(429), 20_000),
    ]);
    assert_eq!(
        decide(&limits, &past, &http(503), 0, None),
        ReplayDecision::Stop {
            reason: StopReason::DelayExhausted {
                window: Window::General
            }
        }
    );
}

// Proves REP-8.
#[test]
fn retry_after_lengthens_but_stays_capped_rep_8() {
    let limits = ReplayLimits::default();
    let f = ProviderFailure::from_http_status(429, Some(7_000));
    assert_eq!(
        decide(&limits, &[], &f, 0, None),
        ReplayDecision::Replay {
            wait_ms: 7_000,
            window: Window::Throttle
        }
    );
    // Never shortens the exponential wait.
    let f = ProviderFailure::from_http_status(429, Some(10));
    assert_eq!(
        decide(&limits, &[], &f, 0, None),
        ReplayDecision::Replay {
            wait_ms: 500,
            window: Window::Throttle
        }
    );
    // Capped per wait...
    let f = ProviderFailure::from_http_status(429, Some(u64::MAX));
    assert_eq!(
        decide(&limits, &[], &f, 0, None),
        ReplayDecision::Replay {
            wait_ms: 20_000,
            window: Window::Throttle
        }
    );
    // ...and by what remains of the window's summed wait.
    let past = past_of(&[(http(429), 375_000)]);
    assert_eq!(
        decide(&limits, &past, &f, 0, None),
        ReplayDecision::Replay {
            wait_ms: 5_000,
            window: Window::Throttle
        }
    );
    // A 503 with Retry-After is judged by the general window's caps.
    let f = ProviderFailure::from_http_status(503, Some(90_000));
    let past = past_of(&[(http(503), 50_000)]);
    assert_eq!(
        decide(&limits, &past, &f, 0, None),
        ReplayDecision::Replay {
            wait_ms: 10_000,
            window: Window::General
        }
    );
}

// Proves REP-10.
#[test]
fn wait_crossing_deadline_is_not_started_rep_10() {
    let limits = ReplayLimits::default();
    let past = past_of(&[(http(503), 500)]);
    // The second wait is 1,000 ms.
    assert_eq!(
        decide(&limits, &past, &http(503), 9_000, Some(10_000)),
        ReplayDecision::Replay {
            wait_ms: 1_000,
            window: Window::General
        }
    );
    assert_eq!(
        decide(&limits, &past, &http(503), 9_001, Some(10_000)),
        ReplayDecision::Stop {
            reason: StopReason::Deadline
        }
    );
    assert_eq!(
        decide(&limits, &past, &http(503), u64::MAX, Some(10_000)),
        ReplayDecision::Stop {
            reason: StopReason::Deadline
        }
    );
}

// Proves REP-14.
#[test]
fn published_content_is_never_replayed_rep_14() {
    let limits = ReplayLimits::default();
    let f = ProviderFailure {
        content_published: true,
        ..ProviderFailure::from_fault(FaultKind::ConnectionDropped)
    };
    assert_eq!(
        decide(&limits, &[], &f, 0, None),
        ReplayDecision::Stop {
            reason: StopReason::ContentPublished
        }
    );
}

// Proves CLS-4.
#[test]
fn stream_incomplete_before_text_is_replayed_after_text_is_not_cls_4() {
    let limits = ReplayLimits::default();
    let f = ProviderFailure::from_fault(FaultKind::StreamIncomplete);
    assert!(matches!(
        decide(&limits, &[], &f, 0, None),
        ReplayDecision::Replay { .. }
    ));
    assert_eq!(
        decide(
            &limits,
            &[],
            &ProviderFailure {
                content_published: true,
                ..f
            },
            0,
            None
        ),
        ReplayDecision::Stop {
            reason: StopReason::ContentPublished
        }
    );
}

// Proves REP-1.
#[test]
fn extreme_limits_do_not_overflow_rep_1() {
    let limits = ReplayLimits {
        base_delay_ms: u64::MAX,
        max_delay_ms: u64::MAX,
        max_total_delay_ms: u64::MAX,
        max_attempts_per_turn: u32::MAX,
        max_throttled_attempts_per_turn: u32::MAX,
        max_throttled_total_delay_ms: u64::MAX,
    };
    let past = past_of(&[(http(503), u64::MAX), (http(503), u64::MAX)]);
    assert_eq!(
        decide(&limits, &past, &http(503), u64::MAX, Some(u64::MAX)),
        ReplayDecision::Stop {
            reason: StopReason::DelayExhausted {
                window: Window::General
            }
        }
    );
    assert_eq!(docsfab_policy::replay::exponential_ms(3, 200), u64::MAX);
    assert_eq!(docsfab_policy::replay::exponential_ms(0, 200), 0);
}
