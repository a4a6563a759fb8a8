//! Usage, cost and run budgets through the real CLI against `docsfab sim serve` (issue 23):
//! the record's usage is the simulator's own count, unknown usage stays null end to end, prompt
//! caching lowers what contract retries are billed, and a run budget stops a fan-out before a
//! request could cross it.

mod support;

use docsfab_runtime::record::validate_against_schema;
use serde_json::Value;
use support::run::{FAST_CATALOG, Setup, Sim};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The simulator's request log, one JSON object a line.
fn sim_log(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn attempts(record: &Value) -> Vec<&Value> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["attempts"].as_array().unwrap())
        .collect()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// What the simulator says it billed, input plus output, over every request it logged.
fn billed_total(log: &[Value]) -> u64 {
    log.iter()
        .map(|e| n(&e["billed"]["input_tokens"]) + n(&e["billed"]["output_tokens"]))
        .sum()
}

const PRICING: &str = "    pricing:\n      inputPerMillion: 3\n      outputPerMillion: 15\n      cacheWritePerMillion: 3.75\n      cacheReadPerMillion: 0.3\n";

/// A read step that fails its contract three times (prose), then answers.
const RETRIED: &str = "name: retried\nlimits:\n  timeoutMs: 60000\n  maxTurns: 2\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Return an object with a modules array. Here is a long and stable instruction that makes the prefix worth caching, repeated so that it has some weight in the prompt's size. Here is a long and stable instruction that makes the prefix worth caching.\n    contract:\n      schema: {type: object, required: [modules]}\n";

const RETRIED_SCENARIO: &str =
    "responses:\n  - answer: {text: not json}\n    repeat: 3\n  - answer: {json: {modules: []}}\n";

/// Runs RETRIED on a fresh Anthropic simulator; the record and the simulator's log.
fn run_retried(caching: bool) -> (Value, Vec<Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("sim.jsonl");
    let sim = Sim::start_logging(tmp.path(), RETRIED_SCENARIO, &log);
    let extra = format!("    promptCaching: {caching}\n{PRICING}{FAST_CATALOG}");
    let s = Setup::with_api("anthropic-messages", &sim.base_url, &extra);
    let comp = s.composition(RETRIED);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    (record, sim_log(&log))
}

#[test]
fn issue23_ops_4_usage_is_the_simulators_count_and_caching_lowers_what_three_contract_retries_cost()
{
    let (cached, cached_log) = run_retried(true);
    let (plain, plain_log) = run_retried(false);
    for (record, log) in [(&cached, &cached_log), (&plain, &plain_log)] {
        let a = attempts(record);
        assert_eq!(a.len(), 4, "three contract retries and the answer");
        // Every attempt's usage, summed, is what the simulator billed.
        let recorded: u64 = a
            .iter()
            .map(|a| n(&a["usage"]["inputTokens"]) + n(&a["usage"]["outputTokens"]))
            .sum();
        assert_eq!(recorded, billed_total(log));
        assert_eq!(
            n(&record["usage"]["inputTokens"]) + n(&record["usage"]["outputTokens"]),
            recorded
        );
        assert!(record["costUsd"].as_f64().unwrap() > 0.0);
    }
    // With caching the retries read the prefix the first attempt wrote.
    let reads: u64 = attempts(&cached)
        .iter()
        .map(|a| a["usage"]["cacheReadTokens"].as_u64().unwrap_or(0))
        .sum();
    assert!(reads > 0, "no cache read: {cached}");
    assert!(
        attempts(&plain)
            .iter()
            .all(|a| a["usage"]["cacheReadTokens"] == 0)
    );
    let (with, without) = (
        cached["costUsd"].as_f64().unwrap(),
        plain["costUsd"].as_f64().unwrap(),
    );
    assert!(
        with < without,
        "cached ${with} is not below uncached ${without}"
    );
    eprintln!("a step with 3 contract retries: ${with} with prompt caching, ${without} without");
}

