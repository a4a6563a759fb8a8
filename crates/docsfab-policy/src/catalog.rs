//! Catalog limits and their resolution into the effective values a run uses.
//!
//! Every limit has a catalog default. The catalog keys (those a `host.yaml` `catalog:` map may
//! name) can only be lowered: their default is also their maximum. A few values are set only by
//! environment variables. Resolution runs in a fixed order, and each effective value remembers
//! which step set it:
//!
//! 1. the catalog default (`catalog`);
//! 2. a lowering in `host.yaml` under `catalog:` (`host catalog`);
//! 3. the environment variable, if the limit has one (`environment`);
//! 4. for `retry.maxRetries` only, the explicit `readOnlyMaxRetries` in `host.yaml`
//!    (`host override`), which stays in force over the environment.
//!
//! The resolver is pure: the caller passes the parsed host configuration and the `DOCSFAB_`
//! environment variables as a map. The first problem found is returned as a [`ConfigError`]
//! whose message is one sentence naming the key or variable, the value, the allowed range and
//! what to do.

use std::collections::BTreeMap;
use std::fmt;

use docsfab_record::TransportRetry;
use serde::Serialize;

use crate::host::{HostConfig, RawKind, RawValue, shown_value};
use crate::replay::ReplayLimits;
use crate::step::StepBudgets;

/// Every limit docsfab resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Limit {
    /// `providerAttempt.baseDelayMs`: the first in-turn replay wait, doubled on each replay.
    ProviderAttemptBaseDelayMs,
    /// `providerAttempt.maxDelayMs`: the cap on one in-turn replay wait.
    ProviderAttemptMaxDelayMs,
    /// `providerAttempt.maxTotalDelayMs`: the sum of one turn's replay waits.
    ProviderAttemptMaxTotalDelayMs,
    /// `providerAttempt.maxAttemptsPerTurn`: requests per turn, the first one included.
    ProviderAttemptMaxAttemptsPerTurn,
    /// `providerAttempt.maxThrottledAttemptsPerTurn`: the same while the provider throttles.
    ProviderAttemptMaxThrottledAttemptsPerTurn,
    /// `providerAttempt.maxThrottledTotalDelayMs`: the same for the sum of the waits.
    ProviderAttemptMaxThrottledTotalDelayMs,
    /// `retry.maxRetries`: contract-correction retries of a step.
    MaxRetries,
    /// `retry.maxTransportRetries`: retries of a step after transport failures.
    MaxTransportRetries,
    /// `retry.transportMaxDelayMs`: the cap on one wait before a transport retry.
    TransportMaxDelayMs,
    /// `retry.transportMaxElapsedMs`: transport-failed attempts of a step plus their waits.
    TransportMaxElapsedMs,
    /// `runtime.deadlineMilliseconds`: the job deadline of a whole run.
    RuntimeDeadlineMilliseconds,
    /// The base of the transport backoff between step attempts (environment only).
    RetryBaseDelayMs,
    /// Condition budget: answers cut at the output limit (environment only).
    MaxCutAnswerRetries,
    /// Condition budget: timed-out attempts (environment only).
    MaxTimeoutRetries,
    /// Condition budget: attempts stopped as no-progress (environment only).
    MaxNoProgressRetries,
}

struct Spec {
    key: &'static str,
    default: u64,
    min: u64,
    max: u64,
    env: Option<&'static str>,
    in_host_catalog: bool,
}

const fn spec(
    key: &'static str,
    default: u64,
    min: u64,
    max: u64,
    env: Option<&'static str>,
    in_host_catalog: bool,
) -> Spec {
    Spec {
        key,
        default,
        min,
        max,
        env,
        in_host_catalog,
    }
}

