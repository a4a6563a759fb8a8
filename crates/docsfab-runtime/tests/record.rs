//! The run record serializes to the shape interfaces.md fixes, validates against the shipped
//! schema, and cannot carry contradictory redundant fields.

use std::collections::BTreeMap;

use docsfab_record::*;
use docsfab_record::{
    CallResult, Disposition, FaultKind, LeaseStop, ProviderErrorClass, RejectReason,
};
use docsfab_runtime::composition::Tool;
use docsfab_runtime::ledger::BatchBuilder;
use docsfab_runtime::record::validate_against_schema;
use serde_json::{Value, json};

/// A failed attempt of two turns whose provider fault schedules a transport retry.
fn transport_attempt() -> AttemptRecord {
    AttemptRecord {
        cost_usd: None,
        attempt: 1,
        budget: Budget::Initial,
        status: AttemptStatus::Failed,
        started_at: "2026-11-29T20:00:00.000Z".into(),
        provider_error_class: Some(ProviderErrorClass::Server),
        http_status: Some(503),
        retry_after_ms: Some(2000),
        gateway: None,
        failure_category: Some("provider-transient".into()),
        failure_class: Some("infrastructure".into()),
        code: Some("provider-server".into()),
        message: Some("HTTP 503 after 8 attempts".into()),
        answer_excerpt: None,
        answer_bytes: None,
        timeout_kind: None,
        output_constraint: None,
        grounding: None,
        retry_rule: Some("transport".into()),
        retry: Retry {
            decision: RetryDecision::Scheduled,
        },
        wait_ms: Some(2000),
        write_settlement: None,
        write_restore: None,
        files_written: None,
        usage: Usage {
            input_tokens: Some(1200),
            output_tokens: Some(40),
            ..Usage::ZERO
        },
        duration_ms: 51_900,
        lease: LeaseRecord {
            max_turns: 12,
            turns_used: 2,
            executed_tool_calls: 1,
            tool_counters: BTreeMap::from([("read_file".to_owned(), 1)]),
            stop_reason: LeaseStop::ProviderFailed,
            disposition: Disposition::Failed,
            evidence: None,
        },
        turns: vec![turn_with_a_tool_batch(), turn_failed_after_two_replays()],
    }
}

/// Turn 1: one call to an unknown tool refused, one `read_file` that ran.
fn turn_with_a_tool_batch() -> TurnRecord {
    let mut batch = BatchBuilder::new();
    batch.reject(
        "c1",
        "read_fil",
        RejectReason::UnknownTool,
        "no tool named read_fil",
    );
    let slot = batch.start("c2", Tool::ReadFile);
    batch.finish(slot, CallResult::Ok);
    TurnRecord {
        cost_usd: None,
        turn: 1,
        status: TurnStatus::Completed,
        replays: vec![],
        tool_batch: batch.build(),
        usage: Usage {
            input_tokens: Some(600),
            output_tokens: Some(40),
            ..Usage::ZERO
        },
        reason: None,
        held_ms: 0,
        duration_ms: Some(1200),
        warnings: Vec::new(),
    }
}

/// Turn 2: a 503 and a dropped connection replayed, then the provider fault that ends it.
fn turn_failed_after_two_replays() -> TurnRecord {
    TurnRecord {
        cost_usd: None,
        turn: 2,
        status: TurnStatus::Failed,
        replays: vec![
            ReplayRecord {
                cause: ReplayCause::Status(503),
                provider_error_class: ProviderErrorClass::Server,
                wait_ms: 500,
                retry_after_ms: None,
                held_ms: 0,
            },
            ReplayRecord {
                cause: ReplayCause::Fault(FaultKind::ConnectionDropped),
                provider_error_class: ProviderErrorClass::Network,
                wait_ms: 1000,
                retry_after_ms: None,
                held_ms: 0,
            },
        ],
        tool_batch: Default::default(),
        usage: Usage {
            input_tokens: Some(600),
            output_tokens: Some(0),
            ..Usage::ZERO
        },
        reason: Some("provider fault: HTTP 503 (server) after 3 requests".into()),
        held_ms: 1200,
        // A turn as docsfab recorded it before it kept turn durations.
        duration_ms: None,
        warnings: Vec::new(),
    }
}

