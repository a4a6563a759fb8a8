//! Prompt caching, modelled by prefix.
//!
//! A request offers the cache a list of prefixes, each a hash and a size in tokens, read from its
//! body ([`CacheProbe::read`]); the server keeps one set of every prefix it has seen
//! ([`PromptCache`]) and works out per request what was read from the cache and what was written.
//!
//! - Anthropic Messages: a block with a `cache_control` member is a breakpoint. Blocks are, in
//!   Anthropic's prefix order, each `tools[]` object, each `system` text block (when `system` is an
//!   array; a string system is part of the prefix but cannot carry a breakpoint) and each block of
//!   each `messages[].content` (a string content is one block). A breakpoint's prefix is every block
//!   up to and including it. Read = the longest of the request's breakpoint prefixes already cached;
//!   creation = the longest breakpoint prefix minus read. Anthropic's 20-block lookback before a
//!   breakpoint is not modelled: only the breakpoints themselves are looked up.
//! - OpenAI Chat Completions, only with a string `prompt_cache_key`: every leading run of whole
//!   elements (each `tools[]` object, then each `messages[]` message) is a prefix, cached per
//!   (model, key). Read (`cached_tokens`) = the longest run an earlier request with the same model
//!   and key also sent; OpenAI bills no cache writes. Its 1024-token minimum is not modelled.
//!
//! A prefix's size is the canonical JSON bytes (object keys sorted, no whitespace, the block's own
//! `cache_control` left out) of its parts, summed, / 4. Its hash is SHA-256 over the API, the model
//! (and the key), and each part's canonical JSON, so a moved breakpoint does not change the hash of
//! the content before it. Entries never expire.

use std::collections::HashSet;

use serde_json::Value;
use sha2::{Digest, Sha256};

use docsfab_record::Api;
use serde::{Deserialize, Serialize};

/// One prefix a request offers the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefix {
    hash: [u8; 32],
    tokens: u64,
}

/// What a request's body offers the cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct CacheProbe {
    pub prefixes: Vec<Prefix>,
    /// OpenAI: the body has a string `prompt_cache_key`, so the usage reports `cached_tokens`.
    pub keyed: bool,
    /// Anthropic bills cache writes (`cache_creation_input_tokens`); OpenAI does not.
    pub bills_writes: bool,
}

/// What the cache did for one request, in tokens (before they are fitted into the prompt total).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheUse {
    pub read: u64,
    pub creation: u64,
}

/// The server-wide set of cached prefixes.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    seen: HashSet<[u8; 32]>,
}

/// A bound on the set, so a long benchmark cannot grow it without limit: past it the cache is
/// emptied, as if everything had expired at once.
const MAX_PREFIXES: usize = 1_000_000;

impl PromptCache {
    /// Looks the request's prefixes up, then caches all of them.
    pub(crate) fn lookup_and_insert(&mut self, probe: &CacheProbe) -> CacheUse {
        let read = probe
            .prefixes
            .iter()
            .filter(|p| self.seen.contains(&p.hash))
            .map(|p| p.tokens)
            .max()
            .unwrap_or(0);
        let longest = probe.prefixes.iter().map(|p| p.tokens).max().unwrap_or(0);
        let creation = if probe.bills_writes {
            longest.saturating_sub(read)
        } else {
            0
        };
        if self.seen.len() + probe.prefixes.len() > MAX_PREFIXES {
            self.seen.clear();
        }
        self.seen.extend(probe.prefixes.iter().map(|p| p.hash));
        CacheUse { read, creation }
    }
}

impl CacheProbe {
    /// The prefixes of a parsed request body sent to `api`.
    pub(crate) fn read(body: &Value, api: Api) -> CacheProbe {
        let model = body.get("model").and_then(Value::as_str).unwrap_or("");
        match api {
            Api::AnthropicMessages => anthropic(body, model),
            Api::OpenaiChat => openai(body, model),
        }
    }
}

/// A running prefix: the hash of the parts so far and their canonical bytes.
struct Chain {
    hasher: Sha256,
    bytes: u64,
}

impl Chain {
    fn new(seed: &[&str]) -> Chain {
        let mut hasher = Sha256::new();
        for s in seed {
            hasher.update(s.as_bytes());
            hasher.update([0u8]);
        }
        Chain { hasher, bytes: 0 }
    }

    fn push(&mut self, tag: &str, part: &Value) {
        let mut text = String::new();
        canonical(part, true, &mut text);
        self.hasher.update(tag.as_bytes());
        self.hasher.update([0u8]);
        self.hasher.update(text.as_bytes());
        self.hasher.update([0u8]);
        self.bytes += text.len() as u64;
    }

    fn prefix(&self) -> Prefix {
        Prefix {
            hash: self.hasher.clone().finalize().into(),
            tokens: self.bytes / 4,
        }
    }
}

fn is_breakpoint(block: &Value) -> bool {
    block.get("cache_control").is_some_and(|c| !c.is_null())
}

fn anthropic(body: &Value, model: &str) -> CacheProbe {
    let mut chain = Chain::new(&["anthropic", model]);
    let mut prefixes = Vec::new();
    let mut part = |chain: &mut Chain, tag: &str, block: &Value| {
        chain.push(tag, block);
        if is_breakpoint(block) {
            prefixes.push(chain.prefix());
        }
    };
    for tool in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        part(&mut chain, "tool", tool);
    }
    match body.get("system") {
        Some(Value::Array(blocks)) => {
            for block in blocks {
                part(&mut chain, "system", block);
            }
        }
        Some(system @ Value::String(_)) => part(&mut chain, "system", system),
        _ => {}
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let tag = format!("message:{role}");
        match message.get("content") {
            Some(Value::Array(blocks)) => {
                for block in blocks {
                    part(&mut chain, &tag, block);
                }
            }
            Some(content) => part(&mut chain, &tag, content),
            None => {}
        }
    }
    CacheProbe {
        prefixes,
        keyed: false,
        bills_writes: true,
    }
}

