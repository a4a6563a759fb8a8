//! An answer's parts as both APIs name them (model, finish reason, tool-call ids, cut arguments)
//! and the non-streamed JSON answer.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_record::Api;
use serde_json::{Value, json};

use super::request::{DEFAULT_MODEL, RequestInfo};
use super::usage::reported_usage;
use crate::http::{Framing, Outgoing};
use crate::scenario::{Answer, ToolCall};

pub(super) fn model_of(answer: &Answer, req: &RequestInfo) -> String {
    answer
        .model
        .clone()
        .or_else(|| req.body.model.clone())
        .unwrap_or_else(|| DEFAULT_MODEL.to_owned())
}

pub(super) fn finish_reason(answer: &Answer, api: Api) -> String {
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

pub(super) fn tool_call_id(call: &ToolCall, api: Api, req: &RequestInfo, k: usize) -> String {
    call.id.clone().unwrap_or_else(|| match api {
        Api::OpenaiChat => format!("call_sim_{}_{k}", req.index),
        Api::AnthropicMessages => format!("toolu_sim_{}_{k}", req.index),
    })
}

pub(super) fn truncated_arguments(call: &ToolCall) -> &str {
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

pub(super) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The non-streamed answer (`stream` false or absent). Stream faults do not apply.
pub(super) fn json_reply(answer: &Answer, req: &RequestInfo) -> Outgoing {
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
