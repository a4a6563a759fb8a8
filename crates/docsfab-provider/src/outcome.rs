//! What one provider request produced: a [`StreamOutcome`] when the stream ended as a stream
//! should, or a [`TransportFailure`] that carries the policy's [`ProviderFailure`].
//!
//! [`StreamReader`] turns decoded SSE events of either API into that result. It is pure (events
//! in, outcome out), so the end-of-stream rules below are tested without sockets:
//!
//! * OpenAI Chat Completions: a stream that closes cleanly with no finish reason and no `[DONE]`
//!   is `stream-incomplete` (CLS-2). One with `[DONE]` but no finish reason is an outcome with
//!   `finish_reason: None`, as before that rule existed (CLS-3); the runtime judges it.
//! * Anthropic Messages: every complete stream ends with `message_stop`, which plays the part of
//!   `[DONE]`, and `message_delta.stop_reason` plays the finish reason. So a clean close with
//!   neither is `stream-incomplete` too, and a stream with either one is an outcome. We apply the
//!   same rule on both APIs because the failure is the same (a hosted stream closed early) and a
//!   different answer per API would make the step retry depend on the wire format.
//! * A body that fails while transferring keeps its transport classification (`network`, or
//!   `timeout` for a read timeout) whatever was read before (CLS-3).

use docsfab_boundary::chunk::{Chunk, Tokens};
use docsfab_boundary::{Event, Redactor, SseEvent, Verdict};
use docsfab_policy::class::{ProviderFailure, classify_error_event};
use docsfab_record::{Api, FaultKind, ProviderErrorClass, Usage};
use serde::{Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;

/// Why the model stopped, normalized across both APIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end (`stop`, `end_turn`, `stop_sequence`).
    Stop,
    /// The output limit cut the answer (`length`, `max_tokens`).
    Length,
    /// The model asked for tools (`tool_calls`, `function_call`, `tool_use`).
    ToolCalls,
    /// The provider refused the content (`content_filter`, `refusal`).
    ContentFilter,
    /// Any other reason, as the provider spelled it.
    Other(String),
}

impl FinishReason {
    fn from_openai(s: &str) -> Self {
        match s {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.to_owned()),
        }
    }

    fn from_anthropic(s: &str) -> Self {
        match s {
            "end_turn" | "stop_sequence" => FinishReason::Stop,
            "max_tokens" => FinishReason::Length,
            "tool_use" => FinishReason::ToolCalls,
            "refusal" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool-calls",
            FinishReason::ContentFilter => "content-filter",
            FinishReason::Other(s) => s,
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A tool call the model made in this turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments text exactly as streamed.
    pub arguments: String,
    /// The arguments were cut: not valid JSON when the stream ended, or the output limit ended
    /// the answer. The agent loop rejects such a call before it runs (LSE-1).
    pub truncated: bool,
}

/// A provider answer whose stream ended as a stream should.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamOutcome {
    pub http_status: u16,
    pub text: String,
    /// Whether answer content (a text or tool-call delta) was published.
    pub content_published: bool,
    pub finish_reason: Option<FinishReason>,
    /// Whether the API's end marker arrived (`[DONE]` or `message_stop`).
    pub done: bool,
    pub usage: Usage,
    pub tool_calls: Vec<ToolCall>,
    /// Every model the stream named, in order of first mention.
    pub models: Vec<String>,
    /// The 200 body exactly as received, when the transport was asked to keep it
    /// ([`crate::HttpConfig::keep_raw_body`]): the composition route passes it through the
    /// response boundary to its client.
    #[serde(skip)]
    pub raw_body: Option<bytes::Bytes>,
    /// The boundary's verdict on that body, reached in the same pass that read it, with the
    /// configuration it was judged under ([`crate::HttpTransport::with_boundary`]).
    #[serde(skip)]
    pub verdict: Option<(docsfab_boundary::BoundaryConfig, Verdict)>,
    /// The rate-limit hints of the response head, read as the head arrived: the shared
    /// provider throttle paces later sends by them.
    #[serde(skip)]
    pub rate_headers: docsfab_throttle::RateHeaders,
    /// The gateway the answer came through, recognised from its head (issue 24). Boxed: it is
    /// rare, and the outcome travels inside every turn's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Box<docsfab_record::Gateway>>,
}

impl StreamOutcome {
    /// The verdict on the raw body under `config`: the one reached while reading, when it was
    /// reached under an equal configuration, else a fresh check. `None` without a raw body.
    pub fn verdict_under(&self, config: &docsfab_boundary::BoundaryConfig) -> Option<Verdict> {
        match &self.verdict {
            Some((judged, v)) if judged == config => Some(v.clone()),
            _ => self.raw_body.as_ref().map(|raw| config.check(raw)),
        }
    }

