//! The provider-neutral request of one turn, and its serialization into the exact bytes that
//! the chosen API receives.
//!
//! A turn's request is serialized once, into a [`Payload`]. Its SHA-256 digest is taken at the
//! same moment, so every replay of the turn can be proven to send the same bytes (REP-12).
//!
//! Wire choices:
//! * `openai-chat`: `stream: true` with `stream_options.include_usage`, so the last chunk
//!   reports usage; the output ceiling goes in `max_tokens`, not `max_completion_tokens`,
//!   because every OpenAI-compatible server accepts the older name and many reject the newer;
//!   the system prompt is the first message; tools are `{type: function, function: {...}}`;
//!   an assistant turn that only called tools sends `content: null`.
//!   A provider whose server refuses `stream_options` sets `includeUsage: false` in host.yaml,
//!   and the member is left out (the usage is then unknown unless the server sends it anyway).
//!   With prompt caching on, `prompt_cache_key` names the step, so its turns, replays and
//!   retries land on the same cache.
//! * `anthropic-messages`: `stream: true`, `max_tokens`, `system` as a top-level field, tools
//!   with `input_schema`, tool calls as `tool_use` blocks whose `input` is the parsed arguments
//!   object, and all results of one tool batch in a single user message of `tool_result` blocks.
//!   With prompt caching on, `cache_control` marks the stable prefix at three breakpoints (the
//!   last tool, the system prompt as one text block, the first user message), so every turn,
//!   replay and step retry of the step reads what the first request wrote.
//!
//! * A contract step's answer requests carry its schema as a structured-output constraint
//!   (`response_format` on OpenAI, `output_config.format` on Anthropic; see [`crate::constraint`]).
//!
//! Caching changes the bytes, never their meaning: the digest covers the payload as sent.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Which provider API a payload is written for: the policy's `host.yaml` type, re-exported
/// here so the runtime passes one value from configuration to transport.
use docsfab_record::Api;

pub use crate::constraint::ResponseFormat;

/// The path appended to the provider's `baseUrl` (which already holds the version prefix).
pub fn endpoint_path(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => "/chat/completions",
        Api::AnthropicMessages => "/messages",
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// A tool call the assistant made in an earlier turn, replayed into the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model sent them: a JSON object in text.
    pub arguments: String,
}

/// One conversation message. The system prompt is not a message: see [`TurnRequest::system`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "kebab-case")]
pub enum Message {
    User {
        text: String,
    },
    Assistant {
        text: String,
        tool_calls: Vec<AssistantToolCall>,
    },
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
}

/// Everything one provider turn asks for, independent of the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRequest {
    pub model: String,
    pub max_output_tokens: u32,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    /// OpenAI: ask for the usage chunk (`stream_options.include_usage`). Anthropic always
    /// reports usage.
    #[serde(default = "yes")]
    pub include_usage: bool,
    /// Prompt caching: the key of the step (OpenAI `prompt_cache_key`); on Anthropic any key
    /// turns on the `cache_control` breakpoints. `None`: no caching asked for.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// The structured-output constraint of a contract step's answer (`None`: none is sent).
    /// OpenAI: `response_format`; Anthropic: `output_config.format` (a JSON Schema only).
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Whether the model must call a tool. `None` sends nothing (the APIs' own default, auto);
    /// `doctor --probe` sends `Required` to learn whether a server honours tools at all.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
}

/// `tool_choice`: OpenAI `"auto"`/`"required"`, Anthropic `{type: auto}`/`{type: any}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call one of the tools.
    Required,
}

fn yes() -> bool {
    true
}

/// Why a request could not be serialized. Nothing was sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error(
        "the arguments of tool call {call_id} are not a JSON object, so they cannot be sent to the Anthropic Messages API"
    )]
    ToolArgumentsNotObject { call_id: String },
    #[error(
        "the Anthropic Messages API has no JSON-object mode; set providers.NAME.structuredOutput to json-schema or off"
    )]
    JsonObjectOnAnthropic,
    #[error("the request could not be written as JSON: {0}")]
    Json(String),
}

/// The SHA-256 digest of a payload's exact bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadDigest([u8; 32]);

impl PayloadDigest {
    pub fn of(bytes: &[u8]) -> Self {
        PayloadDigest(Sha256::digest(bytes).into())
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for PayloadDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PayloadDigest({})", self.to_hex())
    }
}

impl std::fmt::Display for PayloadDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for PayloadDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

