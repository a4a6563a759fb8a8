//! Turns a scenario response into bytes in the shape of the API that was called.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::cache::{BilledUsage, CacheProbe, CacheUse};
use crate::capacity::{
    Capacity, Dimension, Gauge, HeaderFamily, Refusal, RetryAfter, TokenCharge, Verdict,
};
use crate::http::{Framing, Outgoing};
use crate::scenario::{
    Action, Answer, BomLines, ErrorEvent, LineEnding, LineFraming, Quirk, Reply, Response,
    StatusBody, StatusReply, Step, StreamErrorReply, StreamFaults, ToolCall,
};

/// Which provider API a request addressed (chosen by its path): docsfab's one `Api`.
pub(crate) use docsfab_record::Api;

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
const DEFAULT_MODEL: &str = "sim-model";

/// A scripted response's body, rendered when the request is numbered, and what it bills.
pub(crate) struct Rendered {
    /// The response without the rate-limit and scenario headers ([`finish_headers`] adds them).
    pub out: Outgoing,
    pub bill: Bill,
}

/// What a rendered response bills, however much of it is sent.
#[derive(Debug, Clone)]
pub(crate) struct Bill {
    /// Billed when the body is sent to its end (the usage the body reports).
    full: BilledUsage,
    kind: BillKind,
}

#[derive(Debug, Clone)]
enum BillKind {
    /// A status entry: its body is the scenario's text, and a refused request costs nothing.
    Nothing,
    /// An event stream: `(end offset, content bytes)` of every event the answer sends.
    Stream(Vec<(u64, u64)>),
    /// A JSON answer of this many bytes.
    Json(u64),
}

impl Bill {
    /// What the provider bills when `delivered` body bytes were sent (`None`: the whole body).
    ///
    /// A cut stream bills the whole prompt (the provider processed it) and, as output, 1 token
    /// per 4 bytes of answer content (text deltas, tool-call names and tool-call arguments) in
    /// the events written completely before the cut: `sum(content bytes) / 4`, integer division.
    /// docsfab estimates a cut stream's output the same way (1 token per 4 bytes of answer
    /// content received) and its input as request body bytes / 4 (at least 1), which is
    /// [`input_estimate`]. A cut JSON answer bills no output unless every byte was sent.
    pub(crate) fn billed(&self, delivered: Option<u64>) -> BilledUsage {
        let Some(delivered) = delivered else {
            return self.full;
        };
        match &self.kind {
            BillKind::Nothing => BilledUsage::default(),
            BillKind::Json(total) if delivered >= *total => self.full,
            BillKind::Json(_) => BilledUsage {
                output_tokens: 0,
                ..self.full
            },
            BillKind::Stream(marks) => {
                let content: u64 = marks
                    .iter()
                    .filter(|(end, _)| *end <= delivered)
                    .map(|(_, bytes)| bytes)
                    .sum();
                BilledUsage {
                    output_tokens: content / 4,
                    ..self.full
                }
            }
        }
    }

    /// What a request whose answer is never sent bills (a `drop`): its prompt, no output.
    pub(crate) fn prompt_only(req: &RequestInfo) -> BilledUsage {
        let prompt = prompt_usage(req);
        BilledUsage {
            input_tokens: prompt.total,
            output_tokens: 0,
            cache_creation_input_tokens: prompt.creation,
            cache_read_input_tokens: prompt.read,
        }
    }
}

/// Whether the provider processes the prompt of a request this step answers (and so caches its
/// prefixes and bills it): an answer, a stream error or a drop, not a status.
pub(crate) fn processes_prompt(step: &Step) -> bool {
    !matches!(
        &step.action,
        Action::Respond(Response {
            reply: Reply::Status(_),
            ..
        })
    )
}

/// Renders a scripted response's body (and its default headers) and what it bills.
pub(crate) fn render(response: &Response, req: &RequestInfo) -> Rendered {
    let (out, kind, full) = match &response.reply {
        Reply::Status(status) => (
            status_reply(status, req),
            BillKind::Nothing,
            BilledUsage::default(),
        ),
        Reply::Answer(answer) => {
            let full = reported_usage(answer, req).billed();
            if req.body.stream {
                let (out, marks) = match req.api {
                    Api::OpenaiChat => openai_stream(answer, req),
                    Api::AnthropicMessages => anthropic_stream(answer, req),
                };
                (out, BillKind::Stream(marks), full)
            } else {
                let out = json_reply(answer, req);
                let total = out.pieces.iter().map(|p| p.len() as u64).sum();
                (out, BillKind::Json(total), full)
            }
        }
        Reply::StreamError(reply) => {
            let (out, marks) = stream_error(reply, req);
            (out, BillKind::Stream(marks), Bill::prompt_only(req))
        }
    };
    Rendered {
        out,
        bill: Bill { full, kind },
    }
}

/// Adds the headers that are settled when the response is sent: `limits`, when the scenario has
/// a capacity, adds the rate-limit headers; the entry's own headers then replace any default of
/// the same name.
pub(crate) fn finish_headers(
    out: &mut Outgoing,
    response: &Response,
    api: Api,
    limits: Option<(&Capacity, &Verdict)>,
) {
    if let Some((capacity, verdict)) = limits {
        out.headers.extend(rate_limit_headers(
            api,
            capacity,
            verdict,
            SystemTime::now(),
        ));
    }
    // Scenario headers replace a default of the same name.
    out.headers.retain(|(name, _)| {
        !response
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    });
    out.headers.extend(response.headers.iter().cloned());
}

