//! `docsfab doctor` and `docsfab setup` as real processes against a temporary DOCSFAB_HOME
//! (CFG-1, CFG-2, CFG-4, CFG-5, CFG-6, CFG-7, CFG-8, OPS-2).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use tempfile::TempDir;

/// A scratch host directory and a working directory for composition files.
struct Scratch {
    home: TempDir,
    files: TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            home: TempDir::new().expect("temp home"),
            files: TempDir::new().expect("temp dir"),
        }
    }

    /// `docsfab` with a clean environment apart from DOCSFAB_HOME and PATH.
    fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("docsfab").expect("docsfab binary");
        c.env_clear()
            .env("DOCSFAB_HOME", self.home.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        c
    }

    fn host_file(&self) -> PathBuf {
        self.home.path().join("host.yaml")
    }

    fn write_host(&self, text: &str) {
        std::fs::write(self.host_file(), text).expect("write host.yaml");
    }

    fn composition(&self, timeout_ms: u64) -> PathBuf {
        self.composition_text(&format!(
            "name: quickstart\nlimits:\n  timeoutMs: {timeout_ms}\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Survey the crate.\n    tools: [list_files, read_file]\n    contract:\n      schema: {{type: object}}\n"
        ))
    }

    fn composition_text(&self, text: &str) -> PathBuf {
        let p = self.files.path().join("composition.yaml");
        std::fs::write(&p, text).expect("write composition");
        p
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(mut c: Command) -> Out {
    let o = c.output().expect("run docsfab");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn doctor(s: &Scratch, composition: Option<&Path>, env: &[(&str, &str)]) -> Out {
    let mut c = s.cmd();
    c.arg("doctor");
    if let Some(p) = composition {
        c.arg("--composition").arg(p);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

/// A refusal: exit 2, one line on stderr, no panic or backtrace.
fn assert_refused(o: &Out) {
    assert_eq!(o.code, 2, "stdout: {}\nstderr: {}", o.stdout, o.stderr);
    assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    assert!(!o.stderr.contains("backtrace"), "{}", o.stderr);
}

#[test]
fn empty_home_default_envelope_exceeds_deadline_ops_2() {
    let s = Scratch::new();
    let f = s.composition(1_800_000);
    let o = doctor(&s, Some(&f), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains(
        "Transport retry budget: maxTransportRetries=6 transportMaxDelayMs=60000 transportMaxElapsedMs=3600000 baseDelayMs=1000 (catalog)\n"
    ), "{}", o.stdout);
    assert!(o.stdout.contains(
        "Retry envelope: attempts<=10 contract<=7200000ms transport<=5400000ms total<=12600000ms (exceeds runtime.deadlineMilliseconds=10800000)\n"
    ), "{}", o.stdout);
    // The warning names both remedies.
    let warning = o
        .stdout
        .lines()
        .find(|l| l.starts_with("warning: one read-only step"))
        .expect("envelope warning");
    assert!(
        warning.contains("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES"),
        "{warning}"
    );
    assert!(warning.contains("timeoutMs"), "{warning}");
}

#[test]
fn no_transport_retries_shrinks_transport_portion_ops_2_cfg_2() {
    let s = Scratch::new();
    let f = s.composition(1_800_000);
    let o = doctor(
        &s,
        Some(&f),
        &[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "0")],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("transport<=1800000ms"), "{}", o.stdout);
    assert!(o.stdout.contains("attempts<=4"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("(within runtime.deadlineMilliseconds=10800000)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("maxTransportRetries: environment"),
        "{}",
        o.stdout
    );
    assert!(
        !o.stdout.contains("warning: one read-only step"),
        "{}",
        o.stdout
    );
}

#[test]
fn without_composition_the_timer_defaults_to_half_an_hour_ops_2() {
    let s = Scratch::new();
    let o = doctor(&s, None, &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("total<=12600000ms"), "{}", o.stdout);
    let f = s.composition(300_000);
    let o = doctor(&s, Some(&f), &[]);
    assert!(
        o.stdout
            .contains("contract<=1200000ms transport<=2460000ms"),
        "{}",
        o.stdout
    );
}

#[test]
fn env_max_retries_above_range_exits_2_naming_it_cfg_1() {
    let s = Scratch::new();
    let o = doctor(&s, None, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "4")]);
    assert_refused(&o);
    assert!(
        o.stderr.contains("DOCSFAB_READ_ONLY_MAX_RETRIES=4"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("0..3"), "{}", o.stderr);
}

#[test]
fn env_non_integer_exits_2_cfg_1() {
    let s = Scratch::new();
    for bad in ["2.5", "abc", "", " 3"] {
        let o = doctor(&s, None, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", bad)]);
        assert_refused(&o);
        assert!(
            o.stderr.contains("DOCSFAB_READ_ONLY_MAX_RETRIES"),
            "{}",
            o.stderr
        );
    }
    let o = doctor(
        &s,
        None,
        &[("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES", "7")],
    );
    assert_refused(&o);
    assert!(o.stderr.contains("0..6"), "{}", o.stderr);
}

#[test]
fn doctor_shows_each_source_cfg_5() {
    let s = Scratch::new();
    s.write_host(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://api.example.com/v1\n    apiKeyEnv: DOCSFAB_TEST_KEY\n    model: m\nreadOnlyMaxRetries: 1\ncatalog:\n  retry.transportMaxDelayMs: 30000\n",
    );
    let o = doctor(
        &s,
        None,
        &[
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", "3"),
            ("DOCSFAB_RETRY_BASE_DELAY_MS", "250"),
        ],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains(
            "retry.maxRetries=1 (host override) configuredMaxRetries=3 effectiveMaxRetries=1"
        ),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("retry.transportMaxDelayMs=30000 (host catalog)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("retry.baseDelayMs=250 (environment)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("retry.maxTransportRetries=6 (catalog)"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("contract<=3600000ms"), "{}", o.stdout);
    // The shadowed variable is pointed out.
    assert!(
        o.stdout
            .contains("DOCSFAB_READ_ONLY_MAX_RETRIES=3 is set but the host override"),
        "{}",
        o.stdout
    );
}

#[test]
fn doctor_json_gives_the_same_figures_ops_2() {
    let s = Scratch::new();
    let f = s.composition(1_800_000);
    let mut c = s.cmd();
    c.args(["doctor", "--json", "--composition"]).arg(&f);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["valid"], true);
    assert_eq!(v["envelope"]["transportMs"], 5_400_000);
    assert_eq!(v["envelope"]["contractMs"], 7_200_000);
    assert_eq!(v["envelope"]["totalMs"], 12_600_000);
    assert_eq!(v["envelope"]["attempts"], 10);
    assert_eq!(v["envelope"]["exceedsDeadline"], true);
    assert_eq!(v["envelope"]["deadlineMilliseconds"], 10_800_000);
    assert_eq!(v["transportRetry"]["maxTransportRetries"], 6);
    assert_eq!(v["transportRetry"]["baseDelayMs"], 1000);
    assert_eq!(v["configuredMaxRetries"], 3);
    assert_eq!(v["transportRetry"]["sources"]["baseDelayMs"], "catalog");
    assert_eq!(v["effectiveMaxRetries"], 3);
    let limits = v["limits"].as_array().expect("limits");
    assert!(
        limits
            .iter()
            .any(|l| l["key"] == "retry.maxRetries" && l["source"] == "catalog")
    );
}

#[test]
fn host_catalog_raise_exits_2_cfg_8() {
    let s = Scratch::new();
    s.write_host("catalog:\n  retry.maxTransportRetries: 7\n");
    let o = doctor(&s, None, &[]);
    assert_refused(&o);
    assert!(
        o.stderr.contains("retry.maxTransportRetries"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("maximum of 6"), "{}", o.stderr);
    assert!(o.stderr.contains("host.yaml"), "{}", o.stderr);
}

#[test]
fn host_unknown_key_exits_2() {
    let s = Scratch::new();
    s.write_host("readOnlyMaxRetrys: 2\n");
    let o = doctor(&s, None, &[]);
    assert_refused(&o);
    assert!(
        o.stderr.contains("readOnlyMaxRetrys") && o.stderr.contains("line 1"),
        "{}",
        o.stderr
    );
}

#[test]
fn explicit_condition_budget_above_max_retries_exits_2_cfg_7() {
    let s = Scratch::new();
    let o = doctor(
        &s,
        None,
        &[
            ("DOCSFAB_READ_ONLY_MAX_RETRIES", "0"),
            ("DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES", "1"),
        ],
    );
    assert_refused(&o);
    assert!(
        o.stderr
            .contains("DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES=1"),
        "{}",
        o.stderr
    );
    let o = doctor(&s, None, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("retry.maxTimeoutRetries=0 (environment)"),
        "{}",
        o.stdout
    );
}

#[test]
fn composition_with_retry_field_exits_2_naming_it_cfg_6() {
    let s = Scratch::new();
    let f = s.composition_text(
        "name: q\nlimits:\n  timeoutMs: 300000\n  maxRetries: 1\nsteps:\n  - id: a\n    access: read-only\n    instructions: go\n",
    );
    let o = doctor(&s, Some(&f), &[]);
    assert_refused(&o);
    assert!(
        o.stderr.contains("maxRetries") && o.stderr.contains("line 4"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("composition.yaml"), "{}", o.stderr);
}

#[test]
fn missing_composition_exits_2() {
    let s = Scratch::new();
    let o = doctor(&s, Some(&s.files.path().join("nope.yaml")), &[]);
    assert_refused(&o);
    assert!(o.stderr.contains("nope.yaml"), "{}", o.stderr);
}

#[test]
fn doctor_never_prints_the_key() {
    let s = Scratch::new();
    s.write_host(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://api.example.com/v1\n    apiKeyEnv: DOCSFAB_TEST_KEY\n    model: m\n",
    );
    let secret = "sk-test-do-not-print-4242";
    let mut c = s.cmd();
    c.arg("doctor").env("DOCSFAB_TEST_KEY", secret);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains(secret) && !o.stderr.contains(secret));
    assert!(
        o.stdout.contains("apiKeyEnv=DOCSFAB_TEST_KEY (set)"),
        "{}",
        o.stdout
    );
    let mut c = s.cmd();
    c.args(["doctor", "--json"]).env("DOCSFAB_TEST_KEY", secret);
    let o = run(c);
    assert!(!o.stdout.contains(secret));
    let o = doctor(&s, None, &[]);
    assert!(
        o.stdout.contains("apiKeyEnv=DOCSFAB_TEST_KEY (not set)"),
        "{}",
        o.stdout
    );
}

#[test]
fn setup_on_empty_home_writes_no_override_cfg_4() {
    let s = Scratch::new();
    let mut c = s.cmd();
    c.arg("setup");
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(s.host_file()).expect("host.yaml written");
    let host = docsfab_policy::host::HostConfig::parse(&text, "host.yaml").expect("parses");
    assert_eq!(host.read_only_max_retries, None);
    assert_eq!(host.providers["default"].api_key_env, "OPENAI_API_KEY");
    // And the catalog applies.
    let o = doctor(&s, None, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("retry.maxRetries=3 (catalog)"),
        "{}",
        o.stdout
    );
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(s.home.path())
        .expect("home")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("host.yaml")]);
}

/// A model name that mixes case and digits across its parts is a model name, not a key.
#[test]
fn setup_accepts_a_model_name_with_mixed_case_and_digits() {
    let s = Scratch::new();
    let mut c = s.cmd();
    c.args([
        "setup",
        "--base-url",
        "http://LLM-Box:8000/v1",
        "--model",
        "Qwen/Qwen2.5-Coder-32B-Instruct",
    ]);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(s.host_file()).expect("host.yaml written");
    let host = docsfab_policy::host::HostConfig::parse(&text, "host.yaml").expect("parses");
    let d = &host.providers["default"];
    assert_eq!(d.model, "Qwen/Qwen2.5-Coder-32B-Instruct");
    assert_eq!(d.base_url, "http://LLM-Box:8000/v1");
}

#[test]
fn setup_keeps_existing_numeric_override_exactly_cfg_4() {
    let s = Scratch::new();
    s.write_host(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://gw.example.com/v1\n    apiKeyEnv: GW_KEY\n    model: old\n  backup:\n    api: anthropic-messages\n    baseUrl: https://api.anthropic.com/v1\n    apiKeyEnv: ANTHROPIC_API_KEY\n    model: c\nreadOnlyMaxRetries: 2\ncatalog:\n  retry.maxTransportRetries: 4\n",
    );
    let mut c = s.cmd();
    c.args(["setup", "--model", "new-model"]);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(s.host_file()).expect("host.yaml");
    assert!(text.contains("\nreadOnlyMaxRetries: 2\n"), "{text}");
    let host = docsfab_policy::host::HostConfig::parse(&text, "host.yaml").expect("parses");
    let d = &host.providers["default"];
    assert_eq!(
        (
            d.model.as_str(),
            d.base_url.as_str(),
            d.api_key_env.as_str()
        ),
        ("new-model", "https://gw.example.com/v1", "GW_KEY")
    );
    assert!(host.providers.contains_key("backup"));
    assert_eq!(host.catalog["retry.maxTransportRetries"].text, "4");
    let o = doctor(&s, None, &[("DOCSFAB_READ_ONLY_MAX_RETRIES", "0")]);
    assert!(
        o.stdout.contains("retry.maxRetries=2 (host override)"),
        "{}",
        o.stdout
    );
}

#[test]
fn setup_refuses_a_key_and_writes_nothing_cfg_4() {
    let s = Scratch::new();
    let key = "sk-ant-api03-AbCdEf123456";
    let mut c = s.cmd();
    c.args(["setup", "--api", "anthropic-messages", "--api-key-env", key]);
    let o = run(c);
    assert_refused(&o);
    assert!(o.stderr.contains("--api-key-env"), "{}", o.stderr);
    assert!(!o.stderr.contains(key) && !o.stdout.contains(key));
    assert!(!s.host_file().exists());
}

#[test]
fn setup_refuses_to_overwrite_a_broken_host_file() {
    let s = Scratch::new();
    s.write_host("providers: [oops\n");
    let before = std::fs::read_to_string(s.host_file()).expect("read");
    let mut c = s.cmd();
    c.arg("setup");
    let o = run(c);
    assert_refused(&o);
    assert_eq!(
        std::fs::read_to_string(s.host_file()).expect("read"),
        before
    );
}

#[test]
fn setup_with_all_flags_round_trips_through_doctor() {
    let s = Scratch::new();
    let mut c = s.cmd();
    c.args([
        "setup",
        "--api",
        "anthropic-messages",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "claude-x",
        "--api-key-env",
        "MY_ANTHROPIC_KEY",
    ]);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = doctor(&s, None, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(
        "Provider default: api=anthropic-messages baseUrl=http://127.0.0.1:9/v1 model=claude-x apiKeyEnv=MY_ANTHROPIC_KEY (not set)"
    ), "{}", o.stdout);
    // A composition without a model runs on the provider's model.
    let f = s.composition(600_000);
    let o = doctor(&s, Some(&f), &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout
            .contains("model=claude-x (provider default, anthropic-messages) (valid)"),
        "{}",
        o.stdout
    );
}

#[test]
fn usage_error_exits_2() {
    let s = Scratch::new();
    let mut c = s.cmd();
    c.args(["doctor", "--frobnicate"]);
    assert_eq!(run(c).code, 2);
}

#[test]
fn composition_naming_an_undefined_provider_exits_2() {
    let s = Scratch::new();
    s.write_host(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://api.example.com/v1\n    apiKeyEnv: K\n    model: m\n",
    );
    let f = s.composition_text(
        "name: q\nprovider: elsewhere\nsteps:\n  - id: a\n    access: read-only\n    instructions: go\n",
    );
    let o = doctor(&s, Some(&f), &[]);
    assert_refused(&o);
    assert!(
        o.stderr.contains("\"elsewhere\"") && o.stderr.contains("default"),
        "{}",
        o.stderr
    );
}

#[test]
fn doctor_json_spells_sources_in_kebab_case_cfg_5() {
    let s = Scratch::new();
    s.write_host("readOnlyMaxRetries: 2\ncatalog:\n  retry.transportMaxDelayMs: 1000\n");
    let mut c = s.cmd();
    c.args(["doctor", "--json"]);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["effectiveMaxRetriesSource"], "host-override");
    assert_eq!(v["effectiveMaxRetries"], 2);
    assert_eq!(
        v["transportRetry"]["sources"]["transportMaxDelayMs"],
        "host-catalog"
    );
}

/// Issue 34: `--json` carries each provider's spend settings with their sources, and the
/// composition's token envelope, as fields with the figures the text report prints.
#[test]
fn doctor_json_carries_the_spend_settings_and_the_token_envelope() {
    let s = Scratch::new();
    s.write_host(
        "providers:\n  default:\n    api: openai-chat\n    baseUrl: http://127.0.0.1:9/v1\n    apiKeyEnv: K\n    model: m\n    includeUsage: false\n    pricing:\n      inputPerMillion: 3\n      outputPerMillion: 15\n      cacheWritePerMillion: 3.75\n    budget:\n      maxRunCostUsd: 5\n  plain:\n    api: anthropic-messages\n    baseUrl: http://127.0.0.1:9/v1\n    apiKeyEnv: K\n    model: c\n",
    );
    let f = s.composition_text(
        "name: q\nlimits:\n  timeoutMs: 60000\n  maxTurns: 4\n  maxOutputTokens: 1000\n  maxRunTokens: 50000\nsteps:\n  - id: a\n    access: read-only\n    instructions: Survey.\n  - id: b\n    access: read-only\n    instructions: Outline.\n",
    );
    let mut c = s.cmd();
    c.args(["doctor", "--json", "--composition"]).arg(&f);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    let spend = |name: &str| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["spend"]
            .clone()
    };
    assert_eq!(
        spend("default"),
        serde_json::json!({
            "includeUsage": false,
            "promptCaching": true,
            "pricing": {"inputPerMillion": 3.0, "outputPerMillion": 15.0,
                "cacheWritePerMillion": 3.75, "cacheReadPerMillion": 3.0},
            "budget": {"maxRunCostUsd": 5.0},
            "sources": {"includeUsage": "host.yaml", "promptCaching": "default",
                "pricing": "host.yaml", "cacheWritePerMillion": "host.yaml",
                "cacheReadPerMillion": "default", "maxRunCostUsd": "host.yaml"},
        })
    );
    let plain = spend("plain");
    assert_eq!(plain["pricing"], serde_json::Value::Null);
    assert_eq!(plain["budget"]["maxRunCostUsd"], serde_json::Value::Null);
    assert_eq!(plain["sources"]["pricing"], "default");
    assert_eq!(
        plain["sources"]["cacheReadPerMillion"],
        serde_json::Value::Null
    );

    let t = &v["tokenEnvelope"];
    let attempts = v["envelope"]["attempts"].as_u64().unwrap();
    assert_eq!(t["attempts"], attempts);
    assert_eq!(t["maxTurns"], 4);
    assert_eq!(t["maxOutputTokens"], 1000);
    assert_eq!(t["outputTokensPerStep"], attempts * 4 * 1000);
    assert_eq!(
        t["steps"],
        serde_json::json!([
            {"id": "a", "outputTokens": attempts * 4000},
            {"id": "b", "outputTokens": attempts * 4000},
        ])
    );
    assert_eq!(t["timeEnvelopeMs"], v["envelope"]["totalMs"]);
    assert_eq!(t["maxRunTokens"], 50000);
    assert_eq!(t["maxRunTokensSource"], "composition");

    // The text report prints the same figures.
    let mut c = s.cmd();
    c.args(["doctor", "--composition"]).arg(&f);
    let o = run(c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let line = format!(
        "Token envelope of step b: up to {attempts} attempts x 4 turns x 1000 maxOutputTokens = {} output tokens",
        attempts * 4000
    );
    assert!(o.stdout.contains(&line), "{}", o.stdout);
    assert!(
        o.stdout.contains("Provider default spend: includeUsage=false (host.yaml) promptCaching=true (default) pricing USD/M in 3 out 15 cache-write 3.75 cache-read 3 (host.yaml) budget.maxRunCostUsd=5 (host.yaml)"),
        "{}",
        o.stdout
    );

    // Without a composition there is no envelope to give.
    let mut c = s.cmd();
    c.args(["doctor", "--json"]);
    let o = run(c);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["tokenEnvelope"], serde_json::Value::Null);
}

#[test]
fn doctor_json_refusal_is_an_object_and_exit_2_cfg_1() {
    let s = Scratch::new();
    let mut c = s.cmd();
    c.args(["doctor", "--json"])
        .env("DOCSFAB_READ_ONLY_MAX_RETRIES", "4");
    let o = run(c);
    assert_refused(&o);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["valid"], false);
    assert!(v["error"].as_str().is_some_and(|e| e.contains("0..3")));
}

#[test]
fn operator_rules_table_is_validated_and_used() {
    let s = Scratch::new();
    let rules = s.home.path().join("retry-policy.yaml");
    std::fs::write(&rules, "version: 1\nnot-a-rule: [\n").expect("write rules");
    let o = doctor(&s, None, &[]);
    assert_refused(&o);
    assert!(o.stderr.contains("retry-policy.yaml"), "{}", o.stderr);
    std::fs::write(&rules, docsfab_policy::rules::EMBEDDED_SOURCE).expect("write rules");
    let o = doctor(&s, None, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("(operator copy, valid"), "{}", o.stdout);
}
