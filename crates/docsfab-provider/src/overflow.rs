//! Recognising a context-overflow refusal in a provider's error body, in every server dialect
//! docsfab meets, and reading the token counts it gives (STP-14: `context-exhausted`).
//!
//! This only *names* a failure. The status or declared class has already decided that the
//! failure is terminal; [`crate::TransportFailure::context_exhausted`] applies a recognition
//! only to such a failure, so no wording can ever turn a retryable status terminal (REP-4).
//!
//! Reading the message is confined here: a bounded prefix of it is compared, ASCII
//! case-insensitively, with fixed phrases from a table, and only digits that follow fixed
//! anchors are taken out. No part of the message is kept or copied anywhere.

use docsfab_record::ContextWindow;
use serde_json::Value;

/// How much of an error message the matcher looks at. Every dialect below states the overflow
/// and its numbers in the first ~250 bytes; a longer message is read only this far.
const MESSAGE_SCAN_BYTES: usize = 1024;

/// The most digits one count may have (a count beyond that is no token count).
const MAX_DIGITS: usize = 12;

/// Which count an anchor's number fills.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Prompt,
    Context,
    Output,
}

/// One server's wording of a context overflow: the message phrase that identifies it (or the
/// error type/code word), and the anchors whose following number fills a count. Phrases and
/// anchors are lowercase; the message is compared lowercased.
struct Dialect {
    server: &'static str,
    /// A word in `error.type` / `error.code` that identifies the overflow by itself.
    word: Option<&'static str>,
    /// A phrase in the message that identifies the overflow.
    phrase: Option<&'static str>,
    anchors: &'static [(&'static str, Slot)],
}

/// The dialects, first match wins. The wording comes from each server's own source or docs.
const DIALECTS: &[Dialect] = &[
    // llama.cpp tools/server: `send_error(..., ERROR_TYPE_EXCEED_CONTEXT_SIZE)` with "request
    // (%d tokens) exceeds the available context size (%d tokens), try increasing it"; the
    // error JSON also carries `n_prompt_tokens` and `n_ctx` (server-task.cpp), read first.
    Dialect {
        server: "llama.cpp",
        word: Some("exceed_context_size_error"),
        phrase: None,
        anchors: &[
            ("request (", Slot::Prompt),
            ("input (", Slot::Prompt),
            ("context size (", Slot::Context),
        ],
    },
    // llama.cpp builds through 2025 wrote the same refusal, before the type existed, as type
    // `invalid_request_error` with "the request exceeds the available context size. try
    // increasing the context size or enable context shift" (no counts), often on an SSE
    // `error:` field line (llama.cpp PR #16109 moved those to `data:`).
    Dialect {
        server: "llama.cpp",
        word: None,
        phrase: Some("exceeds the available context size"),
        anchors: &[
            ("request (", Slot::Prompt),
            ("context size (", Slot::Context),
        ],
    },
    // OpenAI: code `context_length_exceeded`, message "This model's maximum context length is
    // 128000 tokens. However, your messages resulted in 130000 tokens..." (older: "you
    // requested N tokens (P in the messages, C in the completion)").
    Dialect {
        server: "openai",
        word: Some("context_length_exceeded"),
        phrase: None,
        anchors: VLLM_ANCHORS,
    },
    // vLLM serving_engine: "This model's maximum context length is 2048 tokens. However, you
    // requested 3000 tokens (2000 in the messages, 1000 in the completion)..." and later
    // "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum
    // context length is 4096 tokens and your request has 2778 input tokens (...)".
    Dialect {
        server: "vllm",
        word: None,
        phrase: Some("maximum context length is"),
        anchors: VLLM_ANCHORS,
    },
    // Anthropic Messages: 400 invalid_request_error "prompt is too long: 208310 tokens >
    // 200000 maximum".
    Dialect {
        server: "anthropic",
        word: None,
        phrase: Some("prompt is too long"),
        anchors: &[
            ("prompt is too long: ", Slot::Prompt),
            ("tokens > ", Slot::Context),
        ],
    },
    // text-generation-inference router validation (422, error_type "validation"): "Input
    // validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000
    // `inputs` tokens and 512 `max_new_tokens`".
    Dialect {
        server: "tgi",
        word: None,
        phrase: Some("`inputs` tokens + `max_new_tokens` must be <="),
        anchors: &[
            ("must be <= ", Slot::Context),
            ("given: ", Slot::Prompt),
            ("tokens and ", Slot::Output),
        ],
    },
    // TGI, when the prompt alone is too long: "`inputs` must have less than 4096 tokens.
    // Given: 5000".
    Dialect {
        server: "tgi",
        word: None,
        phrase: Some("`inputs` must have less than"),
        anchors: &[("less than ", Slot::Context), ("given: ", Slot::Prompt)],
    },
];

/// OpenAI's and vLLM's wordings share their anchors.
const VLLM_ANCHORS: &[(&str, Slot)] = &[
    ("maximum context length is ", Slot::Context),
    ("resulted in ", Slot::Prompt),
    // Before "tokens (": the newer wording has "input tokens (8000 > ...)" after it.
    ("request has ", Slot::Prompt),
    ("tokens (", Slot::Prompt),
    ("in the messages, ", Slot::Output),
    ("is too large: ", Slot::Output),
];

/// A recognised overflow: which dialect said it, and the counts it gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub server: &'static str,
    pub window: ContextWindow,
}