/// The 400 an OpenAI request with a `stream_options` member gets under `stream_options: refuse`.
pub(crate) fn stream_options_refusal() -> Outgoing {
    let body = json!({"error": {
        "message": "Unrecognized request argument supplied: stream_options",
        "type": "invalid_request_error",
        "param": "stream_options",
        "code": null
    }});
    Outgoing {
        status: 400,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        pieces: vec![body.to_string().into_bytes()],
        framing: Framing::ContentLength,
        piece_delay: Duration::ZERO,
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn status_reply(reply: &StatusReply, req: &RequestInfo) -> Outgoing {
    let (pieces, framing, piece_delay) = match &reply.body {
        StatusBody::Single { text, chunked } => {
            let body = match text {
                Some(body) => body.clone(),
                None if reply.status >= 400 => default_error_body(reply.status, req.api),
                None => String::new(),
            };
            let framing = if *chunked {
                Framing::Chunked
            } else {
                Framing::ContentLength
            };
            (vec![body.into_bytes()], framing, Duration::ZERO)
        }
        StatusBody::Chunks { items, delay_ms } => (
            items.iter().map(|c| c.clone().into_bytes()).collect(),
            Framing::Chunked,
            Duration::from_millis(*delay_ms),
        ),
    };
    let mut headers = Vec::new();
    if pieces.iter().any(|p| !p.is_empty()) {
        headers.push(("content-type".to_owned(), "application/json".to_owned()));
    }
    Outgoing {
        status: reply.status,
        headers,
        pieces,
        framing,
        piece_delay,
    }
}

/// A provider-style error body, so clients that parse error JSON see the shape they expect.
fn default_error_body(status: u16, api: Api) -> String {
    let message = format!(
        "simulated HTTP {status} ({})",
        crate::http::reason_phrase(status)
    );
    match api {
        Api::OpenaiChat => {
            let kind = match status {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                408 => "timeout",
                409 => "conflict",
                413 => "request_too_large",
                429 => "rate_limit_exceeded",
                502 => "bad_gateway",
                503 => "service_unavailable",
                504 => "gateway_timeout",
                529 => "overloaded_error",
                500..=599 => "server_error",
                _ => "invalid_request_error",
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
                .to_string()
        }
        Api::AnthropicMessages => {
            let kind = match status {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                408 | 504 => "timeout_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                503 | 529 => "overloaded_error",
                500..=599 => "api_error",
                _ => "invalid_request_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
        }
    }
}

fn sse_headers() -> Vec<(String, String)> {
    vec![
        ("content-type".to_owned(), "text/event-stream".to_owned()),
        ("cache-control".to_owned(), "no-cache".to_owned()),
    ]
}

/// Writes SSE events with the scenario's line endings and byte order marks.
struct Sse<'a> {
    framing: &'a LineFraming,
    lines: usize,
    last_was_cr: bool,
    /// Body bytes written so far.
    written: u64,
    /// `(end offset, answer content bytes)` of every event, for billing a cut stream.
    marks: Vec<(u64, u64)>,
    /// Write a `: ping` comment line before every event (the `ping-comments` quirk).
    ping: bool,
}

impl<'a> Sse<'a> {
    fn new(framing: &'a LineFraming) -> Self {
        Sse {
            framing,
            lines: 0,
            last_was_cr: false,
            written: 0,
            marks: Vec::new(),
            ping: false,
        }
    }

    /// An event whose one line has a field other than `data` (`error: {...}`), which carries
    /// no answer content.
    fn field_event(&mut self, field: &str, value: &str) -> Vec<u8> {
        let mut out = Vec::new();
        self.line(&mut out, &format!("{field}: {value}"));
        self.line(&mut out, "");
        self.written += out.len() as u64;
        self.marks.push((self.written, 0));
        out
    }

    /// One event: an optional `event:` line, one `data:` line, and the blank line that ends it.
    fn event(&mut self, name: Option<&str>, data: &str) -> Vec<u8> {
        let content = content_bytes(data);
        self.event_with(name, data, content)
    }

    /// An event that carries no answer content whatever its data says (a stray line after the
    /// end of the stream).
    fn stray(&mut self, data: &str) -> Vec<u8> {
        self.event_with(None, data, 0)
    }

    fn event_with(&mut self, name: Option<&str>, data: &str, content: u64) -> Vec<u8> {
        let mut out = Vec::new();
        if self.ping {
            self.line(&mut out, ": ping");
        }
        if let Some(name) = name {
            self.line(&mut out, &format!("event: {name}"));
        }
        self.line(&mut out, &format!("data: {data}"));
        self.line(&mut out, "");
        self.written += out.len() as u64;
        self.marks.push((self.written, content));
        out
    }

    fn line(&mut self, out: &mut Vec<u8>, text: &str) {
        if let Some(bom) = &self.framing.bom {
            let wanted = !text.is_empty()
                && match bom.lines {
                    BomLines::All => true,
                    BomLines::First => self.lines == 0,
                    BomLines::Data => text.starts_with("data:"),
                };
            if wanted {
                for _ in 0..bom.count {
                    out.extend_from_slice("\u{FEFF}".as_bytes());
                }
            }
        }
        out.extend_from_slice(text.as_bytes());
        let mut ending: &[u8] = match self.framing.line_ending {
            LineEnding::Lf => b"\n",
            LineEnding::Crlf => b"\r\n",
            LineEnding::Cr => b"\r",
            LineEnding::Mixed => [b"\n".as_slice(), b"\r\n", b"\r"][self.lines % 3],
        };
        // After a bare CR, a blank line ending in LF would read as one CRLF and swallow the
        // blank line; keep the event boundary by ending it with CR as well.
        if self.last_was_cr && text.is_empty() && ending != b"\r" {
            ending = b"\r";
        }
        out.extend_from_slice(ending);
        self.last_was_cr = ending == b"\r";
        self.lines += 1;
    }
}

/// The answer content an event's data carries, in bytes: OpenAI's `delta.content` and tool-call
/// `function.name` / `function.arguments`, Anthropic's `text_delta`, `input_json_delta` and a
/// `tool_use` block's name.
fn content_bytes(data: &str) -> u64 {
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return 0;
    };
    let len = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, str::len) as u64;
    let mut bytes = 0;
    for choice in v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let delta = choice.get("delta");
        bytes += len(delta.and_then(|d| d.get("content")));
        for call in delta
            .and_then(|d| d.get("tool_calls"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let function = call.get("function");
            bytes += len(function.and_then(|f| f.get("name")))
                + len(function.and_then(|f| f.get("arguments")));
        }
    }
    if let Some(delta) = v.get("delta") {
        bytes += len(delta.get("text")) + len(delta.get("partial_json"));
    }
    if let Some(block) = v.get("content_block")
        && block.get("type").and_then(Value::as_str) == Some("tool_use")
    {
        bytes += len(block.get("name"));
    }
    bytes
}

/// A 200 event stream of `pieces`, then the stray lines the scenario sends after the stream's
/// end, cut into HTTP chunks and paced as its faults ask; with the events' billing marks.
fn stream_reply(
    mut sse: Sse<'_>,
    mut pieces: Vec<Vec<u8>>,
    faults: &StreamFaults,
) -> (Outgoing, Vec<(u64, u64)>) {
    for data in &faults.after_done {
        pieces.push(sse.stray(data));
    }
    let out = Outgoing {
        status: 200,
        headers: sse_headers(),
        pieces: rechunk(pieces, &faults.framing),
        framing: Framing::Chunked,
        piece_delay: Duration::from_millis(faults.event_delay_ms),
    };
    (out, sse.marks)
}

/// Re-cuts the body into HTTP chunks as the framing asks: every `chunk_bytes` bytes (otherwise at
/// the event boundaries), and between the CR and LF of each CRLF when `split_crlf` is set.
fn rechunk(pieces: Vec<Vec<u8>>, framing: &LineFraming) -> Vec<Vec<u8>> {
    if framing.chunk_bytes.is_none() && !framing.split_crlf {
        return pieces;
    }
    let mut cuts = std::collections::BTreeSet::new();
    match framing.chunk_bytes {
        None => {
            let mut at = 0;
            for piece in &pieces {
                at += piece.len();
                cuts.insert(at);
            }
        }
        Some(n) => {
            let total: usize = pieces.iter().map(Vec::len).sum();
            cuts.extend((n.get()..total).step_by(n.get()));
        }
    }
    let all = pieces.concat();
    if framing.split_crlf {
        cuts.extend(
            all.windows(2)
                .enumerate()
                .filter(|(_, w)| w == b"\r\n")
                .map(|(i, _)| i + 1),
        );
    }
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts.into_iter().chain(std::iter::once(all.len())) {
        if cut > start && cut <= all.len() {
            out.push(all[start..cut].to_vec());
            start = cut;
        }
    }
    out
}

/// Splits `text` into at most `n` pieces of roughly equal length, on character boundaries.
/// Empty text gives no pieces.
fn split_text(text: &str, n: usize) -> Vec<&str> {
    let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let n = n.clamp(1, chars.len());
    let mut pieces = Vec::with_capacity(n);
    let mut start = 0;
    for k in 1..=n {
        let end = if k == n {
            text.len()
        } else {
            chars[k * chars.len() / n]
        };
        if end > start {
            pieces.push(&text[start..end]);
            start = end;
        }
    }
    pieces
}

fn truncated_arguments(call: &ToolCall) -> &str {
    match call.truncate_at {
        Some(at) if at < call.arguments.len() => {
            let mut at = at;
            while !call.arguments.is_char_boundary(at) {
                at -= 1;
            }
            &call.arguments[..at]
        }
        _ => &call.arguments,
    }
}

/// The usage an answer reports, in the simulator's terms: `total_input` is the whole prompt,
/// cache parts included, on both APIs.
#[derive(Debug, Clone, Copy)]
struct Reported {
    total_input: u64,
    output: u64,
    creation: u64,
    read: u64,
    /// OpenAI: send `prompt_tokens_details.cached_tokens`.
    openai_details: bool,
}

impl Reported {
    fn billed(self) -> BilledUsage {
        BilledUsage {
            input_tokens: self.total_input,
            output_tokens: self.output,
            cache_creation_input_tokens: self.creation,
            cache_read_input_tokens: self.read,
        }
    }

    /// Anthropic's `input_tokens`: the prompt tokens that were neither read from nor written to
    /// the cache.
    fn uncached_input(self) -> u64 {
        self.total_input
            .saturating_sub(self.creation)
            .saturating_sub(self.read)
    }

    /// OpenAI's `usage` object.
    fn openai_json(self) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.total_input,
            "completion_tokens": self.output,
            "total_tokens": self.total_input + self.output
        });
        if self.openai_details {
            usage["prompt_tokens_details"] = json!({"cached_tokens": self.read});
        }
        usage
    }
}

