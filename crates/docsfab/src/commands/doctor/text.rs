//! The doctor report as text: the home and host file, each provider with its host, throttle,
//! spend and structured output, the rules table, the composition, every effective limit with
//! its source, the retry and token envelopes, the run store, the probe, the warnings, and the
//! verdict line.

use docsfab_policy::catalog::{EffectiveLimits, Limit};
use docsfab_policy::envelope::RetryEnvelope;
use docsfab_policy::host::ProviderThrottle;
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::store::StoreUrl;

use crate::app::doctor::store::{StoreCheck, StoreState};
use crate::app::doctor::{Report, key_var_is_set};
use crate::app::home::HostContext;

/// The report as the lines doctor prints.
pub fn to_text(r: &Report) -> String {
    let mut lines = host_lines(r);
    lines.push(rules_line(&r.ctx));
    lines.extend(composition_lines(r));
    lines.extend(limit_lines(&r.ctx.limits));
    lines.push(envelope_line(&r.envelope));
    // The envelope line is fixed byte for byte; its times read in human units on the next line.
    let e = &r.envelope;
    lines.push(format!(
        "  = contract {}, transport {}, total {}; deadline {}",
        human_duration(e.contract_ms),
        human_duration(e.transport_ms),
        human_duration(e.total_ms),
        human_duration(e.deadline_ms)
    ));
    lines.extend(token_lines(r));
    lines.push(store_line(&r.store));
    lines.extend(r.goodput.clone());
    lines.extend(r.probe.iter().flat_map(super::probe::lines));
    lines.extend(r.warnings.iter().map(|w| format!("warning: {w}")));
    lines.push(match &r.probe {
        Some(p) if p.conclusion().is_err() => {
            "Configuration is valid, but the probe failed (see the error on stderr).".to_string()
        }
        _ => "Configuration is valid.".to_string(),
    });
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// The home, the host file, and each provider with its host and throttle.
fn host_lines(r: &Report) -> Vec<String> {
    let ctx = &r.ctx;
    let mut lines = vec![
        format!(
            "Home: {} ({})",
            ctx.home.dir.display(),
            if ctx.home.from_env {
                "DOCSFAB_HOME"
            } else {
                "default $HOME/.docsfab"
            }
        ),
        format!(
            "Host file: {} ({})",
            ctx.host.path,
            if ctx.host_file_empty {
                "empty: no providers are configured"
            } else if ctx.host_file_exists {
                "valid"
            } else {
                "absent: catalog defaults"
            }
        ),
    ];
    for (name, p) in &ctx.host.providers {
        lines.push(format!(
            "Provider {name}: api={} baseUrl={} model={} apiKeyEnv={} ({})",
            p.api,
            p.base_url,
            p.model,
            p.api_key_env,
            if key_var_is_set(&p.api_key_env) {
                "set"
            } else {
                "not set"
            }
        ));
        if let Some((_, dns)) = r.dns.iter().find(|(n, _)| n == name) {
            lines.push(format!(
                "Provider {name} host: {} {}",
                dns.host(),
                dns.describe()
            ));
        }
        lines.push(throttle_line(name, &p.throttle));
        lines.push(spend_line(name, &p.spend));
        lines.push(structured_output_line(name, p));
    }
    lines
}

/// The `Provider NAME structuredOutput:` line: what a contract step's requests carry.
fn structured_output_line(name: &str, p: &docsfab_policy::host::ProviderConfig) -> String {
    use docsfab_policy::host::StructuredOutput;
    let s = p.structured_output();
    let source = match p.structured_output_given {
        Some(_) => "host.yaml",
        None => "the API's default",
    };
    let meaning = match (s, p.api) {
        (StructuredOutput::JsonSchema, docsfab_record::Api::OpenaiChat) => {
            "a contract step sends its schema as response_format json_schema (strict where the schema allows it)"
        }
        (StructuredOutput::JsonSchema, docsfab_record::Api::AnthropicMessages) => {
            "a contract step sends its schema as output_config.format when every object in it is closed (additionalProperties: false)"
        }
        (StructuredOutput::JsonObject, _) => {
            "a contract step asks for a JSON object (response_format json_object); the schema is only in the prompt"
        }
        (StructuredOutput::Off, _) => "no constraint is sent; the schema is only in the prompt",
    };
    format!(
        "Provider {name} structuredOutput: {} ({source}): {meaning}",
        s.as_str()
    )
}

/// The `Provider NAME spend:` line: usage, caching, prices and the cost budget, with sources.
fn spend_line(name: &str, s: &docsfab_policy::host::ProviderSpend) -> String {
    let source = |given: bool| if given { "host.yaml" } else { "default" };
    let pricing = match &s.pricing {
        Some(p) => format!(
            "pricing USD/M in {} out {} cache-write {} cache-read {} (host.yaml)",
            p.input_per_million,
            p.output_per_million,
            p.cache_write_per_million.unwrap_or(p.input_per_million),
            p.cache_read_per_million.unwrap_or(p.input_per_million)
        ),
        None => "no pricing (costUsd stays null)".to_owned(),
    };
    let budget = match s.max_run_cost_usd {
        Some(v) => format!("budget.maxRunCostUsd={v} (host.yaml)"),
        None => "budget.maxRunCostUsd=none".to_owned(),
    };
    format!(
        "Provider {name} spend: includeUsage={} ({}) promptCaching={} ({}) {pricing} {budget}",
        s.include_usage,
        source(s.given_include_usage),
        s.prompt_caching,
        source(s.given_prompt_caching),
    )
}

fn token_lines(r: &Report) -> Vec<String> {
    let Some(t) = r.token_envelope() else {
        return Vec::new();
    };
    let mut lines: Vec<String> = t
        .steps
        .iter()
        .map(|id| {
            format!(
                "Token envelope of step {id}: up to {} attempts x {} turns x {} maxOutputTokens = {} output tokens, plus the prompts (time envelope {}ms)",
                t.attempts, t.max_turns, t.max_output_tokens, t.per_step, r.envelope.total_ms
            )
        })
        .collect();
    lines.push(match t.max_run_tokens {
        Some(n) => format!("Run budget: limits.maxRunTokens={n} (composition)"),
        None => "Run budget: limits.maxRunTokens=none (composition sets no token bound)".to_owned(),
    });
    lines
}

fn rules_line(ctx: &HostContext) -> String {
    let rules = &ctx.rules;
    let counts = format!(
        "{} class rules, {} condition rules, {} text rules",
        rules.class_rules().len(),
        rules.condition_rules().len(),
        rules.text_rules().len()
    );
    match &ctx.rules_path {
        Some(p) => format!(
            "Rules table: {} (operator copy, valid: {counts})",
            p.display()
        ),
        None => format!(
            "Rules table: embedded {} (valid: {counts})",
            docsfab_policy::rules::EMBEDDED_NAME
        ),
    }
}

/// The composition checked, if any, and the attempt timer it (or the default) sets.
fn composition_lines(r: &Report) -> Vec<String> {
    match &r.composition {
        Some((path, c, selected)) => {
            let model = match selected {
                Some(m) => m.clone(),
                None => c
                    .model
                    .clone()
                    .unwrap_or_else(|| "(the provider's model)".to_string()),
            };
            vec![
                format!(
                    "Composition: {} ({}) steps={} provider={} model={model} (valid)",
                    c.name,
                    path.display(),
                    c.steps.len(),
                    c.provider,
                ),
                format!(
                    "Attempt timer: {}ms = {} (composition limits.timeoutMs)",
                    r.timer_ms,
                    human_duration(r.timer_ms)
                ),
            ]
        }
        None => vec![format!(
            "Attempt timer: {}ms = {} (default; pass --composition FILE to use its limits.timeoutMs)",
            r.timer_ms,
            human_duration(r.timer_ms)
        )],
    }
}

/// Every effective limit with its source (and variable), then the transport line.
fn limit_lines(l: &EffectiveLimits) -> Vec<String> {
    let mut lines = vec!["Limits:".to_string()];
    for (limit, e) in l.iter() {
        let via = limit
            .env_var()
            .map(|v| format!(" [{v}]"))
            .unwrap_or_default();
        let extra = if limit == Limit::MaxRetries {
            format!(
                " configuredMaxRetries={} effectiveMaxRetries={}",
                l.configured_max_retries(),
                l.effective_max_retries()
            )
        } else {
            String::new()
        };
        lines.push(format!(
            "  {}={} ({}){extra}{via}",
            limit.key(),
            e.value,
            e.source
        ));
    }
    lines.push(transport_line(l));
    lines
}

/// The four values of the transport budget, by the names the doctor line uses.
const TRANSPORT_VALUES: [(&str, Limit); 4] = [
    ("maxTransportRetries", Limit::MaxTransportRetries),
    ("transportMaxDelayMs", Limit::TransportMaxDelayMs),
    ("transportMaxElapsedMs", Limit::TransportMaxElapsedMs),
    ("baseDelayMs", Limit::RetryBaseDelayMs),
];

/// `(catalog)` when every value shares one source, otherwise each value's source by name.
fn transport_sources(l: &EffectiveLimits) -> String {
    let values = TRANSPORT_VALUES;
    let first = l.get(values[0].1).source;
    if values.iter().all(|(_, lim)| l.get(*lim).source == first) {
        return format!("({first})");
    }
    let parts: Vec<String> = values
        .iter()
        .map(|(name, lim)| format!("{name}: {}", l.get(*lim).source))
        .collect();
    format!("({})", parts.join(", "))
}

/// The `Transport retry budget:` line.
fn transport_line(l: &EffectiveLimits) -> String {
    format!(
        "Transport retry budget: maxTransportRetries={} transportMaxDelayMs={} transportMaxElapsedMs={} baseDelayMs={} {}",
        l.max_transport_retries(),
        l.transport_max_delay_ms(),
        l.transport_max_elapsed_ms(),
        l.retry_base_delay_ms(),
        transport_sources(l)
    )
}

/// Where a throttle value came from, in the words doctor uses.
pub fn throttle_source(given: bool) -> &'static str {
    if given { "host.yaml" } else { "default" }
}

