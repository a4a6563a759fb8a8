//! The run record's check against its JSON Schema. The record's types live in `docsfab-record`
//! and are imported from there (`docsfab_record::RunRecord`, ...), their one path.
//!
//! Every field is documented for users in `docs/run-record.md`; the JSON Schema
//! ([`SCHEMA`](docsfab_record::SCHEMA), `crates/docsfab-record/run-record.schema.json`) is the
//! machine-checkable form of the same shape, and [`validate_against_schema`] checks a serialized
//! record against it.

/// Why a value failed [`validate_against_schema`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaCheckError {
    #[error("the run-record schema itself is invalid: {0}")]
    BadSchema(String),
    #[error("the value does not match the run-record schema: {}", .0.join("; "))]
    Mismatch(Vec<String>),
}

/// Validates a serialized run record (or anything claiming to be one) against the shipped
/// schema. Every violation is listed with its JSON pointer.
pub fn validate_against_schema(value: &serde_json::Value) -> Result<(), SchemaCheckError> {
    let schema: serde_json::Value = serde_json::from_str(docsfab_record::SCHEMA)
        .map_err(|e| SchemaCheckError::BadSchema(e.to_string()))?;
    let validator = jsonschema::draft202012::new(&schema)
        .map_err(|e| SchemaCheckError::BadSchema(e.to_string()))?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{}: {}", e.instance_path(), e))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(SchemaCheckError::Mismatch(errors))
    }
}