/// The prompt as the provider counts it: the total estimate, and the cache's read and write
/// fitted into it (Anthropic keeps at least 1 uncached `input_tokens`; writes give way first).
#[derive(Debug, Clone, Copy)]
struct PromptUsage {
    total: u64,
    creation: u64,
    read: u64,
}

fn prompt_usage(req: &RequestInfo) -> PromptUsage {
    let total = input_estimate(&req.body);
    match req.api {
        Api::OpenaiChat => PromptUsage {
            total,
            creation: 0,
            read: req.cache.read.min(total),
        },
        Api::AnthropicMessages => {
            let room = total.saturating_sub(1);
            let read = req.cache.read.min(room);
            let creation = req.cache.creation.min(room - read);
            PromptUsage {
                total,
                creation,
                read,
            }
        }
    }
}

/// The usage an answer reports: the scenario's `usage` when it gives one (its numbers as
/// written), else the estimates with the prompt cache's read and write.
fn reported_usage(answer: &Answer, req: &RequestInfo) -> Reported {
    if let Some(u) = answer.usage {
        return match req.api {
            Api::OpenaiChat => Reported {
                total_input: u.input_tokens,
                output: u.output_tokens,
                creation: 0,
                read: u.cached_tokens.unwrap_or(0),
                openai_details: u.cached_tokens.is_some(),
            },
            Api::AnthropicMessages => {
                let creation = u.cache_creation_input_tokens.unwrap_or(0);
                let read = u.cache_read_input_tokens.unwrap_or(0);
                Reported {
                    total_input: u.input_tokens.saturating_add(creation).saturating_add(read),
                    output: u.output_tokens,
                    creation,
                    read,
                    openai_details: false,
                }
            }
        };
    }
    let (_, output) = usage_for(answer, &req.body);
    let prompt = prompt_usage(req);
    Reported {
        total_input: prompt.total,
        output,
        creation: prompt.creation,
        read: prompt.read,
        openai_details: req.body.cache.keyed,
    }
}

fn usage_for(answer: &Answer, body: &BodyFacts) -> (u64, u64) {
    if let Some(u) = answer.usage {
        return (u.input_tokens, u.output_tokens);
    }
    // A rough chars/4 estimate: deterministic and plausible is all a test needs.
    let input = input_estimate(body);
    let produced: usize = answer.content.as_deref().map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum::<usize>();
    (input, (produced as u64 / 4).max(1))
}

/// The prompt's size in tokens as the simulator estimates it (body bytes / 4): what the log's
/// `prompt_tokens` says and what `tokens: prompt` charges.
pub(crate) fn input_estimate(body: &BodyFacts) -> u64 {
    (body.len as u64 / 4).max(1)
}

