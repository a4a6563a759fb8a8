//! Contract validation of read-only answers (STP-9).

use docsfab_runtime::contract::{Contract, ContractFailureKind, parse_object};
use serde_json::json;

fn contract() -> Contract {
    Contract::new(&json!({
        "type": "object",
        "required": ["modules"],
        "properties": {"modules": {"type": "array", "items": {"type": "string"}}}
    }))
    .unwrap()
}

fn kind(answer: &str) -> ContractFailureKind {
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
    assert_eq!(kind(""), ContractFailureKind::Empty);
    assert_eq!(kind("  \n\t "), ContractFailureKind::Empty);
    assert_eq!(kind("```json\n```"), ContractFailureKind::Empty);
    assert_eq!(
        kind("The crate has two modules."),
        ContractFailureKind::Prose
    );
    assert_eq!(
        kind(r#"Here it is: {"modules": []}"#),
        ContractFailureKind::Prose
    );
    assert_eq!(
        kind(r#"{"modules": []} I hope this helps"#),
        ContractFailureKind::Prose
    );
    assert_eq!(kind(r#""a string""#), ContractFailureKind::Prose);
    assert_eq!(kind("42"), ContractFailureKind::Prose);
    assert_eq!(kind("null"), ContractFailureKind::Prose);
    assert_eq!(kind(r#"{"modules": ["a""#), ContractFailureKind::Prose);
    assert_eq!(kind(r#"["a", "b"]"#), ContractFailureKind::Array);
    assert_eq!(kind(r#"[{"modules": []}]"#), ContractFailureKind::Array);
}

/// Requirement: STP-9.
#[test]
fn an_object_that_breaks_the_schema_is_schema_invalid_with_its_violations_stp_9() {
    let failure = contract().judge(r#"{"modules": [1]}"#).unwrap_err();
    assert_eq!(failure.kind, ContractFailureKind::SchemaInvalid);
    assert!(
        failure.violations[0].starts_with("/modules/0"),
        "{:?}",
        failure.violations
    );
    let failure = contract().judge(r#"{"mods": []}"#).unwrap_err();
    assert_eq!(failure.kind, ContractFailureKind::SchemaInvalid);
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
        assert_eq!(
            kind(not_fenced),
            ContractFailureKind::Prose,
            "{not_fenced:?}"
        );
    }
}

/// Requirement: STP-9.
#[test]
fn each_kind_has_its_own_feedback_stp_9() {
    let kinds = [
        ContractFailureKind::Empty,
        ContractFailureKind::Prose,
        ContractFailureKind::Array,
        ContractFailureKind::SchemaInvalid,
    ];
    for k in kinds {
        assert!(k.feedback().contains("JSON object"), "{k:?}");
    }
    let texts: std::collections::BTreeSet<_> = kinds.iter().map(|k| k.feedback()).collect();
    assert_eq!(texts.len(), kinds.len());
}

#[test]
fn a_contract_without_schema_takes_any_object() {
    let any = Contract::any_object();
    assert!(any.judge("{}").is_ok());
    assert_eq!(
        any.judge("[]").unwrap_err().kind,
        ContractFailureKind::Array
    );
    assert!(parse_object("{\"a\": 1}").is_ok());
}

#[test]
fn a_remote_ref_is_refused_not_fetched() {
    let remote = json!({"$ref": "https://example.invalid/schema.json"});
    assert!(Contract::new(&remote).is_err());
    let local = json!({"$defs": {"m": {"type": "object"}}, "$ref": "#/$defs/m"});
    assert!(Contract::new(&local).unwrap().judge("{}").is_ok());
}
