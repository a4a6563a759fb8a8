//! The retry envelope: the worst-case wall clock and attempt count of one read-only step, given
//! the effective limits and the composition's attempt timer (OPS-2).
//!
//! Two portions add up. The contract portion is every contract-correction attempt running to its
//! full timer. The transport portion is the smaller of two bounds on transport-failed attempts:
//! the elapsed ceiling plus the one attempt allowed to finish after crossing it, or every
//! transport attempt at its full timer plus every wait at its ceiling. All arithmetic saturates,
//! so an absurd timer yields `u64::MAX` rather than wrapping.

use serde::Serialize;

use crate::catalog::EffectiveLimits;

/// What the envelope is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvelopeInputs {
    /// The sealed attempt timer (`limits.timeoutMs` of the composition).
    pub attempt_timer_ms: u64,
    /// Effective `retry.maxRetries`.
    pub max_retries: u64,
    /// Effective `retry.maxTransportRetries`.
    pub max_transport_retries: u64,
    /// Effective `retry.transportMaxDelayMs`: the ceiling of one transport wait.
    pub transport_max_delay_ms: u64,
    /// Effective `retry.transportMaxElapsedMs`.
    pub transport_max_elapsed_ms: u64,
    /// Effective `runtime.deadlineMilliseconds`: the hosted job ceiling to compare against.
    pub deadline_ms: u64,
}

impl EnvelopeInputs {
    /// The inputs from resolved limits and an attempt timer.
    pub fn from_limits(limits: &EffectiveLimits, attempt_timer_ms: u64) -> EnvelopeInputs {
        EnvelopeInputs {
            attempt_timer_ms,
            max_retries: u64::from(limits.effective_max_retries()),
            max_transport_retries: u64::from(limits.max_transport_retries()),
            transport_max_delay_ms: limits.transport_max_delay_ms(),
            transport_max_elapsed_ms: limits.transport_max_elapsed_ms(),
            deadline_ms: limits.deadline_ms(),
        }
    }
}

/// The worst case of one read-only step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryEnvelope {
    /// The attempt timer the envelope was computed for.
    pub attempt_timer_ms: u64,
    /// At most this many attempts: 1 + maxRetries + maxTransportRetries.
    pub attempts: u64,
    /// The contract portion: the first attempt and every contract retry at its full timer.
    pub contract_ms: u64,
    /// The transport portion: the smaller of the elapsed bound and the count bound.
    pub transport_ms: u64,
    /// `contract_ms + transport_ms`: the step's worst-case wall clock.
    pub total_ms: u64,
    /// The job deadline the total is compared against.
    pub deadline_ms: u64,
    /// Whether `total_ms` exceeds `deadline_ms`, so a hosted job deadline could cancel the run.
    pub exceeds_deadline: bool,
}

impl RetryEnvelope {
    /// Computes the envelope.
    pub fn compute(i: &EnvelopeInputs) -> RetryEnvelope {
        let timer = i.attempt_timer_ms;
        let n = i.max_transport_retries;
        let by_elapsed = i.transport_max_elapsed_ms.saturating_add(timer);
        let by_count = n
            .saturating_add(1)
            .saturating_mul(timer)
            .saturating_add(n.saturating_mul(i.transport_max_delay_ms));
        let transport_ms = by_elapsed.min(by_count);
        let contract_ms = i.max_retries.saturating_add(1).saturating_mul(timer);
        let total_ms = transport_ms.saturating_add(contract_ms);
        RetryEnvelope {
            attempt_timer_ms: timer,
            attempts: 1u64
                .saturating_add(i.max_retries)
                .saturating_add(i.max_transport_retries),
            contract_ms,
            transport_ms,
            total_ms,
            deadline_ms: i.deadline_ms,
            exceeds_deadline: total_ms > i.deadline_ms,
        }
    }

    /// Computes the envelope from resolved limits and an attempt timer.
    pub fn for_limits(limits: &EffectiveLimits, attempt_timer_ms: u64) -> RetryEnvelope {
        RetryEnvelope::compute(&EnvelopeInputs::from_limits(limits, attempt_timer_ms))
    }
}
