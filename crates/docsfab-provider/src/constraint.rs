//! A step's contract as a structured-output constraint: what a request asks the server to hold
//! the answer to (docs/structured-output.md).
//!
//! The constraint helps the model; it is never trusted. The contract validator judges every
//! answer exactly as it would without one, so no rule of the retry spec changes meaning: a
//! server that ignores the constraint still gets its prose answers retried as `contract-prose`.
//!
//! Pure: the setting, the API and the schema in, the constraint (or none) out.
//!
//! * `openai-chat`: `response_format: {type: json_schema, json_schema: {name, schema, strict}}`,
//!   strict only when the schema meets the strict rules ([`strict_compatible`]); a schema that
//!   does not is still sent, with `strict: false` (OpenAI treats it as best effort, llama.cpp and
//!   vLLM compile it into a grammar either way). `json-object` sends `{type: json_object}`.
//! * `anthropic-messages`: `output_config: {format: {type: json_schema, schema}}`. Anthropic's
//!   structured outputs are always strict and refuse (HTTP 400, terminal) a schema they cannot
//!   compile, so a schema that does not meet the strict rules is not sent at all: a terminal
//!   refusal caused by a mere hint would cost the step.

use docsfab_policy::host::StructuredOutput;
use docsfab_record::{Api, OutputConstraint};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What one request asks the server to hold its answer to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ResponseFormat {
    /// The contract's JSON Schema.
    JsonSchema {
        /// The schema's name (OpenAI requires one: `^[a-zA-Z0-9_-]{1,64}$`).
        name: String,
        schema: Value,
        strict: bool,
    },
    /// Any JSON object.
    JsonObject,
}

impl ResponseFormat {
    /// The record's word for this constraint.
    pub fn recorded(&self) -> OutputConstraint {
        match self {
            ResponseFormat::JsonSchema { strict: true, .. } => OutputConstraint::JsonSchemaStrict,
            ResponseFormat::JsonSchema { strict: false, .. } => OutputConstraint::JsonSchema,
            ResponseFormat::JsonObject => OutputConstraint::JsonObject,
        }
    }

    /// The constraint a contract step's answer requests carry, or `None` when nothing is sent:
    /// the setting is `off`, or the API cannot take this schema without refusing the request.
    pub fn for_contract(
        setting: StructuredOutput,
        api: Api,
        step_id: &str,
        schema: &Value,
    ) -> Option<ResponseFormat> {
        let strict = strict_compatible(schema);
        match (setting, api) {
            (StructuredOutput::Off, _) => None,
            (StructuredOutput::JsonObject, Api::OpenaiChat) => Some(ResponseFormat::JsonObject),
            // host.yaml refuses json-object on Anthropic; were it to get here, send nothing.
            (StructuredOutput::JsonObject, Api::AnthropicMessages) => None,
            (StructuredOutput::JsonSchema, Api::AnthropicMessages) if !strict => None,
            (StructuredOutput::JsonSchema, _) => Some(ResponseFormat::JsonSchema {
                name: schema_name(step_id),
                schema: with_required_listed(schema),
                strict,
            }),
        }
    }
}

/// A schema name the APIs accept, from the step id: other characters become `_`, at most 64.
fn schema_name(step_id: &str) -> String {
    let name: String = step_id
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "answer".to_owned()
    } else {
        name
    }
}

/// The schema with every `required` name that an object does not list under `properties`
/// listed there as `{}` (any value). The meaning is the same — `{}` accepts anything — but
/// grammar compilers enforce only listed properties: llama.cpp let objects without a required
/// `purpose` through until it was listed (measured on the quickstart's schema).
fn with_required_listed(schema: &Value) -> Value {
    let mut out = schema.clone();
    list_required(&mut out, 0);
    out
}

fn list_required(node: &mut Value, depth: usize) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    if depth > MAX_DEPTH {
        return;
    }
    let missing: Vec<String> = map
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| {
            !map.get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key(*name))
        })
        .map(str::to_owned)
        .collect();
    if !missing.is_empty() {
        let properties = map
            .entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(properties) = properties.as_object_mut() {
            for name in missing {
                properties.insert(name, Value::Object(Default::default()));
            }
        }
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(members) = map.get_mut(key).and_then(Value::as_object_mut) {
            members
                .values_mut()
                .for_each(|v| list_required(v, depth + 1));
        }
    }
    if let Some(items) = map.get_mut("items") {
        list_required(items, depth + 1);
    }
    if let Some(any_of) = map.get_mut("anyOf").and_then(Value::as_array_mut) {
        any_of.iter_mut().for_each(|v| list_required(v, depth + 1));
    }
}

/// Keywords every strict dialect takes (the intersection of OpenAI's and Anthropic's documented
/// subsets). Anything else — `minLength`, `oneOf`, `allOf`, `not`, `patternProperties`, numeric
/// bounds on Anthropic, `$schema`, `default` — keeps a schema out of strict mode.
const STRICT_KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "description",
    "title",
    "$defs",
    "definitions",
    "$ref",
];

/// Whether `schema` meets the strict rules: the root is an object schema; every object closes
/// itself (`additionalProperties: false`) and requires every property it lists; only
/// [`STRICT_KEYWORDS`] appear; `$ref`s point inside the schema.
pub fn strict_compatible(schema: &Value) -> bool {
    let root_is_object = schema.get("type").and_then(Value::as_str) == Some("object");
    root_is_object && strict_node(schema, 0)
}

