//! The scenario: what the simulator answers to each incoming request, in order.
//!
//! The YAML is read into `Raw*` types (strict: unknown fields are refused), then checked and turned
//! into the resolved types below, where each response kind is one enum variant and the seeded random
//! models are already expanded into a fixed list. Doing the expansion at load time keeps a run
//! deterministic however requests interleave, and lets the request log name each generated entry.

use std::collections::BTreeMap;
use std::fmt;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_saphyr::Spanned;

use crate::SimError;
use crate::capacity::{Capacity, CapacitySpec};
use crate::rng::SplitMix64;

/// Repeats are counted, not copied, but random models are expanded entry by entry: cap the
/// expansion so a typo in `episodes` cannot exhaust memory.
const MAX_EXPANDED_ENTRIES: usize = 100_000;

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
    /// Parses and checks a scenario. `source` names the text in error messages (usually its path).
    pub fn from_yaml_str(text: &str, source: &str) -> Result<Scenario, SimError> {
        // The same YAML budget as the configuration files (docsfab-policy's `from_yaml`).
        let options = serde_saphyr::options! {
            strict_booleans: true,
            with_snippet: false,
            budget: serde_saphyr::budget! {
                max_depth: 40,
                max_nodes: 50_000,
                max_aliases: 64,
                max_documents: 1,
            },
        };
        let raw: RawScenario = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
            let line = e.location().map(|l| l.line()).filter(|&l| l > 0);
            SimError::Scenario {
                file: source.to_owned(),
                line,
                message: plain_yaml_message(&e),
            }
        })?;
        let fail = |line: Option<u64>, message: String| SimError::Scenario {
            file: source.to_owned(),
            line,
            message,
        };
        Resolver::default()
            .scenario(raw)
            .map_err(|e| fail(e.line, e.message))
    }

    /// Reads and parses a scenario file.
    /// Only a regular file of at most 1 MiB is read: a FIFO would block `sim serve` before it
    /// listens and `/dev/zero` would fill memory.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        use std::io::{Error, ErrorKind, Read as _};
        const MAX_BYTES: u64 = 1024 * 1024;
        let fail = |source: Error| SimError::ReadScenario {
            path: path.to_owned(),
            source,
        };
        // Checked before opening, since opening a FIFO for reading waits for a writer.
        let meta = std::fs::metadata(path).map_err(fail)?;
        if !meta.is_file() {
            return Err(fail(Error::new(
                ErrorKind::InvalidInput,
                "it is not a regular file",
            )));
        }
        let too_big = || {
            fail(Error::new(
                ErrorKind::InvalidInput,
                format!("it is larger than {MAX_BYTES} bytes"),
            ))
        };
        if meta.len() > MAX_BYTES {
            return Err(too_big());
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(fail)?
            .take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(fail)?;
        if text.len() as u64 > MAX_BYTES {
            return Err(too_big());
        }
        Scenario::from_yaml_str(&text, &path.display().to_string())
    }

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

/// serde-saphyr's rendering carries its own location prefix; keep only the message so that ours
/// (file and line) comes first and is not repeated.
fn plain_yaml_message(e: &serde_saphyr::Error) -> String {
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
    // Drop a trailing " at line L, column C" that some messages carry.
    let message = match first.find(" at line ") {
        Some(at) => &first[..at],
        None => first,
    };
    // Keep the sentence single: drop the library's advice on its own options.
    let message = match message.find(", set DuplicateKeyPolicy") {
        Some(at) => &message[..at],
        None => message,
    };
    // Say what was expected in words rather than in Rust type names.
    let plain = match message {
        "invalid u16" => "expected a whole number from 0 to 65535",
        "invalid u32" => "expected a whole number from 0 to 4294967295",
        "invalid u64" | "invalid usize" => "expected a whole number, 0 or more",
        "invalid f64" => "expected a number",
        "expected sequence start" => "expected a list here",
        "expected mapping start" => "expected a mapping (key: value) here",
        m if m.starts_with("budget breached") => {
            "the scenario is larger or deeper than allowed (at most 40 levels, 50000 values, 64 aliases)"
        }
        m if m.starts_with("multiple YAML documents") => {
            "the file holds more than one YAML document (a second --- line)"
        }
        other => other,
    };
    plain.to_owned()
}

