//! Reading one `data:` line's JSON in a single pass, without building a value: whether it is an
//! object, whether it is a pure structured error event (BND-3), which models it names, and
//! whether any string, once its escapes are decoded, holds credential material.
//!
//! Strings without escapes arrive borrowed from the line, whose raw bytes were already scanned,
//! so only escaped strings are scanned again here. Strings under content-like keys are also
//! appended to a rolling window that joins them across events, so a key split across deltas is
//! found once its last piece arrives.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

use crate::chunk::{Chunk, Field, Slot, Val};
use crate::scan::Scanner;
use crate::verdict::CredentialKind;

/// What one data line said.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Facts {
    pub is_object: bool,
    /// A top-level `error` member.
    pub has_error: bool,
    /// A top-level member other than `error` and `type`.
    pub other_member: bool,
    /// A top-level `type` whose value is not the string `"error"`.
    pub type_not_error: bool,
    /// A top-level `type` equal to `"message_start"`.
    pub message_start: bool,
    /// A top-level `model` member.
    pub top_model: bool,
    /// A `model` member of a top-level `message` object.
    pub message_model: bool,
    /// Some named model (either place) was not exactly the selected model.
    pub model_mismatch: bool,
}

impl Facts {
    /// BND-3: an object whose only members are `error` and an optional `"type": "error"`.
    pub fn is_pure_error(&self) -> bool {
        self.is_object && self.has_error && !self.other_member && !self.type_not_error
    }
}

/// Content-like member names: their string values are what the user reads, joined in order.
const CONTENT_KEYS: &[&str] = &[
    "content",
    "text",
    "partial_json",
    "arguments",
    "thinking",
    "reasoning",
    "reasoning_content",
    "refusal",
];

/// Joined content across events, keeping only the tail that a credential cut at the end could
/// still be part of (usually a few bytes: the last word).
#[derive(Debug)]
pub(crate) struct Carry {
    buf: Vec<u8>,
    /// Whether `buf[0]` is the first content byte of the stream, with nothing before it. After
    /// trimming, `buf[0]` is kept only as the byte before the live part.
    at_start: bool,
}

impl Default for Carry {
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            at_start: true,
        }
    }
}

impl Carry {
    /// Appends `s` and scans the window, then drops what can no longer matter.
    fn push_and_scan(&mut self, scanner: &Scanner, s: &[u8]) -> Option<CredentialKind> {
        self.buf.extend_from_slice(s);
        let found = scanner.find(&self.buf, self.at_start).map(|(_, k)| k);
        let live = scanner.live_from(&self.buf);
        if live > 1 || (live == 1 && self.at_start) {
            self.buf.drain(..live - 1);
            self.at_start = false;
        }
        found
    }
}

/// What the boundary judges a line against; absent when the line is only read for its chunk.
pub(crate) struct Judge<'a> {
    pub scanner: &'a Scanner,
    pub model: &'a str,
    pub carry: &'a mut Carry,
}

pub(crate) struct Ctx<'a> {
    pub judge: Option<Judge<'a>>,
    /// Filled with the line's answer facts in the same pass, when asked for.
    pub chunk: Option<&'a mut Chunk>,
    pub facts: Facts,
    pub credential: Option<CredentialKind>,
}

impl Ctx<'_> {
    fn scan_decoded(&mut self, s: &str) {
        if self.credential.is_none()
            && let Some(j) = &self.judge
            && let Some((_, kind)) = j.scanner.find(s.as_bytes(), true)
        {
            self.credential = Some(kind);
        }
    }

    fn content(&mut self, s: &str) {
        if let Some(j) = &mut self.judge
            && let Some(kind) = j.carry.push_and_scan(j.scanner, s.as_bytes())
            && self.credential.is_none()
        {
            self.credential = Some(kind);
        }
    }

    fn is_model(&self, s: &str) -> bool {
        self.judge.as_ref().is_none_or(|j| s == j.model)
    }

    fn chunk_value(&mut self, slot: Slot, v: Val<'_>) {
        if let Some(c) = self.chunk.as_deref_mut() {
            c.value(slot, v);
        }
    }
}

/// Parses `line` as exactly one JSON value (surrounding whitespace allowed) and records what it
/// says in `ctx`. `Err` means it is not JSON.
pub(crate) fn inspect(line: &[u8], ctx: &mut Ctx<'_>) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(line);
    Seed {
        ctx,
        role: Role::Top,
        slot: Slot::Top,
    }
    .deserialize(&mut de)?;
    de.end()
}

/// Where a value sits, which decides what is recorded about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Top,
    /// The value of a top-level `message`.
    Message,
    /// The value of a top-level `model` or of `message.model`.
    Model,
    /// The value of a top-level `type`.
    Type,
    /// The value of a content-like member.
    Content,
    Plain,
}

struct Seed<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    role: Role,
    slot: Slot,
}

impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Seed<'_, '_> {
    /// Any value but the selected model's name in a model slot is a mismatch; any value but
    /// `"error"` in `type` keeps the object from being a pure error event.
    fn scalar(&mut self, v: Val<'_>) {
        self.ctx.chunk_value(self.slot, v);
        self.not_a_string();
    }

    fn not_a_string(&mut self) {
        match self.role {
            Role::Model => self.ctx.facts.model_mismatch = true,
            Role::Type => self.ctx.facts.type_not_error = true,
            _ => {}
        }
    }

    fn string(&mut self, s: &str, escaped: bool) {
        self.ctx.chunk_value(self.slot, Val::Str(s));
        match self.role {
            Role::Content => {
                // The window scan covers `s` itself too.
                self.ctx.content(s);
                return;
            }
            Role::Model if !self.ctx.is_model(s) => self.ctx.facts.model_mismatch = true,
            Role::Type => {
                if s != "error" {
                    self.ctx.facts.type_not_error = true;
                }
                if s == "message_start" {
                    self.ctx.facts.message_start = true;
                }
            }
            _ => {}
        }
        if escaped {
            self.ctx.scan_decoded(s);
        }
    }
}

impl<'de> Visitor<'de> for Seed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.scalar(Val::Other);
        Ok(())
    }
    fn visit_i64<E: de::Error>(mut self, n: i64) -> Result<(), E> {
        // As `Value::as_u64`: a non-negative integer reads as one.
        self.scalar(u64::try_from(n).map_or(Val::Other, Val::U64));
        Ok(())
    }
    fn visit_u64<E: de::Error>(mut self, n: u64) -> Result<(), E> {
        self.scalar(Val::U64(n));
        Ok(())
    }
    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.scalar(Val::Other);
        Ok(())
    }
    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.scalar(Val::Null);
        Ok(())
    }
    fn visit_borrowed_str<E: de::Error>(mut self, s: &'de str) -> Result<(), E> {
        self.string(s, false);
        Ok(())
    }
    fn visit_str<E: de::Error>(mut self, s: &str) -> Result<(), E> {
        self.string(s, true);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.scalar(Val::Seq);
        let slot = self.slot.element();
        while seq
            .next_element_seed(Seed {
                ctx: self.ctx,
                role: Role::Plain,
                slot,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.ctx.chunk_value(self.slot, Val::Map);
        match self.role {
            Role::Top => self.ctx.facts.is_object = true,
            Role::Model | Role::Type => self.not_a_string(),
            _ => {}
        }
        while let Some((key, field)) = map.next_key_seed(KeySeed { ctx: self.ctx })? {
            let slot = match self.ctx.chunk.as_deref_mut() {
                Some(c) => c.member(self.slot, field),
                None => Slot::None,
            };
            let role = match (self.role, key) {
                (Role::Top, Key::Model) => {
                    self.ctx.facts.top_model = true;
                    self.ctx.facts.other_member = true;
                    Role::Model
                }
                (Role::Top, Key::Type) => Role::Type,
                (Role::Top, Key::Error) => {
                    self.ctx.facts.has_error = true;
                    Role::Plain
                }
                (Role::Top, Key::Message) => {
                    self.ctx.facts.other_member = true;
                    Role::Message
                }
                (Role::Top, key) => {
                    self.ctx.facts.other_member = true;
                    if key == Key::Content {
                        Role::Content
                    } else {
                        Role::Plain
                    }
                }
                (Role::Message, Key::Model) => {
                    self.ctx.facts.message_model = true;
                    Role::Model
                }
                (_, Key::Content) => Role::Content,
                _ => Role::Plain,
            };
            map.next_value_seed(Seed {
                ctx: self.ctx,
                role,
                slot,
            })?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Model,
    Type,
    Error,
    Message,
    Content,
    Other,
}

impl Key {
    fn of(s: &str) -> Key {
        match s {
            "model" => Key::Model,
            "type" => Key::Type,
            "error" => Key::Error,
            "message" => Key::Message,
            _ if CONTENT_KEYS.contains(&s) => Key::Content,
            _ => Key::Other,
        }
    }
}

/// Member names are compared after their escapes are decoded (`"mod\u0065l"` is `model` to
/// every consumer), and escaped names are scanned like any escaped string.
struct KeySeed<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_, '_> {
    type Value = (Key, Field);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Key, Field), D::Error> {
        d.deserialize_str(self)
    }
}

impl KeySeed<'_, '_> {
    fn name(&self, s: &str) -> (Key, Field) {
        // The chunk's names are looked up only when a chunk is wanted.
        let field = if self.ctx.chunk.is_some() {
            Field::of(s)
        } else {
            Field::Other
        };
        (Key::of(s), field)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_, '_> {
    type Value = (Key, Field);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<(Key, Field), E> {
        Ok(self.name(s))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(Key, Field), E> {
        self.ctx.scan_decoded(s);
        Ok(self.name(s))
    }
}
