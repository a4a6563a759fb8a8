//! The host configuration file, `host.yaml`: which providers exist, an optional explicit
//! `readOnlyMaxRetries` override, and optional lowerings of catalog limits.
//!
//! Parsing is strict (an unknown key anywhere is refused) and pure: the caller reads the file and
//! passes its text together with the path used in messages. Numbers under `catalog:` and
//! `readOnlyMaxRetries` are kept exactly as written ([`RawValue`]) so that the resolver in
//! [`crate::catalog`] applies one set of rules to them and to environment variables, and so that
//! `docsfab setup` can write an existing override back unchanged.
//!
//! No key is ever held here: a provider names the environment variable that carries its key.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// The wire protocol a provider speaks: the one `Api` of docsfab, owned by the record crate.
pub use docsfab_record::Api;

/// One entry of `providers:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
        let raw: RawHost =
            serde_saphyr::from_str(text).map_err(|e| HostError::from_yaml(&e, path))?;
        let mut providers = BTreeMap::new();
        for (name, p) in raw.providers.unwrap_or_default() {
            let provider = check_provider(&name, p, path)?;
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
}

fn raw_value(text: &str, v: &Spanned<serde_json::Value>) -> RawValue {
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

fn check_provider(name: &str, p: RawProvider, path: &str) -> Result<ProviderConfig, HostError> {
    let invalid = |key: &str, line: u64, reason: String| HostError::Invalid {
        path: path.to_string(),
        line: Some(line),
        key: format!("providers.{name}.{key}"),
        reason,
    };
    let url = p.base_url.value.trim();
    if url_carries_secret(url) || looks_like_key(url) {
        return Err(invalid(
            "baseUrl",
            p.base_url.defined.line(),
            "the URL appears to carry credentials (user information or a key parameter), and keys are never stored; give the plain base URL and put the key in the variable named by apiKeyEnv".to_string(),
        ));
    }
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(invalid(
            "baseUrl",
            p.base_url.defined.line(),
            format!("{url:?} is not an http:// or https:// URL"),
        ));
    }
    if let Err(problem) = check_key_env_name(&p.api_key_env.value) {
        return Err(invalid(
            "apiKeyEnv",
            p.api_key_env.defined.line(),
            problem.to_string(),
        ));
    }
    if p.model.value.trim().is_empty() {
        return Err(invalid(
            "model",
            p.model.defined.line(),
            "the model name is empty".to_string(),
        ));
    }
    Ok(ProviderConfig {
        api: p.api,
        base_url: url.to_string(),
        api_key_env: p.api_key_env.value,
        model: p.model.value,
    })
}

/// Why a value given as the name of a key variable is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyNameProblem {
    /// Not of the shape `[A-Za-z_][A-Za-z0-9_]*`.
    NotAVariableName,
    /// Has the shape of a credential (a known key prefix, or a long random-looking token).
    LooksLikeAKey,
}

impl fmt::Display for KeyNameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyNameProblem::NotAVariableName => f.write_str(
                "it must be the name of an environment variable (letters, digits and _), not a key",
            ),
            KeyNameProblem::LooksLikeAKey => f.write_str(
                "the value looks like a key rather than the name of the variable that holds it, and keys are never stored",
            ),
        }
    }
}

/// Prefixes that common providers and platforms put in front of their secrets.
const KEY_PREFIXES: &[&str] = &[
    "sk-",
    "sk_",
    "sk-ant-",
    "xai-",
    "gsk_",
    "ghp_",
    "gho_",
    "github_pat_",
    "hf_",
    "nvapi-",
    "AKIA",
    "ASIA",
    "AIza",
    "pk_",
    "rk_",
    "glpat-",
    "xoxb-",
    "xoxp-",
];

