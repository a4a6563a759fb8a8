//! Fan-out steps end to end (issue 12): `run_composition` against the simulator on 127.0.0.1
//! over real HTTP, a real SQLite store and a real workspace. Each instance's conversation carries
//! its element's marker (`[mod-03]`), and the scenario's lanes answer each marker from its own
//! script, so instances running at once get their own answers however their requests interleave.
//! Nothing here measures time; the few `delay_ms` only make one instance slower than another.

mod support;

use std::sync::{Arc, Mutex};

use docsfab_policy::rules::RulesTable;
use docsfab_record::{Api, RunStatus};
use docsfab_runtime::executor::Progress;
use serde_json::{Value, json};
use support::{Harness, OnEvent, Recorded, RunArgs, limits, requests, run_recorded};
use tokio_util::sync::CancellationToken;

/// Fast replay windows; one provider attempt per turn so a 502 reaches the step policy at once.
const FAST_HOST: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n  providerAttempt.maxTotalDelayMs: 200\n  providerAttempt.maxAttemptsPerTurn: 1\n";

fn name(i: usize) -> String {
    format!("mod-{i:02}")
}

/// The outline's answer: `n` modules named `mod-00`, `mod-01`, ...
fn outline_answer(n: usize) -> String {
    let modules: Vec<Value> = (0..n)
        .map(|i| json!({"name": name(i), "purpose": format!("purpose {i}")}))
        .collect();
    json!({ "modules": modules }).to_string()
}

/// An outline, a fan-out write step over its modules, and a summary that reads the fan-out's
/// output array.
fn composition(concurrency: u32) -> String {
    format!(
        r#"name: fanout
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 1024
steps:
  - id: outline
    access: read-only
    instructions: List the modules.
    tools: [list_files]
    contract:
      schema: {{type: object, required: [modules], properties: {{modules: {{type: array}}}}}}
  - id: pages
    access: write
    forEach: steps.outline.output.modules
    concurrency: {concurrency}
    instructions: "Write docs/{{{{item.name}}}}.md about [{{{{item.name}}}}] ({{{{index}}}}): {{{{item.purpose}}}}"
    tools: [read_file, write_file]
    writeRoots: [docs/]
  - id: summary
    access: read-only
    instructions: "SUMMARY-STEP: {{{{steps.pages.output}}}}"
    contract:
      schema: {{type: object}}
"#
    )
}

/// A lane for module `i`: read a source file, write its page, answer `done mod-0i`.
fn page_lane(i: usize, extra: &str) -> String {
    let n = name(i);
    format!(
        r##"  - contains: "[{n}]"
    responses:
{extra}      - answer:
          tool_calls: [{{id: r{i}, name: read_file, arguments: {{path: src/lib.rs}}}}]
      - answer:
          tool_calls: [{{id: w{i}, name: write_file, arguments: {{path: docs/{n}.md, content: "# {n}\n"}}}}]
      - answer: {{text: "done {n}"}}
"##
    )
}

/// A scenario: the outline's answer in the main script, the summary's lane first (its request
/// holds every marker), then `lanes`.
fn scenario(outline: &str, lanes: &str) -> String {
    format!(
        "responses:\n  - answer: {{json: {outline}}}\nlanes:\n  - contains: SUMMARY-STEP\n    responses:\n      - answer: {{json: {{ok: true}}}}\n{lanes}"
    )
}

async fn harness(scenario: &str) -> Harness {
    support::harness(scenario, "//! A tiny crate.\npub mod count;\n").await
}

fn args(env: &[(&str, &str)], on_event: OnEvent) -> RunArgs {
    let mut env = env.to_vec();
    env.push(("DOCSFAB_RETRY_BASE_DELAY_MS", "20"));
    RunArgs {
        api: Api::OpenaiChat,
        limits: limits(FAST_HOST, &env),
        rules: RulesTable::embedded().unwrap(),
        cancel: CancellationToken::new(),
        job_deadline: None,
        on_event,
    }
}