fn sample_run() -> RunRecord {
    let mut second = transport_attempt();
    second.attempt = 2;
    second.budget = Budget::Transport;
    second.status = AttemptStatus::Succeeded;
    second.retry = Retry {
        decision: RetryDecision::None,
    };
    second.wait_ms = None;
    second.provider_error_class = None;
    second.http_status = None;
    second.answer_excerpt = Some("{\"modules\": [\"a\"]}".into());
    second.answer_bytes = Some(18);
    RunRecord {
        cost_usd: None,
        truthfulness: None,
        usage: docsfab_record::Usage::ZERO,
        run_id: "run-20261129-200000-abcdef".into(),
        composition: "quickstart".into(),
        status: RunStatus::Succeeded,
        started_at: "2026-11-29T20:00:00.000Z".into(),
        ended_at: Some("2026-11-29T20:01:00.000Z".into()),
        workspace: Some("/home/me/project".into()),
        provider: Some(RunProvider {
            name: "default".into(),
            api: docsfab_record::Api::OpenaiChat,
            host: "api.example.com".into(),
        }),
        model: Some("some-model".into()),
        docsfab_version: Some("0.1.0".into()),
        // Both attempts' second turns were held 1200 ms.
        held_ms: 2400,
        end_reason: None,
        steps: vec![StepRecord {
            cost_usd: None,
            truthfulness: None,
            usage: docsfab_record::Usage::ZERO,
            step_id: "outline".into(),
            access: Access::ReadOnly,
            status: RunStatus::Succeeded,
            configured_max_retries: 3,
            effective_max_retries: 3,
            transport_retry: TransportRetry {
                max_transport_retries: 6,
                transport_max_delay_ms: 60_000,
                transport_max_elapsed_ms: 3_600_000,
                base_delay_ms: 1000,
            },
            failure: None,
            output: Some(json!({"modules": ["a"]})),
            interrupted_attempt: None,
            for_each: None,
            held_ms: 2400,
            attempts: vec![transport_attempt(), second],
            fingerprint: None,
            inputs: None,
            reused_from: None,
            files_written: None,
        }],
        resumed_from: None,
    }
}

/// Requirement: OPS-1.
#[test]
fn record_has_every_interface_field_and_meets_the_schema_ops_1() {
    let value = serde_json::to_value(sample_run()).unwrap();
    validate_against_schema(&value).unwrap();
    let step = &value["steps"][0];
    for key in [
        "stepId",
        "access",
        "status",
        "configuredMaxRetries",
        "effectiveMaxRetries",
        "transportRetry",
        "failure",
        "attempts",
    ] {
        assert!(step.get(key).is_some(), "step misses {key}");
    }
    let attempt = &step["attempts"][0];
    for key in [
        "attempt",
        "budget",
        "status",
        "providerErrorClass",
        "httpStatus",
        "retryAfterMs",
        "failureCategory",
        "failureClass",
        "code",
        "timeoutKind",
        "retryRule",
        "retryDecision",
        "retryScheduled",
        "waitMs",
        "writeSettlement",
        "usage",
        "durationMs",
        "lease",
        "turns",
    ] {
        assert!(attempt.get(key).is_some(), "attempt misses {key}");
    }
    assert_eq!(attempt["retryScheduled"], json!(true));
    assert_eq!(attempt["providerErrorClass"], json!("server"));
    assert_eq!(attempt["lease"]["stopReason"], json!("provider-failed"));
    let turn = &attempt["turns"][1];
    assert_eq!(turn["providerRetries"], json!(2));
    assert_eq!(turn["replays"][0]["status"], json!(503));
    assert_eq!(turn["replays"][1]["fault"], json!("connection-dropped"));
    assert_eq!(
        attempt["turns"][0]["toolBatch"],
        json!({"requested": 2, "rejected": 1, "executed": 1, "calls": [
            {"id": "c1", "tool": "read_fil", "outcome": "rejected", "reason": "unknown-tool",
             "detail": "no tool named read_fil"},
            {"id": "c2", "tool": "read_file", "outcome": "executed", "result": "ok"}
        ]})
    );
}

