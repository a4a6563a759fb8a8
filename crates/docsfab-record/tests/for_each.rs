//! Issue 12: a fan-out instance's `forEach` object on its step record, and records written
//! before fan-out existed.

use docsfab_record::{ForEach, StepRecord};
use serde_json::{Value, json};

fn step(extra: Value) -> Value {
    let mut s = json!({
        "stepId": "pages[2]", "access": "write", "status": "succeeded",
        "configuredMaxRetries": 3, "effectiveMaxRetries": 3,
        "transportRetry": {"maxTransportRetries": 6, "transportMaxDelayMs": 60000,
                           "transportMaxElapsedMs": 3600000, "baseDelayMs": 1000},
        "failure": null, "output": null, "attempts": []
    });
    s.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    s
}

#[test]
fn issue12_a_step_record_without_for_each_still_loads_and_writes_none() {
    let old: StepRecord = serde_json::from_value(step(json!({}))).unwrap();
    assert_eq!(old.for_each, None);
    assert!(serde_json::to_value(&old).unwrap().get("forEach").is_none());
}

#[test]
fn issue12_an_instance_record_round_trips_its_for_each_object() {
    let fe = json!({"forEach": {"step": "pages", "index": 2, "item": {"name": "core"}}});
    let rec: StepRecord = serde_json::from_value(step(fe.clone())).unwrap();
    assert_eq!(
        rec.for_each,
        Some(ForEach {
            step: "pages".into(),
            index: 2,
            item: json!({"name": "core"}),
        })
    );
    assert_eq!(
        serde_json::to_value(&rec).unwrap()["forEach"],
        fe["forEach"]
    );
    let odd = json!({"forEach": {"step": "pages", "index": 2, "item": 1, "extra": true}});
    assert!(serde_json::from_value::<StepRecord>(step(odd)).is_err());
}