/// What a request costs the token budget. `total`: the usage its answer reports (input plus
/// output, the same numbers as the body's `usage`), or the input estimate for anything that is
/// not an answer. `prompt`: the input estimate, whatever answers it.
pub(crate) fn token_cost(step: &Step, body: &BodyFacts, charge: TokenCharge) -> u64 {
    if charge == TokenCharge::Prompt {
        return input_estimate(body);
    }
    match &step.action {
        Action::Respond(Response {
            reply: Reply::Answer(answer),
            ..
        }) => {
            let (input, output) = usage_for(answer, body);
            input.saturating_add(output)
        }
        _ => input_estimate(body),
    }
}

/// The rate-limit headers in the family the capacity asks for (by default the API's own). Times
/// are real time (already scaled).
///
/// OpenAI sends the reset as a Go-style duration until the budget is back to its initial state;
/// Anthropic sends the RFC 3339 instant at which it is fully replenished.
pub(crate) fn rate_limit_headers(
    api: Api,
    capacity: &Capacity,
    verdict: &Verdict,
    now: SystemTime,
) -> Vec<(String, String)> {
    let family = match capacity.headers {
        HeaderFamily::Api => api,
        HeaderFamily::Openai => Api::OpenaiChat,
        HeaderFamily::Anthropic => Api::AnthropicMessages,
        HeaderFamily::None => return Vec::new(),
    };
    // Anthropic reports a prompt-only budget as its input-tokens family (ITPM); OpenAI has one
    // token family whatever it counts.
    let tokens = match (family, capacity.tokens) {
        (Api::AnthropicMessages, TokenCharge::Prompt) => "input-tokens",
        _ => "tokens",
    };
    let budgets =
        std::iter::once(("requests", verdict.requests)).chain(verdict.tokens.map(|t| (tokens, t)));
    let mut headers = Vec::new();
    for (what, gauge) in budgets {
        let Gauge {
            limit,
            remaining,
            reset,
            ..
        } = gauge;
        let (names, reset) = match family {
            Api::OpenaiChat => (
                [
                    format!("x-ratelimit-limit-{what}"),
                    format!("x-ratelimit-remaining-{what}"),
                    format!("x-ratelimit-reset-{what}"),
                ],
                go_duration(reset),
            ),
            Api::AnthropicMessages => (
                [
                    format!("anthropic-ratelimit-{what}-limit"),
                    format!("anthropic-ratelimit-{what}-remaining"),
                    format!("anthropic-ratelimit-{what}-reset"),
                ],
                rfc3339(now.checked_add(reset).unwrap_or(now)),
            ),
        };
        let [limit_name, remaining_name, reset_name] = names;
        headers.push((limit_name, limit.to_string()));
        headers.push((remaining_name, remaining.to_string()));
        headers.push((reset_name, reset));
    }
    headers
}

/// The 429 a request over capacity gets: the API's own rate-limit error body, the rate-limit
/// headers, and the Retry-After the capacity's `retryAfter` asks for, telling when this request
/// would fit: `retry-after` in whole seconds rounded up, `retry-after-ms` exact (by default
/// both, the milliseconds on the OpenAI API only, as the providers send them).
pub(crate) fn capacity_refusal(
    api: Api,
    capacity: &Capacity,
    verdict: &Verdict,
    refusal: Refusal,
    body: &BodyFacts,
) -> Outgoing {
    let wait_ms = ceil_millis(refusal.wait);
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    headers.extend(rate_limit_headers(
        api,
        capacity,
        verdict,
        SystemTime::now(),
    ));
    let (seconds, millis) = match capacity.retry_after {
        RetryAfter::Both => (true, api == Api::OpenaiChat),
        RetryAfter::Seconds => (true, false),
        RetryAfter::Milliseconds => (false, true),
        RetryAfter::None => (false, false),
    };
    if seconds {
        headers.push(("retry-after".to_owned(), wait_ms.div_ceil(1000).to_string()));
    }
    if millis {
        headers.push(("retry-after-ms".to_owned(), wait_ms.to_string()));
    }
    let gauge = match refusal.by {
        Dimension::Requests => verdict.requests,
        Dimension::Tokens => verdict.tokens.unwrap_or(verdict.requests),
    };
    // What the bucket has given out; the limit is the header's (per minute by default), so with
    // a small burst this reads "Limit 120, Used 1", which is what a quantized limit looks like.
    let used = gauge.size.saturating_sub(gauge.remaining);
    let again = go_duration(refusal.wait);
    let tokens = match capacity.tokens {
        TokenCharge::Total => "tokens",
        TokenCharge::Prompt => "input tokens",
    };
    let text = match api {
        Api::OpenaiChat => {
            let model = body.model.as_deref().unwrap_or(DEFAULT_MODEL);
            let (kind, per_min) = match refusal.by {
                Dimension::Requests => ("requests", "requests per min (RPM)"),
                Dimension::Tokens => ("tokens", "tokens per min (TPM)"),
            };
            let message = format!(
                "Rate limit reached for {model} on {per_min}: Limit {}, Used {used}, Requested {}. Please try again in {again}. (simulated capacity)",
                gauge.limit, refusal.requested
            );
            json!({"error": {"message": message, "type": kind, "param": null, "code": "rate_limit_exceeded"}})
        }
        Api::AnthropicMessages => {
            let what = match refusal.by {
                Dimension::Requests => "requests",
                Dimension::Tokens => tokens,
            };
            // "At once" is the bucket, whatever the limit header reports.
            let message = format!(
                "This request would exceed the simulated rate limit of {} {what} at once; try again in {again}.",
                gauge.size
            );
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}})
        }
    };
    Outgoing {
        status: 429,
        headers,
        pieces: vec![text.to_string().into_bytes()],
        framing: Framing::ContentLength,
        piece_delay: Duration::ZERO,
    }
}