/// The environment variable for `retry.maxRetries`.
pub const ENV_MAX_RETRIES: &str = "DOCSFAB_READ_ONLY_MAX_RETRIES";
/// The environment variable that lowers `retry.maxTransportRetries`.
pub const ENV_MAX_TRANSPORT_RETRIES: &str = "DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES";
/// The environment variable for the transport backoff base.
pub const ENV_RETRY_BASE_DELAY_MS: &str = "DOCSFAB_RETRY_BASE_DELAY_MS";
/// The environment variable for the cut-answer condition budget.
pub const ENV_MAX_CUT_ANSWER_RETRIES: &str = "DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES";
/// The environment variable for the attempt-deadline condition budget.
pub const ENV_MAX_TIMEOUT_RETRIES: &str = "DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES";
/// The environment variable for the no-progress condition budget.
pub const ENV_MAX_NO_PROGRESS_RETRIES: &str = "DOCSFAB_READ_ONLY_MAX_NO_PROGRESS_RETRIES";

/// The `host.yaml` key of the explicit override of `retry.maxRetries`.
pub const HOST_OVERRIDE_KEY: &str = "readOnlyMaxRetries";

impl Limit {
    /// Every limit, in the order doctor prints them.
    pub const ALL: [Limit; 15] = [
        Limit::ProviderAttemptBaseDelayMs,
        Limit::ProviderAttemptMaxDelayMs,
        Limit::ProviderAttemptMaxTotalDelayMs,
        Limit::ProviderAttemptMaxAttemptsPerTurn,
        Limit::ProviderAttemptMaxThrottledAttemptsPerTurn,
        Limit::ProviderAttemptMaxThrottledTotalDelayMs,
        Limit::MaxRetries,
        Limit::MaxTransportRetries,
        Limit::TransportMaxDelayMs,
        Limit::TransportMaxElapsedMs,
        Limit::RuntimeDeadlineMilliseconds,
        Limit::RetryBaseDelayMs,
        Limit::MaxCutAnswerRetries,
        Limit::MaxTimeoutRetries,
        Limit::MaxNoProgressRetries,
    ];

    fn spec(self) -> Spec {
        use Limit::*;
        // Minimums: a turn needs at least one attempt and a job deadline must be positive;
        // every other limit may be lowered to 0 (no waiting, or no retries).
        match self {
            ProviderAttemptBaseDelayMs => {
                spec("providerAttempt.baseDelayMs", 500, 0, 500, None, true)
            }
            ProviderAttemptMaxDelayMs => {
                spec("providerAttempt.maxDelayMs", 20_000, 0, 20_000, None, true)
            }
            ProviderAttemptMaxTotalDelayMs => spec(
                "providerAttempt.maxTotalDelayMs",
                60_000,
                0,
                60_000,
                None,
                true,
            ),
            ProviderAttemptMaxAttemptsPerTurn => {
                spec("providerAttempt.maxAttemptsPerTurn", 8, 1, 8, None, true)
            }
            ProviderAttemptMaxThrottledAttemptsPerTurn => spec(
                "providerAttempt.maxThrottledAttemptsPerTurn",
                24,
                1,
                24,
                None,
                true,
            ),
            ProviderAttemptMaxThrottledTotalDelayMs => spec(
                "providerAttempt.maxThrottledTotalDelayMs",
                380_000,
                0,
                380_000,
                None,
                true,
            ),
            MaxRetries => spec("retry.maxRetries", 3, 0, 3, Some(ENV_MAX_RETRIES), true),
            MaxTransportRetries => spec(
                "retry.maxTransportRetries",
                6,
                0,
                6,
                Some(ENV_MAX_TRANSPORT_RETRIES),
                true,
            ),
            TransportMaxDelayMs => spec("retry.transportMaxDelayMs", 60_000, 0, 60_000, None, true),
            TransportMaxElapsedMs => spec(
                "retry.transportMaxElapsedMs",
                3_600_000,
                0,
                3_600_000,
                None,
                true,
            ),
            RuntimeDeadlineMilliseconds => spec(
                "runtime.deadlineMilliseconds",
                10_800_000,
                1,
                10_800_000,
                None,
                true,
            ),
            RetryBaseDelayMs => spec(
                "retry.baseDelayMs",
                1_000,
                0,
                60_000,
                Some(ENV_RETRY_BASE_DELAY_MS),
                false,
            ),
            MaxCutAnswerRetries => spec(
                "retry.maxCutAnswerRetries",
                1,
                0,
                3,
                Some(ENV_MAX_CUT_ANSWER_RETRIES),
                false,
            ),
            MaxTimeoutRetries => spec(
                "retry.maxTimeoutRetries",
                1,
                0,
                3,
                Some(ENV_MAX_TIMEOUT_RETRIES),
                false,
            ),
            MaxNoProgressRetries => spec(
                "retry.maxNoProgressRetries",
                1,
                0,
                3,
                Some(ENV_MAX_NO_PROGRESS_RETRIES),
                false,
            ),
        }
    }