/// Requirement: OPS-4.
#[test]
fn each_attempt_records_its_own_spend_ops_4() {
    let value = serde_json::to_value(sample_run()).unwrap();
    for attempt in value["steps"][0]["attempts"].as_array().unwrap() {
        assert_eq!(attempt["usage"]["inputTokens"], json!(1200));
        assert_eq!(attempt["durationMs"], json!(51_900));
    }
}

#[test]
fn record_round_trips_through_json() {
    let run = sample_run();
    let text = serde_json::to_string(&run).unwrap();
    let back: RunRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(back, run);
}

fn mutate(f: impl FnOnce(&mut Value)) -> Value {
    let mut value = serde_json::to_value(sample_run()).unwrap();
    f(&mut value);
    value
}

/// Requirement: OPS-1.
#[test]
fn retry_scheduled_that_contradicts_the_decision_is_refused_ops_1() {
    let bad = mutate(|v| v["steps"][0]["attempts"][0]["retryScheduled"] = json!(false));
    assert!(validate_against_schema(&bad).is_err());
    assert!(serde_json::from_value::<RunRecord>(bad).is_err());
}

/// Requirement: REP-13.
#[test]
fn provider_retries_that_disagree_with_replays_are_refused_rep_13() {
    let bad = mutate(|v| v["steps"][0]["attempts"][0]["turns"][1]["providerRetries"] = json!(5));
    let err = serde_json::from_value::<RunRecord>(bad).unwrap_err();
    assert!(err.to_string().contains("providerRetries is 5"), "{err}");
}

#[test]
fn schema_refuses_unknown_fields_and_bad_enums() {
    for bad in [
        mutate(|v| v["extra"] = json!(1)),
        mutate(|v| v["status"] = json!("done")),
        mutate(|v| v["steps"][0]["attempts"][0]["budget"] = json!("bonus")),
        mutate(|v| v["steps"][0]["attempts"][0]["writeSettlement"] = json!("maybe")),
        mutate(|v| v["startedAt"] = json!("yesterday")),
        mutate(|v| {
            v["steps"][0]["attempts"][0]
                .as_object_mut()
                .unwrap()
                .remove("usage");
        }),
    ] {
        assert!(validate_against_schema(&bad).is_err(), "accepted {bad}");
    }
}

/// Requirement: CFG-3.
#[test]
fn more_than_ten_attempts_violate_the_schema_cfg_3() {
    let bad = mutate(|v| {
        let attempts = v["steps"][0]["attempts"].as_array_mut().unwrap();
        let one = attempts[1].clone();
        while attempts.len() < 11 {
            attempts.push(one.clone());
        }
    });
    assert!(validate_against_schema(&bad).is_err());
}

/// Issue 11: a record written before the run's context, the answer excerpt and the turn reason
/// existed (JSON without those keys) still loads, with each new field absent, and still meets
/// the schema.
#[test]
fn issue11_an_old_record_without_the_new_fields_still_loads() {
    let old = mutate(|v| {
        let run = v.as_object_mut().unwrap();
        for key in ["workspace", "provider", "model", "docsfabVersion"] {
            assert!(run.remove(key).is_some(), "the new record has {key}");
        }
        for attempt in v["steps"][0]["attempts"].as_array_mut().unwrap() {
            let attempt = attempt.as_object_mut().unwrap();
            attempt.remove("answerExcerpt").unwrap();
            attempt.remove("answerBytes").unwrap();
            for turn in attempt["turns"].as_array_mut().unwrap() {
                turn.as_object_mut().unwrap().remove("reason").unwrap();
            }
        }
    });
    validate_against_schema(&old).unwrap();
    let run: RunRecord = serde_json::from_value(old).unwrap();
    assert_eq!(run.workspace, None);
    assert_eq!(run.provider, None);
    assert_eq!(run.model, None);
    assert_eq!(run.docsfab_version, None);
    let attempt = &run.steps[0].attempts[1];
    assert_eq!(attempt.answer_excerpt, None);
    assert_eq!(attempt.answer_bytes, None);
    assert!(
        run.steps[0].attempts[0]
            .turns
            .iter()
            .all(|t| t.reason.is_none())
    );
}

