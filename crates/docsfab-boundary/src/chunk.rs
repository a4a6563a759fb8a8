//! What one data line's JSON says about the answer (text, tool calls, finish, usage, models),
//! gathered by the same single pass that judges the line (see `inspect`), so a consumer such
//! as the provider's stream reader never parses the line a second time.
//!
//! The fields are those the stream readers of both APIs use. Each one follows
//! `serde_json::Value` indexing exactly: a member of the wrong type reads as absent, and when a
//! member name repeats, the last one wins. The stream readers rely on that to give the same
//! outcome as reading a `Value`.

/// One data line's answer facts. Read it only when the line parsed as JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// A top-level `error` member that is not `null`.
    pub error: bool,
    /// The top-level `type`, when a string.
    pub kind: Option<String>,
    /// The top-level `model`, when a string.
    pub model: Option<String>,
    /// The top-level `usage`, when an object.
    pub usage: Option<Tokens>,
    /// The top-level `choices`, when an array (OpenAI Chat Completions).
    pub choices: Option<Vec<Choice>>,
    /// The top-level `message` (Anthropic `message_start`).
    pub message: MessageFacts,
    /// The top-level `index`, when a non-negative integer.
    pub index: Option<u64>,
    /// The top-level `content_block` (Anthropic `content_block_start`).
    pub content_block: Block,
    /// The top-level `delta` (Anthropic `content_block_delta` and `message_delta`).
    pub delta: Delta,
}

/// Token counts of a `usage` object, each when a non-negative integer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: Option<u64>,
    /// Anthropic's `cache_read_input_tokens`.
    pub cache_read_input_tokens: Option<u64>,
    /// OpenAI's `prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
}

/// One element of `choices`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// `delta.content`, when a string.
    pub content: Option<String>,
    /// `delta.tool_calls`, when an array: one entry per element, whatever its type.
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// `finish_reason`, when a string.
    pub finish_reason: Option<String>,
}

/// One element of `delta.tool_calls`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: Option<u64>,
    pub id: Option<String>,
    /// `function.name`, when a string.
    pub name: Option<String>,
    /// `function.arguments`, when a string.
    pub arguments: Option<String>,
}

/// The members of a top-level `message` object that are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFacts {
    pub model: Option<String>,
    pub usage: Option<Tokens>,
}

/// The members of a top-level `content_block` object that are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Block {
    pub kind: Option<String>,
    pub id: Option<String>,
    pub name: Option<String>,
    pub text: Option<String>,
}

/// The members of a top-level `delta` object that are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub kind: Option<String>,
    pub text: Option<String>,
    pub partial_json: Option<String>,
    pub stop_reason: Option<String>,
}

/// A member name the chunk cares about (compared after escapes are decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Error,
    Type,
    Model,
    Usage,
    Choices,
    Message,
    Index,
    ContentBlock,
    Delta,
    Tok(Tok),
    Content,
    ToolCalls,
    FinishReason,
    Id,
    Function,
    Name,
    Arguments,
    Text,
    PartialJson,
    StopReason,
    PromptDetails,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tok {
    Prompt,
    Completion,
    Input,
    Output,
    CacheCreation,
    CacheRead,
    Cached,
}

impl Field {
    pub(crate) fn of(s: &str) -> Field {
        match s {
            "error" => Field::Error,
            "type" => Field::Type,
            "model" => Field::Model,
            "usage" => Field::Usage,
            "choices" => Field::Choices,
            "message" => Field::Message,
            "index" => Field::Index,
            "content_block" => Field::ContentBlock,
            "delta" => Field::Delta,
            "prompt_tokens" => Field::Tok(Tok::Prompt),
            "completion_tokens" => Field::Tok(Tok::Completion),
            "input_tokens" => Field::Tok(Tok::Input),
            "output_tokens" => Field::Tok(Tok::Output),
            "cache_creation_input_tokens" => Field::Tok(Tok::CacheCreation),
            "cache_read_input_tokens" => Field::Tok(Tok::CacheRead),
            "cached_tokens" => Field::Tok(Tok::Cached),
            "prompt_tokens_details" => Field::PromptDetails,
            "content" => Field::Content,
            "tool_calls" => Field::ToolCalls,
            "finish_reason" => Field::FinishReason,
            "id" => Field::Id,
            "function" => Field::Function,
            "name" => Field::Name,
            "arguments" => Field::Arguments,
            "text" => Field::Text,
            "partial_json" => Field::PartialJson,
            "stop_reason" => Field::StopReason,
            _ => Field::Other,
        }
    }
}

/// Where a value sits, as far as the chunk is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Nothing the chunk reads.
    None,
    Top,
    Error,
    Type,
    Model,
    Usage,
    UsageTok(Tok),
    /// OpenAI's `usage.prompt_tokens_details`.
    UsageDetails,
    Choices,
    Choice,
    ChoiceDelta,
    ChoiceContent,
    ToolCalls,
    ToolCall,
    ToolCallIndex,
    ToolCallId,
    Function,
    FunctionName,
    FunctionArguments,
    FinishReason,
    Message,
    MessageModel,
    MessageUsage,
    MessageUsageTok(Tok),
    Index,
    Block,
    BlockField(Field),
    Delta,
    DeltaField(Field),
}