    /// The catalog key, e.g. `retry.maxRetries`.
    pub fn key(self) -> &'static str {
        self.spec().key
    }
    /// The catalog default.
    pub fn default_value(self) -> u64 {
        self.spec().default
    }
    /// The smallest accepted value.
    pub fn min(self) -> u64 {
        self.spec().min
    }
    /// The largest accepted value; for a catalog key, equal to its default.
    pub fn max(self) -> u64 {
        self.spec().max
    }
    /// The environment variable that sets or lowers this limit, if any.
    pub fn env_var(self) -> Option<&'static str> {
        self.spec().env
    }
    /// Whether `host.yaml`'s `catalog:` may lower this limit.
    pub fn in_host_catalog(self) -> bool {
        self.spec().in_host_catalog
    }
    /// The limit whose catalog key is `key`, if any.
    pub fn from_key(key: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|l| l.key() == key)
    }
    /// Whether this is one of the three condition budgets bounded by `retry.maxRetries`.
    pub fn is_condition_budget(self) -> bool {
        matches!(
            self,
            Limit::MaxCutAnswerRetries | Limit::MaxTimeoutRetries | Limit::MaxNoProgressRetries
        )
    }
    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Where an effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The catalog default: nothing lowered or set it.
    Catalog,
    /// A lowering under `host.yaml`'s `catalog:`.
    HostCatalog,
    /// A `DOCSFAB_` environment variable.
    Environment,
    /// `host.yaml`'s `readOnlyMaxRetries`, which wins over the environment.
    HostOverride,
}

impl Source {
    /// The spelling doctor prints in parentheses.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Catalog => "catalog",
            Source::HostCatalog => "host catalog",
            Source::Environment => "environment",
            Source::HostOverride => "host override",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One resolved value and the step of the resolution order that set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Effective {
    /// The value in force, inside the limit's range.
    pub value: u64,
    /// The step of the resolution order that set it.
    pub source: Source,
}

/// The resolved limits. Built only by [`resolve`], so every value is inside its range and the
/// condition budgets never exceed the effective `retry.maxRetries`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveLimits {
    values: [Effective; Limit::ALL.len()],
    configured_max_retries: u32,
    shadowed_env_max_retries: Option<u32>,
}

