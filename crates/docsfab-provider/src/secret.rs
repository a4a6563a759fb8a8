//! The provider API key: a value that never prints.

use std::fmt;

/// An API key. `Debug` and `Display` print a fixed placeholder, so the key cannot leak into logs,
/// error text or records by accident; only [`ApiKey::expose`] gives the value, for the one header
/// that carries it to the provider.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself. Call only to build the provider's auth header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
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
    }
}
