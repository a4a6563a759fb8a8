//! Recognising a gateway from a response head (issue 24), and the one thing docsfab takes
//! from it: the provider's own Retry-After that the gateway relayed under another name.
//!
//! LiteLLM's proxy puts `x-litellm-*` headers of its own on every answer it gives, success and
//! error alike (`ProxyBaseLLMRequestProcessing.get_custom_headers` in
//! `litellm/proxy/common_request_processing.py`: `x-litellm-call-id`, `x-litellm-version`, ...),
//! and relays every header of the provider's response with an `llm_provider-` prefix
//! (`_get_llm_provider_headers` in `litellm/litellm_core_utils/llm_response_utils/get_headers.py`).
//! So a 429 whose provider asked for `retry-after: 3` reaches docsfab as
//! `llm_provider-retry-after: 3`, with no `retry-after` of its own.
//!
//! docsfab reads the prefixed pair only when the response came through a gateway it recognises,
//! and only when the head has no Retry-After of its own: the hop docsfab talks to speaks first.
//! What it reads goes through the same parser and the same clamps as the provider's own.

use docsfab_record::{Gateway, GatewayName};
use reqwest::header::HeaderMap;

/// The gateway whose headers `head` carries, if any: LiteLLM when any header name starts with
/// `x-litellm-`, with the version its `x-litellm-version` names (kept only when it looks like
/// a version).
pub fn recognise(head: &HeaderMap) -> Option<Gateway> {
    let litellm = head
        .keys()
        .any(|name| name.as_str().starts_with(LITELLM_PREFIX));
    if !litellm {
        return None;
    }
    let version = head
        .get("x-litellm-version")
        .and_then(|v| v.to_str().ok())
        .and_then(Gateway::version_from_header);
    Some(Gateway {
        name: GatewayName::Litellm,
        version,
    })
}

/// Every header LiteLLM adds of its own starts with this.
const LITELLM_PREFIX: &str = "x-litellm-";

/// The prefix LiteLLM gives each header of the provider's response it relays.
pub const LITELLM_RELAY_PREFIX: &str = "llm_provider-";

/// The Retry-After pair (`retry-after`, `retry-after-ms`) that speaks for the provider: the
/// head's own when it has either, else, behind a recognised gateway, the pair the gateway
/// relayed (`llm_provider-retry-after`, `llm_provider-retry-after-ms`).
pub fn retry_after_pair(
    head: &HeaderMap,
    gateway: Option<&Gateway>,
) -> (Option<String>, Option<String>) {
    let get = |name: &str| {
        head.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let own = (get("retry-after"), get("retry-after-ms"));
    if own.0.is_some() || own.1.is_some() {
        return own;
    }
    match gateway.map(|g| g.name) {
        Some(GatewayName::Litellm) => (
            get("llm_provider-retry-after"),
            get("llm_provider-retry-after-ms"),
        ),
        None => own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn issue24_litellm_is_recognised_by_its_own_headers_with_its_version() {
        let g = recognise(&head(&[
            ("x-litellm-call-id", "c0ffee"),
            ("x-litellm-version", "1.108.7"),
        ]))
        .unwrap();
        assert_eq!(g.name, GatewayName::Litellm);
        assert_eq!(g.version.as_deref(), Some("1.108.7"));
        // Any x-litellm- header is enough; a version that is not one is dropped.
        let g = recognise(&head(&[
            ("x-litellm-model-id", "m"),
            ("x-litellm-version", "1.0 <b>"),
        ]))
        .unwrap();
        assert_eq!(g.version, None);
        // Relayed provider headers alone are not the gateway speaking.
        assert_eq!(
            recognise(&head(&[
                ("llm_provider-x-request-id", "r"),
                ("server", "uvicorn")
            ])),
            None
        );
        assert_eq!(recognise(&HeaderMap::new()), None);
    }

    #[test]
    fn issue24_rep_8_a_relayed_retry_after_speaks_only_behind_a_recognised_gateway() {
        let relayed = head(&[
            ("x-litellm-version", "1.108.7"),
            ("llm_provider-retry-after", "3"),
            ("llm_provider-retry-after-ms", "2500"),
        ]);
        let g = recognise(&relayed);
        assert_eq!(
            retry_after_pair(&relayed, g.as_ref()),
            (Some("3".into()), Some("2500".into()))
        );
        // The same names without the gateway's own headers are nobody's Retry-After.
        let stray = head(&[("llm_provider-retry-after", "3")]);
        assert_eq!(
            retry_after_pair(&stray, recognise(&stray).as_ref()),
            (None, None)
        );
        // The hop docsfab talks to speaks first: its own Retry-After wins over the relayed one.
        let own = head(&[
            ("x-litellm-version", "1.108.7"),
            ("retry-after", "7"),
            ("llm_provider-retry-after", "3"),
        ]);
        assert_eq!(
            retry_after_pair(&own, recognise(&own).as_ref()),
            (Some("7".into()), None)
        );
    }
}