/// The bytes of one turn's request, serialized once, with the digest taken when they were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    api: Api,
    bytes: Bytes,
    digest: PayloadDigest,
}

impl Payload {
    /// Serializes `request` for `api`. The result's bytes never change afterwards.
    pub fn build(api: Api, request: &TurnRequest) -> Result<Payload, RequestError> {
        let body = match api {
            Api::OpenaiChat => serde_json::to_vec(&openai::body(request)),
            Api::AnthropicMessages => serde_json::to_vec(&anthropic::body(request)?),
        }
        .map_err(|e| RequestError::Json(e.to_string()))?;
        Ok(Payload::from_bytes(api, Bytes::from(body)))
    }

    /// Wraps bytes that are already serialized (the composition route forwards a client's body).
    pub fn from_bytes(api: Api, bytes: Bytes) -> Payload {
        let digest = PayloadDigest::of(&bytes);
        Payload { api, bytes, digest }
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn digest(&self) -> PayloadDigest {
        self.digest
    }
}

mod openai {
    use super::*;

    #[derive(Serialize)]
    pub struct Body<'a> {
        model: &'a str,
        messages: Vec<Msg<'a>>,
        // `max_tokens` rather than `max_completion_tokens`: every OpenAI-compatible server we
        // target accepts it, while the newer name is unknown to many of them.
        max_tokens: u32,
        stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        stream_options: Option<StreamOptions>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tools: Vec<Tool<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        prompt_cache_key: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        response_format: Option<Format<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_choice: Option<&'static str>,
    }

    /// `response_format`: `{type: json_schema, json_schema: {...}}` or `{type: json_object}`.
    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Format<'a> {
        JsonSchema { json_schema: Named<'a> },
        JsonObject,
    }