fn quiet() -> OnEvent {
    Box::new(|_| {})
}

fn step_ids(r: &Recorded) -> Vec<String> {
    r.record.steps.iter().map(|s| s.step_id.clone()).collect()
}

/// Every string inside a JSON value, joined: what a request told the model.
fn strings(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(strings).collect::<Vec<_>>().join("\n"),
        Value::Object(o) => o.values().map(strings).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    }
}

#[tokio::test]
async fn issue12_ten_instances_at_concurrency_four_read_write_and_are_recorded_in_index_order() {
    let lanes: String = (0..10).map(|i| page_lane(i, "")).collect();
    let h = harness(&scenario(&outline_answer(10), &lanes)).await;
    // Instances in flight, from the progress events: never more than the concurrency.
    let flight: Arc<Mutex<(i32, i32)>> = Arc::default();
    let on_event: OnEvent = {
        let flight = Arc::clone(&flight);
        Box::new(move |p| {
            let mut f = flight.lock().unwrap();
            match p {
                Progress::StepStarted { step_id, .. } if step_id.starts_with("pages[") => {
                    f.0 += 1;
                    f.1 = f.1.max(f.0);
                }
                Progress::StepFinished { step_id, .. } if step_id.starts_with("pages[") => f.0 -= 1,
                _ => {}
            }
        })
    };
    let r = run_recorded(&h, &composition(4), args(&[], on_event)).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let mut want = vec!["outline".to_owned()];
    want.extend((0..10).map(|i| format!("pages[{i}]")));
    want.push("summary".to_owned());
    assert_eq!(step_ids(&r), want);
    assert_eq!(
        *flight.lock().unwrap(),
        (0, 4),
        "at most 4 instances at once, and 4 reached"
    );

    for i in 0..10 {
        let s = &r.json["steps"][i + 1];
        assert_eq!(s["status"], "succeeded");
        assert_eq!(
            s["forEach"],
            json!({"step": "pages", "index": i, "item": {"name": name(i), "purpose": format!("purpose {i}")}})
        );
        let a = &s["attempts"][0];
        assert_eq!(s["attempts"].as_array().unwrap().len(), 1);
        assert_eq!(a["lease"]["turnsUsed"], 3);
        assert_eq!(a["writeSettlement"], Value::Null);
        let page = std::fs::read_to_string(h.workspace.join(format!("docs/{}.md", name(i))));
        assert_eq!(page.unwrap(), format!("# {}\n", name(i)));
    }
    // Steps that are not instances have no forEach object at all.
    assert!(r.json["steps"][0].get("forEach").is_none());

    // Each instance was told its own element, and the summary got the instance outputs as one
    // JSON array in index order.
    let reqs = requests(&r.events);
    let first_of = |id: &str| {
        let body = &reqs.iter().find(|q| q.0 == id).unwrap().4;
        strings(&serde_json::from_str::<Value>(body).unwrap())
    };
    assert!(first_of("pages[7]").contains("Write docs/mod-07.md about [mod-07] (7): purpose 7"));
    let expected: Vec<String> = (0..10).map(|i| format!("done {}", name(i))).collect();
    let array = serde_json::to_string(&expected).unwrap();
    assert!(first_of("summary").contains(&format!("SUMMARY-STEP: {array}")));

    // The event lines name the instance they belong to.
    let lines: Vec<String> = r
        .events
        .iter()
        .filter_map(Progress::describe_line)
        .collect();
    assert!(
        lines.contains(&"step pages[3] (write)".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"  pages[3]: attempt 1 succeeded".to_owned()),
        "{lines:?}"
    );
}

