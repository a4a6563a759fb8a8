//! The host configuration file, `host.yaml`: which providers exist (with their throttle
//! settings), an optional explicit `readOnlyMaxRetries` override, and optional lowerings of
//! catalog limits.
//!
//! Parsing is strict (an unknown key anywhere is refused) and pure: the caller reads the file and
//! passes its text together with the path used in messages. Numbers under `catalog:` and
//! `readOnlyMaxRetries` are kept exactly as written ([`RawValue`]) so that the resolver in
//! [`crate::catalog`] applies one set of rules to them and to environment variables, and so that
//! `docsfab setup` can write an existing override back unchanged.
//!
//! No key is ever held here: a provider names the environment variable that carries its key.
//!
//! This file holds `host.yaml` and its reading; `yaml` reads every configuration file within
//! bounds and says what is wrong in our own words, `fields` checks the values several files and
//! commands take (a base URL, a model name, a key variable's name), and `secret` says what looks
//! like a key, so that none is stored or repeated.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

mod fields;
mod secret;
mod yaml;

pub use self::fields::{
    KeyNameProblem, ModelProblem, UrlProblem, base_url_host, check_base_url, check_key_env_name,
    check_model,
};
pub use self::secret::{looks_like_key, url_carries_secret};
pub use self::yaml::{
    MAX_CONFIG_BYTES, MAX_YAML_ALIASES, MAX_YAML_DEPTH, MAX_YAML_NODES, from_yaml, shown_list,
    shown_value, unknown_key, yaml_error_parts,
};

/// The wire protocol a provider speaks: the one `Api` of docsfab, owned by the record crate.
use docsfab_record::{Api, Pricing};

/// One entry of `providers:`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfig {
    /// The wire protocol the provider speaks.
    pub api: Api,
    /// Includes the version prefix (`.../v1`); docsfab appends the endpoint path.
    pub base_url: String,
    /// The NAME of the environment variable holding the key, never the key.
    pub api_key_env: String,
    /// The provider's default model.
    pub model: String,
    /// How sends to this provider are throttled (`throttle`, `maxConcurrentRequests`).
    pub throttle: ProviderThrottle,
    /// Usage, prices and the run cost budget (`includeUsage`, `promptCaching`, `pricing`,
    /// `budget.maxRunCostUsd`).
    pub spend: ProviderSpend,
    /// `structuredOutput` as written; `None` takes the API's default
    /// ([`ProviderConfig::structured_output`]).
    pub structured_output_given: Option<StructuredOutput>,
}

impl ProviderConfig {
    /// How a contract step's answer requests are constrained: what host.yaml says, else what
    /// the API documents (both APIs take a JSON Schema).
    pub fn structured_output(&self) -> StructuredOutput {
        self.structured_output_given
            .unwrap_or_else(|| StructuredOutput::default_for(self.api))
    }
}

/// `providers.NAME.structuredOutput`: how the contract of a read-only step is sent to the
/// provider as a constraint on the answer (docs/structured-output.md). Whatever is sent, the
/// contract validator still judges the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StructuredOutput {
    /// The contract's schema: OpenAI `response_format: {type: json_schema}`, Anthropic
    /// `output_config.format`.
    JsonSchema,
    /// Only "a JSON object": OpenAI `response_format: {type: json_object}` (no Anthropic form).
    JsonObject,
    /// No constraint: the system prompt alone asks for the object.
    Off,
}

impl StructuredOutput {
    /// What the API documents: both take a JSON Schema.
    pub fn default_for(api: Api) -> StructuredOutput {
        match api {
            Api::OpenaiChat | Api::AnthropicMessages => StructuredOutput::JsonSchema,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema => "json-schema",
            StructuredOutput::JsonObject => "json-object",
            StructuredOutput::Off => "off",
        }
    }
}

/// What a provider is asked about usage, what its tokens cost, and what a run may spend on it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpend {
    /// OpenAI Chat Completions: send `stream_options.include_usage` (default true). A server
    /// that refuses the member needs `false` (`doctor --probe` tells).
    pub include_usage: bool,
    /// Mark the stable prefix for the provider's prompt cache (default true).
    pub prompt_caching: bool,
    /// USD per million tokens; `None`: no price, every cost is unknown.
    pub pricing: Option<Pricing>,
    /// `budget.maxRunCostUsd`: what one run may spend on this provider, in USD.
    pub max_run_cost_usd: Option<f64>,
    /// Whether `includeUsage` and `promptCaching` were written (setup writes them back).
    pub given_include_usage: bool,
    pub given_prompt_caching: bool,
}