    /// The assistant message this answer adds to the conversation, for the next turn's request.
    #[cfg(any(test, feature = "testing"))]
    pub fn assistant_message(&self) -> crate::request::Message {
        crate::request::Message::Assistant {
            text: self.text.clone(),
            tool_calls: self
                .tool_calls
                .iter()
                .map(|c| crate::request::AssistantToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
        }
    }
}

/// A provider request that failed, with a one-line description for people.
///
/// `detail` is one line for people, built from statuses, error kinds and the provider's error
/// words. The provider chooses those words, so they pass the boundary's redactor (key shapes,
/// escapes, caps) as they are read, and [`HttpTransport`](crate::HttpTransport) passes the whole
/// failure through [`TransportFailure::redacted`] with its own key before returning it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct TransportFailure {
    pub failure: ProviderFailure,
    pub detail: String,
    /// Tokens the provider reported before the request failed (it may still bill them);
    /// unknown when it reported none (the driver then estimates what a sent request cost).
    /// Boxed, so a failure stays small on the error path.
    pub usage: Box<Usage>,
    /// Bytes of answer content (text, tool names and arguments) that arrived before the
    /// failure: what the driver estimates a cut answer's output tokens from.
    pub answer_bytes: u64,
    /// Models the stream named before it failed.
    pub models: Vec<String>,
    /// What the failed response's body said, when it said anything docsfab keeps. Boxed, so a
    /// failure stays small on the error path.
    pub body: Box<FailureBody>,
}

/// What docsfab keeps of a failed response's body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureBody {
    /// The provider's own words for the error: `error.type` and `error.code` of an error body
    /// or a structured error event, redacted, escaped and at most 64 characters each. Never the
    /// message, which some providers fill with request text, keys included.
    pub error_type: Option<String>,
    pub error_code: Option<String>,
    /// The whole 200 body, when the transport keeps raw bodies
    /// ([`crate::HttpConfig::keep_raw_body`]) and the body was read to its end: after a
    /// structured error event the transport reads on, within bounds, so the composition route
    /// can forward the provider's own event (BND-2). `None` for a body that was cut or that
    /// outran those bounds.
    pub raw: Option<bytes::Bytes>,
    /// The rate-limit hints of the response head (none when no head arrived), read as the head
    /// arrived: a 429's Retry-After and budgets feed the shared provider throttle.
    pub rate_headers: docsfab_throttle::RateHeaders,
    /// The gateway the failed response came through, recognised from its head (issue 24);
    /// `None` when no head arrived or it named no gateway docsfab knows.
    pub gateway: Option<docsfab_record::Gateway>,
    /// A context-overflow refusal the body stated in a server's own dialect, with the counts it
    /// gave ([`crate::overflow`]); read only for a failure already terminal by its class.
    pub overflow: Option<crate::overflow::Overflow>,
}

/// Error codes and types that say by themselves that the request did not fit the model's
/// context window (OpenAI's code, llama.cpp's type). Dialects that say it only in the message
/// (vLLM, Anthropic, TGI) are recognised by [`crate::overflow`] into [`FailureBody::overflow`].
const CONTEXT_EXHAUSTED_CODES: &[&str] = &["context_length_exceeded", "exceed_context_size_error"];

impl TransportFailure {
    /// A failure with no stream behind it (no response head, or a non-2xx status).
    pub fn new(failure: ProviderFailure, detail: impl Into<String>) -> Self {
        TransportFailure {
            failure,
            detail: detail.into(),
            usage: Box::new(Usage::UNKNOWN),
            answer_bytes: 0,
            models: Vec::new(),
            body: Box::default(),
        }
    }

    /// The failure with every text a provider could have chosen (the detail, the error words,
    /// the model names) passed through `redactor`: what leaves the transport is safe to print
    /// and to record. The raw body stays as it is, for the boundary to judge.
    pub fn redacted(mut self, redactor: &Redactor) -> Self {
        self.detail = redactor.line(&self.detail);
        let word = |w: &mut Option<String>| {
            if let Some(text) = w {
                *text = redactor.word(text);
            }
        };
        word(&mut self.body.error_type);
        word(&mut self.body.error_code);
        for m in &mut self.models {
            *m = redactor.word(m);
        }
        self
    }

    /// Whether the provider said the request exceeds the model's context window (STP-14:
    /// `context-exhausted`, never retried). Only a failure that is terminal by its class
    /// qualifies, so the words can never turn a retryable status into a terminal one (REP-4).
    pub fn context_exhausted(&self) -> bool {
        let terminal_class = matches!(
            self.failure.class,
            ProviderErrorClass::InvalidRequest | ProviderErrorClass::Unknown
        );
        let named = [&self.body.error_code, &self.body.error_type]
            .into_iter()
            .flatten()
            .any(|w| CONTEXT_EXHAUSTED_CODES.contains(&w.as_str()));
        terminal_class && (named || self.body.overflow.is_some())
    }

    /// The token counts of a context-exhausted failure (empty when the provider gave none);
    /// `None` for any other failure.
    pub fn context_window(&self) -> Option<docsfab_record::ContextWindow> {
        self.context_exhausted()
            .then(|| self.body.overflow.map(|o| o.window).unwrap_or_default())
    }
}

/// The redactor for text parsed before the transport's own key is at hand: key shapes, escapes
/// and caps. [`TransportFailure::redacted`] adds the host key on the way out of the transport.
static SHAPES_ONLY: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(Redactor::default);

/// A short, single-line, redacted rendering of a word the provider chose.
pub(crate) fn printable(s: &str) -> String {
    SHAPES_ONLY.word(s)
}

