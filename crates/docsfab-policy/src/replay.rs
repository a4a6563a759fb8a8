//! The in-turn replay state machine (REP-*): below the turn governor, a provider request that
//! failed with a retryable transport fault is sent again, byte for byte, after a bounded wait.

use serde::{Deserialize, Serialize};

use crate::class::ProviderFailure;

/// The `providerAttempt.*` catalog limits that bound replays within one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayLimits {
    pub base_delay_ms: u64,
    pub max_delay_ms: u64,
    pub max_total_delay_ms: u64,
    pub max_attempts_per_turn: u32,
    pub max_throttled_attempts_per_turn: u32,
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
    General,
    Throttle,
}

/// One earlier failed request of this turn, and the wait that followed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PastReplay {
    pub failure: ProviderFailure,
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
pub fn decide(
    limits: &ReplayLimits,
    past: &[PastReplay],
    failure: &ProviderFailure,
    now_ms: u64,
    deadline_ms: Option<u64>,
) -> ReplayDecision {
    let _ = (limits, past, failure, now_ms, deadline_ms);
    todo!("policy: replay::decide")
}