/// Whether `text` looks like a secret: a known key prefix, or a long token that mixes upper
/// case, lower case and digits the way generated keys do and variable names do not.
///
/// A token is a run of letters, digits and `_`, so a model name or URL whose short parts mix
/// case and digits (`Qwen/Qwen2.5-Coder-32B-Instruct`, `http://LLM-Box:8000/v1`) is not taken
/// for a key, while a key pasted into a URL path still is.
pub fn looks_like_key(text: &str) -> bool {
    if KEY_PREFIXES.iter().any(|p| text.starts_with(p)) {
        return true;
    }
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(is_random_token)
}

/// Whether one token is long and mixes upper case, lower case and digits.
fn is_random_token(token: &str) -> bool {
    let long = token.chars().count() >= 20;
    let upper = token.chars().any(|c| c.is_ascii_uppercase());
    let lower = token.chars().any(|c| c.is_ascii_lowercase());
    let digits = token.chars().filter(char::is_ascii_digit).count();
    long && upper && lower && digits >= 2
}

/// Whether a URL carries credentials: user information (`user:pass@`) or a key-like query
/// parameter. Such a URL would put a secret in `host.yaml` and in doctor's output.
pub fn url_carries_secret(url: &str) -> bool {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return true;
    }
    let query = url
        .split_once('?')
        .map_or("", |(_, q)| q)
        .to_ascii_lowercase();
    [
        "key=",
        "token=",
        "secret=",
        "password=",
        "api_key=",
        "apikey=",
        "sig=",
    ]
    .iter()
    .any(|k| query.contains(k))
}

/// Checks that `name` is usable as the name of the variable holding a provider key.
pub fn check_key_env_name(name: &str) -> Result<(), KeyNameProblem> {
    let mut chars = name.chars();
    let shaped = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    };
    if looks_like_key(name) {
        return Err(KeyNameProblem::LooksLikeAKey);
    }
    if !shaped {
        return Err(KeyNameProblem::NotAVariableName);
    }
    Ok(())
}

/// A `host.yaml` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The YAML does not parse, or does not have the expected shape (including unknown keys).
    #[error(
        "{path} line {line}, column {column}: {message}; fix the file or run `docsfab setup` to regenerate it."
    )]
    Syntax {
        path: String,
        line: u64,
        column: u64,
        message: String,
    },
    /// The YAML has the expected shape but a value is not acceptable.
    #[error("{path}{}: {key}: {reason}; fix the value or run `docsfab setup` to regenerate the file.", line_suffix(*.line))]
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
    fn from_yaml(e: &serde_saphyr::Error, path: &str) -> HostError {
        let (line, column, message) = yaml_error_parts(e);
        HostError::Syntax {
            path: path.to_string(),
            line,
            column,
            message,
        }
    }
}

/// Splits a serde-saphyr error into line, column and a message without its own location suffix.
/// Shared with the rules table and the composition parser so every file error reads the same.
pub fn yaml_error_parts(e: &serde_saphyr::Error) -> (u64, u64, String) {
    let inner = e.without_snippet();
    let (line, column) = inner
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((1, 1));
    let mut message = inner.to_string();
    let suffix = format!(" at line {line}, column {column}");
    if let Some(stripped) = message.strip_suffix(&suffix) {
        message = stripped.to_string();
    }
    // Keep the sentence single: drop the library's advice on its own options.
    if let Some(idx) = message.find(", set DuplicateKeyPolicy") {
        message.truncate(idx);
    }
    (line, column, message.trim_end_matches('.').to_string())
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
    fn key_name_checks() {
        assert_eq!(check_key_env_name("OPENAI_API_KEY"), Ok(()));
        assert_eq!(check_key_env_name("_X1"), Ok(()));
        assert_eq!(
            check_key_env_name("sk-ant-api03-xyz"),
            Err(KeyNameProblem::LooksLikeAKey)
        );
        assert_eq!(
            check_key_env_name("aB3dE5fG7hJ9kL1mN3pQ5"),
            Err(KeyNameProblem::LooksLikeAKey)
        );
        assert_eq!(
            check_key_env_name("MY KEY"),
            Err(KeyNameProblem::NotAVariableName)
        );
        assert_eq!(
            check_key_env_name(""),
            Err(KeyNameProblem::NotAVariableName)
        );
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
}
