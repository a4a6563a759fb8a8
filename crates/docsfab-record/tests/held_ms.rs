//! Issue 12: `heldMs`, the time the shared provider throttle held a turn's requests, on the
//! turn (stored) and summed per step and run; records written before it existed still load.

use docsfab_record::{RunRecord, TurnRecord};
use serde_json::{Value, json};

fn turn(extra: Value) -> Value {
    let mut t = json!({
        "turn": 1, "status": "completed", "providerRetries": 0, "replays": [],
        "toolBatch": {"requested": 0, "rejected": 0, "executed": 0, "calls": []},
        "usage": {"inputTokens": 1, "outputTokens": 1}, "reason": null
    });
    t.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    t
}

#[test]
fn issue12_a_turn_written_before_held_ms_loads_as_zero_and_writes_it() {
    let old: TurnRecord = serde_json::from_value(turn(json!({}))).unwrap();
    assert_eq!(old.held_ms, 0);
    assert_eq!(serde_json::to_value(&old).unwrap()["heldMs"], json!(0));
    let held: TurnRecord = serde_json::from_value(turn(json!({"heldMs": 3200}))).unwrap();
    assert_eq!(held.held_ms, 3200);
}

#[test]
fn issue12_a_run_written_before_held_ms_loads_with_nothing_held() {
    let run = json!({
        "runId": "r", "composition": "c", "status": "succeeded",
        "startedAt": "2026-11-29T20:00:00.000Z", "endedAt": null, "steps": []
    });
    let mut rec: RunRecord = serde_json::from_value(run).unwrap();
    assert_eq!(rec.held_ms, 0);
    rec.sum_totals();
    assert_eq!(rec.held_ms, 0);
}
