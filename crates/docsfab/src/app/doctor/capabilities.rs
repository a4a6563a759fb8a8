//! `doctor --probe`'s capability probes (issue 31). After the ping answered, two more tiny
//! requests, each sent once through `HttpTransport::send` and never replayed:
//!
//! * **tools**: one tool, and a tool call required (`tool_choice: required` on openai-chat,
//!   `{type: any}` on anthropic-messages). An answer with a call: `true`; an answer without one
//!   (a chat template that drops `tools`, as SmolLM2's on llama.cpp does), or a 400/422 refusing
//!   the members: `false`.
//! * **structuredOutput**: a question whose plain answer is prose, constrained to a one-member
//!   schema (`{"ok": boolean}`). A valid instance: `true`; anything else, or a refusal: `false`.
//! * **streamUsage**: whether the ping's answer carried usage (no request of its own).
//!
//! A probe that could not be answered (no response, a 5xx, a 429) is `null`: unknown, not no.

use docsfab_boundary::redact::Redactor;
use docsfab_provider::{
    HttpTransport, Message, Payload, ResponseFormat, StreamOutcome, ToolChoice, ToolSpec,
    Transport as _, TransportFailure, TurnRequest,
};
use docsfab_record::Api;
use serde_json::{Value, json};

use crate::app::error::CliError;

/// The tool the tools probe offers.
const TOOL: &str = "docsfab_probe_echo";
/// The schema name the structured-output probe sends.
const SCHEMA_NAME: &str = "docsfab_probe";

/// One capability: `Some(yes/no)` or `None` (not judged), and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub value: Option<bool>,
    pub seen: String,
}

/// What the probes found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub tools: Capability,
    pub structured_output: Capability,
    pub stream_usage: Option<bool>,
}

impl Capabilities {
    /// Nothing judged: the ping did not answer, so no capability probe was sent.
    pub fn unknown() -> Capabilities {
        let not = || Capability {
            value: None,
            seen: "not probed: the ping did not answer".into(),
        };
        Capabilities {
            tools: not(),
            structured_output: not(),
            stream_usage: None,
        }
    }
}

/// What the probes send: the transport, the API and model, and the ping's findings.
pub struct Probes<'a> {
    pub transport: &'a HttpTransport,
    pub api: Api,
    pub model: &'a str,
    pub include_usage: bool,
    pub redactor: &'a Redactor,
}

/// Sends the two probes (2 requests) and judges them; `stream_usage` is the ping's finding.
pub fn probe(p: &Probes<'_>, stream_usage: bool) -> Result<Capabilities, CliError> {
    let rt = crate::app::execute::runtime()?;
    let send = |request: TurnRequest| -> Result<Result<StreamOutcome, TransportFailure>, CliError> {
        let payload = Payload::build(p.api, &request)
            .map_err(|e| CliError::failed(format!("cannot build a probe request ({e}).")))?;
        Ok(rt.block_on(p.transport.send(payload.bytes().clone())))
    };
    let tools = tools_verdict(&send(tools_request(p))?, p.redactor);
    let structured_output = schema_verdict(&send(schema_request(p))?, p.redactor);
    Ok(Capabilities {
        tools,
        structured_output,
        stream_usage: Some(stream_usage),
    })
}

fn base_request(p: &Probes<'_>, text: &str, max_output_tokens: u32) -> TurnRequest {
    TurnRequest {
        model: p.model.to_owned(),
        max_output_tokens,
        system: None,
        messages: vec![Message::User { text: text.into() }],
        tools: vec![],
        include_usage: p.include_usage,
        prompt_cache_key: None,
        response_format: None,
        tool_choice: None,
    }
}

fn tools_request(p: &Probes<'_>) -> TurnRequest {
    TurnRequest {
        tools: vec![ToolSpec {
            name: TOOL.into(),
            description: "Echoes a text back.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }),
        }],
        tool_choice: Some(ToolChoice::Required),
        ..base_request(p, &format!("Call the tool {TOOL} with text \"ping\"."), 64)
    }
}

/// The probe's schema: every object closed, every member required, so any API's strict mode
/// takes it.
fn probe_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": false,
    })
}

fn schema_request(p: &Probes<'_>) -> TurnRequest {
    TurnRequest {
        response_format: Some(ResponseFormat::JsonSchema {
            name: SCHEMA_NAME.into(),
            schema: probe_schema(),
            strict: true,
        }),
        // A question a model answers in prose unless the constraint holds it to the schema.
        ..base_request(p, "In one short sentence: is the sky blue?", 32)
    }
}

