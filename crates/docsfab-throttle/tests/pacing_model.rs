//! The pure core against a model of a rate-limited provider, in virtual time: a token bucket
//! of `burst` requests refilled at 120 requests a minute, which answers 429 with Retry-After
//! when empty and sends OpenAI-style rate-limit headers on every answer. 120 requests, 8 at a
//! time, 1 s each: the capacity floor is 60 s. The throttle is never told the capacity.
//!
//! This is the benchmark target checked on the decision logic alone (no HTTP, no
//! processes); the end-to-end benchmark on the simulator belongs with the integration.

use docsfab_throttle::headers::{BudgetKind, Observation};
use docsfab_throttle::{Admit, Mode, Outcome, RateHeaders, Settings, ThrottleState};

const REQUESTS: u32 = 120;
const RATE_PER_MS: f64 = 120.0 / 60_000.0;
const LATENCY_MS: u64 = 1_000;
const FLOOR_MS: u64 = 60_000;

struct Provider {
    /// Whether answers carry the rate-limit headers (Retry-After on a 429 is always sent).
    headers: bool,
    burst: f64,
    tokens: f64,
    at_ms: u64,
}

impl Provider {
    fn refill(&mut self, now: u64) {
        self.tokens = (self.tokens + (now - self.at_ms) as f64 * RATE_PER_MS).min(self.burst);
        self.at_ms = now;
    }

    /// Whether the request is served, and the head it answers with.
    fn take(&mut self, now: u64) -> (bool, RateHeaders) {
        self.refill(now);
        let served = self.tokens >= 1.0;
        if served {
            self.tokens -= 1.0;
        }
        let to_full = ((self.burst - self.tokens) / RATE_PER_MS).ceil() as u64;
        let retry_after_ms = (!served).then(|| ((1.0 - self.tokens) / RATE_PER_MS).ceil() as u64);
        let head = RateHeaders {
            at_ms: Some(now),
            retry_after_ms,
            observations: if !self.headers {
                vec![]
            } else {
                vec![Observation {
                    kind: BudgetKind::Requests,
                    limit: Some(self.burst as u64),
                    remaining: self.tokens.floor() as u64,
                    reset_at_ms: now + to_full,
                }]
            },
        };
        (served, head)
    }
}

struct Run {
    makespan_ms: u64,
    rejected: u32,
    sent: u32,
}

/// Runs the workload; `throttled` false sends as soon as a worker is free (retrying a 429
/// after its Retry-After), like a client with no throttle.
fn run(burst: f64, throttled: bool, headers: bool) -> Run {
    let settings = Settings::new(if throttled { Mode::Shared } else { Mode::Off }, 8).unwrap();
    let mut state = ThrottleState::new();
    let mut provider = Provider {
        headers,
        burst,
        tokens: burst,
        at_ms: 0,
    };
    let mut done = 0;
    let mut started = 0;
    let (mut rejected, mut sent) = (0, 0);
    // (arrives_at, seq, served, head) for requests in flight; workers waiting to (re)send
    // a request no sooner than the given instant.
    let mut flying: Vec<(u64, u64, bool, RateHeaders)> = vec![];
    let mut ready: Vec<u64> = vec![0; 8];
    let mut now = 0u64;
    while done < REQUESTS {
        // Responses that have arrived.
        flying.sort_by_key(|f| f.0);
        while flying.first().is_some_and(|f| f.0 <= now) {
            let (_, seq, served, head) = flying.remove(0);
            if served {
                done += 1;
                state.on_response(
                    &settings,
                    seq,
                    Outcome::Success {
                        input_tokens: None,
                        output_tokens: None,
                    },
                    &head,
                    now,
                );
                ready.push(now);
            } else {
                rejected += 1;
                let wait = head.retry_after_ms.unwrap_or(1_000);
                state.on_response(
                    &settings,
                    seq,
                    Outcome::RateLimited {
                        wait_ms: Some(wait),
                    },
                    &head,
                    now,
                );
                // The replay of the same request, after its wait.
                ready.push(now + wait);
                started -= 1;
            }
        }
        // Workers that may send now, while the throttle admits them.
        let mut next_wake = u64::MAX;
        ready.sort_unstable();
        while let Some(&at) = ready.first() {
            if at > now || started >= REQUESTS {
                next_wake = next_wake.min(at);
                break;
            }
            match state.admit(&settings, now) {
                Admit::Go { seq } => {
                    ready.remove(0);
                    started += 1;
                    sent += 1;
                    let (served, head) = provider.take(now);
                    let latency = if served { LATENCY_MS } else { 50 };
                    flying.push((now + latency, seq, served, head));
                }
                Admit::Wait { until_ms, .. } => {
                    if let Some(u) = until_ms {
                        next_wake = next_wake.min(u);
                    }
                    break;
                }
            }
        }
        if started >= REQUESTS {
            ready.clear();
        }
        let next_arrival = flying.iter().map(|f| f.0).min().unwrap_or(u64::MAX);
        let next = next_wake.min(next_arrival);
        assert!(next != u64::MAX || done == REQUESTS, "stalled at {now} ms");
        now = next
            .max(now + 1)
            .min(if next == u64::MAX { now } else { u64::MAX });
    }
    Run {
        makespan_ms: now,
        rejected,
        sent,
    }
}

#[test]
fn at_120_requests_a_minute_the_throttle_meets_the_target_without_being_told_the_capacity() {
    for burst in [1.0, 4.0, 10.0, 30.0] {
        let r = run(burst, true, true);
        let ratio = r.makespan_ms as f64 / FLOOR_MS as f64;
        let share = f64::from(r.rejected) / f64::from(r.sent);
        println!(
            "burst {burst:>4}: throttled  wall/floor {ratio:.3}  429s {} of {} ({:.1} %)",
            r.rejected,
            r.sent,
            share * 100.0
        );
        let off = run(burst, false, true);
        println!(
            "burst {burst:>4}: throttle off wall/floor {:.3}  429s {} of {}",
            off.makespan_ms as f64 / FLOOR_MS as f64,
            off.rejected,
            off.sent
        );
        assert!(
            share <= 0.025,
            "burst {burst}: {} 429s of {}",
            r.rejected,
            r.sent
        );
        assert!(
            ratio <= 1.15,
            "burst {burst}: wall time {ratio:.3} x the floor"
        );
    }
}

/// Without rate-limit headers only the hold and the adaptive window act: every request still
/// succeeds, and far fewer 429s reach the provider than with no throttle.
#[test]
fn without_headers_the_hold_and_the_adaptive_window_cut_the_429s() {
    for burst in [1.0, 10.0] {
        let r = run(burst, true, false);
        let off = run(burst, false, false);
        println!(
            "burst {burst:>4}, no headers: throttled wall/floor {:.3} 429s {} of {}; off wall/floor {:.3} 429s {} of {}",
            r.makespan_ms as f64 / FLOOR_MS as f64,
            r.rejected,
            r.sent,
            off.makespan_ms as f64 / FLOOR_MS as f64,
            off.rejected,
            off.sent
        );
        assert!(
            r.rejected * 4 < off.rejected,
            "burst {burst}: {} vs {}",
            r.rejected,
            off.rejected
        );
    }
}
