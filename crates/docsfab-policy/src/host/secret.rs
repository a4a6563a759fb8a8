//! What looks like a secret: a known key prefix, a long random-looking token, or a URL that
//! carries credentials. Such a value is never stored in a configuration file nor repeated in a
//! message.

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
