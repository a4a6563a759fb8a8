//! The in-turn replay state machine (REP-*): below the turn governor, a provider request that
//! failed with a retryable transport fault is sent again, byte for byte, after a bounded wait.

use serde::{Deserialize, Serialize};

use crate::class::ProviderFailure;

/// The `providerAttempt.*` catalog limits that bound replays within one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayLimits {
    /// `providerAttempt.baseDelayMs`: the first wait, doubled on each replay.
    pub base_delay_ms: u64,
    /// `providerAttempt.maxDelayMs`: the cap on one wait, in either window.
    pub max_delay_ms: u64,
    /// `providerAttempt.maxTotalDelayMs`: the general window's summed wait.
    pub max_total_delay_ms: u64,
    /// `providerAttempt.maxAttemptsPerTurn`: the general window's requests per turn.
    pub max_attempts_per_turn: u32,
    /// `providerAttempt.maxThrottledAttemptsPerTurn`: the throttle window's requests per turn.
    pub max_throttled_attempts_per_turn: u32,
    /// `providerAttempt.maxThrottledTotalDelayMs`: the throttle window's summed wait.
    pub max_throttled_total_delay_ms: u64,
}

impl Default for ReplayLimits {
    /// The catalog defaults.
    fn default() -> Self {
        ReplayLimits {
            base_delay_ms: 500,
            max_delay_ms: 20_000,
            max_total_delay_ms: 60_000,
            max_attempts_per_turn: 8,
            max_throttled_attempts_per_turn: 24,
            max_throttled_total_delay_ms: 380_000,
        }
    }
}

/// Which bound judged a failure: the general window, or the wider throttle window for HTTP 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Window {
    /// Every replayable failure but an HTTP 429.
    General,
    /// HTTP 429: the provider asked for patience, so more attempts and a longer summed wait.
    Throttle,
}

/// One earlier failed request of this turn, and the wait that followed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PastReplay {
    /// How the earlier request failed.
    pub failure: ProviderFailure,
    /// The wait before the request after it.
    pub wait_ms: u64,
}

/// What to do about the failure being decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum ReplayDecision {
    /// Send the identical request again after `wait_ms`.
    Replay { wait_ms: u64, window: Window },
    /// End the turn with this failure.
    Stop { reason: StopReason },
}

/// Why a turn ends instead of replaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum StopReason {
    /// The failure's class or status is never replayed (REP-3, REP-5, REP-6).
    NotReplayable,
    /// Answer content was already published; the step layer decides (REP-14, CLS-4).
    ContentPublished,
    /// The deciding window's attempt bound is reached.
    AttemptsExhausted { window: Window, attempts: u32 },
    /// Nothing remains of the deciding window's summed wait.
    DelayExhausted { window: Window },
    /// The wait would cross the attempt deadline (REP-10).
    Deadline,
}