/// Narrows a value already checked against its range (every maximum fits in `u32`).
fn small(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl EffectiveLimits {
    /// Every limit at its catalog default: what [`resolve`] gives with no host.yaml and no
    /// environment. Handy for tests and for callers without a host.
    pub fn catalog_defaults() -> EffectiveLimits {
        EffectiveLimits {
            values: Limit::ALL.map(|l| Effective {
                value: l.default_value(),
                source: Source::Catalog,
            }),
            configured_max_retries: small(Limit::MaxRetries.default_value()),
            shadowed_env_max_retries: None,
        }
    }

    /// The effective value of `limit` with its source.
    pub fn get(&self, limit: Limit) -> Effective {
        self.values[limit.index()]
    }
    /// The effective value of `limit`.
    pub fn value(&self, limit: Limit) -> u64 {
        self.get(limit).value
    }
    /// Every limit with its effective value, in [`Limit::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Limit, Effective)> + '_ {
        Limit::ALL.into_iter().map(|l| (l, self.get(l)))
    }
    /// `retry.maxRetries` after the host catalog lowering, before the environment and override.
    pub fn configured_max_retries(&self) -> u32 {
        self.configured_max_retries
    }
    /// `retry.maxRetries` as steps use it.
    pub fn effective_max_retries(&self) -> u32 {
        small(self.value(Limit::MaxRetries))
    }
    /// The value of `DOCSFAB_READ_ONLY_MAX_RETRIES` when it is set but the host override wins.
    pub fn shadowed_env_max_retries(&self) -> Option<u32> {
        self.shadowed_env_max_retries
    }
    /// `retry.maxTransportRetries` as steps use it.
    pub fn max_transport_retries(&self) -> u32 {
        small(self.value(Limit::MaxTransportRetries))
    }
    /// `retry.transportMaxDelayMs`.
    pub fn transport_max_delay_ms(&self) -> u64 {
        self.value(Limit::TransportMaxDelayMs)
    }
    /// `retry.transportMaxElapsedMs`.
    pub fn transport_max_elapsed_ms(&self) -> u64 {
        self.value(Limit::TransportMaxElapsedMs)
    }
    /// The base of the transport backoff between step attempts.
    pub fn retry_base_delay_ms(&self) -> u64 {
        self.value(Limit::RetryBaseDelayMs)
    }
    /// `runtime.deadlineMilliseconds`: the job deadline of a run.
    pub fn deadline_ms(&self) -> u64 {
        self.value(Limit::RuntimeDeadlineMilliseconds)
    }
    /// The cut-answer condition budget (never above `retry.maxRetries`).
    pub fn max_cut_answer_retries(&self) -> u32 {
        small(self.value(Limit::MaxCutAnswerRetries))
    }
    /// The attempt-deadline condition budget (never above `retry.maxRetries`).
    pub fn max_timeout_retries(&self) -> u32 {
        small(self.value(Limit::MaxTimeoutRetries))
    }
    /// The no-progress condition budget (never above `retry.maxRetries`).
    pub fn max_no_progress_retries(&self) -> u32 {
        small(self.value(Limit::MaxNoProgressRetries))
    }

    /// The `providerAttempt.*` limits for the in-turn replay.
    pub fn replay_limits(&self) -> ReplayLimits {
        ReplayLimits {
            base_delay_ms: self.value(Limit::ProviderAttemptBaseDelayMs),
            max_delay_ms: self.value(Limit::ProviderAttemptMaxDelayMs),
            max_total_delay_ms: self.value(Limit::ProviderAttemptMaxTotalDelayMs),
            max_attempts_per_turn: small(self.value(Limit::ProviderAttemptMaxAttemptsPerTurn)),
            max_throttled_attempts_per_turn: small(
                self.value(Limit::ProviderAttemptMaxThrottledAttemptsPerTurn),
            ),
            max_throttled_total_delay_ms: self
                .value(Limit::ProviderAttemptMaxThrottledTotalDelayMs),
        }
    }

    /// The budgets the step retry decision applies.
    pub fn step_budgets(&self) -> StepBudgets {
        StepBudgets {
            max_retries: self.effective_max_retries(),
            max_transport_retries: self.max_transport_retries(),
            base_delay_ms: self.retry_base_delay_ms(),
            transport_max_delay_ms: self.transport_max_delay_ms(),
            transport_max_elapsed_ms: self.transport_max_elapsed_ms(),
            cut_answer_retries: self.max_cut_answer_retries(),
            timeout_retries: self.max_timeout_retries(),
            no_progress_retries: self.max_no_progress_retries(),
        }
    }

    /// The applied transport budget, in the shape of the run record's `transportRetry`.
    pub fn transport_retry(&self) -> TransportRetry {
        TransportRetry {
            max_transport_retries: self.max_transport_retries(),
            transport_max_delay_ms: self.transport_max_delay_ms(),
            transport_max_elapsed_ms: self.transport_max_elapsed_ms(),
            base_delay_ms: self.retry_base_delay_ms(),
        }
    }
}

