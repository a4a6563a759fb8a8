//! The doctor report as the one JSON object of `--json`: the same findings as the text, as
//! fields, each value with its source.

use docsfab_policy::catalog::Limit;
use serde_json::{Value, json};

use super::text::throttle_source;
use crate::app::doctor::store::{StoreCheck, StoreState};
use crate::app::doctor::{Report, key_var_is_set};

/// The report as the one JSON object of `--json`.
pub fn to_json(r: &Report) -> Value {
    let ctx = &r.ctx;
    let l = &ctx.limits;
    let limits: Vec<Value> = l
        .iter()
        .map(|(limit, e)| {
            json!({
                "key": limit.key(),
                "value": e.value,
                "source": e.source,
                "default": limit.default_value(),
                "min": limit.min(),
                "max": limit.max(),
                "env": limit.env_var(),
                "hostCatalog": limit.in_host_catalog(),
            })
        })
        .collect();
    let providers = providers_json(r);
    let tr = l.transport_retry();
    let e = &r.envelope;
    json!({
        "valid": true,
        "home": ctx.home.dir.display().to_string(),
        "hostFile": {"path": ctx.host.path, "exists": ctx.host_file_exists, "empty": ctx.host_file_empty},
        "providers": providers,
        "rulesTable": match &ctx.rules_path {
            Some(p) => json!({"source": "operator", "path": p.display().to_string()}),
            None => json!({"source": "embedded", "path": docsfab_policy::rules::EMBEDDED_NAME}),
        },
        "composition": r.composition.as_ref().map(|(path, c, _)| json!({
            "path": path.display().to_string(),
            "name": c.name,
            "provider": c.provider,
            "model": c.model,
            "steps": c.steps.len(),
            "limits": c.limits,
        })),
        "limits": limits,
        "configuredMaxRetries": l.configured_max_retries(),
        "effectiveMaxRetries": l.effective_max_retries(),
        "effectiveMaxRetriesSource": l.get(Limit::MaxRetries).source,
        "transportRetry": {
            "maxTransportRetries": tr.max_transport_retries,
            "transportMaxDelayMs": tr.transport_max_delay_ms,
            "transportMaxElapsedMs": tr.transport_max_elapsed_ms,
            "baseDelayMs": tr.base_delay_ms,
            "sources": {
                "maxTransportRetries": l.get(Limit::MaxTransportRetries).source,
                "transportMaxDelayMs": l.get(Limit::TransportMaxDelayMs).source,
                "transportMaxElapsedMs": l.get(Limit::TransportMaxElapsedMs).source,
                "baseDelayMs": l.get(Limit::RetryBaseDelayMs).source,
            },
        },
        "envelope": {
            "attemptTimerMs": e.attempt_timer_ms,
            "attempts": e.attempts,
            "contractMs": e.contract_ms,
            "transportMs": e.transport_ms,
            "totalMs": e.total_ms,
            "deadlineMilliseconds": e.deadline_ms,
            "exceedsDeadline": e.exceeds_deadline,
        },
        "tokenEnvelope": token_envelope_json(r),
        "store": store_json(&r.store),
        "probe": r.probe.as_ref().map(super::probe::to_json),
        "warnings": r.warnings,
    })
}

/// Each provider of host.yaml with its settings and their sources, for `--json`.
fn providers_json(r: &Report) -> Vec<Value> {
    r.ctx
        .host
        .providers
        .iter()
        .map(|(name, p)| {
            json!({
                "name": name,
                "api": p.api.as_str(),
                "baseUrl": p.base_url,
                "model": p.model,
                "apiKeyEnv": p.api_key_env,
                "apiKeyEnvSet": key_var_is_set(&p.api_key_env),
                "throttle": {
                    "mode": p.throttle.mode.as_str(),
                    "maxConcurrentRequests": p.throttle.max_concurrent_requests,
                    "sources": {
                        "mode": throttle_source(p.throttle.given.mode),
                        "maxConcurrentRequests": throttle_source(p.throttle.given.max_concurrent_requests),
                    },
                },
                "spend": spend_json(&p.spend),
                "structuredOutput": {
                    "mode": p.structured_output().as_str(),
                    "source": if p.structured_output_given.is_some() { "host.yaml" } else { "default" },
                },
                "dns": r.dns.iter().find(|(n, _)| n == name).map(|(_, d)| json!({
                    "host": d.host(),
                    "status": d.status(),
                    "detail": d.describe(),
                })),
            })
        })
        .collect()
}

/// A provider's `spend` in `--json`: what the text's spend line prints, as fields. Cache prices are
/// given as they apply (the input price when host.yaml sets none); each source is `host.yaml`
/// or `default`.
fn spend_json(s: &docsfab_policy::host::ProviderSpend) -> Value {
    let source = |given: bool| if given { "host.yaml" } else { "default" };
    let pricing = s.pricing.as_ref().map(|p| {
        json!({
            "inputPerMillion": p.input_per_million,
            "outputPerMillion": p.output_per_million,
            "cacheWritePerMillion": p.cache_write_per_million.unwrap_or(p.input_per_million),
            "cacheReadPerMillion": p.cache_read_per_million.unwrap_or(p.input_per_million),
        })
    });
    let cache_source = |price: Option<f64>| match (&s.pricing, price) {
        (None, _) => Value::Null,
        (Some(_), given) => json!(source(given.is_some())),
    };
    json!({
        "includeUsage": s.include_usage,
        "promptCaching": s.prompt_caching,
        "pricing": pricing,
        "budget": {"maxRunCostUsd": s.max_run_cost_usd},
        "sources": {
            "includeUsage": source(s.given_include_usage),
            "promptCaching": source(s.given_prompt_caching),
            "pricing": source(s.pricing.is_some()),
            "cacheWritePerMillion": cache_source(s.pricing.as_ref().and_then(|p| p.cache_write_per_million)),
            "cacheReadPerMillion": cache_source(s.pricing.as_ref().and_then(|p| p.cache_read_per_million)),
            "maxRunCostUsd": source(s.max_run_cost_usd.is_some()),
        },
    })
}

/// `tokenEnvelope` of `--json`: the text's token lines as figures; `null` without a
/// composition.
fn token_envelope_json(r: &Report) -> Value {
    let Some(t) = r.token_envelope() else {
        return Value::Null;
    };
    json!({
        "attempts": t.attempts,
        "maxTurns": t.max_turns,
        "maxOutputTokens": t.max_output_tokens,
        "outputTokensPerStep": t.per_step,
        "steps": t.steps.iter().map(|id| json!({"id": id, "outputTokens": t.per_step})).collect::<Vec<_>>(),
        "timeEnvelopeMs": r.envelope.total_ms,
        "maxRunTokens": t.max_run_tokens,
        "maxRunTokensSource": t.max_run_tokens.map(|_| "composition"),
    })
}

/// The `store` member of `--json`.
fn store_json(s: &StoreCheck) -> Value {
    let (state, runs) = match &s.state {
        StoreState::NotCreated => ("not-created", Value::Null),
        StoreState::Open { counts } => (
            "open",
            counts
                .iter()
                .map(|(s, n)| (s.as_str().to_owned(), json!(n)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        ),
        StoreState::Unreachable(_) => ("unreachable", Value::Null),
    };
    json!({
        "place": crate::app::store::store_place(&s.url),
        "backend": s.backend(),
        "state": state,
        "runs": runs,
    })
}
