//! Turns a scenario response into bytes in the shape of the API that was called.
//!
//! This file renders a response (a status, an answer, a stream error) and settles its headers,
//! with what it bills; `request` is what the renderer reads from a request, `answer` an answer's
//! parts and its non-streamed JSON, `stream` the event streams of both APIs with their faults,
//! `usage` what an answer reports and a request costs, and `limits` the rate-limit headers and the
//! 429 of a request over capacity.

mod answer;
mod limits;
mod request;
mod stream;
mod usage;

use std::time::{Duration, SystemTime};

use docsfab_record::Api;
use serde_json::json;

use self::answer::json_reply;
pub(crate) use self::limits::capacity_refusal;
use self::limits::rate_limit_headers;
pub(crate) use self::request::{BodyFacts, RequestInfo};
use self::stream::{anthropic_stream, openai_stream, stream_error};
pub(crate) use self::usage::{input_estimate, token_cost};
use self::usage::{prompt_usage, reported_usage};
use crate::cache::BilledUsage;
use crate::capacity::{Capacity, Verdict};
use crate::http::{Framing, Outgoing};
use crate::scenario::{Action, Reply, Response, StatusBody, StatusReply, Step};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