/// Where a refused value was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// An environment variable.
    Env { var: String },
    /// A key in `host.yaml` (a `catalog:` key, or `readOnlyMaxRetries`).
    Host {
        path: String,
        key: String,
        line: u64,
    },
}

impl Origin {
    /// `VAR=value`, or `key=value in path (line n)`.
    fn subject(&self, value: &str) -> String {
        match self {
            Origin::Env { var } => format!("{var}={value}"),
            Origin::Host { path, key, line } => format!("{key}={value} in {path} (line {line})"),
        }
    }

    fn remedy_unset(&self) -> &'static str {
        match self {
            Origin::Env { .. } => "unset it",
            Origin::Host { .. } => "remove the key",
        }
    }
}

/// A configuration value refused at startup. Each message is one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not a plain decimal whole number (e.g. `2.5`, `abc`, an empty value, ` 3`).
    #[error("{} is not a whole number (allowed range {min}..{max}); set it to a whole number from {min} through {max} or {} to use the default of {default}.", origin.subject(&shown_value(value)), origin.remedy_unset())]
    NotAnInteger {
        origin: Origin,
        value: String,
        min: u64,
        max: u64,
        default: u64,
    },
    /// A whole number outside the limit's own range.
    #[error("{} is outside the allowed range {min}..{max}; set it to a whole number from {min} through {max} or {} to use the default of {default}.", origin.subject(&shown_number(value)), origin.remedy_unset())]
    OutOfRange {
        origin: Origin,
        value: String,
        min: u64,
        max: u64,
        default: u64,
    },
    /// A `catalog:` value above the catalog maximum (CFG-8).
    #[error("{} raises {key} above its catalog maximum of {max} (allowed range {min}..{max}); a host may only lower catalog limits, so lower the value or remove the key.", origin.subject(&value.to_string()))]
    RaisesCatalogMaximum {
        origin: Origin,
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    /// A value above what `host.yaml` lowered the limit to.
    #[error("{} is above {key}={ceiling} set in the catalog of {path} (allowed range {min}..{ceiling}); set it from {min} through {ceiling} or {}.", origin.subject(&value.to_string()), origin.remedy_unset())]
    AboveHostCatalog {
        origin: Origin,
        key: &'static str,
        value: u64,
        min: u64,
        ceiling: u64,
        path: String,
    },
    /// A `catalog:` key docsfab does not know.
    #[error("{path} line {line}: unknown catalog key {} (value {}); the nearest are {} (all: docs/configuration.md), so correct or remove it.", shown_value(key), shown_value(value), nearest_catalog_keys(key).join(", "))]
    UnknownCatalogKey {
        path: String,
        key: String,
        value: String,
        line: u64,
    },
    /// An explicit condition budget above the effective `retry.maxRetries` (CFG-7).
    #[error(
        "{var}={value} is above the effective retry.maxRetries of {max_retries} (source: {max_retries_source}), and every condition budget stays inside it (allowed range 0..{max_retries}); lower {var} to at most {max_retries} or unset it."
    )]
    ConditionAboveMaxRetries {
        var: &'static str,
        value: u64,
        max_retries: u64,
        max_retries_source: Source,
    },
}

/// A number as written, for a message: as is when short, otherwise cut like any other value.
fn shown_number(value: &str) -> String {
    let plain = value.len() <= 24 && value.bytes().all(|b| b.is_ascii_digit() || b == b'-');
    if plain {
        value.to_string()
    } else {
        shown_value(value)
    }
}