/// The `Provider NAME throttle=...` line: both values, then one source when they share it,
/// otherwise each value's source by name.
fn throttle_line(name: &str, t: &ProviderThrottle) -> String {
    let (mode, max) = (
        throttle_source(t.given.mode),
        throttle_source(t.given.max_concurrent_requests),
    );
    let sources = if mode == max {
        mode.to_string()
    } else {
        format!("throttle: {mode}, maxConcurrentRequests: {max}")
    };
    format!(
        "Provider {name} throttle={} maxConcurrentRequests={} ({sources})",
        t.mode, t.max_concurrent_requests
    )
}

/// The `Retry envelope:` line.
fn envelope_line(e: &RetryEnvelope) -> String {
    let verdict = if e.exceeds_deadline {
        "exceeds"
    } else {
        "within"
    };
    format!(
        "Retry envelope: attempts<={} contract<={}ms transport<={}ms total<={}ms ({verdict} runtime.deadlineMilliseconds={})",
        e.attempts, e.contract_ms, e.transport_ms, e.total_ms, e.deadline_ms
    )
}

/// `Run store: PLACE (WHAT)`.
fn store_line(s: &StoreCheck) -> String {
    let place = crate::app::store::store_place(&s.url);
    let what = match &s.state {
        StoreState::NotCreated => "SQLite, not created yet: the first run creates it".into(),
        StoreState::Open { counts } => {
            let total: u64 = counts.iter().map(|(_, n)| n).sum();
            let each: Vec<String> = counts
                .iter()
                .map(|(s, n)| format!("{n} {}", s.as_str()))
                .collect();
            let kind = match s.url {
                StoreUrl::Sqlite(_) => "SQLite",
                StoreUrl::Postgres(_) => "PostgreSQL, reachable",
            };
            match total {
                0 => format!("{kind}; no runs yet"),
                _ => format!(
                    "{kind}; {total} run{}: {}",
                    if total == 1 { "" } else { "s" },
                    each.join(", ")
                ),
            }
        }
        StoreState::Unreachable(_) => "cannot be opened now; see the warning below".into(),
    };
    format!("Run store: {place} ({what})")
}
