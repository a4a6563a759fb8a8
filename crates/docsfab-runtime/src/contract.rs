//! Contract validation: a read-only step's final answer must be one JSON object that meets the
//! step's JSON Schema.
//!
//! The answer text is judged as a whole, after trimming whitespace. One surrounding Markdown
//! code fence (a first line of three backticks, optionally followed by `json`, and a last line
//! of three backticks) is tolerated, because models add it often and it carries no meaning;
//! anything outside the fence, or an object preceded or followed by other text, is prose. No
//! object is dug out of prose: a retry asking for only the object is cheaper than guessing.
//!
//! The failure kind tells the step retry which feedback to give (STP-9): `empty`, `prose`
//! (not JSON, or a JSON string, number, boolean or null), `array`, or `schema-invalid`.
//! Schemas are compiled without any way to fetch a remote `$ref`: such a schema is refused.

use docsfab_record::ContractFailure;
use serde_json::{Map, Value};

/// A one-sentence correction for this kind of failure. Not what a retry sends: the rules
/// table's [`Feedback`](docsfab_policy::rules::Feedback) for the condition decides that, in
/// the words of `agent::feedback_text`.
pub fn feedback(kind: ContractFailure) -> &'static str {
    match kind {
        ContractFailure::Empty => {
            "Your answer was empty. Return only the JSON object the step asks for."
        }
        ContractFailure::Prose => {
            "Your answer was not a JSON object. Return only the JSON object the step asks \
                 for, with no text before or after it."
        }
        ContractFailure::Array => {
            "Your answer was a JSON array. Return only the JSON object the step asks for."
        }
        ContractFailure::Ungrounded => {
            "Your answer cites names the workspace does not hold. Cite only what you read there."
        }
        ContractFailure::SchemaInvalid => {
            "Your answer object does not meet the step's schema. Return only a corrected \
                 JSON object."
        }
    }
}

/// A judged answer that failed, with the schema violations when there are any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the answer is {}{}", .kind.as_str(), if .violations.is_empty() { String::new() } else { format!(": {}", .violations.join("; ")) })]
pub struct ContractRejection {
    pub kind: ContractFailure,
    /// Each schema violation with its JSON pointer (`schema-invalid` only).
    pub violations: Vec<String>,
}

/// A contract schema that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the contract schema cannot be used: {0}")]
pub struct ContractSchemaError(pub String);

/// A compiled contract.
#[derive(Debug)]
pub struct CompiledContract {
    validator: jsonschema::Validator,
}

impl CompiledContract {
    /// Compiles `schema` (its `$schema` picks the draft; 2020-12 when absent).
    pub fn new(schema: &Value) -> Result<CompiledContract, ContractSchemaError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| ContractSchemaError(e.to_string()))?;
        Ok(CompiledContract { validator })
    }

    /// Judges a final answer.
    pub fn judge(&self, answer: &str) -> Result<Map<String, Value>, ContractRejection> {
        let object = Value::Object(parse_object(answer)?);
        let violations = schema_violations(&self.validator, &object);
        if violations.is_empty() {
            Ok(into_map(object))
        } else {
            Err(ContractRejection {
                kind: ContractFailure::SchemaInvalid,
                violations,
            })
        }
    }
}

/// Every way `value` breaks the schema, one line each, prefixed with the JSON pointer of the
/// offending part when it is not the whole value. Tool arguments read the same way.
pub(crate) fn schema_violations(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect()
}

fn into_map(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn failure(kind: ContractFailure) -> ContractRejection {
    ContractRejection {
        kind,
        violations: Vec::new(),
    }
}

/// The answer as one JSON object, or why it is not one.
pub fn parse_object(answer: &str) -> Result<Map<String, Value>, ContractRejection> {
    let text = strip_fence(answer.trim()).trim();
    if text.is_empty() {
        return Err(failure(ContractFailure::Empty));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(Value::Array(_)) => Err(failure(ContractFailure::Array)),
        Ok(_) | Err(_) => Err(failure(ContractFailure::Prose)),
    }
}

/// The inside of one surrounding code fence, or the text unchanged.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some((info, body)) = rest.split_once('\n') else {
        return text;
    };
    let info = info.trim();
    if !(info.is_empty() || info.eq_ignore_ascii_case("json")) {
        return text;
    }
    match body.trim_end().strip_suffix("```") {
        // The closing fence must stand on its own line (or close an empty body).
        Some(inner) if inner.is_empty() || inner.ends_with('\n') => inner,
        _ => text,
    }
}
