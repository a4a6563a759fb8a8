//! The provider API key: a value that never prints.

use std::fmt;

/// An API key. `Debug` and `Display` print a fixed placeholder, so the key cannot leak into logs,
/// error text or records by accident; only [`ApiKey::expose`] gives the value, for the one header
/// that carries it to the provider.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    key: String,
    label: Option<String>,
}

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey {
            key: key.into(),
            label: None,
        }
    }

    /// Names where the key came from (the environment variable), so a refusal that finds the
    /// key's value in a response can say which key it was without showing it.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The label given with [`ApiKey::with_label`], if any.
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The key itself. Call only to build the provider's auth header.
    pub fn expose(&self) -> &str {
        &self.key
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "ApiKey({label}: <redacted>)"),
            None => f.write_str("ApiKey(<redacted>)"),
        }
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_never_prints() {
        let k = ApiKey::new("sk-very-secret");
        assert!(!format!("{k:?}").contains("sk-very"));
        assert!(!format!("{k}").contains("sk-very"));
        assert_eq!(k.expose(), "sk-very-secret");
        let k = k.with_label("OPENAI_API_KEY");
        assert_eq!(format!("{k:?}"), "ApiKey(OPENAI_API_KEY: <redacted>)");
        assert_eq!(k.label(), Some("OPENAI_API_KEY"));
    }
}