/// Whole milliseconds, rounded up: waiting a fraction too little would be refused again.
fn ceil_millis(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A duration as Go's `time.Duration` prints it, at millisecond resolution (rounded up), which
/// is the form OpenAI's `x-ratelimit-reset-*` headers use: `0s`, `120ms`, `1.5s`, `6m0s`.
fn go_duration(d: Duration) -> String {
    let ms = ceil_millis(d);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (secs, frac) = (ms / 1000 % 60, ms % 1000);
    let mut seconds = secs.to_string();
    if frac > 0 {
        let digits = format!("{frac:03}");
        seconds.push('.');
        seconds.push_str(digits.trim_end_matches('0'));
    }
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// An instant as RFC 3339 in UTC, with milliseconds only when the instant is not a whole second
/// (rounded up, so the time named is never before the budget is full).
fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = ceil_millis(since);
    let (secs, frac) = (ms / 1000, ms % 1000);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let time = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    if frac == 0 {
        format!("{time}Z")
    } else {
        format!("{time}.{frac:03}Z")
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`, valid far beyond any clock this runs on.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn model_of(answer: &Answer, req: &RequestInfo) -> String {
    answer
        .model
        .clone()
        .or_else(|| req.body.model.clone())
        .unwrap_or_else(|| DEFAULT_MODEL.to_owned())
}

fn finish_reason(answer: &Answer, api: Api) -> String {
    if let Some(reason) = &answer.finish_reason {
        return reason.clone();
    }
    match (api, answer.tool_calls.is_empty()) {
        (Api::OpenaiChat, true) => "stop",
        (Api::OpenaiChat, false) => "tool_calls",
        (Api::AnthropicMessages, true) => "end_turn",
        (Api::AnthropicMessages, false) => "tool_use",
    }
    .to_owned()
}

fn tool_call_id(call: &ToolCall, api: Api, req: &RequestInfo, k: usize) -> String {
    call.id.clone().unwrap_or_else(|| match api {
        Api::OpenaiChat => format!("call_sim_{}_{k}", req.index),
        Api::AnthropicMessages => format!("toolu_sim_{}_{k}", req.index),
    })
}

fn error_event_json(event: &ErrorEvent, api: Api) -> String {
    let mut inner = serde_json::Map::new();
    inner.insert("type".to_owned(), Value::String(event.kind.clone()));
    if let Some(code) = &event.code {
        inner.insert("code".to_owned(), code.clone());
    }
    let message = match (&event.message, api) {
        (Some(m), _) => Some(m.clone()),
        // Anthropic error events always carry a message; the OpenAI-compatible shape in the
        // spec has none, so none is invented there.
        (None, Api::AnthropicMessages) => Some(format!("simulated {}", event.kind)),
        (None, Api::OpenaiChat) => None,
    };
    if let Some(m) = message {
        inner.insert("message".to_owned(), Value::String(m));
    }
    // Written by hand so `type` comes first, as providers send it.
    let mut fields: Vec<String> = Vec::new();
    for key in ["type", "code", "message"] {
        if let Some(v) = inner.get(key) {
            fields.push(format!("{}:{v}", Value::String(key.to_owned())));
        }
    }
    let inner = format!("{{{}}}", fields.join(","));
    match api {
        Api::OpenaiChat => format!("{{\"error\":{inner}}}"),
        Api::AnthropicMessages => format!("{{\"type\":\"error\",\"error\":{inner}}}"),
    }
}

fn openai_stream(answer: &Answer, req: &RequestInfo) -> (Outgoing, Vec<(u64, u64)>) {
    let faults = &answer.faults;
    let quirk = |q: Quirk| faults.quirks.contains(&q);
    let model = model_of(answer, req);
    let id = format!("chatcmpl-sim-{}", req.index);
    let created = unix_secs();
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        })
    };
    let finish = (!faults.omit_finish_reason).then(|| finish_reason(answer, Api::OpenaiChat));
    let mut before: Vec<Value> = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(content) = &answer.content {
        for piece in split_text(content, answer.deltas.get()) {
            before.push(chunk(json!({"content": piece}), None));
        }
    }
    let whole = quirk(Quirk::ToolCallsWhole) && !answer.tool_calls.is_empty();
    if whole {
        // Every call whole in one chunk that also ends the answer (llama.cpp, Ollama).
        before.push(chunk(
            json!({"tool_calls": whole_tool_calls(answer, req, &faults.quirks)}),
            finish.as_deref(),
        ));
    } else {
        before.extend(
            openai_tool_deltas(answer, req, &faults.quirks)
                .into_iter()
                .map(|d| chunk(d, None)),
        );
    }
    let mut after: Vec<Value> = Vec::new();
    if let Some(finish) = finish.as_deref().filter(|_| !whole) {
        after.push(chunk(json!({}), Some(finish)));
        if quirk(Quirk::DuplicateFinish) {
            after.push(chunk(json!({}), Some(finish)));
        }
    }
    if req.body.include_usage && req.report_usage {
        let mut usage = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [],
            "usage": reported_usage(answer, req).openai_json()
        });
        if quirk(Quirk::UsageExtraMembers) {
            add_extra_usage_members(&mut usage);
        }
        after.push(usage);
    }
    if quirk(Quirk::NullFinishChunk) {
        after.push(chunk(json!({}), None));
    }
    if let Some(foreign) = &faults.foreign_model {
        // The first chunk after the role chunk names the other model (the role chunk itself when
        // it is the only one).
        let at = usize::from(before.len() + after.len() > 1);
        let target = if at < before.len() {
            &mut before[at]
        } else {
            &mut after[at - before.len()]
        };
        target["model"] = Value::String(foreign.clone());
    }
    openai_pieces(faults, &before, &after)
}

/// The OpenAI stream's events: the chunks before the error event, the error event (a `data:`
/// line, or llama.cpp's `error:` field line, after which only `[DONE]` follows), the chunks after
/// it, and `[DONE]`.
fn openai_pieces(
    faults: &StreamFaults,
    before: &[Value],
    after: &[Value],
) -> (Outgoing, Vec<(u64, u64)>) {
    let mut sse = Sse::new(&faults.framing);
    sse.ping = faults.quirks.contains(&Quirk::PingComments);
    let mut pieces: Vec<Vec<u8>> = before
        .iter()
        .map(|c| sse.event(None, &c.to_string()))
        .collect();
    let field_line = faults.quirks.contains(&Quirk::ErrorFieldLine);
    match &faults.error_event {
        Some(event) if field_line => {
            pieces.push(sse.field_event("error", &llama_error_json(event)));
        }
        Some(event) => pieces.push(sse.event(None, &error_event_json(event, Api::OpenaiChat))),
        None => {}
    }
    if !(field_line && faults.error_event.is_some()) {
        pieces.extend(after.iter().map(|c| sse.event(None, &c.to_string())));
    }
    if !faults.omit_done {
        pieces.push(sse.event(None, "[DONE]"));
    }
    stream_reply(sse, pieces, faults)
}

/// The deltas of every tool call as the reference streams them (a head chunk with id, type and
/// name, then the argument pieces), shaped by the dialect's tool-call quirks.
fn openai_tool_deltas(answer: &Answer, req: &RequestInfo, quirks: &[Quirk]) -> Vec<Value> {
    let mut deltas = Vec::new();
    for (k, call) in answer.tool_calls.iter().enumerate() {
        let id = tool_call_id(call, Api::OpenaiChat, req, k);
        let mut head = json!({"index": k, "id": id, "type": "function",
            "function": {"name": call.name, "arguments": ""}});
        if quirks.contains(&Quirk::ToolIdsMissing) {
            head.as_object_mut().map(|o| o.remove("id"));
        }
        deltas.push(json!({"tool_calls": [head]}));
        for piece in split_text(truncated_arguments(call), call.deltas.get()) {
            let mut part = json!({"index": k, "function": {"arguments": piece}});
            if quirks.contains(&Quirk::ToolIdEveryChunk) && !quirks.contains(&Quirk::ToolIdsMissing)
            {
                part["id"] = json!(id);
                part["type"] = json!("function");
                part["function"]["name"] = json!(call.name);
            }
            if quirks.contains(&Quirk::ToolNameEmptyOnContinuations) {
                part["function"]["name"] = json!("");
            }
            deltas.push(json!({"tool_calls": [part]}));
        }
    }
    deltas
}

/// Every tool call whole, for one chunk.
fn whole_tool_calls(answer: &Answer, req: &RequestInfo, quirks: &[Quirk]) -> Vec<Value> {
    let calls = answer.tool_calls.iter().enumerate();
    calls
        .map(|(k, call)| {
            let mut c = json!({"index": k, "id": tool_call_id(call, Api::OpenaiChat, req, k),
                "type": "function",
                "function": {"name": call.name, "arguments": truncated_arguments(call)}});
            if quirks.contains(&Quirk::ToolIdsMissing) {
                c.as_object_mut().map(|o| o.remove("id"));
            }
            c
        })
        .collect()
}

/// Members real servers add to the usage chunk: `*_details: null` (vLLM, SGLang) and
/// llama.cpp's `timings`.
fn add_extra_usage_members(chunk: &mut Value) {
    let usage = &mut chunk["usage"];
    if usage.get("prompt_tokens_details").is_none() {
        usage["prompt_tokens_details"] = Value::Null;
    }
    usage["completion_tokens_details"] = Value::Null;
    chunk["timings"] =
        json!({"prompt_n": 1, "prompt_ms": 1.5, "predicted_n": 1, "predicted_ms": 2.5});
}

/// llama.cpp's error object (`format_error_response`): code, message, type, in that order.
fn llama_error_json(event: &ErrorEvent) -> String {
    let code = event.code.clone().unwrap_or(Value::Null);
    let message = event
        .message
        .clone()
        .unwrap_or_else(|| format!("simulated {}", event.kind));
    format!(
        "{{\"code\":{code},\"message\":{},\"type\":{}}}",
        Value::String(message),
        Value::String(event.kind.clone())
    )
}

fn anthropic_stream(answer: &Answer, req: &RequestInfo) -> (Outgoing, Vec<(u64, u64)>) {
    let faults = &answer.faults;
    let model = faults
        .foreign_model
        .clone()
        .unwrap_or_else(|| model_of(answer, req));
    let usage = reported_usage(answer, req);
    let output = usage.output;
    let mut sse = Sse::new(&faults.framing);
    let mut pieces = Vec::new();
    let mut emit = |sse: &mut Sse, name: &str, data: Value| {
        pieces.push(sse.event(Some(name), &data.to_string()))
    };

    emit(
        &mut sse,
        "message_start",
        json!({
            "type": "message_start",
            "message": {
                "id": format!("msg_sim_{}", req.index), "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": usage.uncached_input(),
                    "cache_creation_input_tokens": usage.creation,
                    "cache_read_input_tokens": usage.read, "output_tokens": 1}
            }
        }),
    );
    anthropic_blocks(answer, req, &mut sse, &mut pieces);
    if let Some(event) = &faults.error_event {
        pieces.push(sse.event(
            Some("error"),
            &error_event_json(event, Api::AnthropicMessages),
        ));
    }
    let mut emit = |sse: &mut Sse, name: &str, data: Value| {
        pieces.push(sse.event(Some(name), &data.to_string()))
    };
    if !faults.omit_finish_reason {
        emit(
            &mut sse,
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": finish_reason(answer, Api::AnthropicMessages), "stop_sequence": null},
                "usage": {"output_tokens": output}
            }),
        );
    }
    if !faults.omit_done {
        emit(&mut sse, "message_stop", json!({"type": "message_stop"}));
    }
    stream_reply(sse, pieces, faults)
}

/// An Anthropic answer's content blocks: its text, then each tool call, each as start, deltas
/// and stop.
fn anthropic_blocks(answer: &Answer, req: &RequestInfo, sse: &mut Sse, pieces: &mut Vec<Vec<u8>>) {
    let mut emit = |sse: &mut Sse, name: &str, data: Value| {
        pieces.push(sse.event(Some(name), &data.to_string()))
    };
    let mut block = 0usize;
    if let Some(content) = &answer.content {
        emit(
            sse,
            "content_block_start",
            json!({
                "type": "content_block_start", "index": block, "content_block": {"type": "text", "text": ""}
            }),
        );
        emit(sse, "ping", json!({"type": "ping"}));
        for piece in split_text(content, answer.deltas.get()) {
            emit(
                sse,
                "content_block_delta",
                json!({
                    "type": "content_block_delta", "index": block, "delta": {"type": "text_delta", "text": piece}
                }),
            );
        }
        emit(
            sse,
            "content_block_stop",
            json!({"type": "content_block_stop", "index": block}),
        );
        block += 1;
    }
    for (k, call) in answer.tool_calls.iter().enumerate() {
        emit(
            sse,
            "content_block_start",
            json!({
                "type": "content_block_start", "index": block,
                "content_block": {"type": "tool_use", "id": tool_call_id(call, Api::AnthropicMessages, req, k),
                    "name": call.name, "input": {}}
            }),
        );
        for piece in split_text(truncated_arguments(call), call.deltas.get()) {
            emit(
                sse,
                "content_block_delta",
                json!({
                    "type": "content_block_delta", "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": piece}
                }),
            );
        }
        emit(
            sse,
            "content_block_stop",
            json!({"type": "content_block_stop", "index": block}),
        );
        block += 1;
    }
}

/// The non-streamed answer (`stream` false or absent). Stream faults do not apply.
fn json_reply(answer: &Answer, req: &RequestInfo) -> Outgoing {
    let model = model_of(answer, req);
    let usage = reported_usage(answer, req);
    let body = match req.api {
        Api::OpenaiChat => {
            let tool_calls: Vec<Value> = answer
                .tool_calls
                .iter()
                .enumerate()
                .map(|(k, call)| {
                    json!({"id": tool_call_id(call, Api::OpenaiChat, req, k), "type": "function",
                        "function": {"name": call.name, "arguments": truncated_arguments(call)}})
                })
                .collect();
            let mut message = json!({"role": "assistant", "content": answer.content});
            if !tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(tool_calls);
            }
            let mut body = json!({
                "id": format!("chatcmpl-sim-{}", req.index), "object": "chat.completion",
                "created": unix_secs(), "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": null,
                    "finish_reason": finish_reason(answer, Api::OpenaiChat)}]
            });
            if req.report_usage {
                body["usage"] = usage.openai_json();
            }
            body
        }
        Api::AnthropicMessages => {
            let mut content: Vec<Value> = Vec::new();
            if let Some(text) = &answer.content {
                content.push(json!({"type": "text", "text": text}));
            }
            for (k, call) in answer.tool_calls.iter().enumerate() {
                let raw = truncated_arguments(call);
                // A truncated or non-JSON argument string stays a string: the fault is the point.
                let input = serde_json::from_str::<Value>(raw)
                    .unwrap_or_else(|_| Value::String(raw.to_owned()));
                content.push(json!({"type": "tool_use", "id": tool_call_id(call, Api::AnthropicMessages, req, k),
                    "name": call.name, "input": input}));
            }
            json!({
                "id": format!("msg_sim_{}", req.index), "type": "message", "role": "assistant",
                "model": model, "content": content,
                "stop_reason": finish_reason(answer, Api::AnthropicMessages), "stop_sequence": null,
                "usage": {"input_tokens": usage.uncached_input(),
                    "cache_creation_input_tokens": usage.creation,
                    "cache_read_input_tokens": usage.read, "output_tokens": usage.output}
            })
        }
    };
    Outgoing {
        status: 200,
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
        pieces: vec![body.to_string().into_bytes()],
        framing: Framing::ContentLength,
        piece_delay: Duration::ZERO,
    }
}

fn stream_error(reply: &StreamErrorReply, req: &RequestInfo) -> (Outgoing, Vec<(u64, u64)>) {
    let mut sse = Sse::new(&reply.framing);
    let mut pieces = Vec::new();
    match req.api {
        Api::OpenaiChat => {
            pieces.push(sse.event(None, &error_event_json(&reply.event, Api::OpenaiChat)));
            if reply.done {
                pieces.push(sse.event(None, "[DONE]"));
            }
        }
        Api::AnthropicMessages => {
            pieces.push(sse.event(
                Some("error"),
                &error_event_json(&reply.event, Api::AnthropicMessages),
            ));
        }
    }
    let out = Outgoing {
        status: 200,
        headers: sse_headers(),
        pieces: rechunk(pieces, &reply.framing),
        framing: Framing::Chunked,
        piece_delay: Duration::ZERO,
    };
    (out, sse.marks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Bom;
    use std::num::NonZeroUsize;

    #[test]
    fn rechunk_cuts_every_n_bytes_and_inside_every_crlf() {
        let pieces = vec![b"ab\r\ncd\r\n\r\n".to_vec(), b"ef\r\n\r\n".to_vec()];
        let framing = |chunk_bytes: Option<usize>, split_crlf| LineFraming {
            chunk_bytes: chunk_bytes.and_then(NonZeroUsize::new),
            split_crlf,
            ..LineFraming::default()
        };
        let show = |out: Vec<Vec<u8>>| -> Vec<String> {
            out.into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect()
        };
        assert_eq!(
            show(rechunk(pieces.clone(), &framing(None, false))),
            ["ab\r\ncd\r\n\r\n", "ef\r\n\r\n"]
        );
        assert_eq!(
            show(rechunk(pieces.clone(), &framing(Some(5), false))),
            ["ab\r\nc", "d\r\n\r\n", "ef\r\n\r", "\n"]
        );
        assert_eq!(
            show(rechunk(pieces, &framing(None, true))),
            ["ab\r", "\ncd\r", "\n\r", "\n", "ef\r", "\n\r", "\n"]
        );
    }

    #[test]
    fn split_text_keeps_every_character_and_respects_boundaries() {
        let text = "héllo wörld ✓";
        for n in 1..20 {
            let pieces = split_text(text, n);
            assert_eq!(pieces.concat(), text);
            assert_eq!(pieces.len(), n.min(text.chars().count()));
        }
        assert!(split_text("", 3).is_empty());
    }

    #[test]
    fn mixed_line_endings_never_merge_a_blank_line_into_crlf() {
        let framing = LineFraming {
            line_ending: LineEnding::Mixed,
            ..LineFraming::default()
        };
        let mut sse = Sse::new(&framing);
        let bytes: Vec<u8> = (0..4).flat_map(|_| sse.event(Some("e"), "{}")).collect();
        let text = String::from_utf8(bytes).unwrap();
        // Lines cycle LF, CRLF, CR; a blank line after CR is a CR too.
        assert!(
            text.starts_with("event: e\ndata: {}\r\n\revent: e\n"),
            "{text:?}"
        );
        assert!(!text.contains("\r\r\n"), "{text:?}");
    }

    #[test]
    fn boms_go_on_the_chosen_lines_only() {
        let framing = LineFraming {
            bom: Some(Bom {
                count: 2,
                lines: BomLines::Data,
            }),
            ..LineFraming::default()
        };
        let mut sse = Sse::new(&framing);
        let text = String::from_utf8(sse.event(Some("x"), "1")).unwrap();
        assert_eq!(text, "event: x\n\u{FEFF}\u{FEFF}data: 1\n\n");
    }

    #[test]
    fn reset_durations_read_like_go_durations() {
        let ms = Duration::from_millis;
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (ms(120), "120ms"),
            (ms(999), "999ms"),
            (ms(1000), "1s"),
            (ms(1500), "1.5s"),
            (ms(17_342), "17.342s"),
            (ms(360_000), "6m0s"),
            (ms(3_723_400), "1h2m3.4s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn reset_instants_are_rfc3339_utc() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        // 2024-02-29T23:59:59.5Z: a leap day, with a fraction.
        assert_eq!(rfc3339(at(1_709_251_199_500)), "2024-02-29T23:59:59.500Z");
        assert_eq!(rfc3339(at(1_795_972_800_000)), "2026-11-29T17:20:00Z");
    }

    fn capacity(yaml: &str) -> (Capacity, crate::scenario::Scenario) {
        let scenario = crate::scenario::Scenario::from_yaml_str(yaml, "t").unwrap();
        (scenario.capacity().unwrap().clone(), scenario)
    }

    fn names(headers: &[(String, String)]) -> Vec<&str> {
        headers.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn the_header_family_is_the_capacitys_choice() {
        let start = tokio::time::Instant::now();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let yaml = |extra: &str| {
            format!(
                "capacity: {{requestsPerMinute: 60, tokensPerMinute: 6000, burst: 1{extra}}}\nresponses: [{{status: 200}}]\n"
            )
        };
        let headers = |extra: &str, api: Api| {
            let (c, _) = capacity(&yaml(extra));
            let verdict = crate::capacity::Limiter::new(&c, start).admit(start, 10);
            rate_limit_headers(api, &c, &verdict, now)
        };
        assert_eq!(
            names(&headers(", headers: openai", Api::AnthropicMessages)),
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens"
            ]
        );
        assert!(headers(", headers: none", Api::OpenaiChat).is_empty());
        // A prompt-only budget is Anthropic's input-tokens family; OpenAI keeps `-tokens`.
        let anthropic = headers(", headers: anthropic, tokens: prompt", Api::OpenaiChat);
        assert_eq!(
            names(&anthropic)[3..],
            [
                "anthropic-ratelimit-input-tokens-limit",
                "anthropic-ratelimit-input-tokens-remaining",
                "anthropic-ratelimit-input-tokens-reset"
            ]
        );
        assert_eq!(anthropic[3].1, "6000");
        assert_eq!(anthropic[0].1, "60");
        assert_eq!(
            names(&headers(", tokens: prompt", Api::OpenaiChat))[3],
            "x-ratelimit-limit-tokens"
        );
    }

    #[test]
    fn prompt_tokens_charge_the_body_estimate_whatever_answers() {
        let (_, scenario) = capacity(
            "capacity: {requestsPerMinute: 60, tokensPerMinute: 6000}\nresponses:\n  - answer: {text: hi, usage: {input_tokens: 10, output_tokens: 20}}\n",
        );
        let step = scenario.pick_in(None, 0).step;
        let body = BodyFacts {
            len: 400,
            ..BodyFacts::default()
        };
        assert_eq!(token_cost(&step, &body, TokenCharge::Total), 30);
        assert_eq!(token_cost(&step, &body, TokenCharge::Prompt), 100);
        assert_eq!(input_estimate(&body), 100);
    }

    #[test]
    fn a_cut_bills_the_content_of_the_events_written_whole_over_four() {
        let full = BilledUsage {
            input_tokens: 50,
            output_tokens: 9,
            cache_creation_input_tokens: 4,
            cache_read_input_tokens: 6,
        };
        // Events end at 100, 210 and 330, carrying 0, 7 and 10 content bytes.
        let bill = Bill {
            full,
            kind: BillKind::Stream(vec![(100, 0), (210, 7), (330, 10)]),
        };
        let out = |delivered| bill.billed(delivered).output_tokens;
        assert_eq!(bill.billed(None), full);
        assert_eq!(out(Some(209)), 0);
        assert_eq!(out(Some(210)), 7 / 4);
        assert_eq!(out(Some(10_000)), 17 / 4);
        assert_eq!(bill.billed(Some(0)).input_tokens, 50);
        assert_eq!(bill.billed(Some(0)).cache_read_input_tokens, 6);
        let json = Bill {
            full,
            kind: BillKind::Json(80),
        };
        assert_eq!(json.billed(Some(79)).output_tokens, 0);
        assert_eq!(json.billed(Some(80)), full);
        let status = Bill {
            full: BilledUsage::default(),
            kind: BillKind::Nothing,
        };
        assert_eq!(status.billed(Some(3)), BilledUsage::default());
    }

    #[test]
    fn content_bytes_count_text_tool_names_and_arguments_on_both_apis() {
        let openai = r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"read","arguments":"{}"}}]}}]}"#;
        assert_eq!(content_bytes(openai), 6);
        assert_eq!(
            content_bytes(r#"{"choices":[{"delta":{"content":"hello"}}]}"#),
            5
        );
        assert_eq!(
            content_bytes(
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"abc"}}"#
            ),
            3
        );
        assert_eq!(
            content_bytes(r#"{"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#),
            4
        );
        assert_eq!(
            content_bytes(r#"{"content_block":{"type":"tool_use","name":"grep","input":{}}}"#),
            4
        );
        assert_eq!(content_bytes("[DONE]"), 0);
    }

    #[test]
    fn retry_after_follows_the_capacity() {
        let start = tokio::time::Instant::now();
        let shapes = |retry: &str, api: Api| {
            let (c, _) = capacity(&format!(
                "capacity: {{requestsPerMinute: 60, burst: 1, retryAfter: {retry}}}\nresponses: [{{status: 200}}]\n"
            ));
            let mut limiter = crate::capacity::Limiter::new(&c, start);
            limiter.admit(start, 1);
            let verdict = limiter.admit(start, 1);
            let out = capacity_refusal(
                api,
                &c,
                &verdict,
                verdict.refused.unwrap(),
                &BodyFacts::default(),
            );
            let mut got: Vec<String> = out
                .headers
                .into_iter()
                .filter(|(n, _)| n.starts_with("retry-after"))
                .map(|(n, v)| format!("{n}: {v}"))
                .collect();
            got.sort();
            got
        };
        assert_eq!(
            shapes("both", Api::OpenaiChat),
            ["retry-after-ms: 1000", "retry-after: 1"]
        );
        assert_eq!(shapes("both", Api::AnthropicMessages), ["retry-after: 1"]);
        assert_eq!(shapes("seconds", Api::OpenaiChat), ["retry-after: 1"]);
        assert_eq!(
            shapes("milliseconds", Api::AnthropicMessages),
            ["retry-after-ms: 1000"]
        );
        assert!(shapes("none", Api::OpenaiChat).is_empty());
    }
}
