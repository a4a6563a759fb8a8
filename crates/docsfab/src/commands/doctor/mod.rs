//! `docsfab doctor`: validate everything a run would read at startup (host.yaml, the
//! environment, the rules table and optionally a composition), then print every effective limit
//! with its source, the transport retry budget and the retry envelope of one read-only step.
//!
//! Each provider's host is resolved (the DNS pre-flight `run` makes, see [`crate::app::preflight`]);
//! a host that does not exist is bad configuration. `--probe` then sends one real request to one
//! provider (see [`probe`]).
//!
//! The run store (`--store`, `DOCSFAB_STORE`, else the home's `runs.db`) is opened as `run`
//! opens it: credentials or a database the server refuses are bad configuration; a server that
//! does not answer is a warning (it may be down for now); a SQLite store that does not exist yet
//! is left uncreated.
//!
//! Exit 0 when the configuration is valid, even with warnings; exit 2 with one sentence on
//! stderr at the first problem. Secrets are never printed: for each provider doctor says only
//! whether the variable it names is set.

pub mod capabilities;
pub mod probe;

use std::path::PathBuf;

use clap::Args;
use docsfab_policy::catalog::{EffectiveLimits, Limit};
use docsfab_policy::envelope::RetryEnvelope;
use docsfab_policy::host::ProviderThrottle;
use docsfab_runtime::composition::{Composition, DEFAULT_TIMEOUT_MS};
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::record::RunStatus;
use docsfab_runtime::store::{RunStore, StoreUrl};
use serde_json::{Value, json};

use self::probe::{ProbeReport, Target, probe};
use crate::app::error::{CliError, emit};
use crate::app::home::{HostContext, Selected, validate_run_inputs};
use crate::app::preflight::{RESOLVE_TIMEOUT, Resolution, resolve};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// A composition file to check; its limits.timeoutMs is the attempt timer of the envelope.
    #[arg(long, value_name = "FILE")]
    pub composition: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Send one minimal real request ("ping", one output token, never replayed) to a provider
    /// and report reachability, the key, the model and the round-trip time (exit 0 answered or
    /// throttled, 2 bad configuration, 1 unreachable or failing).
    #[arg(long)]
    pub probe: bool,
    /// The provider --probe sends to (default: the composition's provider with --composition,
    /// otherwise "default").
    #[arg(long, value_name = "NAME", requires = "probe")]
    pub provider: Option<String>,
}

struct Report {
    ctx: HostContext,
    /// The composition with the model it runs on (when host.yaml exists to say).
    composition: Option<(PathBuf, Composition, Option<String>)>,
    timer_ms: u64,
    envelope: RetryEnvelope,
    /// Each provider's host resolution, in host.yaml order.
    dns: Vec<(String, Resolution)>,
    probe: Option<ProbeReport>,
    /// The expected step success under the store's fitted fault model (issue 14).
    goodput: Option<String>,
    store: StoreCheck,
    warnings: Vec<String>,
}

pub fn run(args: &DoctorArgs, store: Option<&str>) -> Result<(), CliError> {
    let report = match check(args, store) {
        Ok(r) => r,
        Err(e) => {
            if args.json {
                emit(&format!(
                    "{}\n",
                    json!({"valid": false, "error": e.message})
                ))?;
            }
            return Err(e);
        }
    };
    if args.json {
        emit(&format!("{:#}\n", to_json(&report)))?;
    } else {
        emit(&to_text(&report))?;
    }
    match &report.probe {
        Some(p) => p.conclusion(),
        None => Ok(()),
    }
}