impl Default for ProviderSpend {
    fn default() -> ProviderSpend {
        ProviderSpend {
            include_usage: true,
            prompt_caching: true,
            pricing: None,
            max_run_cost_usd: None,
            given_include_usage: false,
            given_prompt_caching: false,
        }
    }
}

/// The most a price per million tokens or a run budget may be, in USD: a typo guard.
pub const MAX_USD: f64 = 1_000_000.0;

/// The allowed range of `maxConcurrentRequests` and its default.
pub const MAX_CONCURRENT_REQUESTS: std::ops::RangeInclusive<u8> = 1..=64;
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: u8 = 8;

/// A provider's throttle settings: how many requests may be in flight at once across every
/// process sharing the DOCSFAB_HOME, and whether the shared throttle applies at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderThrottle {
    /// Within [`MAX_CONCURRENT_REQUESTS`].
    pub max_concurrent_requests: u8,
    pub mode: ThrottleMode,
    /// Which of the two the file wrote; the others are defaults. Doctor names the source, and
    /// setup writes back what the operator wrote (and nothing else).
    pub given: ThrottleGiven,
}

impl Default for ProviderThrottle {
    fn default() -> ProviderThrottle {
        ProviderThrottle {
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            mode: ThrottleMode::Shared,
            given: ThrottleGiven::default(),
        }
    }
}

/// Which throttle keys a provider entry wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThrottleGiven {
    pub max_concurrent_requests: bool,
    pub mode: bool,
}

/// `providers.NAME.throttle`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThrottleMode {
    /// Sends wait for the throttle shared by every process of the DOCSFAB_HOME.
    #[default]
    Shared,
    /// No throttle: sends go out at once (for comparison, or a provider that needs none).
    Off,
}

impl ThrottleMode {
    /// The word host.yaml uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ThrottleMode::Shared => "shared",
            ThrottleMode::Off => "off",
        }
    }

    /// Reads the word host.yaml or `setup --throttle` uses (exactly, as `api` is read).
    pub fn from_word(word: &str) -> Option<ThrottleMode> {
        match word {
            "shared" => Some(ThrottleMode::Shared),
            "off" => Some(ThrottleMode::Off),
            _ => None,
        }
    }
}

impl fmt::Display for ThrottleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a `maxConcurrentRequests` or `throttle` value is refused; the message names the
/// allowed values and the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottleProblem {
    /// Not a plain decimal whole number (`8.0`, `"8"`, `+8`, `eight`).
    NotWhole(String),
    /// A whole number outside 1..=64.
    OutOfRange(String),
    /// Not one of the two words.
    UnknownMode(String),
}

impl fmt::Display for ThrottleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (min, max) = (
            MAX_CONCURRENT_REQUESTS.start(),
            MAX_CONCURRENT_REQUESTS.end(),
        );
        let default = DEFAULT_MAX_CONCURRENT_REQUESTS;
        match self {
            ThrottleProblem::NotWhole(v) => write!(
                f,
                "{} is not a whole number; give the requests in flight at once as a whole number from {min} through {max} (default {default})",
                shown_value(v)
            ),
            ThrottleProblem::OutOfRange(v) => write!(
                f,
                "{v} is outside the allowed range {min}..{max}; give the requests in flight at once as a whole number from {min} through {max} (default {default})"
            ),
            ThrottleProblem::UnknownMode(v) => write!(
                f,
                "{} is not a throttle mode; use shared or off (default shared)",
                shown_value(v)
            ),
        }
    }
}

/// Reads a `maxConcurrentRequests` value: plain decimal digits only (the rule every number in
/// docsfab's configuration follows), within [`MAX_CONCURRENT_REQUESTS`].
pub fn check_max_concurrent_requests(text: &str, is_number: bool) -> Result<u8, ThrottleProblem> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !is_number || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ThrottleProblem::NotWhole(text.to_string()));
    }
    text.parse::<u8>()
        .ok()
        .filter(|n| MAX_CONCURRENT_REQUESTS.contains(n))
        .ok_or_else(|| ThrottleProblem::OutOfRange(text.to_string()))
}

