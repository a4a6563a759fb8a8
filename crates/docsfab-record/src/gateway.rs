//! A gateway that stood between docsfab and the provider: an HTTP proxy that speaks the
//! provider's API on one side and calls the provider on the other (LiteLLM's proxy is the one
//! docsfab recognises). Such a hop can rename, reshape or complete what the provider sent, so an
//! attempt that came through one says so (`docs/retries.md`, "Behind a gateway").

use serde::{Deserialize, Serialize};

/// Which gateway. A closed list: docsfab records only a gateway it knows how to recognise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatewayName {
    /// LiteLLM's proxy (`litellm --config ...`), recognised by its `x-litellm-*` headers.
    Litellm,
}

impl GatewayName {
    /// The record's spelling: `litellm`.
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayName::Litellm => "litellm",
        }
    }

    /// The name people know it by: `LiteLLM`.
    pub fn display_name(self) -> &'static str {
        match self {
            GatewayName::Litellm => "LiteLLM",
        }
    }
}

/// The gateway a response came through, as its own headers named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gateway {
    pub name: GatewayName,
    /// The version the gateway announced (`x-litellm-version`), at most
    /// [`GATEWAY_VERSION_MAX_CHARS`] characters of `[0-9A-Za-z.+_-]`; `null` when it announced
    /// none, or something else.
    pub version: Option<String>,
}

/// The longest version string kept; a longer one is not a version.
pub const GATEWAY_VERSION_MAX_CHARS: usize = 32;

impl Gateway {
    /// `LiteLLM 1.108.7`, or `LiteLLM (version not stated)`.
    pub fn describe(&self) -> String {
        match &self.version {
            Some(v) => format!("{} {v}", self.name.display_name()),
            None => format!("{} (version not stated)", self.name.display_name()),
        }
    }

    /// A version as a header gave it, kept only when it looks like one (see [`Self::version`]):
    /// the value is chosen by whoever answered, and goes into records and terminals.
    pub fn version_from_header(value: &str) -> Option<String> {
        let v = value.trim();
        let plain = v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'));
        (!v.is_empty() && v.len() <= GATEWAY_VERSION_MAX_CHARS && plain).then(|| v.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue24_a_version_is_kept_only_when_it_looks_like_one() {
        assert_eq!(
            Gateway::version_from_header(" 1.108.7 ").as_deref(),
            Some("1.108.7")
        );
        assert_eq!(
            Gateway::version_from_header("1.2.3rc1+local").as_deref(),
            Some("1.2.3rc1+local")
        );
        assert_eq!(Gateway::version_from_header(""), None);
        assert_eq!(Gateway::version_from_header("1.0 <script>"), None);
        assert_eq!(Gateway::version_from_header("1.0\u{1b}[31m"), None);
        assert_eq!(Gateway::version_from_header(&"9".repeat(33)), None);
    }

    #[test]
    fn issue24_the_record_spells_a_gateway_as_name_and_version() {
        let g = Gateway {
            name: GatewayName::Litellm,
            version: Some("1.108.7".into()),
        };
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "litellm", "version": "1.108.7"})
        );
        assert_eq!(serde_json::from_value::<Gateway>(json).unwrap(), g);
        assert_eq!(g.describe(), "LiteLLM 1.108.7");
        let unnamed = Gateway { version: None, ..g };
        assert_eq!(unnamed.describe(), "LiteLLM (version not stated)");
    }
}
