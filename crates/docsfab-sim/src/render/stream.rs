//! The event streams of both APIs: the SSE writer with the scenario's line endings and byte
//! order marks, the OpenAI and Anthropic streams of an answer with their faults and dialect
//! quirks, a stream error, and the billing marks of every event.

use std::time::Duration;

use docsfab_record::Api;
use serde_json::{Value, json};

use super::answer::{finish_reason, model_of, tool_call_id, truncated_arguments, unix_secs};
use super::request::RequestInfo;
use super::usage::reported_usage;
use crate::http::{Framing, Outgoing};
use crate::scenario::{
    Answer, BomLines, ErrorEvent, LineEnding, LineFraming, Quirk, StreamErrorReply, StreamFaults,
};

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

pub(super) fn openai_stream(answer: &Answer, req: &RequestInfo) -> (Outgoing, Vec<(u64, u64)>) {
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

pub(super) fn anthropic_stream(answer: &Answer, req: &RequestInfo) -> (Outgoing, Vec<(u64, u64)>) {
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

pub(super) fn stream_error(
    reply: &StreamErrorReply,
    req: &RequestInfo,
) -> (Outgoing, Vec<(u64, u64)>) {
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
    use std::num::NonZeroUsize;

    use super::*;
    use crate::scenario::{Bom, BomLines, LineEnding};

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
}
