//! Contract validation of read-only answers (STP-9).

use docsfab_record::ContractFailure;
use docsfab_runtime::contract::{CompiledContract, feedback, parse_object};
use serde_json::json;

fn contract() -> CompiledContract {
    CompiledContract::new(&json!({
        "type": "object",
        "required": ["modules"],
        "properties": {"modules": {"type": "array", "items": {"type": "string"}}}
    }))
    .unwrap()
}

fn kind(answer: &str) -> ContractFailure {
    contract().judge(answer).unwrap_err().kind
}

#[test]
fn an_object_meeting_the_schema_is_accepted() {
    let object = contract().judge(r#" {"modules": ["a", "b"]} "#).unwrap();
    assert_eq!(object["modules"], json!(["a", "b"]));
}

/// Requirement: STP-9.
#[test]
fn prose_array_and_empty_answers_are_told_apart_stp_9() {
    assert_eq!(kind(""), ContractFailure::Empty);
    assert_eq!(kind("  \n\t "), ContractFailure::Empty);
    assert_eq!(kind("```json\n```"), ContractFailure::Empty);
    assert_eq!(kind("The crate has two modules."), ContractFailure::Prose);
    assert_eq!(
        kind(r#"Here it is: {"modules": []}"#),
        ContractFailure::Prose
    );
    assert_eq!(
        kind(r#"{"modules": []} I hope this helps"#),
        ContractFailure::Prose
    );
    assert_eq!(kind(r#""a string""#), ContractFailure::Prose);
    assert_eq!(kind("42"), ContractFailure::Prose);
    assert_eq!(kind("null"), ContractFailure::Prose);
    assert_eq!(kind(r#"{"modules": ["a""#), ContractFailure::Prose);
    assert_eq!(kind(r#"["a", "b"]"#), ContractFailure::Array);
    assert_eq!(kind(r#"[{"modules": []}]"#), ContractFailure::Array);
}

/// Requirement: STP-9.
#[test]
fn an_object_that_breaks_the_schema_is_schema_invalid_with_its_violations_stp_9() {
    let failure = contract().judge(r#"{"modules": [1]}"#).unwrap_err();
    assert_eq!(failure.kind, ContractFailure::SchemaInvalid);
    assert!(
        failure.violations[0].starts_with("/modules/0"),
        "{:?}",
        failure.violations
    );
    let failure = contract().judge(r#"{"mods": []}"#).unwrap_err();
    assert_eq!(failure.kind, ContractFailure::SchemaInvalid);
    assert!(failure.to_string().contains("modules"), "{failure}");
}

#[test]
fn one_surrounding_code_fence_is_tolerated() {
    for fenced in [
        "```json\n{\"modules\": []}\n```",
        "```\n{\"modules\": []}\n```\n",
        "```JSON\n{\"modules\": []}\n```",
    ] {
        assert!(contract().judge(fenced).is_ok(), "{fenced:?}");
    }
    for not_fenced in [
        "Answer:\n```json\n{\"modules\": []}\n```",
        "```json\n{\"modules\": []}\n```\nDone.",
        "```python\n{\"modules\": []}\n```",
        "```json {\"modules\": []}```",
    ] {
        assert_eq!(kind(not_fenced), ContractFailure::Prose, "{not_fenced:?}");
    }
}

/// Requirement: STP-9.
#[test]
fn each_kind_has_its_own_feedback_stp_9() {
    let kinds = [
        ContractFailure::Empty,
        ContractFailure::Prose,
        ContractFailure::Array,
        ContractFailure::SchemaInvalid,
    ];
    for k in kinds {
        assert!(feedback(k).contains("JSON object"), "{k:?}");
    }
    let texts: std::collections::BTreeSet<_> = kinds.iter().map(|k| feedback(*k)).collect();
    assert_eq!(texts.len(), kinds.len());
}

#[test]
fn an_empty_schema_takes_any_object() {
    let any = CompiledContract::new(&json!({})).unwrap();
    assert!(any.judge("{}").is_ok());
    assert_eq!(any.judge("[]").unwrap_err().kind, ContractFailure::Array);
    assert!(parse_object("{\"a\": 1}").is_ok());
}

#[test]
fn a_remote_ref_is_refused_not_fetched() {
    let remote = json!({"$ref": "https://example.invalid/schema.json"});
    assert!(CompiledContract::new(&remote).is_err());
    let local = json!({"$defs": {"m": {"type": "object"}}, "$ref": "#/$defs/m"});
    assert!(CompiledContract::new(&local).unwrap().judge("{}").is_ok());
}
