//! Catalog limits and their resolution (CFG-1, CFG-2, CFG-5, CFG-7, CFG-8).

use std::collections::BTreeMap;

use docsfab_policy::catalog::{
    ConfigError, EffectiveLimits, Limit, Source, host_catalog_keys, resolve,
};
use docsfab_policy::host::HostConfig;
use docsfab_policy::replay::ReplayLimits;
use docsfab_policy::step::StepBudgets;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn host(text: &str) -> HostConfig {
    HostConfig::parse(text, "/h/host.yaml").expect("test host.yaml parses")
}

fn no_host() -> HostConfig {
    HostConfig::empty("/h/host.yaml")
}

fn refused(host: &HostConfig, pairs: &[(&str, &str)]) -> String {
    match resolve(host, &env(pairs)) {
        Ok(l) => panic!("expected a refusal, got {l:?}"),
        Err(e) => e.to_string(),
    }
}

/// One sentence: a single full stop, at the end.
fn assert_one_sentence(msg: &str) {
    assert!(msg.ends_with('.'), "{msg}");
    assert_eq!(
        msg.matches(". ").count(),
        0,
        "more than one sentence: {msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn catalog_defaults_with_nothing_set_cfg_1_cfg_2() {
    let l = resolve(&no_host(), &env(&[])).unwrap();
    assert_eq!(l.configured_max_retries(), 3);
    assert_eq!(l.effective_max_retries(), 3);
    assert_eq!(l.max_transport_retries(), 6);
    assert_eq!(l.transport_max_delay_ms(), 60_000);
    assert_eq!(l.transport_max_elapsed_ms(), 3_600_000);
    assert_eq!(l.retry_base_delay_ms(), 1_000);
    assert_eq!(l.deadline_ms(), 10_800_000);
    assert_eq!(
        (
            l.max_cut_answer_retries(),
            l.max_timeout_retries(),
            l.max_no_progress_retries()
        ),
        (1, 1, 1)
    );
    assert!(l.iter().all(|(_, e)| e.source == Source::Catalog));
    assert_eq!(l.replay_limits(), ReplayLimits::default());
    assert_eq!(l.step_budgets(), StepBudgets::default());
    assert_eq!(l, EffectiveLimits::catalog_defaults());
}

#[test]
fn step_budgets_carry_effective_values_cfg_5_cfg_7() {
    let l = resolve(
        &host("readOnlyMaxRetries: 2\n"),
        &env(&[
            ("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "4"),
            ("DOCSFAB_RETRY_BASE_DELAY_MS", "250"),
            ("DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES", "2"),
        ]),
    )
    .unwrap();
    let b = l.step_budgets();
    assert_eq!(
        (
            b.max_retries,
            b.max_transport_retries,
            b.base_delay_ms,
            b.timeout_retries
        ),
        (2, 4, 250, 2)
    );
    assert_eq!((b.cut_answer_retries, b.no_progress_retries), (1, 1));
    assert_eq!(l.transport_retry().max_transport_retries, 4);
}

#[test]
fn every_catalog_key_has_default_equal_to_maximum_cfg_8() {
    for key in host_catalog_keys() {
        let limit = Limit::from_key(key).unwrap();
        assert_eq!(limit.default_value(), limit.max(), "{key}");
    }
    assert_eq!(host_catalog_keys().len(), 11);
}

#[test]
fn env_max_retries_in_range_is_used_cfg_1() {
    for v in 0..=3u32 {
        let l = resolve(
            &no_host(),
            &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", &v.to_string())]),
        )
        .unwrap();
        assert_eq!(l.effective_max_retries(), v);
        assert_eq!(l.configured_max_retries(), 3);
        assert_eq!(l.get(Limit::MaxRetries).source, Source::Environment);
    }
}

#[test]
fn env_max_retries_above_range_refused_cfg_1() {
    let msg = refused(&no_host(), &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "4")]);
    assert!(msg.contains("DOCSFAB_READ_ONLY_MAX_RETRIES=4"), "{msg}");
    assert!(msg.contains("0..3"), "{msg}");
    assert_one_sentence(&msg);
}