fn openai(body: &Value, model: &str) -> CacheProbe {
    let Some(key) = body.get("prompt_cache_key").and_then(Value::as_str) else {
        return CacheProbe::default();
    };
    let mut chain = Chain::new(&["openai", model, key]);
    let mut prefixes = Vec::new();
    let list = |name: &str| {
        body.get(name)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    };
    for tool in list("tools") {
        chain.push("tool", tool);
        prefixes.push(chain.prefix());
    }
    for message in list("messages") {
        chain.push("message", message);
        prefixes.push(chain.prefix());
    }
    CacheProbe {
        prefixes,
        keyed: true,
        bills_writes: false,
    }
}

/// Compact JSON with object keys sorted (whatever order `serde_json` keeps them in); `top`
/// leaves the value's own `cache_control` out.
fn canonical(value: &Value, top: bool, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .keys()
                .filter(|k| !(top && k.as_str() == "cache_control"))
                .collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], false, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, false, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        let mut s = String::new();
        canonical(v, true, &mut s);
        s
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_the_blocks_own_cache_control() {
        let v = json!({"type": "text", "text": "a\"b", "cache_control": {"type": "ephemeral"},
            "n": [1, {"z": null, "cache_control": true}]});
        assert_eq!(
            canon(&v),
            r#"{"n":[1,{"cache_control":true,"z":null}],"text":"a\"b","type":"text"}"#
        );
    }

    #[test]
    fn anthropic_breakpoints_are_prefixes_in_tools_system_messages_order() {
        let body = json!({
            "model": "claude-test",
            "tools": [{"name": "t", "cache_control": {"type": "ephemeral"}}],
            "system": [{"type": "text", "text": "sys"}, {"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]
        });
        let probe = CacheProbe::read(&body, Api::AnthropicMessages);
        let tool = canon(&json!({"name": "t"})).len() as u64;
        let sys = canon(&json!({"type": "text", "text": "sys"})).len() as u64
            + canon(&json!({"type": "text", "text": "more"})).len() as u64;
        let msg = canon(&json!({"type": "text", "text": "hi"})).len() as u64;
        let sizes: Vec<u64> = probe.prefixes.iter().map(|p| p.tokens).collect();
        assert_eq!(sizes, [tool / 4, (tool + sys) / 4, (tool + sys + msg) / 4]);

        let mut cache = PromptCache::default();
        let first = cache.lookup_and_insert(&probe);
        assert_eq!(
            first,
            CacheUse {
                read: 0,
                creation: sizes[2]
            }
        );
        assert_eq!(
            cache.lookup_and_insert(&probe),
            CacheUse {
                read: sizes[2],
                creation: 0
            }
        );
        // Another model shares nothing.
        let mut other = body.clone();
        other["model"] = json!("claude-other");
        assert_eq!(
            cache
                .lookup_and_insert(&CacheProbe::read(&other, Api::AnthropicMessages))
                .read,
            0
        );
    }

    #[test]
    fn openai_caches_leading_whole_messages_per_model_and_key() {
        let body = |key: Option<&str>, last: &str| {
            let mut b = json!({"model": "gpt-test", "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": last}
            ]});
            if let Some(k) = key {
                b["prompt_cache_key"] = json!(k);
            }
            b
        };
        assert!(
            CacheProbe::read(&body(None, "a"), Api::OpenaiChat)
                .prefixes
                .is_empty()
        );
        let mut cache = PromptCache::default();
        let first = CacheProbe::read(&body(Some("k"), "a"), Api::OpenaiChat);
        assert_eq!(cache.lookup_and_insert(&first), CacheUse::default());
        let second = CacheProbe::read(&body(Some("k"), "b"), Api::OpenaiChat);
        let system = canon(&json!({"role": "system", "content": "You are terse."})).len() as u64;
        assert_eq!(
            cache.lookup_and_insert(&second),
            CacheUse {
                read: system / 4,
                creation: 0
            }
        );
        let other_key = CacheProbe::read(&body(Some("other"), "b"), Api::OpenaiChat);
        assert_eq!(cache.lookup_and_insert(&other_key).read, 0);
    }
}

/// What the provider bills for one request, in tokens. `input_tokens` is always the whole prompt,
/// cache parts included, on both APIs (OpenAI's `prompt_tokens`; Anthropic's `input_tokens` +
/// `cache_creation_input_tokens` + `cache_read_input_tokens`).
///
/// - An answer sent to its end: the usage its body reports (or would report, when the request
///   did not ask for usage or the scenario says `usage: never`).
/// - A 200 body ended early (a `cut`, or a client that went away mid-body): the whole prompt, and
///   as output the answer content of the events written completely before the end, 4 bytes a
///   token (see `Bill::billed` in `render.rs`).
/// - A `drop`: the prompt (the provider processed it, then the connection died), no output.
/// - A status answer, a capacity 429, a `stream_options` refusal, `no-route`: nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BilledUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prompt tokens written to the prompt cache (Anthropic only; part of `input_tokens`).
    pub cache_creation_input_tokens: u64,
    /// Prompt tokens read from the prompt cache (Anthropic's `cache_read_input_tokens`, OpenAI's
    /// `cached_tokens`; part of `input_tokens`).
    pub cache_read_input_tokens: u64,
}