/// Recognises a context overflow in an error body (a non-2xx body, or a structured error event
/// of a 200 stream), or `None`. Pure; reads at most [`MESSAGE_SCAN_BYTES`] of the message.
pub fn recognise(body: &Value) -> Option<Overflow> {
    let error = &body["error"];
    let words: Vec<&str> = [&error["type"], &error["code"], &body["error_type"]]
        .into_iter()
        .filter_map(Value::as_str)
        .collect();
    // Where each dialect puts its message: `error.message`, a bare string `error` (TGI), or a
    // top-level `message` (older vLLM).
    let message = [&error["message"], error, &body["message"]]
        .into_iter()
        .find_map(Value::as_str)
        .unwrap_or("");
    let text = lowered_prefix(message);
    let dialect = DIALECTS.iter().find(|d| {
        d.word.is_some_and(|w| words.contains(&w))
            || d.phrase.is_some_and(|p| contains(&text, p.as_bytes()))
    })?;
    let mut window = ContextWindow::default();
    for (anchor, slot) in dialect.anchors {
        let field = match slot {
            Slot::Prompt => &mut window.prompt_tokens,
            Slot::Context => &mut window.context_tokens,
            Slot::Output => &mut window.output_tokens,
        };
        if field.is_none() {
            *field = number_after(&text, anchor.as_bytes());
        }
    }
    // llama.cpp's structured members are exact; they win over the message's numbers.
    let member = |k: &str| error[k].as_u64().filter(|n| *n > 0);
    if let Some(n) = member("n_prompt_tokens") {
        window.prompt_tokens = Some(n);
    }
    if let Some(n) = member("n_ctx") {
        window.context_tokens = Some(n);
    }
    Some(Overflow {
        server: dialect.server,
        window,
    })
}

fn lowered_prefix(message: &str) -> Vec<u8> {
    let bytes = message.as_bytes();
    bytes[..bytes.len().min(MESSAGE_SCAN_BYTES)].to_ascii_lowercase()
}

fn contains(text: &[u8], needle: &[u8]) -> bool {
    position(text, needle).is_some()
}

fn position(text: &[u8], needle: &[u8]) -> Option<usize> {
    text.windows(needle.len()).position(|w| w == needle)
}

/// The decimal number right after the first `anchor` in `text` (spaces skipped).
fn number_after(text: &[u8], anchor: &[u8]) -> Option<u64> {
    let start = position(text, anchor)? + anchor.len();
    let rest = &text[start..];
    let rest = &rest[rest.iter().take_while(|b| **b == b' ').count()..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > MAX_DIGITS {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(p: Option<u64>, c: Option<u64>, o: Option<u64>) -> ContextWindow {
        ContextWindow {
            prompt_tokens: p,
            context_tokens: c,
            output_tokens: o,
        }
    }

    fn seen(body: &str) -> Option<Overflow> {
        recognise(&serde_json::from_str(body).unwrap())
    }

    // STP-14: every dialect's overflow body is recognised, with the counts it states.
    #[test]
    fn each_dialects_overflow_body_is_named_with_its_counts_stp_14() {
        let cases = [
            (
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                "openai",
                window(Some(130000), Some(128000), None),
            ),
            (
                r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#,
                "llama.cpp",
                window(Some(5000), Some(4096), None),
            ),
            (
                r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 3000 tokens (2000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
                "vllm",
                window(Some(2000), Some(2048), Some(1000)),
            ),
            (
                r#"{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None","type":"BadRequestError","param":null,"code":400}}"#,
                "vllm",
                window(Some(2778), Some(4096), Some(8000)),
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#,
                "anthropic",
                window(Some(208310), Some(200000), None),
            ),
            (
                r#"{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 512 `max_new_tokens`","error_type":"validation"}"#,
                "tgi",
                window(Some(4000), Some(4096), Some(512)),
            ),
            (
                r#"{"code":400,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"invalid_request_error"}"#,
                "llama.cpp",
                window(None, None, None),
            ),
            (
                r#"{"error":"Input validation error: `inputs` must have less than 1024 tokens. Given: 2000","error_type":"validation"}"#,
                "tgi",
                window(Some(2000), Some(1024), None),
            ),
        ];
        for (body, server, want) in cases {
            let got = seen(body).unwrap_or_else(|| panic!("not recognised: {body}"));
            assert_eq!((got.server, got.window), (server, want), "{body}");
        }
    }

    #[test]
    fn the_code_alone_names_an_overflow_without_counts() {
        let got = seen(r#"{"error":{"code":"context_length_exceeded"}}"#).unwrap();
        assert_eq!(got.window, ContextWindow::default());
    }

    #[test]
    fn other_refusals_and_lookalikes_are_not_overflows() {
        for body in [
            r#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#,
            r#"{"error":{"message":"the context is fine","type":"server_error","code":500}}"#,
            r#"{"error":"Input validation error: `temperature` must be strictly positive","error_type":"validation"}"#,
            r#"{"error":null}"#,
            r#"[1,2]"#,
            r#""prompt is too long""#,
        ] {
            assert_eq!(seen(body), None, "{body}");
        }
    }

    #[test]
    fn counts_are_bounded_and_only_read_after_their_anchor() {
        // Too many digits is no count; a phrase past the scanned prefix is not read.
        let huge =
            r#"{"error":{"message":"prompt is too long: 1234567890123 tokens > 200000 maximum"}}"#;
        assert_eq!(seen(huge).unwrap().window, window(None, Some(200000), None));
        let far = format!(
            r#"{{"error":{{"message":"{}prompt is too long: 5 tokens > 4 maximum"}}}}"#,
            "x".repeat(MESSAGE_SCAN_BYTES)
        );
        assert_eq!(seen(&far), None);
        let v = json!({"error": {"message": "PROMPT IS TOO LONG: 7 tokens > 5 maximum"}});
        assert_eq!(
            recognise(&v).unwrap().window,
            window(Some(7), Some(5), None)
        );
    }
}