impl Slot {
    /// The slot of an array element under `self`.
    pub(crate) fn element(self) -> Slot {
        match self {
            Slot::Choices => Slot::Choice,
            Slot::ToolCalls => Slot::ToolCall,
            _ => Slot::None,
        }
    }
}

/// A value as the visitor met it; containers are announced before their members.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Val<'s> {
    Map,
    Seq,
    Str(&'s str),
    /// A number that `Value::as_u64` reads as this.
    U64(u64),
    Null,
    /// A boolean or a number `as_u64` does not read.
    Other,
}

fn set(tokens: &mut Tokens, t: Tok, n: Option<u64>) {
    match t {
        Tok::Prompt => tokens.prompt_tokens = n,
        Tok::Completion => tokens.completion_tokens = n,
        Tok::Input => tokens.input_tokens = n,
        Tok::Output => tokens.output_tokens = n,
        Tok::CacheCreation => tokens.cache_creation_input_tokens = n,
        Tok::CacheRead => tokens.cache_read_input_tokens = n,
        Tok::Cached => tokens.cached_tokens = n,
    }
}

impl Chunk {
    fn choice(&mut self) -> Option<&mut Choice> {
        self.choices.as_mut()?.last_mut()
    }

    fn call(&mut self) -> Option<&mut ToolCallDelta> {
        self.choice()?.tool_calls.as_mut()?.last_mut()
    }

    /// A member named `field` of an object in `parent`: forgets what an earlier member of the
    /// same name said (the last one wins) and gives the slot of its value.
    pub(crate) fn member(&mut self, parent: Slot, field: Field) -> Slot {
        match parent {
            Slot::Top => self.top_member(field),
            Slot::Usage
            | Slot::UsageDetails
            | Slot::Choice
            | Slot::ChoiceDelta
            | Slot::ToolCall
            | Slot::Function => self.choice_member(parent, field),
            _ => self.anthropic_member(parent, field),
        }
    }

    /// A member of the event object itself.
    fn top_member(&mut self, field: Field) -> Slot {
        match field {
            Field::Error => {
                self.error = true;
                Slot::Error
            }
            Field::Type => {
                self.kind = None;
                Slot::Type
            }
            Field::Model => {
                self.model = None;
                Slot::Model
            }
            Field::Usage => {
                self.usage = None;
                Slot::Usage
            }
            Field::Choices => {
                self.choices = None;
                Slot::Choices
            }
            Field::Message => {
                self.message = MessageFacts::default();
                Slot::Message
            }
            Field::Index => {
                self.index = None;
                Slot::Index
            }
            Field::ContentBlock => {
                self.content_block = Block::default();
                Slot::Block
            }
            Field::Delta => {
                self.delta = Delta::default();
                Slot::Delta
            }
            _ => Slot::None,
        }
    }

    /// A member inside an OpenAI chunk's usage or choice (its delta, tool calls, function).
    fn choice_member(&mut self, parent: Slot, field: Field) -> Slot {
        match (parent, field) {
            (Slot::Usage, Field::Tok(t)) if t != Tok::Cached => {
                if let Some(u) = &mut self.usage {
                    set(u, t, None);
                }
                Slot::UsageTok(t)
            }
            (Slot::Usage, Field::PromptDetails) => {
                if let Some(u) = &mut self.usage {
                    u.cached_tokens = None;
                }
                Slot::UsageDetails
            }
            (Slot::UsageDetails, Field::Tok(Tok::Cached)) => {
                if let Some(u) = &mut self.usage {
                    u.cached_tokens = None;
                }
                Slot::UsageTok(Tok::Cached)
            }
            (Slot::Choice, Field::Delta) => {
                if let Some(c) = self.choice() {
                    c.content = None;
                    c.tool_calls = None;
                }
                Slot::ChoiceDelta
            }
            (Slot::Choice, Field::FinishReason) => {
                if let Some(c) = self.choice() {
                    c.finish_reason = None;
                }
                Slot::FinishReason
            }
            (Slot::ChoiceDelta, Field::Content) => {
                if let Some(c) = self.choice() {
                    c.content = None;
                }
                Slot::ChoiceContent
            }
            (Slot::ChoiceDelta, Field::ToolCalls) => {
                if let Some(c) = self.choice() {
                    c.tool_calls = None;
                }
                Slot::ToolCalls
            }
            (Slot::ToolCall, Field::Index) => {
                if let Some(c) = self.call() {
                    c.index = None;
                }
                Slot::ToolCallIndex
            }
            (Slot::ToolCall, Field::Id) => {
                if let Some(c) = self.call() {
                    c.id = None;
                }
                Slot::ToolCallId
            }
            (Slot::ToolCall, Field::Function) => {
                if let Some(c) = self.call() {
                    c.name = None;
                    c.arguments = None;
                }
                Slot::Function
            }
            (Slot::Function, Field::Name) => {
                if let Some(c) = self.call() {
                    c.name = None;
                }
                Slot::FunctionName
            }
            (Slot::Function, Field::Arguments) => {
                if let Some(c) = self.call() {
                    c.arguments = None;
                }
                Slot::FunctionArguments
            }
            _ => Slot::None,
        }
    }