fn check(args: &DoctorArgs, store: Option<&str>) -> Result<Report, CliError> {
    let mut warnings = Vec::new();
    // With a composition, exactly the checks `run` makes (see `validate_run_inputs`).
    let (ctx, composition) = match &args.composition {
        Some(path) => {
            let (ctx, c) = validate_run_inputs(path, "--composition", false)?;
            (ctx, Some((path.clone(), c)))
        }
        None => (HostContext::load()?, None),
    };

    let composition = match composition {
        Some((path, c)) => {
            // Without a host.yaml the warning below already says no provider is configured.
            let model = if ctx.host_file_exists {
                let selected = ctx.select_provider(&c, &path)?;
                Some(format!(
                    "{} (provider {}, {})",
                    selected.model, selected.provider_name, selected.provider.api
                ))
            } else {
                None
            };
            Some((path, c, model))
        }
        None => None,
    };

    warnings.extend(host_warnings(&ctx));

    let timer_ms = composition
        .as_ref()
        .map_or(DEFAULT_TIMEOUT_MS, |(_, c, _)| c.limits.timeout_ms);
    let envelope = RetryEnvelope::for_limits(&ctx.limits, timer_ms);
    if envelope.exceeds_deadline {
        warnings.push(format!(
            "one read-only step may take up to {}ms, more than runtime.deadlineMilliseconds={}, so a hosted job deadline could cancel the run first; lower DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES (or DOCSFAB_READ_ONLY_MAX_RETRIES), or seal a shorter limits.timeoutMs in the composition.",
            envelope.total_ms, envelope.deadline_ms
        ));
    }

    let selected = composition.as_ref().map(|(_, c, _)| c.provider.as_str());
    let dns = resolve_hosts(&ctx, selected)?;
    warnings.extend(dns.iter().filter_map(|(name, r)| dns_warning(name, r)));
    let store = crate::app::store::store_url(&ctx.home.dir, store)?;
    let (store, opened) = check_store(&store)?;
    if let StoreState::Unreachable(why) = &store.state {
        warnings.push(why.clone());
    }
    let probe = if args.probe {
        let (name, model) = probe_choice(args, &ctx, composition.as_ref().map(|(_, c, _)| c))?;
        Some(probe_provider(&ctx, &name, &model, &dns)?)
    } else {
        None
    };

    let goodput = opened
        .and_then(|open| crate::app::fault_model::doctor_line(&ctx, &open, &store.url, timer_ms));
    Ok(Report {
        goodput,
        store,
        ctx,
        composition,
        timer_ms,
        envelope,
        dns,
        probe,
        warnings,
    })
}

/// What doctor warns of in the host's own configuration: a missing or empty host file, keys
/// not set, an environment variable an override shadows, and unknown `DOCSFAB_` variables.
fn host_warnings(ctx: &HostContext) -> Vec<String> {
    let mut warnings = Vec::new();
    if !ctx.host_file_exists {
        warnings.push(format!(
            "{} does not exist, so the catalog defaults apply and no provider is configured; run `docsfab setup` to create it.",
            ctx.host.path
        ));
    } else if ctx.host_file_empty {
        warnings.push(format!(
            "{} is empty: no providers are configured; run `docsfab setup` to write it.",
            ctx.host.path
        ));
    } else if ctx.host.providers.is_empty() {
        warnings.push(format!(
            "{} defines no provider; run `docsfab setup` to add the default one.",
            ctx.host.path
        ));
    }
    for (name, p) in &ctx.host.providers {
        if !key_var_is_set(&p.api_key_env) {
            warnings.push(format!(
                "provider {name:?} reads its key from {}, which is not set in this environment; export it before `docsfab run`.",
                p.api_key_env
            ));
        }
    }
    if let Some(v) = ctx.limits.shadowed_env_max_retries() {
        warnings.push(format!(
            "DOCSFAB_READ_ONLY_MAX_RETRIES={v} is set but the host override readOnlyMaxRetries={} in {} stays in force; remove the override to let the environment decide.",
            ctx.limits.effective_max_retries(),
            ctx.host.path
        ));
    }
    warnings.extend(ctx.unknown_env_warnings());
    warnings
}

/// The run store as doctor found it.
struct StoreCheck {
    url: StoreUrl,
    state: StoreState,
}

enum StoreState {
    /// A SQLite file that does not exist yet: the first run creates it.
    NotCreated,
    /// Opened; how many runs it holds in each status (statuses with none left out).
    Open { counts: Vec<(RunStatus, u64)> },
    /// It could not be opened for a reason that may pass (a server down, a busy file): the
    /// warning sentence, which names the store and what to check.
    Unreachable(String),
}