/// The three catalog keys that share the longest start with `key`, for a refusal that must stay
/// one short line (the full list is eleven keys long).
fn nearest_catalog_keys(key: &str) -> Vec<&'static str> {
    let common = |k: &str| {
        k.bytes()
            .zip(key.bytes())
            .take_while(|(a, b)| a == b)
            .count()
    };
    let mut keys = host_catalog_keys();
    // Stable sort: equal prefixes keep the catalog's order.
    keys.sort_by_key(|k| std::cmp::Reverse(common(k)));
    keys.truncate(3);
    keys
}

/// The keys a `host.yaml` `catalog:` map may name.
pub fn host_catalog_keys() -> Vec<&'static str> {
    Limit::ALL
        .into_iter()
        .filter(|l| l.in_host_catalog())
        .map(Limit::key)
        .collect()
}

/// How a given text reads as a whole number.
enum Number {
    Whole(u64),
    /// A whole number too large (or negative) to be in any range.
    OutOfAnyRange,
    NotWhole,
}

/// Only plain decimal digits count, optionally with a leading minus (which is then out of
/// range): no spaces, no `+`, no `_`, no hex, no exponent, no fraction.
fn read_number(text: &str) -> Number {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Number::NotWhole;
    }
    if text.starts_with('-') {
        return Number::OutOfAnyRange;
    }
    digits
        .parse::<u64>()
        .map(Number::Whole)
        .unwrap_or(Number::OutOfAnyRange)
}

/// Reads `text` as a value of `limit` inside the limit's own range.
fn read_in_range(
    limit: Limit,
    origin: &Origin,
    text: &str,
    is_number: bool,
) -> Result<u64, ConfigError> {
    let (min, max, default) = (limit.min(), limit.max(), limit.default_value());
    let number = if is_number {
        read_number(text)
    } else {
        Number::NotWhole
    };
    match number {
        Number::NotWhole => Err(ConfigError::NotAnInteger {
            origin: origin.clone(),
            value: text.to_string(),
            min,
            max,
            default,
        }),
        Number::OutOfAnyRange => Err(ConfigError::OutOfRange {
            origin: origin.clone(),
            value: text.to_string(),
            min,
            max,
            default,
        }),
        Number::Whole(v) if v < min || v > max => Err(ConfigError::OutOfRange {
            origin: origin.clone(),
            value: text.to_string(),
            min,
            max,
            default,
        }),
        Number::Whole(v) => Ok(v),
    }
}

fn host_origin(host: &HostConfig, key: &str, raw: &RawValue) -> Origin {
    Origin::Host {
        path: host.path.clone(),
        key: key.to_string(),
        line: raw.line,
    }
}

/// One effective value per limit, indexed by [`Limit::index`].
type Values = [Effective; Limit::ALL.len()];

/// Resolves every limit from the catalog, `host`, and `env` (the `DOCSFAB_` environment
/// variables; other entries are ignored). See the module documentation for the order.
pub fn resolve(
    host: &HostConfig,
    env: &BTreeMap<String, String>,
) -> Result<EffectiveLimits, ConfigError> {
    let mut values = EffectiveLimits::catalog_defaults().values;
    apply_host_catalog(host, &mut values)?;
    let configured_max_retries = values[Limit::MaxRetries.index()].value;
    apply_env(host, env, &mut values)?;
    let shadowed_env_max_retries = apply_host_override(host, configured_max_retries, &mut values)?;
    clamp_condition_budgets(&mut values)?;
    Ok(EffectiveLimits {
        values,
        configured_max_retries: small(configured_max_retries),
        shadowed_env_max_retries,
    })
}

