//! The simulator against hand-computed steps, and its tie to the production policy.

use std::collections::BTreeMap;

use docsfab_goodput::model::FaultModel;
use docsfab_goodput::policy::{DocsfabPolicy, Policy, peer};
use docsfab_goodput::report::simulate;
use docsfab_goodput::rng::Rng;
use docsfab_goodput::sim::{Bound, step};
use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::envelope::{EnvelopeInputs, RetryEnvelope};
use docsfab_policy::host::HostConfig;
use docsfab_policy::rules::RulesTable;

const TIMER_MS: u64 = 1_800_000;

fn docsfab(limits: &EffectiveLimits) -> Policy {
    let rules = RulesTable::embedded().expect("the shipped rules table parses");
    Policy::Docsfab(Box::new(DocsfabPolicy::from_limits(
        limits, rules, TIMER_MS,
    )))
}

fn defaults() -> Policy {
    docsfab(&EffectiveLimits::catalog_defaults())
}

#[test]
fn goodput_all_ok_is_one_request_and_success() {
    let r = step(&defaults(), &FaultModel::always_ok(1_234), &mut Rng::new(1));
    assert!(r.success);
    assert_eq!(
        (r.requests, r.attempts, r.waited_ms, r.elapsed_ms),
        (1, 1, 0, 1_234)
    );
}

/// REP-1, REP-7, STP-6: every request answers 503 at once, so each attempt makes the general
/// window's 8 requests with its seven waits, and the transport budget adds six attempts with
/// waits 1 s .. 32 s before the step is exhausted.
#[test]
fn goodput_all_503_hits_exactly_the_spec_bounds_rep_1_rep_7() {
    let r = step(&defaults(), &FaultModel::always(503), &mut Rng::new(1));
    let turn = [500, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000];
    let mut expected = Vec::new();
    for k in 0..7u32 {
        expected.extend(turn);
        if k < 6 {
            expected.push(1_000u64 << k);
        }
    }
    assert!(!r.success);
    assert_eq!(r.attempts, 7);
    assert_eq!(r.requests, 7 * 8);
    assert_eq!(r.waits, expected);
    assert_eq!(r.elapsed_ms, 7 * 51_500 + 63_000);
    assert!(r.hit(Bound::ReplayAttempts) && r.hit(Bound::StepExhausted));
    assert!(!r.hit(Bound::ThrottledAttempts) && !r.hit(Bound::AttemptTimer));
}

/// The throttle window: 24 requests a turn, its waits capped at 20 s (REP-7 throttle bound).
#[test]
fn goodput_all_429_uses_the_throttle_window() {
    let r = step(&defaults(), &FaultModel::always(429), &mut Rng::new(1));
    assert!(!r.success);
    assert_eq!(r.requests, r.attempts * 24);
    assert!(r.hit(Bound::ThrottledAttempts));
}

/// A lowered catalog value changes the simulated step exactly as the envelope `doctor` prints
/// says: the attempts it allows are the simulated attempts (plus the unused contract retries).
#[test]
fn goodput_changed_limit_changes_the_outcome_as_doctors_envelope_says() {
    for transport in ["0", "2", "6"] {
        let env = BTreeMap::from([(
            "DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES".to_string(),
            transport.to_string(),
        )]);
        let limits = resolve(&HostConfig::empty("host.yaml"), &env).expect("valid limits");
        let envelope = RetryEnvelope::compute(&EnvelopeInputs::from_limits(&limits, TIMER_MS));
        let r = step(
            &docsfab(&limits),
            &FaultModel::always(503),
            &mut Rng::new(1),
        );
        let contract = u64::from(limits.effective_max_retries());
        assert_eq!(
            u64::from(r.attempts),
            envelope.attempts - contract,
            "transport={transport}"
        );
        assert!(r.elapsed_ms <= envelope.total_ms);
    }
}

#[test]
fn goodput_same_seed_same_summary_other_seed_differs() {
    let model = FaultModel::seed();
    let a = simulate("x", &defaults(), &model, 5_000, 42);
    let b = simulate("x", &defaults(), &model, 5_000, 42);
    let c = simulate("x", &defaults(), &model, 5_000, 43);
    assert_eq!(a, b);
    assert_ne!(a.p50_step_ms, c.p50_step_ms);
}

/// A peer retries only inside the call: with max_retries 2 an always-503 provider gets 3 requests.
#[test]
fn goodput_peer_preset_retries_only_inside_the_call() {
    let p = Policy::Peer(peer("openai-python").expect("preset exists"));
    let r = step(&p, &FaultModel::always(503), &mut Rng::new(1));
    assert_eq!((r.requests, r.attempts, r.success), (3, 1, false));
    assert!(r.hit(Bound::PeerRetries));
    // openai-python: 0.5 s then 1 s, each shortened by up to a quarter.
    assert!(
        (375..=500).contains(&r.waits[0]) && (750..=1_000).contains(&r.waits[1]),
        "{:?}",
        r.waits
    );
}

/// The seed model's 429 correlation (0.7) loses about 0.7^2 of throttled steps to a client
/// with two retries, and almost none to docsfab's 24-request throttle window.
#[test]
fn goodput_seed_model_throttled_steps_docsfab_vs_sdk() {
    let mut m = FaultModel::seed();
    m.good = docsfab_goodput::model::ClassProbabilities {
        rate_limit: 1.0,
        ..Default::default()
    };
    m.good_to_bad = 0.0;
    // First request always 429; after that only the 0.7 repeat curve decides.
    let sdk = simulate(
        "sdk",
        &Policy::Peer(peer("openai-python").unwrap()),
        &m,
        20_000,
        7,
    );
    let ours = simulate("docsfab", &defaults(), &m, 20_000, 7);
    // After the first 429 the repeat curve gives 429 with 0.7, else the good state's draw
    // without its 429 mass, which is success.
    assert!(
        sdk.success_ci95.low < 0.51 && sdk.success_ci95.high > 0.51,
        "{sdk:?}"
    );
    assert!(ours.success_rate > 0.999, "{ours:?}");
}

/// The store fit: 90 clean turns, 10 one-fault bursts and 10 three-fault bursts over 150
/// requests give a mean burst of 2 faults (badToGood 0.5) and 20 bursts per 110 clean requests.
#[test]
fn goodput_fit_from_store_figures_is_hand_computable() {
    use docsfab_goodput::model::Observed;
    let o = Observed {
        requests: 150,
        bursts: vec![(0, 90), (1, 10), (3, 10)],
        faults_by_class: vec![("server".into(), 30), ("rate-limit".into(), 10)],
        repeats_after_429: vec![(0, Some(0.7)), (1_000, None), (5_000, Some(0.5))],
    };
    let m = FaultModel::fit(&o).expect("requests were seen");
    assert_eq!(m.bad_to_good, 0.5);
    assert!((m.good_to_bad - 20.0 / 110.0).abs() < 1e-12);
    assert_eq!((m.bad.server, m.bad.rate_limit), (0.75, 0.25));
    assert_eq!(m.repeat_after_429.len(), 2);
    assert!(m.problem().is_none());
    assert!(FaultModel::fit(&Observed::default()).is_none());
}