#[test]
fn issue23_unknown_usage_stays_null_in_the_record_runs_show_and_runs_stats() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "usage: never\nresponses:\n  - answer: {json: {modules: []}}\n",
    );
    let extra = format!("{PRICING}{FAST_CATALOG}");
    let s = Setup::new(&sim.base_url, &extra);
    let comp = s.composition(support::run::ONE_STEP);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    let a = &attempts(&record)[0];
    assert_eq!(a["usage"]["inputTokens"], Value::Null);
    assert_eq!(a["usage"]["outputTokens"], Value::Null);
    assert_eq!(a["costUsd"], Value::Null);
    assert_eq!(a["turns"][0]["usage"]["inputTokens"], Value::Null);
    assert_eq!(record["usage"]["inputTokens"], Value::Null);
    assert_eq!(record["costUsd"], Value::Null);
    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    let shown = text(&shown.stdout);
    assert!(shown.contains("tokens unknown"), "{shown}");
    assert!(!shown.contains("tokens in 0"), "{shown}");
    let stats = s
        .docsfab()
        .args(["runs", "stats", "--json"])
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["spent"]["unknownUsageAttempts"], 1);
    assert_eq!(stats["spent"]["inputTokens"], 0);
    assert_eq!(stats["spent"]["costUsd"], Value::Null);
}

/// A fan-out of 20 read instances at concurrency 8 under a token budget.
const FAN: &str = "name: fan\nlimits:\n  timeoutMs: 60000\n  maxTurns: 2\n  maxOutputTokens: 200\n  maxRunTokens: 4000\nsteps:\n  - id: outline\n    access: read-only\n    instructions: List the modules.\n    contract:\n      schema: {type: object, required: [modules], properties: {modules: {type: array}}}\n  - id: pages\n    access: read-only\n    forEach: steps.outline.output.modules\n    concurrency: 8\n    instructions: \"Describe [{{item}}].\"\n    contract:\n      schema: {type: object, required: [ok]}\n";

#[test]
fn issue23_a_run_budget_stops_a_fan_out_of_20_at_concurrency_8_before_any_request_crosses_it() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("sim.jsonl");
    let modules: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let scenario = format!(
        "responses:\n  - answer: {{json: {{modules: {modules:?}}}}}\nfallback:\n  respond: {{answer: {{json: {{ok: true}}}}}}\n"
    );
    let sim = Sim::start_logging(tmp.path(), &scenario, &log);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(FAN);
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    assert_eq!(record["status"], "failed");
    let stopped: Vec<&Value> = attempts(&record)
        .into_iter()
        .filter(|a| a["failureCategory"] == "budget-exhausted")
        .collect();
    assert!(!stopped.is_empty(), "{record}");
    for a in &stopped {
        assert_eq!(a["code"], "run-max-tokens-bound");
        assert_eq!(a["retryDecision"], "terminal");
        assert!(
            a["message"]
                .as_str()
                .unwrap()
                .starts_with("run-max-tokens-bound: ")
        );
    }
    // The spend never passed the budget, by the record and by the simulator's own count, and
    // every request the simulator saw is one the record accounts for.
    let log = sim_log(&log);
    let billed = billed_total(&log);
    let recorded = n(&record["usage"]["inputTokens"]) + n(&record["usage"]["outputTokens"]);
    assert_eq!(recorded, billed);
    assert!(
        billed <= 9000,
        "billed {billed} tokens past a 9000-token budget"
    );
    let sent: u64 = attempts(&record)
        .iter()
        .flat_map(|a| a["turns"].as_array().unwrap())
        .filter(|t| !t["reason"].as_str().unwrap_or("").starts_with("run budget"))
        .map(|t| 1 + n(&t["providerRetries"]))
        .sum();
    assert_eq!(
        sent,
        log.len() as u64,
        "requests the record does not account for"
    );
    let instances_run = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "succeeded")
        .count();
    assert!(instances_run < 21, "the budget stopped nothing");
}