/// Issue 11: the new fields serialize under their interface names and meet the schema, which
/// refuses a provider with unknown keys or an excerpt beyond its bound.
#[test]
fn issue11_context_excerpt_and_reason_are_in_the_record_and_the_schema() {
    let value = serde_json::to_value(sample_run()).unwrap();
    validate_against_schema(&value).unwrap();
    assert_eq!(value["workspace"], json!("/home/me/project"));
    assert_eq!(
        value["provider"],
        json!({"name": "default", "api": "openai-chat", "host": "api.example.com"})
    );
    assert_eq!(value["model"], json!("some-model"));
    assert_eq!(value["docsfabVersion"], json!("0.1.0"));
    let attempts = &value["steps"][0]["attempts"];
    assert_eq!(attempts[0]["answerExcerpt"], Value::Null);
    assert_eq!(
        attempts[1]["answerExcerpt"],
        json!("{\"modules\": [\"a\"]}")
    );
    assert_eq!(attempts[1]["answerBytes"], json!(18));
    assert_eq!(attempts[0]["turns"][0]["reason"], Value::Null);
    assert_eq!(
        attempts[0]["turns"][1]["reason"],
        json!("provider fault: HTTP 503 (server) after 3 requests")
    );
    for bad in [
        mutate(|v| v["provider"]["url"] = json!("http://user:pw@h/v1")),
        mutate(|v| v["provider"]["api"] = json!("gemini")),
        mutate(|v| {
            v["steps"][0]["attempts"][1]["answerExcerpt"] = json!("x".repeat(2049));
        }),
        mutate(|v| v["steps"][0]["attempts"][0]["turns"][1]["reason"] = json!(7)),
    ] {
        assert!(validate_against_schema(&bad).is_err(), "accepted {bad}");
    }
}

/// Issue 11: `filesWritten` in a record; a record from before it existed still loads (the
/// field is absent, not an empty list, since nobody knows what that attempt wrote), and a
/// malformed hash is refused by the schema.
#[test]
fn issue11_files_written_round_trips_and_an_older_record_without_it_still_loads() {
    let mut a = transport_attempt();
    a.files_written = Some(vec![FileWritten {
        path: "docs/a.md".into(),
        bytes: 4,
        sha256_before: None,
        sha256_after: Some("ab".repeat(32)),
    }]);
    let value = serde_json::to_value(&a).unwrap();
    assert_eq!(
        value["filesWritten"],
        json!([{"path": "docs/a.md", "bytes": 4, "sha256Before": null, "sha256After": "ab".repeat(32)}])
    );
    assert_eq!(
        serde_json::from_value::<AttemptRecord>(value.clone()).unwrap(),
        a
    );

    let mut old = value.clone();
    old.as_object_mut().unwrap().remove("filesWritten");
    let loaded: AttemptRecord = serde_json::from_value(old.clone()).unwrap();
    assert_eq!(loaded.files_written, None);
    assert_eq!(serde_json::to_value(&loaded).unwrap(), old);

    let run = |attempt: Value| {
        json!({"runId": "r", "composition": "c", "status": "failed",
               "startedAt": "2026-11-29T20:35:01.123Z", "endedAt": null,
               "steps": [{"stepId": "s", "access": "write", "status": "failed",
                          "configuredMaxRetries": 3, "effectiveMaxRetries": 3,
                          "transportRetry": {"maxTransportRetries": 6, "transportMaxDelayMs": 60000,
                                             "transportMaxElapsedMs": 3600000, "baseDelayMs": 1000},
                          "failure": null, "attempts": [attempt]}]})
    };
    validate_against_schema(&run(value.clone())).unwrap();
    validate_against_schema(&run(old)).unwrap();
    let mut bad = value;
    bad["filesWritten"][0]["sha256After"] = json!("not-a-hash");
    assert!(validate_against_schema(&run(bad)).is_err());
}