#[tokio::test]
async fn issue12_a_value_that_is_not_an_array_fails_the_step_with_one_sentence() {
    // The outline's contract does not say what `modules` is, so only run time can tell.
    let h = harness(&scenario(r#"{modules: "core, cli"}"#, "")).await;
    let loose = composition(4).replace("{modules: {type: array}}", "{}");
    let r = run_recorded(&h, &loose, args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    assert_eq!(step_ids(&r), ["outline", "pages"]);
    let pages = &r.json["steps"][1];
    assert_eq!(pages["status"], "failed");
    assert_eq!(pages["attempts"], json!([]));
    assert_eq!(pages["failure"]["category"], "fan-out-input");
    assert_eq!(pages["failure"]["code"], "for-each-not-array");
    assert_eq!(
        pages["failure"]["message"],
        "Step pages could not fan out: forEach steps.outline.output.modules names a string, not an array."
    );
    // Only the outline reached the provider.
    assert_eq!(h.server.requests().len(), 1);
}

#[tokio::test]
async fn issue12_an_empty_array_succeeds_with_no_instances_and_an_empty_output() {
    let h = harness(&scenario("{modules: []}", "")).await;
    let r = run_recorded(&h, &composition(4), args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    assert_eq!(step_ids(&r), ["outline", "pages", "summary"]);
    assert_eq!(r.json["steps"][1]["attempts"], json!([]));
    let reqs = requests(&r.events);
    let summary = &reqs.iter().find(|q| q.0 == "summary").unwrap().4;
    assert!(summary.contains("SUMMARY-STEP: []"), "{summary}");
}

#[tokio::test]
async fn issue12_when_an_instance_fails_for_good_no_new_instance_starts_and_running_ones_finish() {
    // mod-00 is cut at the output limit after writing nothing: a write step does not retry
    // that. mod-01 is still running then (its first answer is slow) and finishes.
    let failing = "  - contains: \"[mod-00]\"\n    responses:\n      - answer: {text: cut, finish_reason: length}\n";
    let slow = "      - delay_ms: 1500\n        answer: {tool_calls: [{id: l1, name: read_file, arguments: {path: src/lib.rs}}]}\n";
    let lanes = format!(
        "{failing}{}{}",
        page_lane(1, slow),
        (2..6).map(|i| page_lane(i, "")).collect::<String>()
    );
    let h = harness(&scenario(&outline_answer(6), &lanes)).await;
    let r = run_recorded(&h, &composition(2), args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    assert_eq!(step_ids(&r), ["outline", "pages[0]", "pages[1]"]);
    let s = &r.json["steps"];
    assert_eq!(s[1]["status"], "failed");
    assert_eq!(s[1]["failure"]["category"], "cut-answer");
    assert_eq!(s[2]["status"], "succeeded");
    assert!(h.workspace.join("docs/mod-01.md").exists());
    // No request of a later instance ever reached the provider.
    let entries: Vec<String> = h.server.requests().into_iter().map(|e| e.entry).collect();
    assert!(
        entries
            .iter()
            .all(|e| !e.starts_with("lanes[3]") && !e.starts_with("lanes[4]")),
        "{entries:?}"
    );
}

#[tokio::test]
async fn issue12_a_sibling_path_is_a_tool_error_naming_the_sibling_and_the_model_recovers() {
    // Concurrency 1, so which instance writes docs/shared.md first is certain.
    let lanes = r##"  - contains: "[mod-00]"
    responses:
      - answer: {tool_calls: [{id: a, name: write_file, arguments: {path: docs/shared.md, content: "zero\n"}}]}
      - answer: {text: done}
  - contains: "[mod-01]"
    responses:
      - answer: {tool_calls: [{id: b, name: write_file, arguments: {path: docs/shared.md, content: "one\n"}}]}
      - answer: {tool_calls: [{id: c, name: write_file, arguments: {path: docs/mod-01.md, content: "one\n"}}]}
      - answer: {text: done}
"##;
    let h = harness(&scenario(&outline_answer(2), lanes)).await;
    let r = run_recorded(&h, &composition(1), args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let refusal = "docs/shared.md was written by sibling pages[0]; write a different file";
    // The model was told, as a tool error on its next turn ...
    let reqs = requests(&r.events);
    let second = reqs.iter().find(|q| q.0 == "pages[1]" && q.2 == 2).unwrap();
    assert!(
        second.4.contains(&format!("error: {refusal}")),
        "{}",
        second.4
    );
    // ... the ledger records the call as refused, and the sibling's file is untouched.
    let batch = r.json["steps"][2]["attempts"][0]["turns"][0].to_string();
    assert!(
        batch.contains("refused") && batch.contains(refusal),
        "{batch}"
    );
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("docs/shared.md")).unwrap(),
        "zero\n"
    );
    assert!(h.workspace.join("docs/mod-01.md").exists());
}

#[tokio::test]
async fn issue12_a_failing_instance_restores_only_its_own_writes_while_a_sibling_succeeds() {
    // mod-00 overwrites a file that was there before the run, then its provider fails (502):
    // its attempt is restored before the retry, the retry fails too, and the instance fails
    // for good. mod-01 writes its own page meanwhile and succeeds.
    let lanes = r##"  - contains: "[mod-00]"
    responses:
      - answer: {tool_calls: [{id: a, name: write_file, arguments: {path: docs/mod-00.md, content: "draft\n"}}]}
      - delay_ms: 300
        status: 502
  - contains: "[mod-01]"
    responses:
      - answer: {tool_calls: [{id: b, name: write_file, arguments: {path: docs/mod-01.md, content: "# mod-01\n"}}]}
      - answer: {text: done}
"##;
    let h = harness(&scenario(&outline_answer(2), lanes)).await;
    std::fs::create_dir_all(h.workspace.join("docs")).unwrap();
    std::fs::write(h.workspace.join("docs/mod-00.md"), "before the run\n").unwrap();
    let env = [("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "1")];
    let r = run_recorded(&h, &composition(2), args(&env, quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    assert_eq!(step_ids(&r), ["outline", "pages[0]", "pages[1]"]);
    let failed = &r.json["steps"][1];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["attempts"][0]["writeSettlement"], "write-executed");
    assert_eq!(failed["attempts"][0]["writeRestore"], "restored");
    assert_eq!(r.json["steps"][2]["status"], "succeeded");
    // The failed instance's file is back as it was; the sibling's file stays.
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("docs/mod-00.md")).unwrap(),
        "before the run\n"
    );
    assert_eq!(
        std::fs::read_to_string(h.workspace.join("docs/mod-01.md")).unwrap(),
        "# mod-01\n"
    );
}

#[tokio::test]
async fn issue12_cancelling_the_run_cancels_every_running_instance() {
    let slow = "      - delay_ms: 5000\n        answer: {text: late}\n";
    let lanes: String = (0..4).map(|i| page_lane(i, slow)).collect();
    let h = harness(&scenario(&outline_answer(4), &lanes)).await;
    let cancel = CancellationToken::new();
    let started = Arc::new(Mutex::new(0));
    let on_event: OnEvent = {
        let (cancel, started) = (cancel.clone(), Arc::clone(&started));
        Box::new(move |p| {
            // Cancel once both running instances have sent their first request.
            if let Progress::AttemptStarted { step_id, .. } = p
                && step_id.starts_with("pages[")
            {
                let mut n = started.lock().unwrap();
                *n += 1;
                if *n == 2 {
                    cancel.cancel();
                }
            }
        })
    };
    let mut a = args(&[], on_event);
    a.cancel = cancel;
    let r = run_recorded(&h, &composition(2), a).await;
    assert_eq!(r.outcome.status, RunStatus::Cancelled);
    assert_eq!(step_ids(&r), ["outline", "pages[0]", "pages[1]"]);
    for i in 1..=2 {
        let s = &r.json["steps"][i];
        assert_eq!(s["status"], "cancelled");
        assert_eq!(s["failure"]["category"], "cancelled");
        assert_eq!(s["attempts"][0]["status"], "cancelled");
    }
}

#[tokio::test]
async fn issue12_read_only_instances_answer_objects_and_a_fan_out_can_fan_out_again() {
    let lanes = r#"  - contains: "<mod-00>"
    responses:
      - answer: {json: {page: p0}}
  - contains: "<mod-01>"
    responses:
      - answer: {json: {page: p1}}
  - contains: "Again p0!"
    responses:
      - answer: {json: {ok: 0}}
  - contains: "Again p1!"
    responses:
      - answer: {json: {ok: 1}}
"#;
    let h = harness(&scenario(&outline_answer(2), lanes)).await;
    let composition = r#"name: twice
limits:
  timeoutMs: 20000
steps:
  - id: outline
    access: read-only
    instructions: List the modules.
    contract:
      schema: {type: object}
  - id: facts
    access: read-only
    forEach: steps.outline.output.modules
    instructions: "Facts about <{{item.name}}>."
    contract:
      schema: {type: object, required: [page]}
  - id: again
    access: read-only
    forEach: steps.facts.output
    concurrency: 1
    instructions: "Again {{item.page}}!"
    contract:
      schema: {type: object}
  - id: summary
    access: read-only
    instructions: "SUMMARY-STEP: {{steps.facts.output}} {{steps.again.output}}"
    contract:
      schema: {type: object}
"#;
    let r = run_recorded(&h, composition, args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    assert_eq!(
        step_ids(&r),
        [
            "outline", "facts[0]", "facts[1]", "again[0]", "again[1]", "summary"
        ]
    );
    // Each read-only instance keeps its answer object as its step output ...
    assert_eq!(r.json["steps"][2]["output"], json!({"page": "p1"}));
    // ... the second fan-out ran over the first one's answers ...
    assert_eq!(
        r.json["steps"][4]["forEach"],
        json!({"step": "again", "index": 1, "item": {"page": "p1"}})
    );
    // ... and a later step sees both output arrays as JSON, in index order.
    let reqs = requests(&r.events);
    let summary = &reqs.iter().find(|q| q.0 == "summary").unwrap().4;
    let told = strings(&serde_json::from_str::<Value>(summary).unwrap());
    assert!(
        told.contains(r#"SUMMARY-STEP: [{"page":"p0"},{"page":"p1"}] [{"ok":0},{"ok":1}]"#),
        "{told}"
    );
}

#[tokio::test]
async fn issue12_an_element_without_a_member_the_instructions_use_fails_that_instance_unrun() {
    let outline =
        r#"{modules: [{name: mod-00, purpose: p}, {name: mod-01}, {name: mod-02, purpose: p}]}"#;
    let lanes: String = (0..3).map(|i| page_lane(i, "")).collect();
    let h = harness(&scenario(outline, &lanes)).await;
    let r = run_recorded(&h, &composition(1), args(&[], quiet())).await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    assert_eq!(step_ids(&r), ["outline", "pages[0]", "pages[1]"]);
    let s = &r.json["steps"][2];
    assert_eq!(s["status"], "failed");
    assert_eq!(s["attempts"], json!([]));
    assert_eq!(s["failure"]["code"], "item-member-missing");
    assert_eq!(
        s["failure"]["message"],
        "Instance pages[1] was not run: the element has no member purpose for {{item.purpose}}."
    );
}

/// Compile-time: a run with fan-out steps is still a `Send` future, so a server can spawn it
/// on a multi-threaded runtime (the instances share the store behind a mutex, not a `RefCell`).
#[allow(dead_code)]
fn a_run_future_is_send(
    cfg: docsfab_runtime::executor::RunConfig,
    store: &mut docsfab_runtime::store::RunStore,
) {
    fn send<T: Send>(_: &T) {}
    send(&docsfab_runtime::executor::run_composition(cfg, store));
}
