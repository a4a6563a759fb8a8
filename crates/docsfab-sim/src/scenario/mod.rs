//! The scenario: what the simulator answers to each incoming request, in order.
//!
//! The YAML is read into `Raw*` types (strict: unknown fields are refused), then checked and turned
//! into the resolved types below, where each response kind is one enum variant and the seeded random
//! models are already expanded into a fixed list. Doing the expansion at load time keeps a run
//! deterministic however requests interleave, and lets the request log name each generated entry.
//!
//! This file holds the resolved scenario and how it picks the answer to a request; `load` reads
//! a scenario file (`Scenario::load`, `Scenario::from_yaml_str`), `raw` is the YAML as written
//! and `resolve` checks it and turns it into the resolved types.

mod load;
mod raw;
mod resolve;

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;

use serde::Deserialize;

use crate::capacity::Capacity;

/// A loaded, checked scenario. Build it with [`Scenario::from_yaml_str`] or [`Scenario::load`].
#[derive(Debug, Clone)]
pub struct Scenario {
    name: Option<String>,
    slots: Vec<Slot>,
    /// `ends[i]` is the script index one past the last request answered by `slots[i]`.
    ends: Vec<u64>,
    fallback: Fallback,
    /// The provider's rate limit, when the scenario gives one.
    capacity: Option<Capacity>,
    /// Scripts chosen by the request's content; a request no lane takes uses the main script.
    lanes: Vec<Lane>,
    /// Top-level `usage: reported | never`.
    usage: UsageReports,
    /// Top-level `stream_options: accept | refuse`.
    stream_options: StreamOptions,
}

/// `lanes[i]`: requests whose body contains `contains` are answered from this lane's own
/// script, in their own arrival order, so concurrent conversations (fan-out instances) each get
/// their own answers however their requests interleave.
#[derive(Debug, Clone)]
struct Lane {
    contains: String,
    /// Its responses and fallback; never has lanes or a capacity of its own.
    script: Scenario,
}

/// One scripted entry after expansion: answers `repeat` consecutive requests.
#[derive(Debug, Clone)]
struct Slot {
    label: String,
    repeat: u32,
    step: Arc<Step>,
}

/// What answers requests past the script. Each variant holds what it needs, so an empty script
/// with a fallback that needs one cannot be built.
#[derive(Debug, Clone)]
enum Fallback {
    RepeatLast(Slot),
    Cycle(NonZeroU64),
    Respond(Arc<Step>),
}

/// What one request gets: an optional delay before anything is sent, then an action.
#[derive(Debug)]
pub(crate) struct Step {
    pub delay_ms: u64,
    pub action: Action,
}

#[derive(Debug)]
pub(crate) enum Action {
    /// Read the request, then close the connection without a response.
    Drop(CloseHow),
    Respond(Response),
}

/// How a connection ends early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CloseHow {
    /// An orderly close (FIN).
    Close,
    /// An abortive close (RST, through `SO_LINGER = 0`).
    Reset,
}

#[derive(Debug)]
pub(crate) struct Response {
    pub reply: Reply,
    /// Extra response headers, in the order given (after the simulator's own defaults, which a
    /// header of the same name replaces).
    pub headers: Vec<(String, String)>,
    pub stall: Option<Stall>,
    pub cut: Option<Cut>,
}

#[derive(Debug)]
pub(crate) enum Reply {
    Status(StatusReply),
    Answer(Box<Answer>),
    StreamError(StreamErrorReply),
}

#[derive(Debug)]
pub(crate) struct StatusReply {
    pub status: u16,
    pub body: StatusBody,
}

#[derive(Debug)]
pub(crate) enum StatusBody {
    /// One body. `None`: a provider-style JSON error body fitting the status and the API.
    Single { text: Option<String>, chunked: bool },
    /// Sent chunked, one HTTP chunk per item, so a scenario can write any stream byte for byte.
    Chunks { items: Vec<String>, delay_ms: u64 },
}

#[derive(Debug)]
pub(crate) struct Answer {
    /// The assistant text (a `json:` answer is stored as its compact JSON text).
    pub content: Option<String>,
    pub deltas: NonZeroUsize,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub model: Option<String>,
    pub faults: StreamFaults,
}

#[derive(Debug)]
pub(crate) struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    pub arguments: String,
    pub deltas: NonZeroUsize,
    pub truncate_at: Option<usize>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Anthropic's `cache_creation_input_tokens` (reported as 0 when not given).
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
    /// Anthropic's `cache_read_input_tokens` (reported as 0 when not given).
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    /// OpenAI's `prompt_tokens_details.cached_tokens` (sent only when given).
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

/// The scenario's top-level `usage`: whether the provider reports usage at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum UsageReports {
    /// As the API does: OpenAI's usage chunk when `stream_options.include_usage` asks for it,
    /// Anthropic's usage always.
    #[default]
    Reported,
    /// An OpenAI-compatible server that never sends `usage` (no usage chunk, no `usage` in a JSON
    /// answer). Anthropic answers keep theirs.
    Never,
}

/// The scenario's top-level `stream_options`: what the provider does with an OpenAI request
/// that has a `stream_options` member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum StreamOptions {
    #[default]
    Accept,
    /// 400 with OpenAI's "Unrecognized request argument supplied: stream_options".
    Refuse,
}

#[derive(Debug, Default)]
pub(crate) struct StreamFaults {
    pub omit_finish_reason: bool,
    pub omit_done: bool,
    pub error_event: Option<ErrorEvent>,
    pub framing: LineFraming,
    pub foreign_model: Option<String>,
    pub after_done: Vec<String>,
    pub event_delay_ms: u64,
    /// Server dialects: shapes real servers send that the OpenAI reference does not.
    pub quirks: Vec<Quirk>,
}

