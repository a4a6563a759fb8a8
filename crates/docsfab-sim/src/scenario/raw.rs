//! The scenario's YAML as written, deserialised strictly (an unknown field is refused); `resolve`
//! checks it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_saphyr::Spanned;

use super::{Bom, CloseHow, Cut, ErrorEvent, LineEnding, Quirk, Stall, Usage};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) responses: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    pub(super) fallback: Option<Spanned<RawFallback>>,
    #[serde(default)]
    pub(super) capacity: Option<Spanned<RawCapacity>>,
    #[serde(default)]
    pub(super) lanes: Vec<Spanned<RawLane>>,
    #[serde(default)]
    pub(super) usage: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) stream_options: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLane {
    pub(super) contains: String,
    #[serde(default)]
    pub(super) responses: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    pub(super) fallback: Option<Spanned<RawFallback>>,
}

/// `capacity:` keeps the camelCase names fixed in the interfaces document.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawCapacity {
    pub(super) requests_per_minute: u64,
    #[serde(default)]
    pub(super) tokens_per_minute: Option<u64>,
    #[serde(default)]
    pub(super) burst: Option<u64>,
    #[serde(default)]
    pub(super) time_scale: Option<f64>,
    #[serde(default)]
    pub(super) limit_header: Option<String>,
    #[serde(default)]
    pub(super) headers: Option<String>,
    #[serde(default)]
    pub(super) retry_after: Option<String>,
    #[serde(default)]
    pub(super) token_burst_seconds: Option<u64>,
    #[serde(default)]
    pub(super) tokens: Option<String>,
    #[serde(default)]
    pub(super) outside_share: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawFallback {
    RepeatLast,
    Cycle,
    Respond(Box<Spanned<RawEntry>>),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntry {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) repeat: Option<u32>,
    #[serde(default)]
    pub(super) delay_ms: Option<u64>,

    // The response kinds: exactly one per entry.
    #[serde(default)]
    pub(super) status: Option<u16>,
    #[serde(default)]
    pub(super) drop: Option<CloseHow>,
    #[serde(default)]
    pub(super) answer: Option<RawAnswer>,
    #[serde(default)]
    pub(super) stream_error: Option<RawStreamError>,
    #[serde(default)]
    pub(super) random: Option<RawRandom>,

    // Only with `status`.
    #[serde(default)]
    pub(super) body: Option<String>,
    #[serde(default)]
    pub(super) chunked: Option<bool>,
    #[serde(default)]
    pub(super) chunks: Option<Vec<String>>,
    #[serde(default)]
    pub(super) chunk_delay_ms: Option<u64>,

    // With any kind that sends a response.
    #[serde(default)]
    pub(super) headers: Option<BTreeMap<String, ScalarText>>,
    #[serde(default)]
    pub(super) stall: Option<Stall>,
    #[serde(default)]
    pub(super) cut: Option<Cut>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnswer {
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) json: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) deltas: Option<usize>,
    #[serde(default)]
    pub(super) tool_calls: Vec<RawToolCall>,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
    #[serde(default)]
    pub(super) model: Option<String>,
    // Stream faults.
    #[serde(default)]
    pub(super) omit_finish_reason: bool,
    #[serde(default)]
    pub(super) omit_done: bool,
    #[serde(default)]
    pub(super) error_event: Option<ErrorEvent>,
    #[serde(default)]
    pub(super) line_ending: LineEnding,
    #[serde(default)]
    pub(super) bom: Option<Bom>,
    #[serde(default)]
    pub(super) chunk_bytes: Option<usize>,
    #[serde(default)]
    pub(super) split_crlf: bool,
    #[serde(default)]
    pub(super) foreign_model: Option<String>,
    #[serde(default)]
    pub(super) after_done: Vec<String>,
    #[serde(default)]
    pub(super) event_delay_ms: u64,
    #[serde(default)]
    pub(super) quirks: Vec<Quirk>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToolCall {
    #[serde(default)]
    pub(super) id: Option<String>,
    pub(super) name: String,
    #[serde(default)]
    pub(super) arguments: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) deltas: Option<usize>,
    #[serde(default)]
    pub(super) truncate_arguments: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStreamError {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) code: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) message: Option<String>,
    #[serde(default = "yes")]
    pub(super) done: bool,
    #[serde(default)]
    pub(super) line_ending: LineEnding,
    #[serde(default)]
    pub(super) bom: Option<Bom>,
    #[serde(default)]
    pub(super) chunk_bytes: Option<usize>,
    #[serde(default)]
    pub(super) split_crlf: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRandom {
    pub(super) seed: u64,
    pub(super) episodes: u32,
    #[serde(default)]
    pub(super) burst: Option<RawBurst>,
    #[serde(default)]
    pub(super) throttle: Option<RawThrottle>,
    pub(super) then: Box<Spanned<RawEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBurst {
    /// Inclusive `[min, max]` number of faults per burst.
    pub(super) length: [u32; 2],
    pub(super) statuses: Vec<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawThrottle {
    #[serde(default)]
    pub(super) chance: Option<f64>,
    pub(super) persistence: f64,
    #[serde(default)]
    pub(super) max_run: Option<u32>,
    #[serde(default)]
    pub(super) retry_after: Vec<ScalarText>,
    #[serde(default)]
    pub(super) retry_after_ms: Vec<u64>,
}

/// A YAML scalar taken as text, so `retry-after: 2` and `retry-after: "2"` mean the same.
pub(super) struct ScalarText(pub(super) String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ScalarText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
        }
        deserializer.deserialize_any(V)
    }
}