/// Opens the store as `run` would, and returns it open when it could be read (for the goodput
/// line). A refusal that is configuration (a password or database the server rejects, a file
/// that is not a store) is returned as the error `run` would give.
fn check_store(url: &StoreUrl) -> Result<(StoreCheck, Option<RunStore>), CliError> {
    let url = url.clone();
    if let StoreUrl::Sqlite(path) = &url
        && !path.exists()
    {
        let state = StoreState::NotCreated;
        return Ok((StoreCheck { url, state }, None));
    }
    let (state, opened) = match crate::app::store::open_store_url(&url) {
        Err(e) if e.kind == crate::app::error::ErrorKind::BadInput => return Err(e),
        Err(e) => (StoreState::Unreachable(e.message), None),
        Ok(store) => match store.count_by_status() {
            Ok(counts) => (
                StoreState::Open {
                    counts: counts.into_iter().filter(|(_, n)| *n > 0).collect(),
                },
                Some(store),
            ),
            Err(e) => (
                StoreState::Unreachable(crate::app::store::read_failed(&url, e).message),
                None,
            ),
        },
    };
    Ok((StoreCheck { url, state }, opened))
}

impl StoreCheck {
    fn backend(&self) -> &'static str {
        match self.url {
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Postgres(_) => "postgres",
        }
    }

    /// `Run store: PLACE (WHAT)`.
    fn line(&self) -> String {
        let place = crate::app::store::store_place(&self.url);
        let what = match &self.state {
            StoreState::NotCreated => "SQLite, not created yet: the first run creates it".into(),
            StoreState::Open { counts } => {
                let total: u64 = counts.iter().map(|(_, n)| n).sum();
                let each: Vec<String> = counts
                    .iter()
                    .map(|(s, n)| format!("{n} {}", s.as_str()))
                    .collect();
                let kind = match self.url {
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

    fn to_json(&self) -> Value {
        let (state, runs) = match &self.state {
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
            "place": crate::app::store::store_place(&self.url),
            "backend": self.backend(),
            "state": state,
            "runs": runs,
        })
    }
}

/// Resolves every provider's host. A host that does not exist refuses the configuration when
/// its provider is the one the composition runs on (as `run` refuses it); for any other
/// provider, and without a composition, it is a warning, since no run is known to use it.
fn resolve_hosts(
    ctx: &HostContext,
    selected: Option<&str>,
) -> Result<Vec<(String, Resolution)>, CliError> {
    let mut out = Vec::new();
    for (name, p) in &ctx.host.providers {
        let r = resolve(&p.base_url, RESOLVE_TIMEOUT);
        if matches!(r, Resolution::NoSuchHost { .. }) && selected == Some(name.as_str()) {
            return Err(crate::app::preflight::refusal(name, &ctx.host.path, &r));
        }
        out.push((name.clone(), r));
    }
    Ok(out)
}

/// The warning for a provider host that did not resolve (and did not refuse the check).
fn dns_warning(name: &str, r: &Resolution) -> Option<String> {
    match r {
        Resolution::NoSuchHost { host, said } => Some(format!(
            "the host {host} of provider {name:?} does not exist (the resolver says: {said}); a run on this provider would be refused, so correct providers.{name}.baseUrl or check this machine's DNS settings."
        )),
        _ => crate::app::preflight::warning(name, r),
    }
}

/// The provider and model `--probe` uses: `--provider`, else the composition's provider and
/// model, else "default" with its own model.
fn probe_choice(
    args: &DoctorArgs,
    ctx: &HostContext,
    composition: Option<&Composition>,
) -> Result<(String, String), CliError> {
    let name = args
        .provider
        .clone()
        .or_else(|| composition.map(|c| c.provider.clone()))
        .unwrap_or_else(|| "default".to_string());
    let Some(p) = ctx.host.providers.get(&name) else {
        let known: Vec<&str> = ctx.host.providers.keys().map(String::as_str).collect();
        return Err(CliError::bad_input(format!(
            "cannot probe provider {name:?}: {} does not define it (it defines: {}); pass --provider with a defined name, or run `docsfab setup`.",
            ctx.host.path,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let model = composition
        .filter(|c| c.provider == name)
        .and_then(|c| c.model.clone())
        .unwrap_or_else(|| p.model.clone());
    Ok((name, model))
}

fn probe_provider(
    ctx: &HostContext,
    name: &str,
    model: &str,
    dns: &[(String, Resolution)],
) -> Result<ProbeReport, CliError> {
    let (provider_name, provider) = ctx
        .host
        .providers
        .get_key_value(name)
        .expect("probe_choice checked the name");
    let selected = Selected {
        provider_name,
        provider,
        model,
    };
    let key = crate::app::execute::read_key(&selected)?;
    let resolution = dns
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, r)| r.clone())
        .unwrap_or_else(|| resolve(&provider.base_url, RESOLVE_TIMEOUT));
    // Sending would only meet the resolver's answer again: refused as `run` refuses it.
    if matches!(resolution, Resolution::NoSuchHost { .. }) {
        return Err(crate::app::preflight::refusal(
            name,
            &ctx.host.path,
            &resolution,
        ));
    }
    probe(
        Target {
            provider: name,
            api: provider.api,
            base_url: &provider.base_url,
            model,
            key_var: &provider.api_key_env,
            key,
            include_usage: provider.spend.include_usage,
        },
        resolution,
    )
}

fn key_var_is_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
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
pub fn transport_line(l: &EffectiveLimits) -> String {
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
fn throttle_source(given: bool) -> &'static str {
    if given { "host.yaml" } else { "default" }
}

/// The `Provider NAME throttle=...` line: both values, then one source when they share it,
/// otherwise each value's source by name.
pub fn throttle_line(name: &str, t: &ProviderThrottle) -> String {
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
pub fn envelope_line(e: &RetryEnvelope) -> String {
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

fn to_text(r: &Report) -> String {
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
    lines.push(r.store.line());
    lines.extend(r.goodput.clone());
    lines.extend(r.probe.iter().flat_map(ProbeReport::lines));
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
pub fn spend_line(name: &str, s: &docsfab_policy::host::ProviderSpend) -> String {
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

/// Each step's worst-case token envelope beside the time envelope: every attempt the spec
/// allows, every turn of each, at the sealed output ceiling; prompts come on top. The text and
/// the JSON are both read from this.
struct TokenEnvelope<'a> {
    attempts: u64,
    max_turns: u32,
    max_output_tokens: u32,
    /// The output tokens one step may take.
    per_step: u64,
    steps: Vec<&'a str>,
    max_run_tokens: Option<u64>,
}

fn token_envelope(r: &Report) -> Option<TokenEnvelope<'_>> {
    let (_, c, _) = r.composition.as_ref()?;
    let l = &c.limits;
    Some(TokenEnvelope {
        attempts: r.envelope.attempts,
        max_turns: l.max_turns,
        max_output_tokens: l.max_output_tokens,
        per_step: r
            .envelope
            .attempts
            .saturating_mul(u64::from(l.max_turns))
            .saturating_mul(u64::from(l.max_output_tokens)),
        // A pages step sends no request, so it spends nothing (docs/pages.md).
        steps: c
            .steps
            .iter()
            .filter(|s| !s.writes_pages())
            .map(|s| s.id.as_str())
            .collect(),
        max_run_tokens: l.max_run_tokens,
    })
}

fn token_lines(r: &Report) -> Vec<String> {
    let Some(t) = token_envelope(r) else {
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

/// `tokenEnvelope` of `--json`: the figures of [`token_lines`]; `null` without a composition.
fn token_envelope_json(r: &Report) -> Value {
    let Some(t) = token_envelope(r) else {
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

/// A provider's `spend` in `--json`: what [`spend_line`] prints, as fields. Cache prices are
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

fn to_json(r: &Report) -> Value {
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
        "store": r.store.to_json(),
        "probe": r.probe.as_ref().map(ProbeReport::to_json),
        "warnings": r.warnings,
    })
}
