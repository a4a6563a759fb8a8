//! Properties of limit resolution over arbitrary hosts and environments (CFG-1, CFG-2, CFG-5,
//! CFG-7, CFG-8).

use std::collections::BTreeMap;

use docsfab_policy::catalog::{Limit, Source, resolve};
use docsfab_policy::host::HostConfig;
use proptest::prelude::*;

/// Values an operator might type: valid, out of range, and not numbers at all.
fn typed_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..8).prop_map(|v| v.to_string()),
        Just("2.5".to_string()),
        Just(String::new()),
        Just(" 3".to_string()),
        Just("-1".to_string()),
        (0u64..70_000).prop_map(|v| v.to_string()),
    ]
}

fn env_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    let vars: Vec<&'static str> = Limit::ALL.into_iter().filter_map(Limit::env_var).collect();
    proptest::collection::vec(proptest::option::of(typed_value()), vars.len()).prop_map(
        move |vals| {
            vars.iter()
                .zip(vals)
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
                .collect()
        },
    )
}

fn host_strategy() -> impl Strategy<Value = String> {
    (
        proptest::option::of(0u64..5),
        proptest::option::of(0u64..5),
        proptest::option::of(0u64..8),
    )
        .prop_map(|(over, max_r, max_t)| {
            let mut text = String::new();
            if let Some(o) = over {
                text.push_str(&format!("readOnlyMaxRetries: {o}\n"));
            }
            if max_r.is_some() || max_t.is_some() {
                text.push_str("catalog:\n");
            }
            if let Some(v) = max_r {
                text.push_str(&format!("  retry.maxRetries: {v}\n"));
            }
            if let Some(v) = max_t {
                text.push_str(&format!("  retry.maxTransportRetries: {v}\n"));
            }
            text
        })
}

proptest! {
    /// Whatever is given, resolution either refuses it or yields values inside every range, no
    /// raise above the host's lowering, and condition budgets inside retry.maxRetries.
    #[test]
    fn resolved_limits_respect_every_bound_cfg_7_cfg_8(host_text in host_strategy(), env in env_strategy()) {
        let host = HostConfig::parse(&host_text, "host.yaml").unwrap();
        let Ok(l) = resolve(&host, &env) else { return Ok(()) };
        for (limit, e) in l.iter() {
            prop_assert!(e.value >= limit.min() && e.value <= limit.max(), "{limit}: {e:?}");
        }
        prop_assert!(l.effective_max_retries() <= l.configured_max_retries());
        prop_assert!(l.configured_max_retries() <= 3);
        prop_assert!(l.max_transport_retries() <= 6);
        let max = l.effective_max_retries();
        prop_assert!(l.max_cut_answer_retries() <= max);
        prop_assert!(l.max_timeout_retries() <= max);
        prop_assert!(l.max_no_progress_retries() <= max);
    }

    /// An environment value is taken exactly when it is a whole number in range and no host
    /// setting stands above it (CFG-1, CFG-2, CFG-5).
    #[test]
    fn env_value_taken_iff_valid_cfg_1_cfg_2(v in typed_value(), transport in any::<bool>()) {
        let (var, limit, max) = if transport {
            ("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", Limit::MaxTransportRetries, 6)
        } else {
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", Limit::MaxRetries, 3)
        };
        let env: BTreeMap<String, String> = [(var.to_string(), v.clone())].into();
        let valid = v.parse::<u64>().ok().filter(|n| *n <= max && !v.starts_with(['+', ' ']));
        // With maxRetries lowered to 0, the default condition budgets follow it down, so every
        // valid value resolves.
        match (resolve(&HostConfig::empty("host.yaml"), &env), valid) {
            (Ok(l), Some(n)) => {
                prop_assert_eq!(l.get(limit).value, n);
                prop_assert_eq!(l.get(limit).source, Source::Environment);
            }
            (Err(e), None) => prop_assert!(e.to_string().contains(var)),
            (r, want) => prop_assert!(false, "{v:?}: got {r:?}, wanted {want:?}"),
        }
    }
}