// ---------------------------------------------------------------------------------------------
// Raw, strictly deserialised YAML.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    responses: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    fallback: Option<Spanned<RawFallback>>,
    #[serde(default)]
    capacity: Option<Spanned<RawCapacity>>,
    #[serde(default)]
    lanes: Vec<Spanned<RawLane>>,
    #[serde(default)]
    usage: Option<Spanned<String>>,
    #[serde(default)]
    stream_options: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLane {
    contains: String,
    #[serde(default)]
    responses: Vec<Spanned<RawEntry>>,
    #[serde(default)]
    fallback: Option<Spanned<RawFallback>>,
}

/// `capacity:` keeps the camelCase names fixed in the interfaces document.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCapacity {
    requests_per_minute: u64,
    #[serde(default)]
    tokens_per_minute: Option<u64>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    time_scale: Option<f64>,
    #[serde(default)]
    limit_header: Option<String>,
    #[serde(default)]
    headers: Option<String>,
    #[serde(default)]
    retry_after: Option<String>,
    #[serde(default)]
    token_burst_seconds: Option<u64>,
    #[serde(default)]
    tokens: Option<String>,
    #[serde(default)]
    outside_share: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RawFallback {
    RepeatLast,
    Cycle,
    Respond(Box<Spanned<RawEntry>>),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    repeat: Option<u32>,
    #[serde(default)]
    delay_ms: Option<u64>,

    // The response kinds: exactly one per entry.
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    drop: Option<CloseHow>,
    #[serde(default)]
    answer: Option<RawAnswer>,
    #[serde(default)]
    stream_error: Option<RawStreamError>,
    #[serde(default)]
    random: Option<RawRandom>,

    // Only with `status`.
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    chunked: Option<bool>,
    #[serde(default)]
    chunks: Option<Vec<String>>,
    #[serde(default)]
    chunk_delay_ms: Option<u64>,

    // With any kind that sends a response.
    #[serde(default)]
    headers: Option<BTreeMap<String, ScalarText>>,
    #[serde(default)]
    stall: Option<Stall>,
    #[serde(default)]
    cut: Option<Cut>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAnswer {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    json: Option<serde_json::Value>,
    #[serde(default)]
    deltas: Option<usize>,
    #[serde(default)]
    tool_calls: Vec<RawToolCall>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    model: Option<String>,
    // Stream faults.
    #[serde(default)]
    omit_finish_reason: bool,
    #[serde(default)]
    omit_done: bool,
    #[serde(default)]
    error_event: Option<ErrorEvent>,
    #[serde(default)]
    line_ending: LineEnding,
    #[serde(default)]
    bom: Option<Bom>,
    #[serde(default)]
    chunk_bytes: Option<usize>,
    #[serde(default)]
    split_crlf: bool,
    #[serde(default)]
    foreign_model: Option<String>,
    #[serde(default)]
    after_done: Vec<String>,
    #[serde(default)]
    event_delay_ms: u64,
    #[serde(default)]
    quirks: Vec<Quirk>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
    #[serde(default)]
    deltas: Option<usize>,
    #[serde(default)]
    truncate_arguments: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStreamError {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default = "yes")]
    done: bool,
    #[serde(default)]
    line_ending: LineEnding,
    #[serde(default)]
    bom: Option<Bom>,
    #[serde(default)]
    chunk_bytes: Option<usize>,
    #[serde(default)]
    split_crlf: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRandom {
    seed: u64,
    episodes: u32,
    #[serde(default)]
    burst: Option<RawBurst>,
    #[serde(default)]
    throttle: Option<RawThrottle>,
    then: Box<Spanned<RawEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBurst {
    /// Inclusive `[min, max]` number of faults per burst.
    length: [u32; 2],
    statuses: Vec<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawThrottle {
    #[serde(default)]
    chance: Option<f64>,
    persistence: f64,
    #[serde(default)]
    max_run: Option<u32>,
    #[serde(default)]
    retry_after: Vec<ScalarText>,
    #[serde(default)]
    retry_after_ms: Vec<u64>,
}

/// A YAML scalar taken as text, so `retry-after: 2` and `retry-after: "2"` mean the same.
struct ScalarText(String);

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

// ---------------------------------------------------------------------------------------------
// Checking and resolving.

/// The one response kind an entry names.
enum Kind {
    Status(u16),
    Drop(CloseHow),
    Answer(Box<RawAnswer>),
    StreamError(RawStreamError),
    Random,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Status(_) => "status",
            Kind::Drop(_) => "drop",
            Kind::Answer(_) => "answer",
            Kind::StreamError(_) => "stream_error",
            Kind::Random => "random",
        }
    }
}

struct Invalid {
    line: Option<u64>,
    message: String,
}

type Checked<T> = Result<T, Invalid>;

/// The one response kind an entry gives (status, drop, answer, stream_error or random), taken
/// out of it.
fn one_kind(entry: &mut RawEntry, line: u64) -> Checked<Kind> {
    let mut kinds: Vec<Kind> = Vec::with_capacity(1);
    kinds.extend(entry.status.take().map(Kind::Status));
    kinds.extend(entry.drop.take().map(Kind::Drop));
    kinds.extend(entry.answer.take().map(|a| Kind::Answer(Box::new(a))));
    kinds.extend(entry.stream_error.take().map(Kind::StreamError));
    if entry.random.is_some() {
        kinds.push(Kind::Random);
    }
    match kinds.len() {
        1 => Ok(kinds.remove(0)),
        0 => invalid(
            line,
            "the entry has no response kind: give exactly one of status, drop, answer, stream_error, random",
        ),
        _ => {
            let names: Vec<&str> = kinds.iter().map(Kind::name).collect();
            invalid(
                line,
                format!(
                    "the entry has several response kinds ({}); give exactly one",
                    names.join(", ")
                ),
            )
        }
    }
}

/// A status entry's body: one text (chunked or not) or timed chunks.
fn status_body(
    status: u16,
    body: Option<String>,
    chunks: Option<Vec<String>>,
    chunked: Option<bool>,
    chunk_delay_ms: Option<u64>,
    line: u64,
) -> Checked<StatusBody> {
    if !(200..=999).contains(&status) {
        return invalid(
            line,
            format!("status {status} is not a final HTTP status (200..999)"),
        );
    }
    match (body, chunks) {
        (Some(_), Some(_)) => invalid(line, "give body or chunks, not both"),
        (_, Some(_)) if chunked == Some(false) => {
            invalid(line, "chunks are always sent chunked; drop chunked: false")
        }
        (_, Some(items)) => Ok(StatusBody::Chunks {
            items,
            delay_ms: chunk_delay_ms.unwrap_or(0),
        }),
        (_, None) if chunk_delay_ms.is_some() => invalid(line, "chunk_delay_ms needs chunks"),
        (text, None) => Ok(StatusBody::Single {
            text,
            chunked: chunked.unwrap_or(false),
        }),
    }
}

/// A response header: name and value.
type Header = (String, String);

#[derive(Default)]
struct Resolver {
    expanded: usize,
}

fn invalid<T>(line: u64, message: impl Into<String>) -> Checked<T> {
    Err(Invalid {
        line: Some(line),
        message: message.into(),
    })
}

/// For each slot, how many requests the script answers up to and including it.
fn script_ends(slots: &[Slot]) -> Vec<u64> {
    let mut ends = Vec::with_capacity(slots.len());
    let mut total: u64 = 0;
    for slot in slots {
        total += u64::from(slot.repeat);
        ends.push(total);
    }
    ends
}

/// `capacity:` checked into the simulator's rate limit.
fn checked_capacity(spanned: Spanned<RawCapacity>) -> Checked<Capacity> {
    let c = spanned.value;
    Capacity::check(CapacitySpec {
        requests_per_minute: c.requests_per_minute,
        tokens_per_minute: c.tokens_per_minute,
        burst: c.burst,
        time_scale: c.time_scale,
        limit_header: c.limit_header,
        headers: c.headers,
        retry_after: c.retry_after,
        token_burst_seconds: c.token_burst_seconds,
        tokens: c.tokens,
        outside_share: c.outside_share,
    })
    .or_else(|m| invalid(spanned.referenced.line(), m))
}

/// `usage:`: whether the provider reports usage as the API does (`reported`, the default) or,
/// as some OpenAI-compatible servers, never (`never`).
fn checked_usage(raw: Option<Spanned<String>>) -> Checked<UsageReports> {
    let Some(spanned) = raw else {
        return Ok(UsageReports::Reported);
    };
    match spanned.value.as_str() {
        "reported" => Ok(UsageReports::Reported),
        "never" => Ok(UsageReports::Never),
        other => invalid(
            spanned.referenced.line(),
            format!("usage must be reported or never, not {other}"),
        ),
    }
}

/// `stream_options:`: whether an OpenAI request that has a `stream_options` member is answered
/// (`accept`, the default) or refused with a 400 (`refuse`).
fn checked_stream_options(raw: Option<Spanned<String>>) -> Checked<StreamOptions> {
    let Some(spanned) = raw else {
        return Ok(StreamOptions::Accept);
    };
    match spanned.value.as_str() {
        "accept" => Ok(StreamOptions::Accept),
        "refuse" => Ok(StreamOptions::Refuse),
        other => invalid(
            spanned.referenced.line(),
            format!("stream_options must be accept or refuse, not {other}"),
        ),
    }
}

impl Resolver {
    fn scenario(&mut self, raw: RawScenario) -> Checked<Scenario> {
        let mut slots = Vec::new();
        for (i, entry) in raw.responses.into_iter().enumerate() {
            self.entry(entry, format!("responses[{i}]"), &mut slots)?;
        }
        let ends = script_ends(&slots);
        let total = ends.last().copied().unwrap_or(0);
        let fallback = self.fallback(raw.fallback, &slots, total)?;
        let capacity = raw.capacity.map(checked_capacity).transpose()?;
        let mut lanes = Vec::with_capacity(raw.lanes.len());
        for spanned in raw.lanes {
            lanes.push(self.lane(spanned)?);
        }
        Ok(Scenario {
            name: raw.name,
            slots,
            ends,
            fallback,
            capacity,
            lanes,
            usage: checked_usage(raw.usage)?,
            stream_options: checked_stream_options(raw.stream_options)?,
        })
    }

    /// What answers the requests past the script: `fallback:` as written, or the last scripted
    /// response repeated when it is left out. `total` is how many requests the script answers.
    fn fallback(
        &mut self,
        raw: Option<Spanned<RawFallback>>,
        slots: &[Slot],
        total: u64,
    ) -> Checked<Fallback> {
        let empty = || Invalid {
            line: None,
            message:
                "responses is empty: script at least one response or set `fallback: {respond: ...}`"
                    .to_owned(),
        };
        let repeat_last = || slots.last().cloned().map(Fallback::RepeatLast);
        let Some(spanned) = raw else {
            return repeat_last().ok_or_else(empty);
        };
        let line = spanned.referenced.line();
        match spanned.value {
            RawFallback::RepeatLast => repeat_last().ok_or_else(empty),
            RawFallback::Cycle => NonZeroU64::new(total)
                .map(Fallback::Cycle)
                .ok_or_else(empty),
            RawFallback::Respond(entry) => {
                let entry_line = entry.referenced.line();
                let entry = entry.value;
                if entry.random.is_some() {
                    return invalid(line, "fallback.respond cannot be a random model");
                }
                if entry.repeat.is_some() {
                    return invalid(
                        entry_line,
                        "fallback.respond takes no repeat: it answers every request past the script",
                    );
                }
                Ok(Fallback::Respond(Arc::new(self.step(entry, entry_line)?)))
            }
        }
    }

    fn lane(&mut self, spanned: Spanned<RawLane>) -> Checked<Lane> {
        let line = spanned.referenced.line();
        let raw = spanned.value;
        if raw.contains.is_empty() {
            return invalid(
                line,
                "lanes[].contains is empty: give the text that marks this lane's requests",
            );
        }
        let script = self
            .scenario(RawScenario {
                name: None,
                responses: raw.responses,
                fallback: raw.fallback,
                capacity: None,
                lanes: Vec::new(),
                usage: None,
                stream_options: None,
            })
            .map_err(|e| Invalid {
                line: e.line.or(Some(line)),
                message: format!("in the lane for {:?}: {}", raw.contains, e.message),
            })?;
        Ok(Lane {
            contains: raw.contains,
            script,
        })
    }

    fn entry(
        &mut self,
        spanned: Spanned<RawEntry>,
        index_label: String,
        out: &mut Vec<Slot>,
    ) -> Checked<()> {
        let line = spanned.referenced.line();
        let mut entry = spanned.value;
        let label = match entry.name.take() {
            Some(name) if name.trim().is_empty() || name.chars().any(char::is_control) => {
                return invalid(
                    line,
                    "name must be non-empty text without control characters",
                );
            }
            Some(name) => name,
            None => index_label,
        };
        if let Some(random) = entry.random.take() {
            return self.random(entry, random, line, &label, out);
        }
        let repeat = match entry.repeat {
            Some(0) => return invalid(line, "repeat must be at least 1"),
            Some(n) => n,
            None => 1,
        };
        let step = self.step(entry, line)?;
        self.push(
            out,
            Slot {
                label,
                repeat,
                step: Arc::new(step),
            },
            line,
        )
    }

    fn push(&mut self, out: &mut Vec<Slot>, slot: Slot, line: u64) -> Checked<()> {
        self.expanded += 1;
        if self.expanded > MAX_EXPANDED_ENTRIES {
            return invalid(
                line,
                format!(
                    "the scenario expands to more than {MAX_EXPANDED_ENTRIES} entries; use repeat or fewer episodes"
                ),
            );
        }
        out.push(slot);
        Ok(())
    }

    /// Checks a non-random entry and builds what it does.
    fn step(&mut self, mut entry: RawEntry, line: u64) -> Checked<Step> {
        let kind = one_kind(&mut entry, line)?;
        let name = kind.name();
        if !matches!(kind, Kind::Status(_)) {
            for (field, set) in [
                ("body", entry.body.is_some()),
                ("chunked", entry.chunked.is_some()),
                ("chunks", entry.chunks.is_some()),
                ("chunk_delay_ms", entry.chunk_delay_ms.is_some()),
            ] {
                if set {
                    return invalid(
                        line,
                        format!("{field} is only allowed with status, not with {name}"),
                    );
                }
            }
        }
        let delay_ms = entry.delay_ms.unwrap_or(0);
        let reply = match kind {
            Kind::Random => {
                return invalid(line, "a random model cannot be nested here");
            }
            Kind::Drop(how) => {
                for (field, set) in [
                    ("headers", entry.headers.is_some()),
                    ("stall", entry.stall.is_some()),
                    ("cut", entry.cut.is_some()),
                ] {
                    if set {
                        return invalid(
                            line,
                            format!("{field} is not allowed with drop: nothing is sent"),
                        );
                    }
                }
                return Ok(Step {
                    delay_ms,
                    action: Action::Drop(how),
                });
            }
            Kind::Status(status) => {
                let body = status_body(
                    status,
                    entry.body.take(),
                    entry.chunks.take(),
                    entry.chunked,
                    entry.chunk_delay_ms,
                    line,
                )?;
                Reply::Status(StatusReply { status, body })
            }
            Kind::Answer(answer) => Reply::Answer(Box::new(
                resolve_answer(*answer).or_else(|m| invalid(line, m))?,
            )),
            Kind::StreamError(raw) => Reply::StreamError(StreamErrorReply {
                event: ErrorEvent {
                    kind: raw.kind,
                    code: raw.code,
                    message: raw.message,
                },
                done: raw.done,
                framing: line_framing(raw.line_ending, raw.bom, raw.chunk_bytes, raw.split_crlf)
                    .or_else(|m| invalid(line, m))?,
            }),
        };
        let headers = match entry.headers {
            None => Vec::new(),
            Some(map) => {
                let mut headers = Vec::with_capacity(map.len());
                for (name, ScalarText(value)) in map {
                    check_header(&name, &value).or_else(|m| invalid(line, m))?;
                    headers.push((name, value));
                }
                headers
            }
        };
        Ok(Step {
            delay_ms,
            action: Action::Respond(Response {
                reply,
                headers,
                stall: entry.stall,
                cut: entry.cut,
            }),
        })
    }

    fn random(
        &mut self,
        entry: RawEntry,
        random: RawRandom,
        line: u64,
        label: &str,
        out: &mut Vec<Slot>,
    ) -> Checked<()> {
        alone_with_random(&entry, line)?;
        if random.episodes == 0 {
            return invalid(line, "random.episodes must be at least 1");
        }
        if random.burst.is_none() && random.throttle.is_none() {
            return invalid(line, "random needs burst, throttle or both");
        }
        if let Some(burst) = &random.burst {
            check_burst(burst, line)?;
        }
        let throttle = match &random.throttle {
            None => None,
            Some(t) => Some(throttle_model(t, random.burst.is_some(), line)?),
        };
        let then_line = random.then.referenced.line();
        let then = random.then.value;
        if then.random.is_some() {
            return invalid(then_line, "random.then cannot itself be a random model");
        }
        let then_repeat = match then.repeat {
            Some(0) => return invalid(then_line, "repeat must be at least 1"),
            Some(n) => n,
            None => 1,
        };
        let then_step = Arc::new(self.step(then, then_line)?);

        let mut rng = SplitMix64::new(random.seed);
        let mut fault_steps: BTreeMap<(u16, Option<Header>), Arc<Step>> = BTreeMap::new();
        let mut fault = |status: u16, header: Option<Header>| {
            Arc::clone(
                fault_steps
                    .entry((status, header.clone()))
                    .or_insert_with(|| Arc::new(bare_status(status, header))),
            )
        };
        for episode in 0..random.episodes {
            let throttled = match (&throttle, &random.burst) {
                (Some(t), Some(_)) => rng.chance(t.chance),
                (Some(_), None) => true,
                (None, _) => false,
            };
            let mut faults: Vec<Arc<Step>> = Vec::new();
            if let (true, Some(t)) = (throttled, &throttle) {
                loop {
                    let header = if t.retry_after.is_empty() {
                        None
                    } else {
                        t.retry_after[rng.below(t.retry_after.len() as u64) as usize].clone()
                    };
                    faults.push(fault(429, header));
                    if faults.len() as u32 >= t.max_run || !rng.chance(t.persistence) {
                        break;
                    }
                }
            } else if let Some(burst) = &random.burst {
                let [min, max] = burst.length;
                let length = min + rng.below(u64::from(max - min) + 1) as u32;
                for _ in 0..length {
                    let status = burst.statuses[rng.below(burst.statuses.len() as u64) as usize];
                    faults.push(fault(status, None));
                }
            }
            for (k, step) in faults.into_iter().enumerate() {
                self.push(
                    out,
                    Slot {
                        label: format!("{label}.episode[{episode}].fault[{k}]"),
                        repeat: 1,
                        step,
                    },
                    line,
                )?;
            }
            self.push(
                out,
                Slot {
                    label: format!("{label}.episode[{episode}].then"),
                    repeat: then_repeat,
                    step: Arc::clone(&then_step),
                },
                line,
            )?;
        }
        Ok(())
    }
}

/// A random model's entry holds nothing else: its responses go in `random.then`.
fn alone_with_random(entry: &RawEntry, line: u64) -> Checked<()> {
    let others = [
        ("repeat", entry.repeat.is_some()),
        ("delay_ms", entry.delay_ms.is_some()),
        ("status", entry.status.is_some()),
        ("drop", entry.drop.is_some()),
        ("answer", entry.answer.is_some()),
        ("stream_error", entry.stream_error.is_some()),
        ("body", entry.body.is_some()),
        ("chunked", entry.chunked.is_some()),
        ("chunks", entry.chunks.is_some()),
        ("chunk_delay_ms", entry.chunk_delay_ms.is_some()),
        ("headers", entry.headers.is_some()),
        ("stall", entry.stall.is_some()),
        ("cut", entry.cut.is_some()),
    ];
    match others.iter().find(|(_, set)| *set) {
        Some((field, _)) => invalid(
            line,
            format!(
                "{field} is not allowed next to random (use episodes, and put responses in random.then)"
            ),
        ),
        None => Ok(()),
    }
}

/// A fault a random model draws: the status with an empty body, and its Retry-After if any.
fn bare_status(status: u16, header: Option<Header>) -> Step {
    Step {
        delay_ms: 0,
        action: Action::Respond(Response {
            reply: Reply::Status(StatusReply {
                status,
                body: StatusBody::Single {
                    text: None,
                    chunked: false,
                },
            }),
            headers: header.into_iter().collect(),
            stall: None,
            cut: None,
        }),
    }
}

/// Checks a random model's burst: a sane length range and final HTTP statuses.
fn check_burst(burst: &RawBurst, line: u64) -> Checked<()> {
    let [min, max] = burst.length;
    if min > max {
        return invalid(
            line,
            format!("random.burst.length [{min}, {max}]: min is above max"),
        );
    }
    if max > 10_000 {
        return invalid(line, "random.burst.length max must be at most 10000");
    }
    if burst.statuses.is_empty() {
        return invalid(line, "random.burst.statuses must name at least one status");
    }
    if let Some(bad) = burst.statuses.iter().find(|s| !(200..=999).contains(*s)) {
        return invalid(
            line,
            format!("random.burst.statuses: {bad} is not a final HTTP status"),
        );
    }
    Ok(())
}

/// A random model's throttle runs, checked.
struct ThrottleModel {
    /// The chance that an episode is a throttle run (1 when there is no burst to choose from).
    chance: f64,
    /// The chance that a throttle run goes on after each 429.
    persistence: f64,
    /// The longest throttle run.
    max_run: u32,
    /// The Retry-After headers to draw from for each 429 (`None`: no header).
    retry_after: Vec<Option<Header>>,
}

fn throttle_model(t: &RawThrottle, with_burst: bool, line: u64) -> Checked<ThrottleModel> {
    let chance = match (t.chance, with_burst) {
        (Some(c), _) => c,
        (None, false) => 1.0,
        (None, true) => {
            return invalid(
                line,
                "random.throttle.chance is required when burst is also given (the chance that an episode is a throttle run)",
            );
        }
    };
    for (field, p) in [("chance", chance), ("persistence", t.persistence)] {
        if !(0.0..=1.0).contains(&p) {
            return invalid(
                line,
                format!("random.throttle.{field} must be between 0 and 1, not {p}"),
            );
        }
    }
    let max_run = t.max_run.unwrap_or(23);
    if max_run == 0 || max_run > 10_000 {
        return invalid(line, "random.throttle.max_run must be between 1 and 10000");
    }
    let mut retry_after: Vec<Option<Header>> = Vec::new();
    for ScalarText(v) in &t.retry_after {
        if v.is_empty() {
            retry_after.push(None);
        } else {
            check_header("retry-after", v).or_else(|m| invalid(line, m))?;
            retry_after.push(Some(("retry-after".to_owned(), v.clone())));
        }
    }
    for ms in &t.retry_after_ms {
        retry_after.push(Some(("retry-after-ms".to_owned(), ms.to_string())));
    }
    Ok(ThrottleModel {
        chance,
        persistence: t.persistence,
        max_run,
        retry_after,
    })
}

fn resolve_answer(raw: RawAnswer) -> Result<Answer, String> {
    let content = match (raw.text, raw.json) {
        (Some(_), Some(_)) => return Err("answer takes text or json, not both".to_owned()),
        (Some(text), None) => Some(text),
        (None, Some(value)) => Some(value.to_string()),
        (None, None) => None,
    };
    let deltas = nonzero(raw.deltas, "answer.deltas")?;
    let mut tool_calls = Vec::with_capacity(raw.tool_calls.len());
    for call in raw.tool_calls {
        if call.name.is_empty() {
            return Err("answer.tool_calls: name must not be empty".to_owned());
        }
        let arguments = match call.arguments {
            None => "{}".to_owned(),
            // A string is sent verbatim, so a scenario can send arguments that are not JSON.
            Some(serde_json::Value::String(s)) => s,
            Some(value) => value.to_string(),
        };
        tool_calls.push(ToolCall {
            id: call.id,
            name: call.name,
            arguments,
            deltas: nonzero(call.deltas, "answer.tool_calls.deltas")?,
            truncate_at: call.truncate_arguments,
        });
    }
    if raw.quirks.contains(&Quirk::ErrorFieldLine) && raw.error_event.is_none() {
        return Err("answer.quirks: error-field-line needs an error_event to send".to_owned());
    }
    if let Some(reason) = &raw.finish_reason
        && reason.is_empty()
    {
        return Err("answer.finish_reason must not be empty (use omit_finish_reason)".to_owned());
    }
    Ok(Answer {
        content,
        deltas,
        tool_calls,
        finish_reason: raw.finish_reason,
        usage: raw.usage,
        model: raw.model,
        faults: StreamFaults {
            omit_finish_reason: raw.omit_finish_reason,
            omit_done: raw.omit_done,
            error_event: raw.error_event,
            framing: line_framing(raw.line_ending, raw.bom, raw.chunk_bytes, raw.split_crlf)?,
            foreign_model: raw.foreign_model,
            after_done: raw.after_done,
            event_delay_ms: raw.event_delay_ms,
            quirks: raw.quirks,
        },
    })
}

fn line_framing(
    line_ending: LineEnding,
    bom: Option<Bom>,
    chunk_bytes: Option<usize>,
    split_crlf: bool,
) -> Result<LineFraming, String> {
    if let Some(bom) = &bom {
        check_bom(bom)?;
    }
    let chunk_bytes = match chunk_bytes {
        None => None,
        Some(n) => Some(NonZeroUsize::new(n).ok_or("chunk_bytes must be at least 1")?),
    };
    Ok(LineFraming {
        line_ending,
        bom,
        chunk_bytes,
        split_crlf,
    })
}

fn nonzero(value: Option<usize>, field: &str) -> Result<NonZeroUsize, String> {
    match value {
        None => Ok(NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN)),
        Some(n) => NonZeroUsize::new(n).ok_or_else(|| format!("{field} must be at least 1")),
    }
}