/// Phase 2, host catalog lowerings (keys are visited in sorted order, so the first error is stable)
fn apply_host_catalog(host: &HostConfig, values: &mut Values) -> Result<(), ConfigError> {
    for (key, raw) in &host.catalog {
        let limit = match Limit::from_key(key).filter(|l| l.in_host_catalog()) {
            Some(l) => l,
            None => {
                return Err(ConfigError::UnknownCatalogKey {
                    path: host.path.clone(),
                    key: key.clone(),
                    value: raw.text.clone(),
                    line: raw.line,
                });
            }
        };
        let origin = host_origin(host, key, raw);
        let is_number = raw.kind == RawKind::Number;
        // A raise gets its own message: the host may only lower.
        if let (true, Number::Whole(v)) = (is_number, read_number(&raw.text))
            && v > limit.max()
        {
            return Err(ConfigError::RaisesCatalogMaximum {
                origin,
                key: limit.key(),
                value: v,
                min: limit.min(),
                max: limit.max(),
            });
        }
        let v = read_in_range(limit, &origin, &raw.text, is_number)?;
        values[limit.index()] = Effective {
            value: v,
            source: Source::HostCatalog,
        };
    }
    Ok(())
}

/// Phase 3, the environment.
fn apply_env(
    host: &HostConfig,
    env: &BTreeMap<String, String>,
    values: &mut Values,
) -> Result<(), ConfigError> {
    for limit in Limit::ALL {
        let Some(var) = limit.env_var() else { continue };
        let Some(text) = env.get(var) else { continue };
        let origin = Origin::Env {
            var: var.to_string(),
        };
        let v = read_in_range(limit, &origin, text, true)?;
        let current = values[limit.index()];
        // An environment variable never raises what host.yaml lowered.
        if current.source == Source::HostCatalog && v > current.value {
            return Err(ConfigError::AboveHostCatalog {
                origin,
                key: limit.key(),
                value: v,
                min: limit.min(),
                ceiling: current.value,
                path: host.path.clone(),
            });
        }
        values[limit.index()] = Effective {
            value: v,
            source: Source::Environment,
        };
    }
    Ok(())
}

/// Phase 4, the explicit host override of retry.maxRetries; returns the environment value it
/// shadowed, if any.
fn apply_host_override(
    host: &HostConfig,
    configured_max_retries: u64,
    values: &mut Values,
) -> Result<Option<u32>, ConfigError> {
    let Some(raw) = &host.read_only_max_retries else {
        return Ok(None);
    };
    let limit = Limit::MaxRetries;
    let origin = host_origin(host, HOST_OVERRIDE_KEY, raw);
    let v = read_in_range(limit, &origin, &raw.text, raw.kind == RawKind::Number)?;
    if v > configured_max_retries {
        return Err(ConfigError::AboveHostCatalog {
            origin,
            key: limit.key(),
            value: v,
            min: limit.min(),
            ceiling: configured_max_retries,
            path: host.path.clone(),
        });
    }
    let current = values[limit.index()];
    let shadowed = (current.source == Source::Environment).then(|| small(current.value));
    values[limit.index()] = Effective {
        value: v,
        source: Source::HostOverride,
    };
    Ok(shadowed)
}

/// Condition budgets live inside retry.maxRetries: an explicit one above it is refused, a
/// default one is lowered to it and then takes the source of the value that lowered it.
fn clamp_condition_budgets(values: &mut Values) -> Result<(), ConfigError> {
    let max_retries = values[Limit::MaxRetries.index()];
    for limit in Limit::ALL.into_iter().filter(|l| l.is_condition_budget()) {
        let current = values[limit.index()];
        if current.value <= max_retries.value {
            continue;
        }
        if current.source == Source::Environment {
            return Err(ConfigError::ConditionAboveMaxRetries {
                var: limit.env_var().unwrap_or(""),
                value: current.value,
                max_retries: max_retries.value,
                max_retries_source: max_retries.source,
            });
        }
        values[limit.index()] = max_retries;
    }
    Ok(())
}
