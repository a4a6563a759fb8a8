//! The values several files and commands take, checked once: a provider's base URL (read as the
//! HTTP transport reads it), a model name and the name of a key's environment variable.

use std::fmt;

use super::secret::{looks_like_key, url_carries_secret};
use super::yaml::shown_value;

/// Why a provider base URL is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlProblem {
    /// User information or a key-like query parameter or path part.
    CarriesSecret,
    /// Not an absolute http:// or https:// URL with a host (and a valid port, if any).
    NotHttpUrl(String),
}

impl fmt::Display for UrlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlProblem::CarriesSecret => f.write_str(
                "the URL appears to carry credentials, and keys are never stored; give the plain base URL and put the key in the variable named by apiKeyEnv",
            ),
            UrlProblem::NotHttpUrl(shown) => write!(
                f,
                "{shown} is not an http(s) URL with a host and a port from 1 to 65535, such as https://api.openai.com/v1"
            ),
        }
    }
}

/// Checks a provider base URL the way the HTTP transport will read it, so that `doctor`,
/// `setup` and `run` accept and refuse the same URLs.
pub fn check_base_url(url: &str) -> Result<(), UrlProblem> {
    let url = url.trim();
    if url_carries_secret(url) || looks_like_key(url) {
        return Err(UrlProblem::CarriesSecret);
    }
    let not_http = || UrlProblem::NotHttpUrl(shown_value(url));
    if !(url.starts_with("https://") || url.starts_with("http://"))
        || url.contains(char::is_whitespace)
    {
        return Err(not_http());
    }
    let parsed = url::Url::parse(url).map_err(|_| not_http())?;
    let has_host = parsed.host_str().is_some_and(|h| !h.is_empty());
    if parsed.cannot_be_a_base() || !has_host || parsed.port() == Some(0) {
        return Err(not_http());
    }
    Ok(())
}

/// The host and port of a base URL as the transport reads it (`api.openai.com`,
/// `127.0.0.1:8080`, `[::1]:9000`): never its user information, path or query, which can carry
/// credentials. The port is shown only when the URL names one other than the scheme's default.
/// `None` when the URL has no host.
pub fn base_url_host(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url.trim()).ok()?;
    let host = parsed.host_str().filter(|h| !h.is_empty())?;
    Some(match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// Why a model name is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelProblem {
    Empty,
    ControlCharacters,
    LooksLikeAKey,
}

impl fmt::Display for ModelProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelProblem::Empty => "the model name is empty",
            ModelProblem::ControlCharacters => "the model name contains control characters",
            ModelProblem::LooksLikeAKey => {
                "this looks like a key, not a model name, and keys are never stored here"
            }
        })
    }
}

/// Checks a model name given in host.yaml, a composition or `setup --model`.
pub fn check_model(model: &str) -> Result<(), ModelProblem> {
    if looks_like_key(model) {
        Err(ModelProblem::LooksLikeAKey)
    } else if model.trim().is_empty() {
        Err(ModelProblem::Empty)
    } else if model.contains(char::is_control) {
        Err(ModelProblem::ControlCharacters)
    } else {
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_base_url_host_keeps_host_and_port_only() {
        assert_eq!(
            base_url_host("http://user:pw@127.0.0.1:8080/v1?key=x#f").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            base_url_host(" https://api.openai.com/v1 ").as_deref(),
            Some("api.openai.com")
        );
        assert_eq!(
            base_url_host("https://api.example.com:443/v1").as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            base_url_host("http://[::1]:9000/v1").as_deref(),
            Some("[::1]:9000")
        );
        assert_eq!(base_url_host("not a url"), None);
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
    fn hardening_doctor_equals_run_base_urls_are_read_like_the_transport_reads_them() {
        for bad in [
            "http://",
            "http://[::1",
            "http://127.0.0.1:99999/v1",
            "http://h:0/v1",
            "ftp://h/v1",
            "http://a b/v1",
        ] {
            assert!(
                matches!(check_base_url(bad), Err(UrlProblem::NotHttpUrl(_))),
                "{bad}"
            );
        }
        for good in [
            "http://127.0.0.1:8080/v1",
            "https://api.openai.com/v1",
            "http://[::1]:9/v1",
            "http://LLM-Box:8000/v1",
        ] {
            assert_eq!(check_base_url(good), Ok(()), "{good}");
        }
        assert_eq!(
            check_base_url("https://u:p@h/v1"),
            Err(UrlProblem::CarriesSecret)
        );
        assert_eq!(
            check_model("aB3dE5fG7hJ9kL1mN3pQ5xY"),
            Err(ModelProblem::LooksLikeAKey)
        );
        assert_eq!(check_model("Qwen/Qwen2.5-Coder-32B-Instruct"), Ok(()));
    }
}