    #[derive(Serialize)]
    struct Named<'a> {
        name: &'a str,
        schema: &'a Value,
        strict: bool,
    }

    fn format(f: &ResponseFormat) -> Format<'_> {
        match f {
            ResponseFormat::JsonSchema {
                name,
                schema,
                strict,
            } => Format::JsonSchema {
                json_schema: Named {
                    name,
                    schema,
                    strict: *strict,
                },
            },
            ResponseFormat::JsonObject => Format::JsonObject,
        }
    }

    #[derive(Serialize)]
    struct StreamOptions {
        include_usage: bool,
    }

    #[derive(Serialize)]
    #[serde(tag = "role", rename_all = "lowercase")]
    enum Msg<'a> {
        System {
            content: &'a str,
        },
        User {
            content: &'a str,
        },
        Assistant {
            // `null` when the assistant only called tools, as the API expects.
            content: Option<&'a str>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            tool_calls: Vec<Call<'a>>,
        },
        Tool {
            tool_call_id: &'a str,
            content: &'a str,
        },
    }

    #[derive(Serialize)]
    struct Call<'a> {
        id: &'a str,
        r#type: &'static str,
        function: CallFn<'a>,
    }

    #[derive(Serialize)]
    struct CallFn<'a> {
        name: &'a str,
        arguments: &'a str,
    }

    #[derive(Serialize)]
    struct Tool<'a> {
        r#type: &'static str,
        function: ToolFn<'a>,
    }

    #[derive(Serialize)]
    struct ToolFn<'a> {
        name: &'a str,
        description: &'a str,
        parameters: &'a Value,
    }

    pub fn body(r: &TurnRequest) -> Body<'_> {
        let mut messages = Vec::with_capacity(r.messages.len() + 1);
        if let Some(system) = &r.system {
            messages.push(Msg::System { content: system });
        }
        for m in &r.messages {
            messages.push(match m {
                Message::User { text } => Msg::User { content: text },
                Message::Assistant { text, tool_calls } => Msg::Assistant {
                    content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
                    tool_calls: tool_calls
                        .iter()
                        .map(|c| Call {
                            id: &c.id,
                            r#type: "function",
                            function: CallFn {
                                name: &c.name,
                                arguments: &c.arguments,
                            },
                        })
                        .collect(),
                },
                Message::ToolResult {
                    call_id, content, ..
                } => Msg::Tool {
                    tool_call_id: call_id,
                    content,
                },
            });
        }
        Body {
            model: &r.model,
            messages,
            max_tokens: r.max_output_tokens,
            stream: true,
            stream_options: r.include_usage.then_some(StreamOptions {
                include_usage: true,
            }),
            prompt_cache_key: r.prompt_cache_key.as_deref(),
            response_format: r.response_format.as_ref().map(format),
            tool_choice: r.tool_choice.map(|c| match c {
                ToolChoice::Auto => "auto",
                ToolChoice::Required => "required",
            }),
            tools: r
                .tools
                .iter()
                .map(|t| Tool {
                    r#type: "function",
                    function: ToolFn {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
        }
    }
}

mod anthropic {
    use super::*;

    #[derive(Serialize)]
    pub struct Body<'a> {
        model: &'a str,
        max_tokens: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        system: Option<System<'a>>,
        messages: Vec<Msg<'a>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tools: Vec<Cached<Tool<'a>>>,
        stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        output_config: Option<OutputConfig<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_choice: Option<Choice>,
    }

    /// `tool_choice: {type: auto | any}`.
    #[derive(Serialize)]
    struct Choice {
        r#type: &'static str,
    }

    /// `output_config: {format: {type: json_schema, schema}}`: Anthropic's structured outputs.
    #[derive(Serialize)]
    struct OutputConfig<'a> {
        format: SchemaFormat<'a>,
    }

    #[derive(Serialize)]
    struct SchemaFormat<'a> {
        r#type: &'static str,
        schema: &'a Value,
    }

    fn output_config(f: Option<&ResponseFormat>) -> Result<Option<OutputConfig<'_>>, RequestError> {
        match f {
            None => Ok(None),
            Some(ResponseFormat::JsonSchema { schema, .. }) => Ok(Some(OutputConfig {
                format: SchemaFormat {
                    r#type: "json_schema",
                    schema,
                },
            })),
            Some(ResponseFormat::JsonObject) => Err(RequestError::JsonObjectOnAnthropic),
        }
    }

    /// The system prompt: a plain string, or one text block when it carries a cache breakpoint.
    #[derive(Serialize)]
    #[serde(untagged)]
    enum System<'a> {
        Text(&'a str),
        Blocks([Cached<Block<'a>>; 1]),
    }

    /// A block or tool, with `cache_control` when it ends a cached prefix.
    #[derive(Serialize)]
    struct Cached<T> {
        #[serde(flatten)]
        item: T,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<Ephemeral>,
    }

    #[derive(Serialize)]
    struct Ephemeral {
        r#type: &'static str,
    }

    fn cached<T>(item: T, breakpoint: bool) -> Cached<T> {
        Cached {
            item,
            cache_control: breakpoint.then_some(Ephemeral {
                r#type: "ephemeral",
            }),
        }
    }

    #[derive(Serialize)]
    struct Msg<'a> {
        role: &'static str,
        content: Vec<Cached<Block<'a>>>,
    }

    #[derive(Serialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Block<'a> {
        Text {
            text: &'a str,
        },
        ToolUse {
            id: &'a str,
            name: &'a str,
            input: Value,
        },
        ToolResult {
            tool_use_id: &'a str,
            content: &'a str,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            is_error: bool,
        },
    }

    #[derive(Serialize)]
    struct Tool<'a> {
        name: &'a str,
        description: &'a str,
        input_schema: &'a Value,
    }

    pub fn body(r: &TurnRequest) -> Result<Body<'_>, RequestError> {
        let messages = drafts(&r.messages)?;
        let caching = r.prompt_cache_key.is_some();
        let last_tool = r.tools.len().checked_sub(1);
        // The first user message ends the stable prefix: the step's instructions and sources.
        let first_user = messages.first().filter(|m| m.role == "user").map(|_| 0);
        let messages = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let last = m.content.len().saturating_sub(1);
                Msg {
                    role: m.role,
                    content: m
                        .content
                        .into_iter()
                        .enumerate()
                        .map(|(j, b)| cached(b, caching && first_user == Some(i) && j == last))
                        .collect(),
                }
            })
            .collect();
        let system = r.system.as_deref().map(|text| match caching {
            true => System::Blocks([cached(Block::Text { text }, true)]),
            false => System::Text(text),
        });
        Ok(Body {
            model: &r.model,
            max_tokens: r.max_output_tokens,
            system,
            messages,
            tools: r
                .tools
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let tool = Tool {
                        name: &t.name,
                        description: &t.description,
                        input_schema: &t.parameters,
                    };
                    cached(tool, caching && last_tool == Some(i))
                })
                .collect(),
            stream: true,
            output_config: output_config(r.response_format.as_ref())?,
            tool_choice: r.tool_choice.map(|c| Choice {
                r#type: match c {
                    ToolChoice::Auto => "auto",
                    ToolChoice::Required => "any",
                },
            }),
        })
    }

    /// The conversation in the API's messages, before cache breakpoints are placed: tool calls
    /// as `tool_use` blocks, and every result of one tool batch in a single user message.
    fn drafts(conversation: &[Message]) -> Result<Vec<Draft<'_>>, RequestError> {
        let mut messages: Vec<Draft<'_>> = Vec::with_capacity(conversation.len());
        for m in conversation {
            match m {
                Message::User { text } => messages.push(Draft {
                    role: "user",
                    content: vec![Block::Text { text }],
                }),
                Message::Assistant { text, tool_calls } => {
                    let mut content = Vec::with_capacity(tool_calls.len() + 1);
                    if !text.is_empty() {
                        content.push(Block::Text { text });
                    }
                    for c in tool_calls {
                        let input = arguments_object(&c.arguments).ok_or_else(|| {
                            RequestError::ToolArgumentsNotObject {
                                call_id: c.id.clone(),
                            }
                        })?;
                        content.push(Block::ToolUse {
                            id: &c.id,
                            name: &c.name,
                            input,
                        });
                    }
                    messages.push(Draft {
                        role: "assistant",
                        content,
                    });
                }
                Message::ToolResult {
                    call_id,
                    content,
                    is_error,
                } => {
                    let block = Block::ToolResult {
                        tool_use_id: call_id,
                        content,
                        is_error: *is_error,
                    };
                    // The API wants every result of one tool batch in a single user message.
                    match messages.last_mut() {
                        Some(last)
                            if last.role == "user"
                                && last
                                    .content
                                    .iter()
                                    .all(|b| matches!(b, Block::ToolResult { .. })) =>
                        {
                            last.content.push(block)
                        }
                        _ => messages.push(Draft {
                            role: "user",
                            content: vec![block],
                        }),
                    }
                }
            }
        }
        Ok(messages)
    }

    /// A message while the conversation is gathered, before breakpoints are placed.
    struct Draft<'a> {
        role: &'static str,
        content: Vec<Block<'a>>,
    }

    fn arguments_object(arguments: &str) -> Option<Value> {
        if arguments.trim().is_empty() {
            return Some(Value::Object(Default::default()));
        }
        match serde_json::from_str::<Value>(arguments) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> TurnRequest {
        TurnRequest {
            include_usage: true,
            prompt_cache_key: None,
            response_format: None,
            tool_choice: None,
            model: "m1".into(),
            max_output_tokens: 512,
            system: Some("be brief".into()),
            messages: vec![
                Message::User { text: "hi".into() },
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![
                        AssistantToolCall {
                            id: "c1".into(),
                            name: "read_file".into(),
                            arguments: r#"{"path":"a.rs"}"#.into(),
                        },
                        AssistantToolCall {
                            id: "c2".into(),
                            name: "list_files".into(),
                            arguments: "{}".into(),
                        },
                    ],
                },
                Message::ToolResult {
                    call_id: "c1".into(),
                    content: "fn main() {}".into(),
                    is_error: false,
                },
                Message::ToolResult {
                    call_id: "c2".into(),
                    content: "denied".into(),
                    is_error: true,
                },
            ],
            tools: vec![ToolSpec {
                name: "read_file".into(),
                description: "Read a file".into(),
                parameters: json!({"type":"object","required":["path"]}),
            }],
        }
    }

    fn parsed(p: &Payload) -> Value {
        serde_json::from_slice(p.bytes()).unwrap()
    }

    #[test]
    fn openai_body_shape() {
        let p = Payload::build(Api::OpenaiChat, &request()).unwrap();
        let v = parsed(&p);
        assert_eq!(v["stream"], json!(true));
        assert_eq!(v["stream_options"], json!({"include_usage": true}));
        assert_eq!(v["max_tokens"], json!(512));
        assert_eq!(
            v["messages"][0],
            json!({"role":"system","content":"be brief"})
        );
        assert_eq!(v["messages"][2]["content"], Value::Null);
        assert_eq!(
            v["messages"][2]["tool_calls"][0],
            json!({"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.rs\"}"}})
        );
        assert_eq!(
            v["messages"][3],
            json!({"role":"tool","tool_call_id":"c1","content":"fn main() {}"})
        );
        assert_eq!(v["tools"][0]["type"], json!("function"));
        assert_eq!(
            v["tools"][0]["function"]["parameters"]["required"],
            json!(["path"])
        );
    }

    #[test]
    fn anthropic_body_shape() {
        let p = Payload::build(Api::AnthropicMessages, &request()).unwrap();
        let v = parsed(&p);
        assert_eq!(v["system"], json!("be brief"));
        assert_eq!(v["stream"], json!(true));
        assert_eq!(v["max_tokens"], json!(512));
        assert_eq!(v["messages"].as_array().unwrap().len(), 3);
        assert_eq!(
            v["messages"][1]["content"][0],
            json!({"type":"tool_use","id":"c1","name":"read_file","input":{"path":"a.rs"}})
        );
        // Both results of the batch share one user message.
        assert_eq!(v["messages"][2]["role"], json!("user"));
        assert_eq!(v["messages"][2]["content"].as_array().unwrap().len(), 2);
        assert_eq!(v["messages"][2]["content"][1]["is_error"], json!(true));
        assert_eq!(v["tools"][0]["input_schema"]["type"], json!("object"));
    }

    #[test]
    fn anthropic_refuses_non_object_arguments() {
        let mut r = request();
        r.messages[1] = Message::Assistant {
            text: "x".into(),
            tool_calls: vec![AssistantToolCall {
                id: "c9".into(),
                name: "t".into(),
                arguments: "{\"cut".into(),
            }],
        };
        assert_eq!(
            Payload::build(Api::AnthropicMessages, &r),
            Err(RequestError::ToolArgumentsNotObject {
                call_id: "c9".into()
            })
        );
    }

    fn constrained(format: ResponseFormat) -> TurnRequest {
        TurnRequest {
            response_format: Some(format),
            ..request()
        }
    }

    fn schema_format(strict: bool) -> ResponseFormat {
        ResponseFormat::JsonSchema {
            name: "outline".into(),
            schema: json!({"type": "object", "required": ["modules"]}),
            strict,
        }
    }

    #[test]
    fn issue31_tool_choice_is_sent_per_api_only_when_set() {
        let required = TurnRequest {
            tool_choice: Some(ToolChoice::Required),
            ..request()
        };
        let v = parsed(&Payload::build(Api::OpenaiChat, &required).unwrap());
        assert_eq!(v["tool_choice"], json!("required"));
        let v = parsed(&Payload::build(Api::AnthropicMessages, &required).unwrap());
        assert_eq!(v["tool_choice"], json!({"type": "any"}));
        let auto = TurnRequest {
            tool_choice: Some(ToolChoice::Auto),
            ..request()
        };
        let v = parsed(&Payload::build(Api::AnthropicMessages, &auto).unwrap());
        assert_eq!(v["tool_choice"], json!({"type": "auto"}));
        for api in [Api::OpenaiChat, Api::AnthropicMessages] {
            let v = parsed(&Payload::build(api, &request()).unwrap());
            assert!(v.get("tool_choice").is_none(), "{api}");
        }
    }

    #[test]
    fn openai_carries_the_contract_as_response_format() {
        let v =
            parsed(&Payload::build(Api::OpenaiChat, &constrained(schema_format(false))).unwrap());
        assert_eq!(
            v["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "outline",
                "schema": {"type": "object", "required": ["modules"]}, "strict": false}})
        );
        let v = parsed(
            &Payload::build(Api::OpenaiChat, &constrained(ResponseFormat::JsonObject)).unwrap(),
        );
        assert_eq!(v["response_format"], json!({"type": "json_object"}));
        let v = parsed(&Payload::build(Api::OpenaiChat, &request()).unwrap());
        assert!(v.get("response_format").is_none());
    }

    #[test]
    fn anthropic_carries_the_contract_as_output_config() {
        let v = parsed(
            &Payload::build(Api::AnthropicMessages, &constrained(schema_format(true))).unwrap(),
        );
        assert_eq!(
            v["output_config"],
            json!({"format": {"type": "json_schema", "schema": {"type": "object", "required": ["modules"]}}})
        );
        assert!(v.get("response_format").is_none());
        assert_eq!(
            Payload::build(
                Api::AnthropicMessages,
                &constrained(ResponseFormat::JsonObject)
            ),
            Err(RequestError::JsonObjectOnAnthropic)
        );
    }

    // Proves REP-12.
    #[test]
    fn serialization_is_stable_and_digest_matches_bytes_rep_12() {
        let a = Payload::build(Api::OpenaiChat, &request()).unwrap();
        let b = Payload::build(Api::OpenaiChat, &request()).unwrap();
        assert_eq!(a.bytes(), b.bytes());
        assert_eq!(a.digest(), PayloadDigest::of(a.bytes()));
        assert_eq!(a.digest().to_hex().len(), 64);
    }
}