/// A documented shape of a real OpenAI-compatible server (docs/compat-results.md, "Servers"),
/// for the OpenAI stream. The Anthropic stream ignores them: none of them is Anthropic's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Quirk {
    /// An SSE comment line (`: ping`) before every event, as keep-alive pings.
    PingComments,
    /// The `error_event` is sent as an SSE `error:` field line in llama.cpp's bare shape
    /// (`error: {"code":..,"message":..,"type":..}`), followed by `data: [DONE]` and nothing else.
    ErrorFieldLine,
    /// No `id` member on any tool-call chunk.
    ToolIdsMissing,
    /// The call's `id`, `type` and whole `function.name` repeated on every chunk of the call.
    ToolIdEveryChunk,
    /// `function.name: ""` on every argument chunk after the first.
    ToolNameEmptyOnContinuations,
    /// Each tool call whole (id, name, all arguments) in one chunk that also carries the finish
    /// reason; with `finish_reason: stop` this is the llama.cpp / Ollama shape.
    ToolCallsWhole,
    /// The usage chunk carries members OpenAI does not send (`*_details: null`, `timings`).
    UsageExtraMembers,
    /// One more chunk with an empty delta and `finish_reason: null` right before `[DONE]`.
    NullFinishChunk,
    /// The finish chunk sent twice.
    DuplicateFinish,
}

/// How SSE lines are terminated and prefixed.
#[derive(Debug, Clone, Default)]
pub(crate) struct LineFraming {
    pub line_ending: LineEnding,
    pub bom: Option<Bom>,
    /// Re-cut the stream into HTTP chunks of this many bytes (instead of one chunk per event).
    pub chunk_bytes: Option<NonZeroUsize>,
    /// Also end a chunk between the CR and the LF of every CRLF.
    pub split_crlf: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LineEnding {
    #[default]
    Lf,
    Crlf,
    Cr,
    /// Cycles LF, CRLF, CR line by line.
    Mixed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Bom {
    #[serde(default = "one")]
    pub count: usize,
    #[serde(default)]
    pub lines: BomLines,
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BomLines {
    /// Every non-blank line.
    #[default]
    All,
    /// Only the first line of the body.
    First,
    /// Only `data:` lines.
    Data,
}

/// A structured error event inside a 200 stream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ErrorEvent {
    #[serde(rename = "type")]
    pub kind: String,
    /// Sent verbatim: usually an integer status, but any JSON scalar is allowed.
    #[serde(default)]
    pub code: Option<serde_json::Value>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug)]
pub(crate) struct StreamErrorReply {
    pub event: ErrorEvent,
    pub done: bool,
    pub framing: LineFraming,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Stall {
    #[serde(default)]
    pub after_bytes: u64,
    pub ms: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Cut {
    pub after_bytes: u64,
    pub with: CloseHow,
}

/// The scenario entry chosen for one request.
pub(crate) struct Pick {
    pub label: String,
    pub step: Arc<Step>,
}

impl Scenario {
    /// The scenario's optional `name`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The scenario's rate limit, if any.
    pub(crate) fn capacity(&self) -> Option<&Capacity> {
        self.capacity.as_ref()
    }

    /// Whether the provider reports usage (top-level `usage`).
    pub(crate) fn usage_reports(&self) -> UsageReports {
        self.usage
    }

    /// What the provider does with an OpenAI `stream_options` member (top-level
    /// `stream_options`).
    pub(crate) fn stream_options(&self) -> StreamOptions {
        self.stream_options
    }

    /// How many requests the script answers before the fallback takes over.
    pub fn scripted_len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The label of the entry that answers the request with this 0-based script index, as written
    /// to the request log's `entry` field.
    #[cfg(any(test, feature = "testing"))]
    pub fn entry_label(&self, index: u64) -> String {
        self.pick(index).label
    }

    /// The lane whose text the request body contains (the first such, in the file's order).
    pub(crate) fn lane_for(&self, body: &[u8]) -> Option<usize> {
        self.lanes.iter().position(|lane| {
            let needle = lane.contains.as_bytes();
            body.windows(needle.len()).any(|w| w == needle)
        })
    }

    /// How many lanes the scenario has.
    pub(crate) fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// The answer for the `index`th request of `lane` (the main script for `None`).
    pub(crate) fn pick_in(&self, lane: Option<usize>, index: u64) -> Pick {
        match lane.and_then(|i| self.lanes.get(i).map(|l| (i, l))) {
            None => self.pick(index),
            Some((i, l)) => {
                let inner = l.script.pick(index);
                Pick {
                    label: format!("lanes[{i}] {}", inner.label),
                    step: inner.step,
                }
            }
        }
    }

    pub(crate) fn pick(&self, index: u64) -> Pick {
        let total = self.scripted_len();
        if index < total {
            return self.scripted(index);
        }
        match &self.fallback {
            Fallback::Respond(step) => Pick {
                label: "fallback".to_owned(),
                step: Arc::clone(step),
            },
            Fallback::Cycle(total) => {
                let inner = self.scripted(index % total.get());
                Pick {
                    label: format!("{} (fallback: cycle)", inner.label),
                    step: inner.step,
                }
            }
            Fallback::RepeatLast(slot) => Pick {
                label: format!("{} (fallback: repeat-last)", slot.label),
                step: Arc::clone(&slot.step),
            },
        }
    }

    fn scripted(&self, index: u64) -> Pick {
        let at = self.ends.partition_point(|&end| end <= index);
        let slot = &self.slots[at];
        let start = if at == 0 { 0 } else { self.ends[at - 1] };
        let label = if slot.repeat > 1 {
            format!("{}#{}", slot.label, index - start + 1)
        } else {
            slot.label.clone()
        };
        Pick {
            label,
            step: Arc::clone(&slot.step),
        }
    }
}