fn check_bom(bom: &Bom) -> Result<(), String> {
    if bom.count == 0 || bom.count > 16 {
        return Err("bom.count must be between 1 and 16".to_owned());
    }
    Ok(())
}

/// Header names must be HTTP tokens and values must not break the response head.
fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!(
            "header name {name:?} is not a valid HTTP header name"
        ));
    }
    if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
        return Err(format!(
            "header {name}: the value must not contain CR, LF or NUL"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower == "content-length" || lower == "transfer-encoding" || lower == "connection" {
        return Err(format!(
            "header {name} is set by the simulator (it frames the body); use chunked or cut instead"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (label, status, headers) of every scripted entry that answers with a status.
    fn statuses(s: &Scenario) -> Vec<(String, u16, Vec<Header>)> {
        s.slots
            .iter()
            .filter_map(|slot| match &slot.step.action {
                Action::Respond(Response {
                    reply: Reply::Status(reply),
                    headers,
                    ..
                }) => Some((slot.label.clone(), reply.status, headers.clone())),
                _ => None,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The expansion of a random model keeps every promise the format makes, for any seed.
        #[test]
        fn random_models_keep_their_bounds(
            seed in any::<u64>(),
            episodes in 1u32..30,
            min in 0u32..6,
            extra in 0u32..6,
            chance in 0.0f64..=1.0,
            persistence in 0.0f64..=1.0,
            max_run in 1u32..30,
        ) {
            let max = min + extra;
            let yaml = format!(
                "responses:\n  - random:\n      seed: {seed}\n      episodes: {episodes}\n      \
                 burst: {{length: [{min}, {max}], statuses: [408, 503]}}\n      \
                 throttle: {{chance: {chance}, persistence: {persistence}, max_run: {max_run}, \
                 retry_after: ['2', ''], retry_after_ms: [150]}}\n      then: {{status: 200}}\n"
            );
            let s = Scenario::from_yaml_str(&yaml, "prop").unwrap();
            let again = Scenario::from_yaml_str(&yaml, "prop").unwrap();
            prop_assert_eq!(statuses(&s), statuses(&again));

            let all = statuses(&s);
            prop_assert_eq!(all.iter().filter(|(l, ..)| l.ends_with(".then")).count(), episodes as usize);
            for e in 0..episodes {
                let prefix = format!("responses[0].episode[{e}].fault[");
                let faults: Vec<_> = all.iter().filter(|(l, ..)| l.starts_with(&prefix)).collect();
                let throttled = faults.iter().any(|(_, status, _)| *status == 429);
                if throttled {
                    prop_assert!(faults.iter().all(|(_, status, _)| *status == 429));
                    prop_assert!((1..=max_run as usize).contains(&faults.len()));
                    for (_, _, headers) in &faults {
                        let allowed: [&[Header]; 3] = [
                            &[],
                            &[("retry-after".to_owned(), "2".to_owned())],
                            &[("retry-after-ms".to_owned(), "150".to_owned())],
                        ];
                        prop_assert!(allowed.contains(&headers.as_slice()), "{:?}", headers);
                    }
                } else {
                    prop_assert!((min as usize..=max as usize).contains(&faults.len()));
                    prop_assert!(faults.iter().all(|(_, status, h)| [408, 503].contains(status) && h.is_empty()));
                }
            }
        }
    }

    #[test]
    fn persistence_one_runs_to_max_run_and_zero_stops_at_one() {
        let run = |persistence: f64| {
            let yaml = format!(
                "responses:\n  - random:\n      seed: 3\n      episodes: 5\n      \
                 throttle: {{persistence: {persistence}, max_run: 9}}\n      then: {{status: 200}}\n"
            );
            let s = Scenario::from_yaml_str(&yaml, "p").unwrap();
            statuses(&s)
                .iter()
                .filter(|(_, status, _)| *status == 429)
                .count()
        };
        assert_eq!(run(1.0), 5 * 9);
        assert_eq!(run(0.0), 5);
    }
}