/// Reads a `throttle` value as written (quotes allowed): `shared` or `off`. The source text is
/// read rather than the YAML value because YAML 1.1 would take a plain `off` for false.
pub fn check_throttle_mode(written: &str) -> Result<ThrottleMode, ThrottleProblem> {
    let word = unquoted(written);
    ThrottleMode::from_word(word).ok_or_else(|| ThrottleProblem::UnknownMode(word.to_string()))
}

/// A scalar's source text without one pair of surrounding quotes.
fn unquoted(text: &str) -> &str {
    ['"', '\'']
        .iter()
        .find_map(|q| text.strip_prefix(*q).and_then(|t| t.strip_suffix(*q)))
        .unwrap_or(text)
}

/// A scalar kept as written in the file, with the line it is on, so that its validation can use
/// the same integer rules as an environment variable and name the place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RawValue {
    /// The scalar's source text (quotes included when it was quoted).
    pub text: String,
    /// What YAML made of it.
    pub kind: RawKind,
    /// 1-based line in the file.
    pub line: u64,
}

/// What kind of YAML scalar a [`RawValue`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawKind {
    /// A YAML number; whether it is a plain decimal integer is decided from `text`.
    Number,
    /// Text, a boolean or anything else that is not a number.
    Other,
}

/// The parsed `host.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostConfig {
    /// Where the configuration came from, used in every message about it.
    pub path: String,
    /// The providers a composition may name, by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// The explicit operator override of `retry.maxRetries`, as written. `None` when the key is
    /// absent or null, in which case the catalog applies.
    pub read_only_max_retries: Option<RawValue>,
    /// Catalog lowerings, by key, as written. Keys are checked by the resolver.
    pub catalog: BTreeMap<String, RawValue>,
}

impl HostConfig {
    /// The configuration of a host without a `host.yaml`: no providers, catalog defaults.
    pub fn empty(path: impl Into<String>) -> HostConfig {
        HostConfig {
            path: path.into(),
            providers: BTreeMap::new(),
            read_only_max_retries: None,
            catalog: BTreeMap::new(),
        }
    }

