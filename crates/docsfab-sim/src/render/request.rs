//! What the renderer reads from a request: the facts of its body and where it was routed.

use docsfab_record::Api;
use serde_json::Value;

use crate::cache::{CacheProbe, CacheUse};

/// What the simulator reads from a request body; anything missing or unreadable is a default.
#[derive(Debug, Clone, Default)]
pub(crate) struct BodyFacts {
    pub model: Option<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// The body has a `stream_options` member (whatever its value).
    pub has_stream_options: bool,
    pub len: usize,
    /// The prefixes the body offers the prompt cache (none for an unserved path).
    pub cache: CacheProbe,
}

impl BodyFacts {
    /// Reads a body sent to `api` (`None`: a path the simulator does not serve).
    pub(crate) fn read(body: &[u8], api: Option<Api>) -> Self {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let field = |name: &str| parsed.as_ref().and_then(|v| v.get(name));
        BodyFacts {
            has_stream_options: field("stream_options").is_some(),
            cache: parsed
                .as_ref()
                .zip(api)
                .map(|(v, api)| CacheProbe::read(v, api))
                .unwrap_or_default(),
            model: field("model").and_then(Value::as_str).map(str::to_owned),
            stream: field("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: field("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            len: body.len(),
        }
    }
}

/// A routed request as the renderer needs it.
#[derive(Debug, Clone)]
pub(crate) struct RequestInfo {
    pub api: Api,
    /// The request log index, used in generated ids.
    pub index: usize,
    pub body: BodyFacts,
    /// What the prompt cache read and wrote for this request.
    pub cache: CacheUse,
    /// False under the scenario's `usage: never` (OpenAI only: no usage chunk or `usage`).
    pub report_usage: bool,
}

/// Used when neither the scenario nor the request names a model.
pub(super) const DEFAULT_MODEL: &str = "sim-model";
