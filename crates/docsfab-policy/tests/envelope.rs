//! The retry envelope doctor prints (OPS-2) and the attempt bound it states (CFG-3).

use std::collections::BTreeMap;

use docsfab_policy::catalog::resolve;
use docsfab_policy::envelope::{EnvelopeInputs, RetryEnvelope};
use docsfab_policy::host::HostConfig;
use proptest::prelude::*;

fn limits(pairs: &[(&str, &str)]) -> docsfab_policy::catalog::EffectiveLimits {
    let env: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    resolve(&HostConfig::empty("host.yaml"), &env).unwrap()
}

#[test]
fn defaults_with_half_hour_timer_ops_2() {
    let e = RetryEnvelope::for_limits(&limits(&[]), 1_800_000);
    assert_eq!(e.transport_ms, 5_400_000);
    assert_eq!(e.contract_ms, 7_200_000);
    assert_eq!(e.total_ms, 12_600_000);
    assert_eq!(e.deadline_ms, 10_800_000);
    assert!(e.exceeds_deadline);
    assert_eq!(e.attempts, 10);
}

#[test]
fn no_transport_retries_leaves_one_timer_ops_2() {
    let e = RetryEnvelope::for_limits(
        &limits(&[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "0")]),
        1_800_000,
    );
    assert_eq!(e.transport_ms, 1_800_000);
    assert_eq!(e.total_ms, 9_000_000);
    assert!(!e.exceeds_deadline);
    assert_eq!(e.attempts, 4);
}

#[test]
fn short_timer_is_bounded_by_count_not_elapsed_ops_2() {
    // 7 × 300,000 + 6 × 60,000 = 2,460,000 < 3,600,000 + 300,000.
    let e = RetryEnvelope::for_limits(&limits(&[]), 300_000);
    assert_eq!(e.transport_ms, 2_460_000);
    assert_eq!(e.contract_ms, 1_200_000);
    assert!(!e.exceeds_deadline);
}

#[test]
fn contract_portion_follows_effective_max_retries_ops_2() {
    let e = RetryEnvelope::for_limits(
        &limits(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")]),
        1_800_000,
    );
    assert_eq!(e.contract_ms, 1_800_000);
    assert_eq!(e.attempts, 7);
}

#[test]
fn exactly_at_deadline_does_not_exceed() {
    let e = RetryEnvelope::compute(&EnvelopeInputs {
        attempt_timer_ms: 1_000,
        max_retries: 0,
        max_transport_retries: 0,
        transport_max_delay_ms: 0,
        transport_max_elapsed_ms: 0,
        deadline_ms: 2_000,
    });
    assert_eq!(e.total_ms, 2_000);
    assert!(!e.exceeds_deadline);
}

#[test]
fn huge_timer_saturates_instead_of_wrapping() {
    let e = RetryEnvelope::for_limits(&limits(&[]), u64::MAX / 2);
    assert_eq!(e.total_ms, u64::MAX);
    assert!(e.exceeds_deadline);
}

proptest! {
    /// The transport portion is never more than either of its two bounds, and the attempt bound
    /// is 1 + maxRetries + maxTransportRetries, at most 10 (OPS-2, CFG-3).
    #[test]
    fn envelope_matches_its_definition_ops_2(
        timer in 0u64..10_000_000,
        r in 0u64..=3,
        n in 0u64..=6,
        delay in 0u64..=60_000,
        elapsed in 0u64..=3_600_000,
    ) {
        let e = RetryEnvelope::compute(&EnvelopeInputs {
            attempt_timer_ms: timer,
            max_retries: r,
            max_transport_retries: n,
            transport_max_delay_ms: delay,
            transport_max_elapsed_ms: elapsed,
            deadline_ms: 10_800_000,
        });
        prop_assert_eq!(e.transport_ms, (elapsed + timer).min((n + 1) * timer + n * delay));
        prop_assert_eq!(e.contract_ms, (1 + r) * timer);
        prop_assert_eq!(e.total_ms, e.transport_ms + e.contract_ms);
        prop_assert_eq!(e.attempts, 1 + r + n);
        prop_assert!(e.attempts <= 10);
        prop_assert_eq!(e.exceeds_deadline, e.total_ms > 10_800_000);
    }
}