    /// Parses the text of a `host.yaml`; `path` is only used in messages.
    pub fn parse(text: &str, path: &str) -> Result<HostConfig, HostError> {
        let raw: RawHost = from_yaml(text).map_err(|e| HostError::from_yaml(&e, path, text))?;
        let mut providers = BTreeMap::new();
        for (name, p) in raw.providers.unwrap_or_default() {
            let provider = check_provider(&name, p, path, text)?;
            providers.insert(name, provider);
        }
        let read_only_max_retries = match raw.read_only_max_retries {
            Some(v) if !v.value.is_null() => Some(raw_value(text, &v)),
            _ => None,
        };
        let catalog = raw
            .catalog
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, raw_value(text, &v)))
            .collect();
        Ok(HostConfig {
            path: path.to_string(),
            providers,
            read_only_max_retries,
            catalog,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHost {
    providers: Option<BTreeMap<String, RawProvider>>,
    read_only_max_retries: Option<Spanned<serde_json::Value>>,
    catalog: Option<BTreeMap<String, Spanned<serde_json::Value>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProvider {
    api: Api,
    base_url: Spanned<String>,
    api_key_env: Spanned<String>,
    model: Spanned<String>,
    max_concurrent_requests: Option<Spanned<serde_json::Value>>,
    throttle: Option<Spanned<serde_json::Value>>,
    include_usage: Option<Spanned<serde_json::Value>>,
    prompt_caching: Option<Spanned<serde_json::Value>>,
    pricing: Option<Spanned<RawPricing>>,
    budget: Option<Spanned<RawBudget>>,
    structured_output: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPricing {
    input_per_million: Option<Spanned<serde_json::Value>>,
    output_per_million: Option<Spanned<serde_json::Value>>,
    cache_write_per_million: Option<Spanned<serde_json::Value>>,
    cache_read_per_million: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBudget {
    max_run_cost_usd: Option<Spanned<serde_json::Value>>,
}

/// A value as written in `text`, with its line.
pub fn raw_value(text: &str, v: &Spanned<serde_json::Value>) -> RawValue {
    let span = v.defined.span();
    let source = match (span.byte_offset(), span.byte_len()) {
        (Some(start), Some(len)) => usize::try_from(start)
            .ok()
            .zip(usize::try_from(start.saturating_add(len)).ok())
            .and_then(|(s, e)| text.get(s..e)),
        _ => None,
    };
    // Fall back to the parsed value's rendering if the span cannot be mapped onto the text.
    let written = source
        .map(str::to_string)
        .unwrap_or_else(|| v.value.to_string());
    RawValue {
        text: written,
        kind: if v.value.is_number() {
            RawKind::Number
        } else {
            RawKind::Other
        },
        line: v.defined.line(),
    }
}

fn check_provider(
    name: &str,
    p: RawProvider,
    path: &str,
    text: &str,
) -> Result<ProviderConfig, HostError> {
    let invalid = |key: &str, line: u64, reason: String| HostError::Invalid {
        path: path.to_string(),
        line: Some(line),
        key: format!("providers.{name}.{key}"),
        reason,
    };
    if let Err(problem) = check_base_url(&p.base_url.value) {
        return Err(invalid(
            "baseUrl",
            p.base_url.defined.line(),
            problem.to_string(),
        ));
    }
    if let Err(problem) = check_key_env_name(&p.api_key_env.value) {
        return Err(invalid(
            "apiKeyEnv",
            p.api_key_env.defined.line(),
            problem.to_string(),
        ));
    }
    if let Err(problem) = check_model(&p.model.value) {
        return Err(invalid(
            "model",
            p.model.defined.line(),
            problem.to_string(),
        ));
    }
    let throttle = check_throttle(&p, text)
        .map_err(|(key, line, problem)| invalid(key, line, problem.to_string()))?;
    let spend = check_spend(&p).map_err(|(key, line, problem)| invalid(&key, line, problem))?;
    let structured_output_given = check_structured_output(&p, text)
        .map_err(|(key, line, problem)| invalid(&key, line, problem))?;
    Ok(ProviderConfig {
        api: p.api,
        base_url: p.base_url.value.trim().to_string(),
        api_key_env: p.api_key_env.value,
        model: p.model.value,
        throttle,
        spend,
        structured_output_given,
    })
}

/// `structuredOutput`: one of the three words, and `json-object` only where the API has it.
/// Read from the source text, as `throttle` is: some YAML readers take a plain `off` for false.
fn check_structured_output(
    p: &RawProvider,
    text: &str,
) -> Result<Option<StructuredOutput>, KeyProblem> {
    let Some(v) = p.structured_output.as_ref().filter(|v| !v.value.is_null()) else {
        return Ok(None);
    };
    let line = v.defined.line();
    let problem = |reason: String| ("structuredOutput".to_owned(), line, reason);
    let written = raw_value(text, v).text;
    let chosen = match unquoted(&written) {
        "json-schema" => StructuredOutput::JsonSchema,
        "json-object" => StructuredOutput::JsonObject,
        "off" => StructuredOutput::Off,
        other => {
            return Err(problem(format!(
                "structuredOutput is {}, but it must be json-schema, json-object or off",
                shown_value(other)
            )));
        }
    };
    if chosen == StructuredOutput::JsonObject && p.api == Api::AnthropicMessages {
        return Err(problem(
            "structuredOutput: json-object has no form on api: anthropic-messages (it takes only a JSON Schema); use json-schema or off".to_owned(),
        ));
    }
    Ok(Some(chosen))
}

/// A refusal of a provider key: the key under the provider, its line, the problem.
type KeyProblem = (String, u64, String);

/// The provider's usage, price and budget settings; absent or null keys take their default.
fn check_spend(p: &RawProvider) -> Result<ProviderSpend, KeyProblem> {
    let mut out = ProviderSpend::default();
    if let Some(v) = flag(&p.include_usage, "includeUsage")? {
        if p.api != Api::OpenaiChat {
            let line = p.include_usage.as_ref().map_or(0, |v| v.defined.line());
            return Err((
                "includeUsage".into(),
                line,
                "includeUsage applies only to api: openai-chat (Anthropic always reports usage); remove it".into(),
            ));
        }
        out.include_usage = v;
        out.given_include_usage = true;
    }
    if let Some(v) = flag(&p.prompt_caching, "promptCaching")? {
        out.prompt_caching = v;
        out.given_prompt_caching = true;
    }
    if let Some(raw) = &p.pricing {
        let r = &raw.value;
        let need = |v: &Option<Spanned<serde_json::Value>>, key: &str| {
            usd(v, &format!("pricing.{key}"))?.ok_or_else(|| {
                (
                    format!("pricing.{key}"),
                    raw.defined.line(),
                    format!("pricing needs {key} (USD per million tokens, such as 3.0); add it"),
                )
            })
        };
        out.pricing = Some(Pricing {
            input_per_million: need(&r.input_per_million, "inputPerMillion")?,
            output_per_million: need(&r.output_per_million, "outputPerMillion")?,
            cache_write_per_million: usd(
                &r.cache_write_per_million,
                "pricing.cacheWritePerMillion",
            )?,
            cache_read_per_million: usd(&r.cache_read_per_million, "pricing.cacheReadPerMillion")?,
        });
    }
    if let Some(raw) = &p.budget {
        out.max_run_cost_usd = usd(&raw.value.max_run_cost_usd, "budget.maxRunCostUsd")?;
        if out.max_run_cost_usd == Some(0.0) {
            return Err((
                "budget.maxRunCostUsd".into(),
                raw.defined.line(),
                "budget.maxRunCostUsd must be above 0 (leave it out for no cost bound)".into(),
            ));
        }
        if out.max_run_cost_usd.is_some() && out.pricing.is_none() {
            return Err((
                "budget.maxRunCostUsd".into(),
                raw.defined.line(),
                "budget.maxRunCostUsd needs the provider's pricing to count cost; add pricing with inputPerMillion and outputPerMillion".into(),
            ));
        }
    }
    Ok(out)
}

/// A `true`/`false` key; null or absent is `None`.
fn flag(v: &Option<Spanned<serde_json::Value>>, key: &str) -> Result<Option<bool>, KeyProblem> {
    let Some(s) = v.as_ref().filter(|v| !v.value.is_null()) else {
        return Ok(None);
    };
    match s.value.as_bool() {
        Some(b) => Ok(Some(b)),
        None => Err((
            key.into(),
            s.defined.line(),
            format!("{key} must be true or false, not {}", s.value),
        )),
    }
}

/// An amount in USD from 0 to [`MAX_USD`]; null or absent is `None`.
fn usd(v: &Option<Spanned<serde_json::Value>>, key: &str) -> Result<Option<f64>, KeyProblem> {
    let Some(s) = v.as_ref().filter(|v| !v.value.is_null()) else {
        return Ok(None);
    };
    match s.value.as_f64() {
        Some(n) if n.is_finite() && (0.0..=MAX_USD).contains(&n) => Ok(Some(n)),
        _ => Err((
            key.into(),
            s.defined.line(),
            format!(
                "{key} must be a number of US dollars from 0 to {MAX_USD}, not {}",
                s.value
            ),
        )),
    }
}

/// The provider's throttle settings; an absent or null key takes its default. On a refusal,
/// the key, its line and the problem.
fn check_throttle(
    p: &RawProvider,
    text: &str,
) -> Result<ProviderThrottle, (&'static str, u64, ThrottleProblem)> {
    let given = |v: &Option<Spanned<serde_json::Value>>| {
        v.as_ref()
            .filter(|v| !v.value.is_null())
            .map(|v| raw_value(text, v))
    };
    let mut out = ProviderThrottle::default();
    if let Some(raw) = given(&p.max_concurrent_requests) {
        out.max_concurrent_requests =
            check_max_concurrent_requests(&raw.text, raw.kind == RawKind::Number)
                .map_err(|e| ("maxConcurrentRequests", raw.line, e))?;
        out.given.max_concurrent_requests = true;
    }
    if let Some(raw) = given(&p.throttle) {
        out.mode = check_throttle_mode(&raw.text).map_err(|e| ("throttle", raw.line, e))?;
        out.given.mode = true;
    }
    Ok(out)
}

/// A `host.yaml` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The YAML does not parse, or does not have the expected shape (including unknown keys).
    #[error(
        "{path} line {line}, column {column}: {message}; fix the file or rerun `docsfab setup`."
    )]
    Syntax {
        path: String,
        line: u64,
        column: u64,
        message: String,
    },
    /// The YAML has the expected shape but a value is not acceptable.
    #[error("{path}{}: {key}: {reason}; fix the value or rerun `docsfab setup`.", line_suffix(*.line))]
    Invalid {
        path: String,
        line: Option<u64>,
        key: String,
        reason: String,
    },
}

fn line_suffix(line: Option<u64>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}

impl HostError {
    fn from_yaml(e: &serde_saphyr::Error, path: &str, text: &str) -> HostError {
        let (line, column, message) = yaml_error_parts(e, text);
        HostError::Syntax {
            path: path.to_string(),
            line,
            column,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://api.example.com/v1\n    apiKeyEnv: OPENAI_API_KEY\n    model: some-model\nreadOnlyMaxRetries: 2\ncatalog:\n  retry.maxRetries: 3\n  retry.maxTransportRetries: 4\n";

    #[test]
    fn parses_the_documented_shape() {
        let h = HostConfig::parse(FULL, "host.yaml").unwrap();
        let p = &h.providers["default"];
        assert_eq!(p.api, Api::OpenaiChat);
        assert_eq!(p.base_url, "https://api.example.com/v1");
        assert_eq!(p.api_key_env, "OPENAI_API_KEY");
        let o = h.read_only_max_retries.unwrap();
        assert_eq!((o.text.as_str(), o.kind, o.line), ("2", RawKind::Number, 7));
        assert_eq!(h.catalog["retry.maxTransportRetries"].text, "4");
        assert_eq!(h.catalog["retry.maxTransportRetries"].line, 10);
    }

    #[test]
    fn empty_text_is_an_empty_host() {
        let h = HostConfig::parse("# nothing yet\n", "host.yaml").unwrap();
        assert_eq!(h, HostConfig::empty("host.yaml"));
    }

    #[test]
    fn null_override_means_no_override_cfg_4() {
        let h = HostConfig::parse("readOnlyMaxRetries: ~\n", "host.yaml").unwrap();
        assert_eq!(h.read_only_max_retries, None);
    }

    #[test]
    fn unknown_key_names_key_file_and_line() {
        let text = FULL.replace("    model: some-model\n", "    model: m\n    apiKey: x\n");
        let e = HostConfig::parse(&text, "/h/host.yaml").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/h/host.yaml line 7"), "{msg}");
        assert!(msg.contains("apiKey"), "{msg}");
    }

    #[test]
    fn unknown_api_is_refused() {
        let text = FULL.replace("openai-chat", "openai");
        let msg = HostConfig::parse(&text, "host.yaml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("openai") && msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn key_in_api_key_env_is_refused_without_echoing_it() {
        let text = FULL.replace("OPENAI_API_KEY", "sk-proj-abcdef123456");
        let msg = HostConfig::parse(&text, "host.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("apiKeyEnv") && msg.contains("looks like a key"),
            "{msg}"
        );
        assert!(!msg.contains("sk-proj"), "{msg}");
    }

    #[test]
    fn credentials_in_base_url_refused_without_echoing_them() {
        for url in [
            "https://me:hunter2@api.example.com/v1",
            "https://api.example.com/v1?api_key=hunter2",
        ] {
            let text = FULL.replace("https://api.example.com/v1", url);
            let msg = HostConfig::parse(&text, "host.yaml")
                .unwrap_err()
                .to_string();
            assert!(msg.contains("baseUrl") && !msg.contains("hunter2"), "{msg}");
        }
        assert!(!url_carries_secret("https://api.example.com/v1?x=1"));
    }

    #[test]
    fn names_with_separators_are_not_keys_but_a_long_random_token_inside_is() {
        // Model names and URLs mix case and digits across short parts; a key is one long run.
        for text in [
            "Qwen/Qwen2.5-Coder-32B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo",
            "http://LLM-Box:8000/v1",
        ] {
            assert!(!looks_like_key(text), "{text}");
        }
        let text = FULL.replace("https://api.example.com/v1", "http://LLM-Box:8000/v1");
        let host = HostConfig::parse(&text, "host.yaml").expect("a plain base URL");
        assert_eq!(host.providers["default"].base_url, "http://LLM-Box:8000/v1");
        for text in [
            "aB3dE5fG7hJ9kL1mN3pQ5",
            "https://gw.example.com/v1/aB3dE5fG7hJ9kL1mN3pQ5",
            "MyCompanyProviderKey2024",
        ] {
            assert!(looks_like_key(text), "{text}");
        }
    }

    #[test]
    fn duplicate_key_is_one_sentence() {
        let msg = HostConfig::parse("catalog: {}\ncatalog: {}\n", "host.yaml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("line 2") && msg.contains("duplicate"), "{msg}");
        assert!(!msg.contains("DuplicateKeyPolicy"), "{msg}");
    }

    #[test]
    fn hardening_unclear_refusals_yaml_budget_is_named_in_our_words() {
        let deep = format!("catalog: {}1{}\n", "{a: ".repeat(60), "}".repeat(60));
        let msg = HostConfig::parse(&deep, "h.yaml").unwrap_err().to_string();
        assert!(msg.contains("40 levels"), "{msg}");
        let two = "catalog: {}\n---\ncatalog: {}\n";
        let msg = HostConfig::parse(two, "h.yaml").unwrap_err().to_string();
        assert!(msg.contains("more than one YAML document"), "{msg}");
        let mut bomb = String::from("a0: &a0 [x, x]\n");
        for i in 1..30 {
            bomb.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}]\n", p = i - 1));
        }
        let msg = HostConfig::parse(&bomb, "h.yaml").unwrap_err().to_string();
        assert!(
            !msg.contains("Aliases {") && msg.lines().count() == 1,
            "{msg}"
        );
        let msg = HostConfig::parse("readOnlyMaxRetries: [1\n", "h.yaml")
            .unwrap_err()
            .to_string();
        assert!(!msg.contains("serde") && msg.lines().count() == 1, "{msg}");
    }

    fn with_throttle(lines: &str) -> String {
        FULL.replace(
            "    model: some-model\n",
            &format!("    model: some-model\n{lines}"),
        )
    }

    fn throttle_refusal(lines: &str) -> String {
        HostConfig::parse(&with_throttle(lines), "/h/host.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn issue12_throttle_settings_default_to_shared_and_8_when_absent() {
        let h = HostConfig::parse(FULL, "host.yaml").unwrap();
        let t = h.providers["default"].throttle;
        assert_eq!(t, ProviderThrottle::default());
        assert_eq!(
            (t.mode, t.max_concurrent_requests),
            (ThrottleMode::Shared, 8)
        );
        assert_eq!(t.given, ThrottleGiven::default());
        // A null value means the default too, as for readOnlyMaxRetries.
        let h = HostConfig::parse(
            &with_throttle("    maxConcurrentRequests: ~\n    throttle:\n"),
            "host.yaml",
        )
        .unwrap();
        assert_eq!(h.providers["default"].throttle, ProviderThrottle::default());
    }

    #[test]
    fn issue12_throttle_settings_are_read_per_provider() {
        let text = format!(
            "{}  other:\n    api: anthropic-messages\n    baseUrl: https://api.anthropic.com/v1\n    apiKeyEnv: ANTHROPIC_API_KEY\n    model: m\n    throttle: 'shared'\n",
            with_throttle("    maxConcurrentRequests: 64\n    throttle: off\n")
                .replace("readOnlyMaxRetries: 2\ncatalog:\n  retry.maxRetries: 3\n  retry.maxTransportRetries: 4\n", "")
        );
        let h = HostConfig::parse(&text, "host.yaml").unwrap();
        let d = h.providers["default"].throttle;
        assert_eq!((d.mode, d.max_concurrent_requests), (ThrottleMode::Off, 64));
        assert!(d.given.mode && d.given.max_concurrent_requests);
        let o = h.providers["other"].throttle;
        assert_eq!(
            (o.mode, o.max_concurrent_requests),
            (ThrottleMode::Shared, 8)
        );
        assert!(o.given.mode && !o.given.max_concurrent_requests);
        for (written, mode) in [
            ("\"off\"", ThrottleMode::Off),
            ("shared", ThrottleMode::Shared),
        ] {
            let h = HostConfig::parse(&with_throttle(&format!("    throttle: {written}\n")), "h")
                .unwrap();
            assert_eq!(h.providers["default"].throttle.mode, mode, "{written}");
        }
        let h = HostConfig::parse(&with_throttle("    maxConcurrentRequests: 1\n"), "h").unwrap();
        assert_eq!(h.providers["default"].throttle.max_concurrent_requests, 1);
        // Comments after the value and flow style read the same way.
        let h = HostConfig::parse(
            &with_throttle("    maxConcurrentRequests: 16  # half\n    throttle: off # compare\n"),
            "h",
        )
        .unwrap();
        let t = h.providers["default"].throttle;
        assert_eq!((t.mode, t.max_concurrent_requests), (ThrottleMode::Off, 16));
        let flow = "providers: {p: {api: openai-chat, baseUrl: 'https://h/v1', apiKeyEnv: K, model: m, throttle: off, maxConcurrentRequests: 3}}\n";
        let t = HostConfig::parse(flow, "h").unwrap().providers["p"].throttle;
        assert_eq!((t.mode, t.max_concurrent_requests), (ThrottleMode::Off, 3));
    }

    #[test]
    fn issue12_max_concurrent_requests_outside_1_to_64_names_file_line_key_and_range() {
        for bad in ["0", "65", "300", "-1", "99999999999999999999999"] {
            let msg = throttle_refusal(&format!("    maxConcurrentRequests: {bad}\n"));
            assert_eq!(
                msg,
                format!(
                    "/h/host.yaml line 7: providers.default.maxConcurrentRequests: {bad} is outside the allowed range 1..64; give the requests in flight at once as a whole number from 1 through 64 (default 8); fix the value or rerun `docsfab setup`."
                )
            );
        }
    }

    #[test]
    fn issue12_max_concurrent_requests_must_be_a_plain_whole_number() {
        for bad in ["8.0", "\"8\"", "+8", "eight", "0x10", "1e1", "[8]", "true"] {
            let msg = throttle_refusal(&format!("    maxConcurrentRequests: {bad}\n"));
            assert!(
                msg.starts_with("/h/host.yaml line 7: providers.default.maxConcurrentRequests: ")
                    && msg.contains("is not a whole number")
                    && msg.contains("from 1 through 64")
                    && msg.contains("(default 8)"),
                "{bad}: {msg}"
            );
            assert_eq!(msg.lines().count(), 1, "{msg}");
        }
    }

    #[test]
    fn issue12_unknown_throttle_mode_names_the_allowed_words() {
        for bad in ["on", "false", "Off", "SHARED", "adaptive", "1"] {
            let msg = throttle_refusal(&format!("    throttle: {bad}\n"));
            assert_eq!(
                msg,
                format!(
                    "/h/host.yaml line 7: providers.default.throttle: {} is not a throttle mode; use shared or off (default shared); fix the value or rerun `docsfab setup`.",
                    shown_value(bad)
                )
            );
        }
        // A key pasted into the wrong place is not repeated.
        let msg = throttle_refusal("    throttle: sk-proj-aB3dE5fG7hJ9kL1mN3pQ5\n");
        assert!(!msg.contains("aB3d") && msg.contains("withheld"), "{msg}");
    }

    #[test]
    fn issue12_misspelt_throttle_key_is_refused_like_any_unknown_key() {
        let msg = throttle_refusal("    maxConcurrentRequest: 4\n");
        assert!(
            msg.starts_with("/h/host.yaml line 7")
                && msg.contains("unknown key \"maxConcurrentRequest\"")
                && msg.contains("\"maxConcurrentRequests\"")
                && msg.contains("\"throttle\""),
            "{msg}"
        );
    }

    #[test]
    fn issue31_structured_output_defaults_to_json_schema_and_reads_every_word() {
        let h = HostConfig::parse(FULL, "host.yaml").unwrap();
        let p = &h.providers["default"];
        assert_eq!(p.structured_output_given, None);
        assert_eq!(p.structured_output(), StructuredOutput::JsonSchema);
        for (word, want) in [
            ("json-schema", StructuredOutput::JsonSchema),
            ("json-object", StructuredOutput::JsonObject),
            // A plain `off` is false to some YAML readers: the word as written decides.
            ("off", StructuredOutput::Off),
            ("'off'", StructuredOutput::Off),
        ] {
            let h = HostConfig::parse(
                &with_throttle(&format!("    structuredOutput: {word}\n")),
                "host.yaml",
            )
            .unwrap();
            assert_eq!(h.providers["default"].structured_output(), want, "{word}");
        }
    }

    #[test]
    fn issue31_structured_output_refusals_are_one_sentence_at_the_line() {
        let msg = throttle_refusal("    structuredOutput: grammar\n");
        assert_eq!(
            msg,
            "/h/host.yaml line 7: providers.default.structuredOutput: structuredOutput is \"grammar\", but it must be json-schema, json-object or off; fix the value or rerun `docsfab setup`."
        );
        let anthropic = with_throttle("    structuredOutput: json-object\n")
            .replace("api: openai-chat", "api: anthropic-messages");
        let msg = HostConfig::parse(&anthropic, "/h/host.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("json-object has no form on api: anthropic-messages")
                && msg.lines().count() == 1,
            "{msg}"
        );
    }
}