/// Deeper than this is refused (OpenAI allows 10 levels of objects; a schema nested further is
/// not one a contract needs).
const MAX_DEPTH: usize = 32;

fn strict_node(node: &Value, depth: usize) -> bool {
    let Some(map) = node.as_object() else {
        return false;
    };
    if depth > MAX_DEPTH || !map.keys().all(|k| STRICT_KEYWORDS.contains(&k.as_str())) {
        return false;
    }
    if let Some(r) = map.get("$ref")
        && !r.as_str().is_some_and(|r| r.starts_with("#/"))
    {
        return false;
    }
    if is_object_schema(map) && !closed_and_all_required(map) {
        return false;
    }
    children(map).all(|child| strict_node(child, depth + 1))
}

fn is_object_schema(map: &serde_json::Map<String, Value>) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => map.contains_key("properties"),
    }
}

fn closed_and_all_required(map: &serde_json::Map<String, Value>) -> bool {
    if map.get("additionalProperties") != Some(&Value::Bool(false)) {
        return false;
    }
    let required: Vec<&str> = map
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let listed = map.get("properties").and_then(Value::as_object);
    let all_listed_required =
        listed.is_none_or(|p| p.keys().all(|k| required.contains(&k.as_str())));
    let all_required_listed = required
        .iter()
        .all(|r| listed.is_some_and(|p| p.contains_key(*r)));
    all_listed_required && all_required_listed
}

/// The subschemas of one schema node.
fn children(map: &serde_json::Map<String, Value>) -> impl Iterator<Item = &Value> {
    let members = ["properties", "$defs", "definitions"]
        .into_iter()
        .filter_map(|k| map.get(k).and_then(Value::as_object))
        .flat_map(|m| m.values());
    let items = map.get("items").into_iter();
    let any_of = map
        .get("anyOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    members.chain(items).chain(any_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn closed() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["modules"],
            "properties": {"modules": {"type": "array", "items": {
                "type": "object", "additionalProperties": false,
                "required": ["name", "purpose"],
                "properties": {"name": {"type": "string"}, "purpose": {"type": "string"}}
            }}}
        })
    }

    #[test]
    fn a_closed_schema_with_every_property_required_is_strict() {
        assert!(strict_compatible(&closed()));
    }

    #[test]
    fn open_objects_unlisted_requirements_and_foreign_keywords_are_not_strict() {
        // The quickstart's schema: `modules` items are open objects.
        let quickstart = json!({"type": "object", "required": ["modules"],
            "properties": {"modules": {"type": "array", "items": {"type": "object", "required": ["name"]}}}});
        assert!(!strict_compatible(&quickstart));
        let mut optional = closed();
        optional["required"] = json!([]);
        assert!(!strict_compatible(&optional));
        let mut min_len = closed();
        min_len["properties"]["modules"]["minItems"] = json!(1);
        assert!(!strict_compatible(&min_len));
        assert!(!strict_compatible(
            &json!({"type": "object", "additionalProperties": false, "oneOf": []})
        ));
        assert!(!strict_compatible(&json!({"type": "array", "items": {}})));
        assert!(!strict_compatible(
            &json!({"type": "object", "additionalProperties": false,
            "required": [], "properties": {}, "$ref": "https://example.com/s.json"})
        ));
    }

    #[test]
    fn the_setting_and_the_api_pick_what_is_sent() {
        let open = json!({"type": "object", "required": ["a"]});
        let openai = |s| ResponseFormat::for_contract(s, Api::OpenaiChat, "outline", &open);
        let anthropic = |s, schema: &Value| {
            ResponseFormat::for_contract(s, Api::AnthropicMessages, "outline", schema)
        };
        assert_eq!(
            openai(StructuredOutput::JsonSchema).map(|f| f.recorded()),
            Some(OutputConstraint::JsonSchema)
        );
        assert_eq!(
            openai(StructuredOutput::JsonObject),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(openai(StructuredOutput::Off), None);
        // Anthropic refuses a schema it cannot compile: an open one is not sent.
        assert_eq!(anthropic(StructuredOutput::JsonSchema, &open), None);
        assert_eq!(
            anthropic(StructuredOutput::JsonSchema, &closed()).map(|f| f.recorded()),
            Some(OutputConstraint::JsonSchemaStrict)
        );
        assert_eq!(anthropic(StructuredOutput::JsonObject, &closed()), None);
    }

    #[test]
    fn required_names_are_listed_as_any_value_and_nothing_else_changes() {
        let quickstart = json!({"type": "object", "required": ["modules"],
            "properties": {"modules": {"type": "array", "items": {"type": "object", "required": ["name", "purpose"],
                "properties": {"name": {"type": "string"}}}}}});
        let sent = with_required_listed(&quickstart);
        assert_eq!(
            sent["properties"]["modules"]["items"]["properties"],
            json!({"name": {"type": "string"}, "purpose": {}})
        );
        let mut back = sent.clone();
        back["properties"]["modules"]["items"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("purpose");
        assert_eq!(back, quickstart);
        assert_eq!(with_required_listed(&closed()), closed());
    }

    #[test]
    fn schema_names_fit_the_api_pattern() {
        assert_eq!(schema_name("pages[3]"), "pages_3_");
        assert_eq!(schema_name(""), "answer");
        assert_eq!(schema_name(&"x".repeat(100)).len(), 64);
    }
}