    /// A member inside an Anthropic event's message, content block or delta.
    fn anthropic_member(&mut self, parent: Slot, field: Field) -> Slot {
        match (parent, field) {
            (Slot::Message, Field::Model) => {
                self.message.model = None;
                Slot::MessageModel
            }
            (Slot::Message, Field::Usage) => {
                self.message.usage = None;
                Slot::MessageUsage
            }
            (Slot::MessageUsage, Field::Tok(t)) if t != Tok::Cached => {
                if let Some(u) = &mut self.message.usage {
                    set(u, t, None);
                }
                Slot::MessageUsageTok(t)
            }
            (Slot::Block, f @ (Field::Type | Field::Id | Field::Name | Field::Text)) => {
                *self.block_field(f) = None;
                Slot::BlockField(f)
            }
            (
                Slot::Delta,
                f @ (Field::Type | Field::Text | Field::PartialJson | Field::StopReason),
            ) => {
                *self.delta_field(f) = None;
                Slot::DeltaField(f)
            }
            _ => Slot::None,
        }
    }

    fn block_field(&mut self, f: Field) -> &mut Option<String> {
        let b = &mut self.content_block;
        match f {
            Field::Type => &mut b.kind,
            Field::Id => &mut b.id,
            Field::Name => &mut b.name,
            _ => &mut b.text,
        }
    }

    fn delta_field(&mut self, f: Field) -> &mut Option<String> {
        let d = &mut self.delta;
        match f {
            Field::Type => &mut d.kind,
            Field::Text => &mut d.text,
            Field::PartialJson => &mut d.partial_json,
            _ => &mut d.stop_reason,
        }
    }

    /// A value in `slot` begins (a container before its members).
    pub(crate) fn value(&mut self, slot: Slot, v: Val<'_>) {
        // Every element is an entry, whatever its type: a reader indexes `choices[i]` and
        // counts tool-call positions over all elements.
        match slot {
            Slot::Choice => {
                if let Some(cs) = &mut self.choices {
                    cs.push(Choice::default());
                }
            }
            Slot::ToolCall => {
                if let Some(calls) = self.choice().and_then(|c| c.tool_calls.as_mut()) {
                    calls.push(ToolCallDelta::default());
                }
            }
            _ => {}
        }
        let text = |s: &str| Some(s.to_owned());
        match (slot, v) {
            (Slot::Error, Val::Null) => self.error = false,
            (Slot::Type, Val::Str(s)) => self.kind = text(s),
            (Slot::Model, Val::Str(s)) => self.model = text(s),
            (Slot::Usage, Val::Map) => self.usage = Some(Tokens::default()),
            (Slot::UsageTok(t), Val::U64(n)) => {
                if let Some(u) = &mut self.usage {
                    set(u, t, Some(n));
                }
            }
            (Slot::Choices, Val::Seq) => self.choices = Some(Vec::new()),
            (Slot::ChoiceContent, Val::Str(s)) => {
                if let Some(c) = self.choice() {
                    c.content = text(s);
                }
            }
            (Slot::ToolCalls, Val::Seq) => {
                if let Some(c) = self.choice() {
                    c.tool_calls = Some(Vec::new());
                }
            }
            (Slot::FinishReason, Val::Str(s)) => {
                if let Some(c) = self.choice() {
                    c.finish_reason = text(s);
                }
            }
            (Slot::ToolCallIndex, Val::U64(n)) => {
                if let Some(c) = self.call() {
                    c.index = Some(n);
                }
            }
            (Slot::ToolCallId, Val::Str(s)) => {
                if let Some(c) = self.call() {
                    c.id = text(s);
                }
            }
            (Slot::FunctionName, Val::Str(s)) => {
                if let Some(c) = self.call() {
                    c.name = text(s);
                }
            }
            (Slot::FunctionArguments, Val::Str(s)) => {
                if let Some(c) = self.call() {
                    c.arguments = text(s);
                }
            }
            (Slot::MessageModel, Val::Str(s)) => self.message.model = text(s),
            (Slot::MessageUsage, Val::Map) => self.message.usage = Some(Tokens::default()),
            (Slot::MessageUsageTok(t), Val::U64(n)) => {
                if let Some(u) = &mut self.message.usage {
                    set(u, t, Some(n));
                }
            }
            (Slot::Index, Val::U64(n)) => self.index = Some(n),
            (Slot::BlockField(f), Val::Str(s)) => *self.block_field(f) = text(s),
            (Slot::DeltaField(f), Val::Str(s)) => *self.delta_field(f) = text(s),
            _ => {}
        }
    }
}