/// Decides the failure of attempt `past.len() + 1` of a turn.
///
/// `past` holds the turn's earlier failures with the wait that followed each; `now_ms` and
/// `deadline_ms` are on one monotonic millisecond scale chosen by the caller (the attempt
/// deadline, when there is one). Pure: the same inputs always give the same decision.
///
/// The checks run in this order, and the first that refuses ends the turn:
/// 1. the class (and head status) must be replayable (REP-2..REP-6);
/// 2. no answer content may have been published (REP-14, CLS-4);
/// 3. the deciding window (throttle for this failure being HTTP 429, else general) must allow
///    another attempt, counting every attempt of the turn (REP-7);
/// 4. something must remain of that window's summed wait, counting every earlier wait (REP-1);
/// 5. the wait must end by the deadline (REP-10).
///
/// The wait is `base × 2^(n-1)` for replay `n`, lengthened to the failure's Retry-After
/// (REP-8), capped at `max_delay_ms` whichever window judges it, then clamped to what remains of
/// the window's summed wait.
pub fn decide(
    limits: &ReplayLimits,
    past: &[PastReplay],
    failure: &ProviderFailure,
    now_ms: u64,
    deadline_ms: Option<u64>,
) -> ReplayDecision {
    if !failure.is_transport_retryable() {
        return stop(StopReason::NotReplayable);
    }
    if failure.content_published {
        return stop(StopReason::ContentPublished);
    }

    let window = window_of(failure);
    let attempt = attempt_number(past);
    if attempt >= limits.max_attempts(window) {
        return stop(StopReason::AttemptsExhausted {
            window,
            attempts: attempt,
        });
    }

    let spent = past
        .iter()
        .fold(0u64, |sum, p| sum.saturating_add(p.wait_ms));
    let remaining = limits.max_total_delay(window).saturating_sub(spent);
    if remaining == 0 {
        return stop(StopReason::DelayExhausted { window });
    }

    let wait = limits
        .replay_wait(attempt, failure.retry_after_ms)
        .min(remaining);
    if let Some(deadline) = deadline_ms
        && now_ms.saturating_add(wait) > deadline
    {
        return stop(StopReason::Deadline);
    }
    ReplayDecision::Replay {
        wait_ms: wait,
        window,
    }
}

fn stop(reason: StopReason) -> ReplayDecision {
    ReplayDecision::Stop { reason }
}

/// The window that judges a failure: throttle only for HTTP 429 on the response head.
pub fn window_of(failure: &ProviderFailure) -> Window {
    if failure.is_throttled() {
        Window::Throttle
    } else {
        Window::General
    }
}

/// The 1-based number of the attempt being decided: one more than the failures before it.
fn attempt_number(past: &[PastReplay]) -> u32 {
    u32::try_from(past.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

impl ReplayLimits {
    /// The attempt bound of a window.
    pub fn max_attempts(&self, window: Window) -> u32 {
        match window {
            Window::General => self.max_attempts_per_turn,
            Window::Throttle => self.max_throttled_attempts_per_turn,
        }
    }

    /// The summed-wait bound of a window.
    pub fn max_total_delay(&self, window: Window) -> u64 {
        match window {
            Window::General => self.max_total_delay_ms,
            Window::Throttle => self.max_throttled_total_delay_ms,
        }
    }

    /// The wait before replay `n` (1-based), before the summed-wait clamp: exponential from
    /// `base_delay_ms`, lengthened to a Retry-After, capped at `max_delay_ms`.
    pub fn replay_wait(&self, n: u32, retry_after_ms: Option<u64>) -> u64 {
        let exponential = exponential_ms(self.base_delay_ms, n);
        exponential
            .max(retry_after_ms.unwrap_or(0))
            .min(self.max_delay_ms)
    }

    /// Every wait a window allows when each attempt fails without a Retry-After and no deadline
    /// applies: with the catalog defaults the general window gives 500, 1,000, 2,000, 4,000,
    /// 8,000, 16,000 and 20,000 ms (51,500 ms in all).
    pub fn schedule(&self, window: Window) -> Vec<u64> {
        let failure = match window {
            Window::General => ProviderFailure::from_http_status(503, None),
            Window::Throttle => ProviderFailure::from_http_status(429, None),
        };
        let mut past: Vec<PastReplay> = Vec::new();
        while let ReplayDecision::Replay { wait_ms, .. } = decide(self, &past, &failure, 0, None) {
            past.push(PastReplay { failure, wait_ms });
        }
        past.into_iter().map(|p| p.wait_ms).collect()
    }
}

/// `base × 2^(n-1)`, saturating; `n = 0` is treated as 1.
pub fn exponential_ms(base_ms: u64, n: u32) -> u64 {
    let shift = n.saturating_sub(1);
    let factor = 1u64.checked_shl(shift);
    match factor {
        Some(f) => base_ms.saturating_mul(f),
        None if base_ms == 0 => 0,
        None => u64::MAX,
    }
}
