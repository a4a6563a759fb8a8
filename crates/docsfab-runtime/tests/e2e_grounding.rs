//! Grounding as part of the contract (issue 32, docs/grounding.md), end to end: a page that
//! cites a function the workspace does not hold is `contract-ungrounded`, retried from the
//! contract budget with every unknown name and the nearest real ones; the corrected answer
//! passes, and both attempts keep what they cited. Real HTTP to the simulator, a real SQLite
//! run store, the workspace read from disk.

mod support;

use docsfab_policy::rules::RulesTable;
use docsfab_record::{Api, RunStatus};
use serde_json::{Value, json};
use support::{Harness, RunArgs, limits, requests, run_recorded};
use tokio_util::sync::CancellationToken;

async fn harness(scenario: &str) -> Harness {
    // src/lib.rs declares `count_words`; src/count.rs holds `count`.
    support::harness(
        scenario,
        "pub mod count;\npub fn count_words(s: &str) -> usize { s.len() }\n",
    )
    .await
}

fn page_step(retries: &str) -> String {
    format!(
        r#"name: grounded
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 512
steps:
  - id: page
    access: read-only
    instructions: 'Write the page as {{"markdown": "..."}}.'
    tools: [read_file]
    contract:
      schema: {{type: object, required: [markdown], properties: {{markdown: {{type: string}}}}}}
      grounding: [markdown]
{retries}"#
    )
}

async fn run(h: &Harness, composition: &str, env: &[(&str, &str)]) -> support::Recorded {
    run_recorded(
        h,
        composition,
        RunArgs {
            api: Api::OpenaiChat,
            limits: limits("", env),
            rules: RulesTable::embedded().unwrap(),
            cancel: CancellationToken::new(),
            job_deadline: None,
            on_event: Box::new(|_| {}),
        },
    )
    .await
}

/// Proves STP-8/STP-9 for the new rule: an ungrounded page is a contract violation decided by
/// the rules table's `contract-ungrounded`, paid from the contract budget, and the retry's
/// correction names the unknown function with the nearest real one.
#[tokio::test]
async fn an_invented_function_is_retried_with_the_list_and_the_corrected_page_passes() {
    let h = harness(
        r#"responses:
  - answer:
      json: {markdown: "Call `count_word` from `src/lib.rs`; see [count](src/count.rs) and `src/wc.py`."}
  - answer:
      json: {markdown: "Call `count_words` from `src/lib.rs`; `count()` lives in `src/count.rs`."}
"#,
    )
    .await;
    let r = run(&h, &page_step(""), &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded);
    let attempts = r.json["steps"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 2);
    let first = &attempts[0];
    assert_eq!(first["retryRule"], "contract-ungrounded");
    assert_eq!(first["code"], "contract-ungrounded");
    assert_eq!(first["failureCategory"], "contract-violation");
    assert_eq!(first["retryDecision"], "scheduled");
    assert_eq!(
        first["grounding"],
        json!({"cited": 4, "grounded": 2, "external": 0, "unknown": [
            {"member": "markdown", "text": "count_word", "kind": "identifier", "line": 1, "nearest": ["count_words"]},
            {"member": "markdown", "text": "src/wc.py", "kind": "path", "line": 1}
        ]})
    );
    let second = &attempts[1];
    assert_eq!(second["budget"], "contract");
    assert_eq!(second["grounding"]["unknown"], json!([]));
    assert_eq!(second["grounding"]["grounded"], 4);
    assert_eq!(
        r.json["steps"][0]["truthfulness"],
        json!({"cited": 4, "grounded": 4, "share": 1.0, "caught": 2, "steps": 1})
    );
    // The correction went to the model with the names.
    let reqs = requests(&r.events);
    let retry: Value = serde_json::from_str(&reqs[1].4).unwrap();
    let opening = retry["messages"][1]["content"].as_str().unwrap();
    assert!(
        opening.contains("`count_word` in markdown, line 1 (the workspace has: count_words)")
            && opening.contains("`src/wc.py`"),
        "{opening}"
    );
}

/// The rule stays inside DOCSFAB_READ_ONLY_MAX_RETRIES (STP-13): with it at 0 an ungrounded
/// page ends the step, and no page (no output) is accepted.
#[tokio::test]
async fn an_ungrounded_page_is_never_accepted_when_the_budget_is_spent() {
    let h = harness(
        "responses:\n  - answer:\n      json: {markdown: \"Uses `parse_config` in `src/config.rs`.\"}\n",
    )
    .await;
    let r = run(
        &h,
        &page_step(""),
        &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")],
    )
    .await;
    assert_eq!(r.outcome.status, RunStatus::Failed);
    let step = &r.json["steps"][0];
    assert!(step["output"].is_null());
    assert_eq!(step["failure"]["code"], "contract-ungrounded");
    assert_eq!(step["attempts"][0]["retryDecision"], "exhausted");
    // The truthfulness of the step's best answer, and of the run (issue 32).
    let figure = json!({"cited": 2, "grounded": 0, "share": 0.0, "caught": 2, "steps": 1});
    assert_eq!(step["truthfulness"], figure);
    assert_eq!(r.json["truthfulness"], figure);
}

/// A fan-out of grounded pages (the instances share one reading of the workspace): each
/// instance is judged on its own answer, and only the one that invented a name is retried.
#[tokio::test]
async fn fan_out_pages_are_each_grounded_and_only_the_invented_one_retries() {
    let h = harness(
        r#"responses:
  - answer:
      json: {names: [alpha, beta, gamma]}
lanes:
  - contains: "[page-alpha]"
    responses:
      - answer: {json: {markdown: "`count_words` in `src/lib.rs`."}}
  - contains: "[page-beta]"
    responses:
      - answer: {json: {markdown: "`count_wordz` in `src/lib.rs`."}}
      - answer: {json: {markdown: "`count_words` in `src/lib.rs`."}}
  - contains: "[page-gamma]"
    responses:
      - answer: {json: {markdown: "`count()` in `src/count.rs`."}}
"#,
    )
    .await;
    let composition = r#"name: grounded-fan-out
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 512
steps:
  - id: outline
    access: read-only
    instructions: 'List the pages.'
    contract:
      schema: {type: object, required: [names]}
  - id: page
    access: read-only
    forEach: steps.outline.output.names
    concurrency: 3
    instructions: 'Write page [page-{{item}}] as {"markdown": "..."}.'
    contract:
      schema: {type: object, required: [markdown], properties: {markdown: {type: string}}}
      grounding: [markdown]
"#;
    let r = run(&h, composition, &[("DOCSFAB_RETRY_BASE_DELAY_MS", "20")]).await;
    assert_eq!(r.outcome.status, RunStatus::Succeeded, "{:#}", r.json);
    let steps = r.json["steps"].as_array().unwrap();
    let attempts_of = |id: &str| {
        steps
            .iter()
            .find(|s| s["stepId"] == id)
            .unwrap_or_else(|| panic!("no step {id}: {:#}", r.json))["attempts"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(attempts_of("page[0]").len(), 1);
    assert_eq!(attempts_of("page[2]").len(), 1);
    let beta = attempts_of("page[1]");
    assert_eq!(beta.len(), 2);
    assert_eq!(beta[0]["retryRule"], "contract-ungrounded");
    assert_eq!(
        beta[0]["grounding"]["unknown"][0]["nearest"],
        json!(["count_words"])
    );
    assert_eq!(beta[1]["grounding"]["grounded"], 2);
}