#[test]
fn env_non_integers_refused_cfg_1() {
    for bad in [
        "2.5", "abc", "", " 3", "3 ", "+1", "0x2", "1_0", "1e0", "３",
    ] {
        let err = resolve(&no_host(), &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", bad)])).unwrap_err();
        assert!(
            matches!(err, ConfigError::NotAnInteger { .. }),
            "{bad:?}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("DOCSFAB_READ_ONLY_MAX_RETRIES"), "{msg}");
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        assert!(msg.contains("0..3"), "{msg}");
        assert_one_sentence(&msg);
    }
}

#[test]
fn env_negative_and_huge_refused_as_out_of_range_cfg_1() {
    for bad in ["-1", "99999999999999999999999"] {
        let err = resolve(&no_host(), &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", bad)])).unwrap_err();
        assert!(matches!(err, ConfigError::OutOfRange { .. }), "{err:?}");
    }
}

#[test]
fn env_transport_retries_lower_and_range_cfg_2() {
    let l = resolve(
        &no_host(),
        &env(&[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "0")]),
    )
    .unwrap();
    assert_eq!(l.max_transport_retries(), 0);
    assert_eq!(
        l.get(Limit::MaxTransportRetries).source,
        Source::Environment
    );
    let msg = refused(
        &no_host(),
        &[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "7")],
    );
    assert!(
        msg.contains("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES=7") && msg.contains("0..6"),
        "{msg}"
    );
    assert_one_sentence(&msg);
}

#[test]
fn env_base_delay_and_condition_ranges() {
    let l = resolve(
        &no_host(),
        &env(&[("DOCSFAB_RETRY_BASE_DELAY_MS", "60000")]),
    )
    .unwrap();
    assert_eq!(l.retry_base_delay_ms(), 60_000);
    let msg = refused(&no_host(), &[("DOCSFAB_RETRY_BASE_DELAY_MS", "60001")]);
    assert!(msg.contains("0..60000"), "{msg}");
    for var in [
        "DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES",
        "DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES",
        "DOCSFAB_READ_ONLY_MAX_NO_PROGRESS_RETRIES",
    ] {
        let msg = refused(&no_host(), &[(var, "4")]);
        assert!(msg.contains(var) && msg.contains("0..3"), "{msg}");
        let l = resolve(&no_host(), &env(&[(var, "3")])).unwrap();
        assert!(l.iter().any(|(lim, e)| lim.env_var() == Some(var)
            && e.value == 3
            && e.source == Source::Environment));
    }
}

#[test]
fn host_override_stays_in_force_over_env_cfg_5() {
    let h = host("readOnlyMaxRetries: 1\n");
    let l = resolve(&h, &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", "3")])).unwrap();
    assert_eq!(l.effective_max_retries(), 1);
    assert_eq!(l.get(Limit::MaxRetries).source, Source::HostOverride);
    assert_eq!(l.shadowed_env_max_retries(), Some(3));
    assert_eq!(l.configured_max_retries(), 3);
}

#[test]
fn env_value_is_still_validated_under_host_override_cfg_5() {
    let h = host("readOnlyMaxRetries: 1\n");
    let msg = refused(&h, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "9")]);
    assert!(msg.contains("DOCSFAB_READ_ONLY_MAX_RETRIES=9"), "{msg}");
}

#[test]
fn sources_are_reported_for_each_step_cfg_5() {
    let h = host("catalog:\n  retry.transportMaxDelayMs: 30000\n");
    let l = resolve(
        &h,
        &env(&[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "2")]),
    )
    .unwrap();
    assert_eq!(
        l.get(Limit::TransportMaxDelayMs).source,
        Source::HostCatalog
    );
    assert_eq!(l.get(Limit::TransportMaxDelayMs).value, 30_000);
    assert_eq!(
        l.get(Limit::MaxTransportRetries).source,
        Source::Environment
    );
    assert_eq!(l.get(Limit::TransportMaxElapsedMs).source, Source::Catalog);
    assert_eq!(Source::HostCatalog.to_string(), "host catalog");
    assert_eq!(Source::HostOverride.to_string(), "host override");
}

#[test]
fn host_override_out_of_range_or_not_integer_refused() {
    let msg = refused(&host("readOnlyMaxRetries: 4\n"), &[]);
    assert!(
        msg.contains("readOnlyMaxRetries=4")
            && msg.contains("/h/host.yaml")
            && msg.contains("0..3"),
        "{msg}"
    );
    let msg = refused(&host("readOnlyMaxRetries: \"2\"\n"), &[]);
    assert!(msg.contains("not a whole number"), "{msg}");
    let msg = refused(&host("readOnlyMaxRetries: 2.5\n"), &[]);
    assert!(
        msg.contains("not a whole number") && msg.contains("line 1"),
        "{msg}"
    );
}

#[test]
fn host_catalog_lowers_every_key_cfg_8() {
    for key in host_catalog_keys() {
        let limit = Limit::from_key(key).unwrap();
        let lowered = limit.max() - 1;
        let l = resolve(&host(&format!("catalog:\n  {key}: {lowered}\n")), &env(&[])).unwrap();
        assert_eq!(l.get(limit).value, lowered, "{key}");
        assert_eq!(l.get(limit).source, Source::HostCatalog, "{key}");
    }
}

