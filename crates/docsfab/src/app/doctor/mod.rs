//! What `docsfab doctor` finds: everything a run would read at startup (host.yaml, the
//! environment, the rules table and optionally a composition) validated with the checks `run`
//! makes; each provider's host resolved (the DNS pre-flight of [`crate::app::preflight`]: a host
//! that does not exist is bad configuration for the composition's provider, a warning for any
//! other); the run store opened as `run` opens it ([`store`]); the retry and token envelopes of
//! one step; the expected step success under the store's fitted fault model; and with
//! `--probe` one real request to one provider ([`probe`], then [`capabilities`]). The command
//! prints the [`Report`]; the first problem is the error it exits with.

pub mod capabilities;
pub mod probe;
pub mod store;

use std::path::{Path, PathBuf};

use docsfab_policy::envelope::RetryEnvelope;
use docsfab_runtime::composition::{Composition, DEFAULT_TIMEOUT_MS};

use self::probe::{ProbeReport, Target, probe};
use self::store::{StoreCheck, StoreState, check_store};
use crate::app::error::CliError;
use crate::app::home::{HostContext, Selected, validate_run_inputs};
use crate::app::preflight::{RESOLVE_TIMEOUT, Resolution, resolve};

/// What the command asks doctor to check.
pub struct Ask<'a> {
    /// A composition file to check; its limits.timeoutMs is the attempt timer of the envelope.
    pub composition: Option<&'a Path>,
    /// Send one minimal real request to a provider.
    pub probe: bool,
    /// The provider the probe sends to (default: the composition's provider with a
    /// composition, otherwise "default").
    pub provider: Option<&'a str>,
}

/// Everything doctor found.
pub struct Report {
    pub ctx: HostContext,
    /// The composition with the model it runs on (when host.yaml exists to say).
    pub composition: Option<(PathBuf, Composition, Option<String>)>,
    pub timer_ms: u64,
    pub envelope: RetryEnvelope,
    /// Each provider's host resolution, in host.yaml order.
    pub dns: Vec<(String, Resolution)>,
    pub probe: Option<ProbeReport>,
    /// The expected step success under the store's fitted fault model (issue 14).
    pub goodput: Option<String>,
    pub store: StoreCheck,
    pub warnings: Vec<String>,
}

/// Checks everything `ask` names; `store` is the `--store` flag. `Err` is the first problem,
/// as `run` would give it.
pub fn check(ask: &Ask<'_>, store: Option<&str>) -> Result<Report, CliError> {
    let mut warnings = Vec::new();
    // With a composition, exactly the checks `run` makes (see `validate_run_inputs`).
    let (ctx, composition) = match ask.composition {
        Some(path) => {
            let (ctx, c) = validate_run_inputs(path, "--composition", false)?;
            (ctx, Some((path.to_path_buf(), c)))
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
    let probe = if ask.probe {
        let (name, model) =
            probe_choice(ask.provider, &ctx, composition.as_ref().map(|(_, c, _)| c))?;
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

/// The provider and model `--probe` uses: `provider` (`--provider`), else the composition's
/// provider and model, else "default" with its own model.
fn probe_choice(
    provider: Option<&str>,
    ctx: &HostContext,
    composition: Option<&Composition>,
) -> Result<(String, String), CliError> {
    let name = provider
        .map(str::to_owned)
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

/// Whether the variable `name` holds a value (never what it holds).
pub fn key_var_is_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// Each step's worst-case token envelope beside the time envelope: every attempt the spec
/// allows, every turn of each, at the sealed output ceiling; prompts come on top. The text and
/// the JSON are both read from this.
pub struct TokenEnvelope<'a> {
    pub attempts: u64,
    pub max_turns: u32,
    pub max_output_tokens: u32,
    /// The output tokens one step may take.
    pub per_step: u64,
    pub steps: Vec<&'a str>,
    pub max_run_tokens: Option<u64>,
}

impl Report {
    /// The token envelope of the composition's steps; `None` without a composition.
    pub fn token_envelope(&self) -> Option<TokenEnvelope<'_>> {
        let (_, c, _) = self.composition.as_ref()?;
        let l = &c.limits;
        Some(TokenEnvelope {
            attempts: self.envelope.attempts,
            max_turns: l.max_turns,
            max_output_tokens: l.max_output_tokens,
            per_step: self
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
}