/// A refusal of the request's members (not of the key or the rate): the server does not take
/// them at all.
fn refused_members(f: &TransportFailure) -> bool {
    matches!(f.failure.http_status, Some(400 | 422))
}

fn not_judged(f: &TransportFailure, redactor: &Redactor) -> Capability {
    Capability {
        value: None,
        seen: format!("not judged: {}", redactor.line(&f.detail)),
    }
}

fn refused(f: &TransportFailure, redactor: &Redactor) -> Capability {
    Capability {
        value: Some(false),
        seen: format!("refused: {}", redactor.line(&f.detail)),
    }
}

fn tools_verdict(
    sent: &Result<StreamOutcome, TransportFailure>,
    redactor: &Redactor,
) -> Capability {
    match sent {
        Ok(a) if !a.tool_calls.is_empty() => Capability {
            value: Some(true),
            seen: format!(
                "a required tool call came back ({})",
                redactor.line(&a.tool_calls[0].name)
            ),
        },
        Ok(_) => Capability {
            value: Some(false),
            seen: "a request that required a tool call was answered without one".into(),
        },
        Err(f) if refused_members(f) => refused(f, redactor),
        Err(f) => not_judged(f, redactor),
    }
}

fn schema_verdict(
    sent: &Result<StreamOutcome, TransportFailure>,
    redactor: &Redactor,
) -> Capability {
    match sent {
        Ok(a) if is_instance(&a.text) => Capability {
            value: Some(true),
            seen: "a schema-constrained request came back as a valid instance".into(),
        },
        Ok(_) => Capability {
            value: Some(false),
            seen: "a schema-constrained request came back as something else than a valid instance"
                .into(),
        },
        Err(f) if refused_members(f) => refused(f, redactor),
        Err(f) => not_judged(f, redactor),
    }
}

/// Whether `text` is exactly an instance of [`probe_schema`]: `{"ok": true|false}`.
fn is_instance(text: &str) -> bool {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Object(m)) => m.len() == 1 && m.get("ok").is_some_and(Value::is_boolean),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_policy::class::ProviderFailure;
    use docsfab_provider::ToolCall;
    use docsfab_record::FaultKind;

    fn answer(text: &str, calls: usize) -> Result<StreamOutcome, TransportFailure> {
        Ok(StreamOutcome {
            http_status: 200,
            text: text.to_owned(),
            content_published: true,
            finish_reason: None,
            done: true,
            usage: docsfab_record::Usage::UNKNOWN,
            tool_calls: (0..calls)
                .map(|i| ToolCall {
                    id: format!("c{i}"),
                    name: TOOL.into(),
                    arguments: "{}".into(),
                    truncated: false,
                })
                .collect(),
            models: Vec::new(),
            raw_body: None,
            verdict: None,
            rate_headers: Default::default(),
            gateway: None,
        })
    }

    fn status(code: u16) -> Result<StreamOutcome, TransportFailure> {
        Err(TransportFailure::new(
            ProviderFailure::from_http_status(code, None),
            format!("HTTP {code}"),
        ))
    }

    #[test]
    fn issue31_tools_is_yes_with_a_call_no_without_unknown_without_an_answer() {
        let r = Redactor::new::<&str>(&[]);
        assert_eq!(tools_verdict(&answer("", 1), &r).value, Some(true));
        assert_eq!(tools_verdict(&answer("sunny", 0), &r).value, Some(false));
        assert_eq!(tools_verdict(&status(400), &r).value, Some(false));
        assert_eq!(tools_verdict(&status(503), &r).value, None);
        let reset = Err(TransportFailure::new(
            ProviderFailure::from_fault(FaultKind::Reset),
            "reset",
        ));
        assert_eq!(tools_verdict(&reset, &r).value, None);
    }

    #[test]
    fn issue31_structured_output_needs_exactly_an_instance() {
        let r = Redactor::new::<&str>(&[]);
        assert_eq!(
            schema_verdict(&answer("{\"ok\": true}", 0), &r).value,
            Some(true)
        );
        assert_eq!(
            schema_verdict(&answer(" {\"ok\":false}\n", 0), &r).value,
            Some(true)
        );
        for text in [
            "Yes, it is.",
            "{\"ok\": \"yes\"}",
            "{\"ok\": true, \"x\": 1}",
            "```json\n{\"ok\": true}\n```",
        ] {
            assert_eq!(
                schema_verdict(&answer(text, 0), &r).value,
                Some(false),
                "{text}"
            );
        }
        assert_eq!(schema_verdict(&status(422), &r).value, Some(false));
        assert_eq!(schema_verdict(&status(429), &r).value, None);
    }
}