#[test]
fn host_catalog_raise_refused_naming_key_and_maximum_cfg_8() {
    for key in host_catalog_keys() {
        let limit = Limit::from_key(key).unwrap();
        let raised = limit.max() + 1;
        let err = resolve(&host(&format!("catalog:\n  {key}: {raised}\n")), &env(&[])).unwrap_err();
        assert!(
            matches!(err, ConfigError::RaisesCatalogMaximum { .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains(key), "{msg}");
        assert!(
            msg.contains(&format!("maximum of {}", limit.max())),
            "{msg}"
        );
        assert!(msg.contains("/h/host.yaml (line 2)"), "{msg}");
        assert_one_sentence(&msg);
    }
}

#[test]
fn host_catalog_unknown_key_and_wrong_type_refused_cfg_8() {
    let msg = refused(&host("catalog:\n  retry.maxRetrys: 2\n"), &[]);
    assert!(
        msg.contains("retry.maxRetrys") && msg.contains("line 2"),
        "{msg}"
    );
    assert_one_sentence(&msg);
    // Environment-only values are not catalog keys.
    let msg = refused(&host("catalog:\n  retry.baseDelayMs: 10\n"), &[]);
    assert!(msg.contains("unknown catalog key"), "{msg}");
    for bad in ["abc", "2.5", "0x2", "1_000", "\"3\"", "true"] {
        let err = resolve(
            &host(&format!("catalog:\n  retry.maxRetries: {bad}\n")),
            &env(&[]),
        )
        .unwrap_err();
        assert!(
            matches!(err, ConfigError::NotAnInteger { .. }),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn host_catalog_below_minimum_refused() {
    let msg = refused(
        &host("catalog:\n  providerAttempt.maxAttemptsPerTurn: 0\n"),
        &[],
    );
    assert!(msg.contains("1..8"), "{msg}");
}

#[test]
fn env_cannot_raise_a_host_catalog_lowering_cfg_8() {
    let h = host("catalog:\n  retry.maxTransportRetries: 2\n  retry.maxRetries: 1\n");
    let msg = refused(&h, &[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "3")]);
    assert!(
        msg.contains("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES=3") && msg.contains("0..2"),
        "{msg}"
    );
    assert_one_sentence(&msg);
    let l = resolve(&h, &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")])).unwrap();
    assert_eq!(
        (l.configured_max_retries(), l.effective_max_retries()),
        (1, 0)
    );
    // The host's own override may not exceed its own lowering either.
    let msg = refused(
        &host("readOnlyMaxRetries: 2\ncatalog:\n  retry.maxRetries: 1\n"),
        &[],
    );
    assert!(
        msg.contains("readOnlyMaxRetries=2") && msg.contains("0..1"),
        "{msg}"
    );
}

#[test]
fn lowered_max_retries_lowers_default_condition_budgets_cfg_7() {
    let l = resolve(&no_host(), &env(&[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")])).unwrap();
    assert_eq!(
        (
            l.max_cut_answer_retries(),
            l.max_timeout_retries(),
            l.max_no_progress_retries()
        ),
        (0, 0, 0)
    );
    assert_eq!(l.get(Limit::MaxTimeoutRetries).source, Source::Environment);
    let l = resolve(&host("catalog:\n  retry.maxRetries: 0\n"), &env(&[])).unwrap();
    assert_eq!(l.max_cut_answer_retries(), 0);
    assert_eq!(
        l.get(Limit::MaxCutAnswerRetries).source,
        Source::HostCatalog
    );
}

#[test]
fn explicit_condition_budget_above_max_retries_refused_cfg_7() {
    let msg = refused(
        &no_host(),
        &[
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", "1"),
            ("DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES", "2"),
        ],
    );
    assert!(
        msg.contains("DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES=2"),
        "{msg}"
    );
    assert!(msg.contains("retry.maxRetries of 1"), "{msg}");
    assert!(msg.contains("0..1"), "{msg}");
    assert_one_sentence(&msg);
    // Against a host override as well.
    let msg = refused(
        &host("readOnlyMaxRetries: 0\n"),
        &[("DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES", "1")],
    );
    assert!(msg.contains("host override"), "{msg}");
    // Equal is fine.
    let l = resolve(
        &no_host(),
        &env(&[
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", "2"),
            ("DOCSFAB_READ_ONLY_MAX_NO_PROGRESS_RETRIES", "2"),
        ]),
    )
    .unwrap();
    assert_eq!(l.max_no_progress_retries(), 2);
}

#[test]
fn unrelated_variables_are_ignored() {
    let l = resolve(&no_host(), &env(&[("DOCSFAB_HOME", "/x"), ("PATH", "abc")])).unwrap();
    assert!(l.iter().all(|(_, e)| e.source == Source::Catalog));
}

#[test]
fn replay_limits_follow_host_lowering() {
    let h = host(
        "catalog:\n  providerAttempt.maxAttemptsPerTurn: 3\n  providerAttempt.baseDelayMs: 100\n",
    );
    let r = resolve(&h, &env(&[])).unwrap().replay_limits();
    assert_eq!(r.max_attempts_per_turn, 3);
    assert_eq!(r.base_delay_ms, 100);
    assert_eq!(r.max_throttled_attempts_per_turn, 24);
}