/// `error.type` and `error.code` of an error object, as strings (a numeric code as its digits).
pub(crate) fn error_words(error: &Value) -> (Option<String>, Option<String>) {
    let field = |k: &str| match &error[k] {
        Value::String(s) => Some(printable(s)),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    (field("type"), field("code"))
}

/// Builds a [`ProviderFailure`] with the fields that are usually empty left empty.
pub fn failure(fault: FaultKind, class: ProviderErrorClass) -> ProviderFailure {
    ProviderFailure {
        fault,
        class,
        http_status: None,
        declared_status: None,
        retry_after_ms: None,
        content_published: false,
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
    saw_argument_delta: bool,
}

impl PartialCall {
    /// Adds a streamed name fragment. OpenAI sends the name once and fragments append, but
    /// some servers repeat the whole name on every chunk of the call (reported against
    /// llama.cpp's streamed tool calls, PR #12379) and others send `""` on continuations: a
    /// fragment equal to the whole name so far is that repeat, not more name.
    fn add_name(&mut self, fragment: &str) {
        if self.name != fragment {
            self.name.push_str(fragment);
        }
    }
}

/// Reads the decoded events of one 200 stream into an outcome or a failure.
#[derive(Debug)]
pub struct StreamReader {
    api: Api,
    http_status: u16,
    text: String,
    published: bool,
    finish: Option<FinishReason>,
    done: bool,
    /// The usage members seen so far, as the API spells them (read into [`Usage`] at the end).
    tokens: Option<Tokens>,
    calls: BTreeMap<u64, PartialCall>,
    models: Vec<String>,
}

impl StreamReader {
    pub fn new(api: Api, http_status: u16) -> Self {
        StreamReader {
            api,
            http_status,
            text: String::new(),
            published: false,
            finish: None,
            done: false,
            tokens: None,
            calls: BTreeMap::new(),
            models: Vec::new(),
        }
    }

    /// Whether answer content has been published so far.
    pub fn content_published(&self) -> bool {
        self.published
    }

    /// Reads one event. `Err` ends the request: the stream carried an error.
    pub fn event(&mut self, ev: &SseEvent) -> Result<(), TransportFailure> {
        match self.api {
            Api::OpenaiChat => self.openai_event(ev),
            Api::AnthropicMessages => self.anthropic_event(ev),
        }
    }

    /// Reads one event decoded by [`docsfab_boundary::EventReader`], from the chunks the
    /// boundary's pass gathered, without parsing its lines again. What the chunks do not cover
    /// (a line that is not JSON, an error, an Anthropic event of several data lines) is read
    /// from the event's text, exactly as [`Self::event`] reads it.
    pub fn read(&mut self, ev: &Event) -> Result<(), TransportFailure> {
        for field in &ev.error_fields {
            self.error_field(field)?;
        }
        match self.api {
            Api::OpenaiChat => {
                for (i, chunk) in ev.chunks.iter().enumerate() {
                    match chunk {
                        Some(c) if !c.error => self.openai_chunk(c),
                        _ => self.openai_line(&ev.line(i))?,
                    }
                }
                Ok(())
            }
            Api::AnthropicMessages => {
                if let [Some(c)] = ev.chunks.as_slice() {
                    let ty = c.kind.as_deref().or(ev.event.as_deref()).unwrap_or("");
                    if ty != "error" && ev.event.as_deref() != Some("error") {
                        self.anthropic_chunk(c, ty);
                        return Ok(());
                    }
                }
                self.anthropic_event(&ev.to_sse())
            }
        }
    }

    /// An SSE `error:` field line (some llama.cpp builds: `server_sent_event(sink, "error",
    /// ...)`, then `data: [DONE]`). Its JSON is read as a structured error event under CLS-5/6:
    /// `{"error":{...}}` as it stands, a bare `{"code":..,"message":..,"type":..}` as the
    /// `error` member of one; an integer code is the declared status, the type is looked up in
    /// the closed lists, the message is never read for the class. A value that is not a JSON
    /// object is ignored, as SSE ignores a field it does not know.
    fn error_field(&mut self, value: &str) -> Result<(), TransportFailure> {
        let Ok(Value::Object(object)) = serde_json::from_str::<Value>(value) else {
            return Ok(());
        };
        let event = match object.get("error") {
            Some(e) if !e.is_null() => Value::Object(object),
            _ => serde_json::json!({ "error": Value::Object(object) }),
        };
        let mut failure = self.error_fail(&event);
        failure
            .detail
            .push_str(" (sent as an SSE `error:` field line)");
        Err(failure)
    }

    /// [`Self::openai_line`] for a line already read into a chunk with no error member.
    fn openai_chunk(&mut self, c: &Chunk) {
        if let Some(m) = &c.model {
            self.note_model_str(m);
        }
        if let Some(u) = c.usage {
            self.tokens = Some(u);
        }
        let Some(choices) = &c.choices else {
            return;
        };
        for choice in choices {
            if let Some(t) = &choice.content
                && !t.is_empty()
            {
                self.text.push_str(t);
                self.published = true;
            }
            if let Some(calls) = &choice.tool_calls {
                for (pos, c) in calls.iter().enumerate() {
                    let index = c.index.unwrap_or(pos as u64);
                    let call = self.calls.entry(index).or_default();
                    if let Some(id) = &c.id {
                        call.id.clone_from(id);
                    }
                    if let Some(name) = &c.name {
                        call.add_name(name);
                    }
                    if let Some(args) = &c.arguments {
                        call.arguments.push_str(args);
                        call.saw_argument_delta |= !args.is_empty();
                    }
                    self.published = true;
                }
            }
            if let Some(r) = &choice.finish_reason {
                self.finish = Some(FinishReason::from_openai(r));
            }
        }
    }

    /// The non-error part of [`Self::anthropic_event`] for a single-line event read into a
    /// chunk; `ty` is its type (the `type` member, else the event name).
    fn anthropic_chunk(&mut self, c: &Chunk, ty: &str) {
        match ty {
            "message_start" => {
                let m = &c.message;
                if let Some(model) = &m.model {
                    self.note_model_str(model);
                }
                self.tokens = m.usage;
            }
            "content_block_start" => {
                let index = c.index.unwrap_or(0);
                let block = &c.content_block;
                match block.kind.as_deref() {
                    Some("tool_use") => {
                        self.calls.insert(
                            index,
                            PartialCall {
                                id: block.id.clone().unwrap_or_default(),
                                name: block.name.clone().unwrap_or_default(),
                                ..PartialCall::default()
                            },
                        );
                        self.published = true;
                    }
                    Some("text") => {
                        if let Some(t) = &block.text
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            self.published = true;
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = c.index.unwrap_or(0);
                let delta = &c.delta;
                match delta.kind.as_deref() {
                    Some("text_delta") => {
                        if let Some(t) = &delta.text
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            self.published = true;
                        }
                    }
                    Some("input_json_delta") => {
                        let part = delta.partial_json.as_deref().unwrap_or_default();
                        let call = self.calls.entry(index).or_default();
                        call.arguments.push_str(part);
                        call.saw_argument_delta |= !part.is_empty();
                        self.published = true;
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = &c.delta.stop_reason {
                    self.finish = Some(FinishReason::from_anthropic(r));
                }
                if let Some(u) = c.usage {
                    self.merge_delta_tokens(u);
                }
            }
            "message_stop" => self.done = true,
            _ => {}
        }
    }

    /// The stream closed cleanly: an outcome, or `stream-incomplete` (CLS-2), or the refusal of
    /// a content-filter finish.
    pub fn finish(self) -> Result<StreamOutcome, TransportFailure> {
        if self.finish == Some(FinishReason::ContentFilter) {
            return Err(self.content_filter_finish());
        }
        if self.finish.is_none() && !self.done {
            let what = match self.api {
                Api::OpenaiChat => "no finish reason and no [DONE]",
                Api::AnthropicMessages => "no stop_reason and no message_stop",
            };
            let detail = format!("the stream closed cleanly with {what} (stream-incomplete)");
            return Err(self.fail(
                ProviderFailure::from_fault(FaultKind::StreamIncomplete),
                detail,
            ));
        }
        let usage = self.usage();
        let truncated_by_limit = self.finish == Some(FinishReason::Length);
        let tool_calls = self
            .calls
            .into_values()
            .map(|c| {
                let arguments = if c.arguments.trim().is_empty() && !c.saw_argument_delta {
                    "{}".to_owned()
                } else {
                    c.arguments
                };
                let valid = serde_json::from_str::<Value>(&arguments).is_ok();
                ToolCall {
                    id: c.id,
                    name: c.name,
                    truncated: truncated_by_limit || !valid,
                    arguments,
                }
            })
            .collect();
        Ok(StreamOutcome {
            http_status: self.http_status,
            text: self.text,
            content_published: self.published,
            finish_reason: self.finish,
            done: self.done,
            usage,
            tool_calls,
            models: self.models,
            raw_body: None,
            verdict: None,
            rate_headers: Default::default(),
            gateway: None,
        })
    }

    /// The body failed while transferring: it keeps that classification (CLS-3), unless the
    /// provider had already refused the content.
    pub fn cut(self, failure: ProviderFailure, detail: String) -> TransportFailure {
        if self.finish == Some(FinishReason::ContentFilter) {
            return self.content_filter_finish();
        }
        self.fail(failure, detail)
    }

    fn content_filter_finish(self) -> TransportFailure {
        self.fail(
            ProviderFailure::from_fault(FaultKind::ContentFilter),
            "the provider ended the answer with a content-filter finish reason".to_owned(),
        )
    }

    fn fail(self, mut f: ProviderFailure, detail: String) -> TransportFailure {
        f.content_published = self.published;
        TransportFailure {
            usage: Box::new(self.usage()),
            answer_bytes: self.answer_bytes(),
            models: self.models,
            ..TransportFailure::new(f, detail)
        }
    }

    /// `message_delta`'s counts are cumulative: each one it carries replaces the start's.
    fn merge_delta_tokens(&mut self, u: Tokens) {
        let t = self.tokens.get_or_insert_with(Tokens::default);
        let keep = |new: Option<u64>, old: Option<u64>| new.or(old);
        t.input_tokens = keep(u.input_tokens, t.input_tokens);
        t.output_tokens = keep(u.output_tokens, t.output_tokens);
        t.cache_creation_input_tokens =
            keep(u.cache_creation_input_tokens, t.cache_creation_input_tokens);
        t.cache_read_input_tokens = keep(u.cache_read_input_tokens, t.cache_read_input_tokens);
    }

    /// The usage reported so far, in docsfab's terms: `inputTokens` counts every prompt token
    /// on both APIs (Anthropic's `input_tokens` leaves the cache parts out, so they are added).
    fn usage(&self) -> Usage {
        let Some(t) = self.tokens else {
            return Usage::UNKNOWN;
        };
        match self.api {
            Api::OpenaiChat => Usage {
                input_tokens: t.prompt_tokens,
                output_tokens: t.completion_tokens,
                cache_read_tokens: t.cached_tokens.unwrap_or(0),
                ..Usage::UNKNOWN
            },
            Api::AnthropicMessages => {
                let write = t.cache_creation_input_tokens.unwrap_or(0);
                let read = t.cache_read_input_tokens.unwrap_or(0);
                Usage {
                    input_tokens: t
                        .input_tokens
                        .map(|i| i.saturating_add(write).saturating_add(read)),
                    output_tokens: t.output_tokens,
                    cache_write_tokens: write,
                    cache_read_tokens: read,
                    estimated: false,
                }
            }
        }
    }

    /// Bytes of answer content read so far (text, tool names and arguments).
    fn answer_bytes(&self) -> u64 {
        let calls: usize = self
            .calls
            .values()
            .map(|c| c.name.len() + c.arguments.len())
            .sum();
        (self.text.len() + calls) as u64
    }

    fn note_model(&mut self, v: &Value) {
        if let Some(m) = v.as_str() {
            self.note_model_str(m);
        }
    }

    fn note_model_str(&mut self, m: &str) {
        if !self.models.iter().any(|x| x == m) {
            self.models.push(m.to_owned());
        }
    }

    fn error_event(self_published: bool, v: &Value) -> (ProviderFailure, String) {
        let err = &v["error"];
        let is_filter = ["code", "type"].iter().any(|k| {
            matches!(
                err[*k].as_str(),
                Some("content_filter" | "content_policy_violation")
            )
        });
        let mut f = if is_filter {
            ProviderFailure::from_fault(FaultKind::ContentFilter)
        } else {
            match classify_error_event(v) {
                Some(c) => ProviderFailure::from_error_event(c),
                None => ProviderFailure::from_fault(FaultKind::ErrorEvent),
            }
        };
        f.content_published = self_published;
        // The message is never read (CLS-5): the detail names only the type and declared code.
        let ty = err["type"]
            .as_str()
            .map_or_else(|| "unknown".to_owned(), printable);
        let detail = match f.declared_status {
            Some(code) => format!("the 200 stream carried an error event: type {ty}, code {code}"),
            None => format!("the 200 stream carried an error event: type {ty}"),
        };
        (f, detail)
    }

    /// A 200 answer whose body is one JSON document instead of a stream: a structured error is
    /// classified like an error event; anything else is no stream at all (`unknown`).
    pub fn json_body(mut self, body: &[u8]) -> TransportFailure {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) if v.get("error").is_some_and(|e| !e.is_null()) => self.error_fail(&v),
            _ => {
                let f = ProviderFailure::from_fault(FaultKind::ErrorEvent);
                self.take_fail(
                    f,
                    "the provider answered 200 with a JSON body instead of an event stream"
                        .to_owned(),
                )
            }
        }
    }

    fn openai_event(&mut self, ev: &SseEvent) -> Result<(), TransportFailure> {
        // Each data line is one JSON chunk; a multi-line event is read line by line.
        for line in &ev.data_lines {
            self.openai_line(line)?;
        }
        Ok(())
    }

    fn openai_line(&mut self, line: &str) -> Result<(), TransportFailure> {
        if line.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if line.trim().is_empty() {
            return Ok(());
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => return Err(self.unreadable()),
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Err(self.error_fail(&v));
        }
        self.note_model(&v["model"]);
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.tokens = Some(tokens_of(u));
        }
        let Some(choices) = v["choices"].as_array() else {
            return Ok(());
        };
        for choice in choices {
            let delta = &choice["delta"];
            if let Some(t) = delta["content"].as_str()
                && !t.is_empty()
            {
                self.text.push_str(t);
                self.published = true;
            }
            if let Some(calls) = delta["tool_calls"].as_array() {
                for (pos, c) in calls.iter().enumerate() {
                    let index = c["index"].as_u64().unwrap_or(pos as u64);
                    let call = self.calls.entry(index).or_default();
                    if let Some(id) = c["id"].as_str() {
                        call.id = id.to_owned();
                    }
                    if let Some(name) = c["function"]["name"].as_str() {
                        call.add_name(name);
                    }
                    if let Some(args) = c["function"]["arguments"].as_str() {
                        call.arguments.push_str(args);
                        call.saw_argument_delta |= !args.is_empty();
                    }
                    self.published = true;
                }
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                self.finish = Some(FinishReason::from_openai(r));
            }
        }
        Ok(())
    }

    fn anthropic_event(&mut self, ev: &SseEvent) -> Result<(), TransportFailure> {
        if ev.data.trim().is_empty() {
            return Ok(());
        }
        let v: Value = match serde_json::from_str(&ev.data) {
            Ok(v) => v,
            Err(_) => return Err(self.unreadable()),
        };
        let ty = v["type"].as_str().or(ev.event.as_deref()).unwrap_or("");
        if ty == "error" || ev.event.as_deref() == Some("error") {
            return Err(self.error_fail(&v));
        }
        match ty {
            "message_start" => {
                let m = &v["message"];
                self.note_model(&m["model"]);
                self.tokens = m.get("usage").filter(|u| u.is_object()).map(tokens_of);
            }
            "content_block_start" => {
                let index = v["index"].as_u64().unwrap_or(0);
                let block = &v["content_block"];
                match block["type"].as_str() {
                    Some("tool_use") => {
                        self.calls.insert(
                            index,
                            PartialCall {
                                id: block["id"].as_str().unwrap_or_default().to_owned(),
                                name: block["name"].as_str().unwrap_or_default().to_owned(),
                                ..PartialCall::default()
                            },
                        );
                        self.published = true;
                    }
                    Some("text") => {
                        if let Some(t) = block["text"].as_str()
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            self.published = true;
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = v["index"].as_u64().unwrap_or(0);
                let delta = &v["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        if let Some(t) = delta["text"].as_str()
                            && !t.is_empty()
                        {
                            self.text.push_str(t);
                            self.published = true;
                        }
                    }
                    Some("input_json_delta") => {
                        let part = delta["partial_json"].as_str().unwrap_or_default();
                        let call = self.calls.entry(index).or_default();
                        call.arguments.push_str(part);
                        call.saw_argument_delta |= !part.is_empty();
                        self.published = true;
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v["delta"]["stop_reason"].as_str() {
                    self.finish = Some(FinishReason::from_anthropic(r));
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.merge_delta_tokens(tokens_of(u));
                }
            }
            "message_stop" => self.done = true,
            _ => {} // ping, content_block_stop, and events we do not need
        }
        Ok(())
    }

    fn unreadable(&mut self) -> TransportFailure {
        // A data line that is not JSON is no answer and no declared error: `unknown`, which is
        // never replayed.
        let f = ProviderFailure::from_fault(FaultKind::ErrorEvent);
        self.take_fail(
            f,
            "the 200 stream carried a data line that is not JSON".to_owned(),
        )
    }

    fn take_fail(&mut self, mut f: ProviderFailure, detail: String) -> TransportFailure {
        f.content_published = self.published;
        TransportFailure {
            usage: Box::new(self.usage()),
            answer_bytes: self.answer_bytes(),
            models: std::mem::take(&mut self.models),
            ..TransportFailure::new(f, detail)
        }
    }

    /// [`Self::take_fail`] for a structured error, keeping its type and code words.
    fn error_fail(&mut self, v: &Value) -> TransportFailure {
        let (f, detail) = Self::error_event(self.published, v);
        let (error_type, error_code) = error_words(&v["error"]);
        let mut failure = self.take_fail(f, detail);
        failure.body.error_type = error_type;
        failure.body.error_code = error_code;
        failure.body.overflow = crate::overflow::recognise(v);
        failure
    }
}

/// A `usage` object's counts, read as the boundary's chunk reads them (a member of the wrong
/// type is absent).
fn tokens_of(u: &Value) -> Tokens {
    let n = |k: &str| u[k].as_u64();
    Tokens {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        input_tokens: n("input_tokens"),
        output_tokens: n("output_tokens"),
        cache_creation_input_tokens: n("cache_creation_input_tokens"),
        cache_read_input_tokens: n("cache_read_input_tokens"),
        cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_boundary::SseDecoder;

    /// Decodes `body` as one stream that closed cleanly.
    fn read(api: Api, body: &str) -> Result<StreamOutcome, TransportFailure> {
        let mut dec = SseDecoder::new();
        let mut events = Vec::new();
        dec.feed(body.as_bytes(), |e| events.push(e));
        dec.finish(|e| events.push(e));
        let mut r = StreamReader::new(api, 200);
        for e in &events {
            r.event(e)?;
        }
        r.finish()
    }

    /// Reads `body` through the boundary's event reader (the transport's path), split into two
    /// reads at `cut`.
    fn read_split(api: Api, body: &[u8], cut: usize) -> Result<StreamOutcome, TransportFailure> {
        let mut dec = docsfab_boundary::EventReader::new();
        let mut r = StreamReader::new(api, 200);
        let mut failed = None;
        let mut on = |e: &Event| {
            if failed.is_none() {
                failed = r.read(e).err();
            }
        };
        dec.feed(&body[..cut], &mut on);
        dec.feed(&body[cut..], &mut on);
        dec.finish(&mut on);
        match failed {
            Some(f) => Err(f),
            None => r.finish(),
        }
    }

    // CLS-5/CLS-6 on an SSE `error:` field line (llama.cpp), at every split of the raw bytes
    // (BND-9 style): a declared 500 is `server` (replayed), a declared 503 in the wrapped shape
    // too, a declared 429 is a rate limit without HTTP status (terminal, REP-6), and a declared
    // 400 overflow is named context-exhausted with its counts (STP-14).
    #[test]
    fn error_field_lines_are_structured_error_events_at_every_split_cls_5_cls_6() {
        let content = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let cases: [(&str, ProviderErrorClass, Option<u16>); 4] = [
            (
                "error: {\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}\n\ndata: [DONE]\n\n",
                ProviderErrorClass::Server,
                Some(500),
            ),
            (
                "error: {\"error\":{\"code\":503,\"type\":\"unavailable_error\"}}\r\n\r\ndata: [DONE]",
                ProviderErrorClass::Server,
                Some(503),
            ),
            (
                "error: {\"code\":429,\"message\":\"slow down\",\"type\":\"rate_limit_error\"}\n\ndata: [DONE]\n\n",
                ProviderErrorClass::RateLimit,
                Some(429),
            ),
            (
                "error: {\"code\":400,\"message\":\"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":5000,\"n_ctx\":4096}\n\ndata: [DONE]\n\n",
                ProviderErrorClass::InvalidRequest,
                Some(400),
            ),
        ];
        for (tail, class, declared) in cases {
            for prefix in ["", content] {
                let body = format!("{prefix}{tail}");
                for cut in 0..=body.len() {
                    let f = read_split(Api::OpenaiChat, body.as_bytes(), cut).unwrap_err();
                    let p = f.failure;
                    assert_eq!(
                        (p.class, p.declared_status),
                        (class, declared),
                        "{body} @{cut}"
                    );
                    assert_eq!(p.http_status, None);
                    assert_eq!(p.content_published, !prefix.is_empty());
                    assert!(!p.is_throttled(), "a declared 429 is no HTTP 429 (REP-6)");
                    assert!(f.detail.contains("`error:` field line"), "{}", f.detail);
                    assert_eq!(f.context_exhausted(), declared == Some(400));
                }
            }
        }
        let f = read_split(Api::OpenaiChat, cases[3].0.as_bytes(), 0).unwrap_err();
        let w = f.context_window().unwrap();
        assert_eq!(
            (w.prompt_tokens, w.context_tokens),
            (Some(5000), Some(4096))
        );
        // The Anthropic transport reads the field the same way.
        let f = read_split(Api::AnthropicMessages, cases[0].0.as_bytes(), 3).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::Server);
    }

    // Tool calls as real servers stream them, assembled by index: no ids, the id and the whole
    // name repeated on every chunk, `name: ""` on continuations.
    #[test]
    fn tool_call_dialects_assemble_into_one_call_by_index() {
        let head = |call: &str| {
            format!(
                "data: {{\"model\":\"m\",\"choices\":[{{\"delta\":{{\"tool_calls\":[{call}]}}}}]}}\n\n"
            )
        };
        let end = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
        let bodies = [
            [
                r#"{"index":0,"type":"function","function":{"name":"read_file","arguments":""}}"#,
                r#"{"index":0,"function":{"arguments":"{\"path\":"}}"#,
                r#"{"index":0,"function":{"arguments":"\"a\"}"}}"#,
            ],
            [
                r#"{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":""}}"#,
                r#"{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}"#,
                r#"{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":"\"a\"}"}}"#,
            ],
            [
                r#"{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":""}}"#,
                r#"{"index":0,"function":{"name":"","arguments":"{\"path\":"}}"#,
                r#"{"index":0,"function":{"name":"","arguments":"\"a\"}"}}"#,
            ],
        ];
        for calls in bodies {
            let body: String = calls.iter().map(|c| head(c)).collect::<String>() + end;
            for o in [
                read(Api::OpenaiChat, &body).unwrap(),
                read_split(Api::OpenaiChat, body.as_bytes(), body.len() / 2).unwrap(),
            ] {
                assert_eq!(o.tool_calls.len(), 1, "{body}");
                let c = &o.tool_calls[0];
                assert_eq!(
                    (c.name.as_str(), c.arguments.as_str()),
                    ("read_file", "{\"path\":\"a\"}")
                );
                assert!(!c.truncated);
            }
        }
    }

    #[test]
    fn an_error_field_that_is_not_a_json_object_is_ignored_as_sse_says() {
        let body = "error: oops\n\nerror: [1]\n\ndata: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        for cut in 0..=body.len() {
            let o = read_split(Api::OpenaiChat, body.as_bytes(), cut).unwrap();
            assert_eq!((o.text.as_str(), o.done), ("Hi", true));
        }
    }

    const OA_TEXT: &str = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn openai_complete_stream() {
        let o = read(Api::OpenaiChat, OA_TEXT).unwrap();
        assert_eq!(o.text, "Hello");
        assert!(o.content_published && o.done);
        assert_eq!(o.finish_reason, Some(FinishReason::Stop));
        assert_eq!(
            o.usage,
            Usage {
                input_tokens: Some(11),
                output_tokens: Some(2),
                ..Usage::ZERO
            }
        );
        assert_eq!(o.models, vec!["m1".to_string()]);
    }

    // Proves CLS-2.
    #[test]
    fn openai_clean_close_without_finish_or_done_is_stream_incomplete_cls_2() {
        let body = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        let f = read(Api::OpenaiChat, body).unwrap_err();
        assert_eq!(f.failure.fault, FaultKind::StreamIncomplete);
        assert_eq!(f.failure.class, ProviderErrorClass::StreamIncomplete);
        assert!(f.failure.content_published);
    }

    // Proves CLS-3.
    #[test]
    fn openai_done_without_finish_is_not_stream_incomplete_cls_3() {
        let body = "data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
        let o = read(Api::OpenaiChat, body).unwrap();
        assert!(o.done);
        assert_eq!(o.finish_reason, None);
    }

    // Proves CLS-3.
    #[test]
    fn openai_cut_body_keeps_network_class_cls_3() {
        let mut r = StreamReader::new(Api::OpenaiChat, 200);
        let f = r.event(&SseEvent {
            event: None,
            data: String::new(),
            data_lines: vec![],
        });
        assert!(f.is_ok());
        let f = r.cut(
            ProviderFailure::from_fault(FaultKind::BodyCut),
            "cut".into(),
        );
        assert_eq!(f.failure.class, ProviderErrorClass::Network);
        assert!(!f.failure.content_published);
    }

    #[test]
    fn openai_tool_calls_and_truncation() {
        let body = "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"pa\"}}]}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":\\\"a\\\"}\"}}]}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"list_files\",\"arguments\":\"{\\\"pa\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: [DONE]\n\n";
        let o = read(Api::OpenaiChat, body).unwrap();
        assert_eq!(o.finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(o.tool_calls.len(), 2);
        assert_eq!(o.tool_calls[0].arguments, "{\"path\":\"a\"}");
        assert!(!o.tool_calls[0].truncated);
        assert!(
            o.tool_calls[1].truncated,
            "invalid JSON at the end is truncated"
        );
        assert!(o.content_published);
    }

    #[test]
    fn an_answer_becomes_the_next_requests_assistant_message() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"Let me look.\",\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"a\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
        let o = read(Api::OpenaiChat, body).unwrap();
        assert_eq!(
            o.assistant_message(),
            crate::request::Message::Assistant {
                text: "Let me look.".into(),
                tool_calls: vec![crate::request::AssistantToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: "{\"path\":\"a\"}".into(),
                }],
            }
        );
    }

    #[test]
    fn length_finish_marks_tool_arguments_truncated() {
        let body = "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"t\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
        let o = read(Api::OpenaiChat, body).unwrap();
        assert!(o.tool_calls[0].truncated);
    }

    // Proves CLS-1.
    #[test]
    fn content_filter_finish_is_content_filter_cls_1() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"content_filter\"}]}\n\ndata: [DONE]\n\n";
        let f = read(Api::OpenaiChat, body).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::ContentFilter);
        assert_eq!(f.failure.fault, FaultKind::ContentFilter);
    }

    // Proves REP-5.
    #[test]
    fn content_filter_error_code_is_content_filter_rep_5() {
        // The message mentions a timeout; the class still comes from the code.
        let body = "data: {\"error\":{\"code\":\"content_filter\",\"message\":\"connection timeout\"}}\n\n";
        let f = read(Api::OpenaiChat, body).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::ContentFilter);
    }

    // Proves STP-14 (context-exhausted from the error words only) and REP-4 (the words never
    // override a retryable class).
    #[test]
    fn context_exhausted_is_read_from_type_or_code_of_a_terminal_failure_stp_14() {
        let body = "data: {\"error\":{\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\",\"message\":\"too long\"}}\n\n";
        let f = read(Api::OpenaiChat, body).unwrap_err();
        assert_eq!(
            f.body.error_code.as_deref(),
            Some("context_length_exceeded")
        );
        assert!(f.context_exhausted());
        let mut f = TransportFailure::new(
            failure(FaultKind::HttpStatus, ProviderErrorClass::Server),
            "HTTP 503",
        );
        f.body.error_code = Some("context_length_exceeded".into());
        assert!(!f.context_exhausted());
        // Anthropic names it only in the message: the bounded matcher names it, with counts,
        // and the class the event's type gave stays as it was.
        let body = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 9 tokens > 8 maximum\"}}\n\n";
        let f = read(Api::AnthropicMessages, body).unwrap_err();
        assert_eq!(f.body.error_type.as_deref(), Some("invalid_request_error"));
        assert_eq!(f.failure.class, ProviderErrorClass::InvalidRequest);
        assert!(f.context_exhausted());
        let w = f.context_window().unwrap();
        assert_eq!((w.prompt_tokens, w.context_tokens), (Some(9), Some(8)));
    }

    // REP-4 with STP-14: an overflow in the words of a retryable failure (a declared 503, a
    // server-fault type) is never named context-exhausted, so it stays retryable.
    #[test]
    fn overflow_words_never_make_a_retryable_failure_terminal_rep_4_stp_14() {
        let body = "data: {\"error\":{\"code\":503,\"type\":\"exceed_context_size_error\",\"message\":\"request (9 tokens) exceeds the available context size (8 tokens)\"}}\n\n";
        let f = read(Api::OpenaiChat, body).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::Server);
        assert!(f.body.overflow.is_some());
        assert!(!f.context_exhausted());
        assert_eq!(f.context_window(), None);
    }

    #[test]
    fn unparseable_data_line_is_unknown() {
        let f = read(Api::OpenaiChat, "data: {nope\n\n").unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::Unknown);
    }

    const AN_TEXT: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\":\"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"read_file\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\":\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"a\\\"}\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":7}}\n\n";

    #[test]
    fn anthropic_complete_stream() {
        let body = format!("{AN_TEXT}event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n");
        let o = read(Api::AnthropicMessages, &body).unwrap();
        assert_eq!(o.text, "Hi");
        assert!(o.done);
        assert_eq!(o.finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(
            o.usage,
            Usage {
                input_tokens: Some(9),
                output_tokens: Some(7),
                ..Usage::ZERO
            }
        );
        assert_eq!(o.tool_calls[0].arguments, "{\"path\":\"a\"}");
        assert!(!o.tool_calls[0].truncated);
        assert_eq!(o.models, vec!["claude-x".to_string()]);
    }

    #[test]
    fn anthropic_stop_reason_without_message_stop_is_an_outcome() {
        let o = read(Api::AnthropicMessages, AN_TEXT).unwrap();
        assert!(!o.done);
    }

    // Proves CLS-2.
    #[test]
    fn anthropic_clean_close_without_stop_is_stream_incomplete_cls_2() {
        let body = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"c\"}}\n\n";
        let f = read(Api::AnthropicMessages, body).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::StreamIncomplete);
        assert!(!f.failure.content_published);
    }

    #[test]
    fn anthropic_refusal_is_content_filter() {
        let body = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let f = read(Api::AnthropicMessages, body).unwrap_err();
        assert_eq!(f.failure.class, ProviderErrorClass::ContentFilter);
    }
}
