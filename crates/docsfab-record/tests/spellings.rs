//! The record types' JSON spellings and the time format, pinned.

use std::time::{Duration, UNIX_EPOCH};

use docsfab_record::*;

#[test]
fn formats_known_instants_as_rfc3339() {
    assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    // 2000-02-29 (a leap day) 12:34:56.789 UTC
    let t = UNIX_EPOCH + Duration::from_millis(951_827_696_789);
    assert_eq!(rfc3339_utc(t), "2000-02-29T12:34:56.789Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_795_980_000);
    assert_eq!(rfc3339_utc(t), "2026-11-29T19:20:00.000Z");
}

/// Each concept's JSON is the record's spelling, and `as_str` / `Display` agree with it.
#[test]
fn policy_types_serialize_as_the_record_spells_them() {
    use serde_json::json;
    assert_eq!(
        json!([Budget::Initial, Budget::Contract, Budget::Transport]),
        json!(["initial", "contract", "transport"])
    );
    for b in [Budget::Initial, Budget::Contract, Budget::Transport] {
        assert_eq!(json!(b), json!(b.as_str()));
    }
    for s in [
        AttemptStatus::Succeeded,
        AttemptStatus::Failed,
        AttemptStatus::Cancelled,
    ] {
        assert_eq!(json!(s), json!(s.as_str()));
    }
    for s in [
        TurnStatus::Completed,
        TurnStatus::Failed,
        TurnStatus::Cancelled,
    ] {
        assert_eq!(json!(s), json!(s.as_str()));
    }
    assert_eq!(
        json!([
            RetryDecision::None,
            RetryDecision::Scheduled,
            RetryDecision::Exhausted,
            RetryDecision::Terminal,
            RetryDecision::Declined
        ]),
        json!(["none", "scheduled", "exhausted", "terminal", "declined"])
    );
    assert_eq!(
        json!([TimeoutKind::AttemptDeadline, TimeoutKind::ProviderTimeout]),
        json!(["attempt-deadline", "provider-timeout"])
    );
    assert_eq!(ReplayCause::Status(503).to_string(), "HTTP 503");
    assert_eq!(
        ReplayCause::Fault(FaultKind::ConnectionDropped).to_string(),
        "connection-dropped"
    );
    let settlements = [
        RecordedSettlement::NoWrite,
        RecordedSettlement::WriteExecuted,
        RecordedSettlement::Unavailable,
    ];
    assert_eq!(
        json!(settlements),
        json!(["no-write", "write-executed", "unavailable"])
    );
    for s in settlements {
        assert_eq!(json!(s), json!(s.as_str()));
    }
    let failure = StepFailure {
        category: "c".into(),
        failure_class: "f".into(),
        code: "x".into(),
        message: "m".into(),
        remediation: "r".into(),
        context: None,
    };
    assert_eq!(
        serde_json::to_string(&failure).ok().as_deref(),
        Some(r#"{"category":"c","failureClass":"f","code":"x","message":"m","remediation":"r"}"#)
    );
    let extra = r#"{"category":"c","failureClass":"f","code":"x","message":"m","remediation":"r","more":1}"#;
    assert!(serde_json::from_str::<StepFailure>(extra).is_err());
}

/// Every fault's `as_str` is its JSON spelling, so a replay's cause reads as the record writes it.
#[test]
fn fault_names_are_their_json_spellings() {
    for f in FaultKind::ALL {
        assert_eq!(serde_json::json!(f), serde_json::json!(f.as_str()));
        assert_eq!(ReplayCause::Fault(f).to_string(), f.as_str());
    }
}

/// The schema's `fault` enum lists exactly the labels the record writes (issue 11).
#[test]
fn issue11_schema_fault_enum_lists_every_fault_label() {
    let schema: serde_json::Value =
        serde_json::from_str(docsfab_record::SCHEMA).expect("the schema is JSON");
    let listed: Vec<&str> = schema["$defs"]["replay"]["properties"]["fault"]["enum"]
        .as_array()
        .expect("a fault enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let known: Vec<&str> = FaultKind::ALL.iter().map(|f| f.as_str()).collect();
    assert_eq!(listed, known);
}
