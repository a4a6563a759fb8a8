//! Issue 11: the DNS pre-flight of `docsfab run` and `docsfab doctor`, and `docsfab doctor
//! --probe`, as real processes against `docsfab sim serve` (the simulator's request log counts
//! what the probe sent).

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::run::{ONE_STEP, SECRET, Setup, Sim};

/// A host under the reserved `.invalid` top-level domain: it can never exist (RFC 6761).
const NO_SUCH_HOST_URL: &str = "http://docsfab-test.invalid:9/v1";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What this machine's resolver says for the `.invalid` name: `Some(true)` for a definitive
/// "no such host", `Some(false)` for a temporary failure (a sandbox without any DNS may answer
/// EAI_AGAIN), `None` if it somehow resolved.
fn resolver_says_no_such_host() -> Option<bool> {
    use std::net::ToSocketAddrs as _;
    match ("docsfab-test.invalid", 9).to_socket_addrs() {
        Ok(_) => None,
        Err(e) => {
            let said = e.to_string();
            Some(
                said.contains("Name or service not known")
                    || said.contains("No address associated with hostname")
                    || said.contains("Name does not resolve"),
            )
        }
    }
}

// Proves the issue 11 pre-flight: a provider host that does not exist is refused before anything
// is recorded (exit 2, one sentence naming provider, host and host.yaml key, stdout empty).
#[test]
fn issue11_dns_refusal_run_exits_2_and_records_nothing() {
    let s = Setup::new(NO_SUCH_HOST_URL, "");
    let c = s.composition(ONE_STEP);
    let out = s.run_command(&c).output().unwrap();
    let stderr = text(&out.stderr);
    match resolver_says_no_such_host() {
        Some(true) => {
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with("error: provider \"default\" points at host docsfab-test.invalid (providers.default.baseUrl in "),
                "{stderr}"
            );
            assert!(
                stderr.contains("which does not exist (the resolver says: "),
                "{stderr}"
            );
            assert!(stderr.contains("correct the host name in baseUrl"));
            assert!(s.list_json().is_empty(), "a run was recorded");
        }
        // A resolver that cannot answer definitively must not refuse the run: it warns once
        // and the run goes on (and fails on its transport budget, not checked here).
        Some(false) => {
            assert!(stderr.contains("could not be resolved now"), "{stderr}");
        }
        None => panic!("docsfab-test.invalid resolved: this resolver breaks RFC 6761"),
    }
    assert!(!stderr.contains(SECRET));
}

// `doctor --composition F` refuses the host as `run F` does; `--probe` refuses it before
// sending; plain `doctor` (no run known to use the provider) warns and exits 0.
#[test]
fn issue11_dns_refusal_doctor_exits_2_text_and_json() {
    if resolver_says_no_such_host() != Some(true) {
        eprintln!("skipped: this resolver gives no definitive answer for .invalid");
        return;
    }
    let s = Setup::new(NO_SUCH_HOST_URL, "");
    let c = s.composition(ONE_STEP);
    let out = s
        .docsfab()
        .arg("doctor")
        .arg("--composition")
        .arg(&c)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("points at host docsfab-test.invalid"));
    let out = s
        .docsfab()
        .args(["doctor", "--json", "--composition"])
        .arg(&c)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("docsfab-test.invalid")
    );
    let out = s.docsfab().args(["doctor", "--probe"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("points at host docsfab-test.invalid"));

    let out = s.docsfab().arg("doctor").output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("Provider default host: docsfab-test.invalid does not exist ("),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "warning: the host docsfab-test.invalid of provider \"default\" does not exist"
        ),
        "{stdout}"
    );
}

#[test]
fn issue11_doctor_reports_each_provider_host_resolution() {
    let s = Setup::new(
        "http://127.0.0.1:9/v1",
        "  local:\n    api: openai-chat\n    baseUrl: http://localhost:9/v1\n    apiKeyEnv: DOCSFAB_TEST_PROVIDER_KEY\n    model: m\n",
    );
    let out = s.docsfab().arg("doctor").output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("Provider default host: 127.0.0.1 not resolved (an IP address)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Provider local host: localhost not resolved (localhost)\n"),
        "{stdout}"
    );
    let out = s.docsfab().args(["doctor", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["providers"][0]["dns"]["status"], "skipped");
    assert_eq!(v["probe"], Value::Null);
}

/// `doctor --probe --json` against a simulator answering with `scenario`: the output, the
/// parsed report, and how many requests the simulator saw.
fn probe_against(scenario: &str, extra: &[&str]) -> (Output, Value, usize) {
    probe_api("openai-chat", scenario, extra)
}

fn probe_api(api: &str, scenario: &str, extra: &[&str]) -> (Output, Value, usize) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let sim = Sim::start_logging(dir.path(), scenario, &log);
    let s = Setup::with_api(api, &sim.base_url, "");
    let out = s
        .docsfab()
        .args(["doctor", "--probe", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let requests = logged(&log);
    drop(sim);
    for stream in [&out.stdout, &out.stderr] {
        assert!(!text(stream).contains(SECRET), "the key leaked");
    }
    (out, v, requests)
}

fn logged(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[test]
fn issue11_probe_ok_reports_the_round_trip_and_sends_one_request() {
    let (out, v, requests) = probe_against("responses:\n  - answer: {text: pong}\n", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let p = &v["probe"];
    assert_eq!(p["result"], "answered");
    assert_eq!(p["httpStatus"], 200);
    assert_eq!(p["provider"], "default");
    assert_eq!(p["model"], "sim-model");
    assert!(p["rttMs"].is_u64(), "{p}");
    // The ping, then the two capability probes (issue 31); the simulator answers "pong" to
    // each, so neither a tool call nor a schema instance came back.
    assert_eq!(requests, 3);
    assert_eq!(p["requests"], 3);
    assert_eq!(
        p["capabilities"],
        serde_json::json!({"tools": false, "structuredOutput": false, "streamUsage": true})
    );
}

#[test]
fn issue11_probe_text_shows_result_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), "responses:\n  - answer: {text: pong}\n");
    let s = Setup::new(&sim.base_url, "");
    let out = s.docsfab().args(["doctor", "--probe"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let result = stdout
        .lines()
        .find(|l| l.starts_with("Probe result: answered (HTTP 200) round trip "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(result.ends_with(" s)"), "{result}");
    assert!(stdout.contains(&format!(
        "Probe: provider default api=openai-chat host={} model=sim-model (3 requests, never replayed)\n",
        sim.addr()
    )));
    assert!(stdout.ends_with("Configuration is valid.\n"), "{stdout}");
}

#[test]
fn issue11_probe_401_is_a_refused_key_exit_2_never_replayed() {
    let (out, v, requests) = probe_against("responses:\n  - status: 401\n", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(v["probe"]["result"], "key-refused");
    assert_eq!(v["probe"]["httpStatus"], 401);
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: provider \"default\" refused the API key in DOCSFAB_TEST_PROVIDER_KEY (HTTP 401"
        ),
        "{stderr}"
    );
    assert_eq!(requests, 1);
}

#[test]
fn issue11_probe_unknown_model_is_named_exit_2() {
    let scenario = "responses:\n  - status: 404\n    body: '{\"error\":{\"message\":\"The model does not exist\",\"type\":\"invalid_request_error\",\"code\":\"model_not_found\"}}'\n";
    let (out, v, requests) = probe_against(scenario, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(v["probe"]["result"], "no-such-model");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: the model \"sim-model\" does not exist at provider \"default\" (HTTP 404"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("error code model_not_found"), "{stderr}");
    assert_eq!(requests, 1);
}

#[test]
fn issue11_probe_429_is_reachable_but_throttled_exit_0_never_replayed() {
    let (out, v, requests) = probe_against(
        "responses:\n  - status: 429\n    headers: {retry-after: 2}\n",
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(v["probe"]["result"], "throttled");
    assert_eq!(v["probe"]["retryAfterMs"], 2000);
    assert!(
        v["probe"]["detail"]
            .as_str()
            .unwrap()
            .starts_with("HTTP 429")
    );
    assert_eq!(
        requests, 1,
        "a 429 is replayed by a run, never by the probe"
    );
}

#[test]
fn issue11_probe_refused_port_is_unreachable_exit_1() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = Setup::new(&format!("http://127.0.0.1:{port}/v1"), "");
    let out = s
        .docsfab()
        .args(["doctor", "--probe", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["probe"]["result"], "unreachable");
    assert_eq!(v["probe"]["fault"], "connect-refused");
    assert_eq!(v["probe"]["providerErrorClass"], "network");
    assert!(
        text(&out.stderr).contains("could not be reached"),
        "{}",
        text(&out.stderr)
    );
    let out = s.docsfab().args(["doctor", "--probe"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout.contains("; connect-refused, class network) round trip "),
        "{stdout}"
    );
    assert!(
        stdout
            .ends_with("Configuration is valid, but the probe failed (see the error on stderr).\n")
    );
}

#[test]
fn issue11_probe_of_an_undefined_provider_is_refused() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s
        .docsfab()
        .args(["doctor", "--probe", "--provider", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot probe provider \"nope\""),
        "{}",
        text(&out.stderr)
    );
}

// The Anthropic API: an answer passes, and the simulator's default 404 body (`not_found_error`,
// what Anthropic sends for an unknown model) is a missing model.
#[test]
fn issue11_probe_anthropic_answer_and_unknown_model() {
    let (out, v, requests) = probe_api(
        "anthropic-messages",
        "responses:\n  - answer: {text: pong}\n",
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(v["probe"]["api"], "anthropic-messages");
    assert_eq!(v["probe"]["result"], "answered");
    assert_eq!(requests, 3);

    let (out, v, requests) = probe_api("anthropic-messages", "responses:\n  - status: 404\n", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(v["probe"]["result"], "no-such-model");
    assert!(
        text(&out.stderr).contains("error type not_found_error"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(requests, 1);
}

/// A scenario whose lanes answer the capability probes: `tools` and `schema` are the script
/// entries for the tool probe and the schema probe; the ping gets "pong".
fn capability_scenario(tools: &str, schema: &str) -> String {
    format!(
        "responses:\n  - answer: {{text: pong}}\nlanes:\n  - contains: docsfab_probe_echo\n    responses:\n      - {tools}\n  - contains: the sky blue\n    responses:\n      - {schema}\n"
    )
}

// Issue 31: a required tool call that comes back, and a schema instance, are capabilities; on
// both APIs, each probe sent once.
#[test]
fn issue31_probe_capabilities_yes_when_the_server_honours_them() {
    let scenario = capability_scenario(
        "answer: {tool_calls: [{name: docsfab_probe_echo, arguments: {text: ping}}]}",
        "answer: {json: {ok: true}}",
    );
    for api in ["openai-chat", "anthropic-messages"] {
        let (out, v, requests) = probe_api(api, &scenario, &[]);
        assert_eq!(out.status.code(), Some(0), "{api}: {}", text(&out.stderr));
        assert_eq!(
            v["probe"]["capabilities"],
            serde_json::json!({"tools": true, "structuredOutput": true, "streamUsage": true}),
            "{api}"
        );
        assert_eq!(requests, 3, "{api}");
    }
}

// Issue 31: what a "no" means and what to set, in the text report; usage never sent is a "no"
// too.
#[test]
fn issue31_probe_capabilities_no_says_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "usage: never\nresponses:\n  - answer: {text: pong}\n",
    );
    let s = Setup::new(&sim.base_url, "");
    let out = s.docsfab().args(["doctor", "--probe"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("Probe capabilities: tools no, structuredOutput no, streamUsage no\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("steps that need the read tools will answer without reading"),
        "{stdout}"
    );
    assert!(
        stdout.contains("set providers.default.structuredOutput: off or json-object in host.yaml"),
        "{stdout}"
    );
}

// Issue 31: a probe the server cannot answer is unknown (null), not "no".
#[test]
fn issue31_probe_capability_unanswered_is_null() {
    let scenario = capability_scenario("status: 503", "answer: {json: {ok: true}}");
    let (out, v, _) = probe_against(&scenario, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(v["probe"]["capabilities"]["tools"], Value::Null, "{v}");
    assert_eq!(v["probe"]["capabilities"]["structuredOutput"], true, "{v}");
}

// Issue 31: a 404 at a base URL without its version path, an answer with it: the probe says
// which base URL to use (exit 2), in one more request.
#[test]
fn issue31_probe_finds_the_missing_v1() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let sim = Sim::start_logging(dir.path(), "responses:\n  - answer: {text: pong}\n", &log);
    let bare = format!("http://{}", sim.addr());
    let s = Setup::new(&bare, "");
    let out = s
        .docsfab()
        .args(["doctor", "--probe", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["probe"]["result"], "wrong-base-url", "{v}");
    assert_eq!(v["probe"]["suggestedBaseUrl"], format!("{bare}/v1"));
    assert_eq!(v["probe"]["requests"], 2);
    assert_eq!(logged(&log), 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "set providers.default.baseUrl: {bare}/v1 in host.yaml"
        )),
        "{stderr}"
    );
}

// Issue 31: an anthropic-messages base URL without a path (the form Anthropic's SDKs and
// llama.cpp document) reaches /v1/messages, for the probe and for a run.
#[test]
fn issue31_anthropic_base_url_without_v1_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        dir.path(),
        "responses:\n  - answer: {json: {modules: []}}\n",
    );
    let bare = format!("http://{}", sim.addr());
    let s = Setup::with_api("anthropic-messages", &bare, "");
    let out = s
        .docsfab()
        .args(["doctor", "--probe", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["probe"]["result"], "answered", "{v}");
    let c = s.composition(ONE_STEP);
    let out = s.run_command(&c).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

// Issue 31: a run answered 404 names the base URL's version path next to the model, and the
// probe that tells them apart.
#[test]
fn issue31_a_run_answered_404_points_at_the_version_path() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(dir.path(), "responses:\n  - answer: {text: pong}\n");
    let s = Setup::new(&format!("http://{}", sim.addr()), "");
    let c = s.composition(ONE_STEP);
    let out = s.run_command(&c).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let id = text(&out.stdout).lines().next().unwrap().to_owned();
    let record = s.show_json(&id);
    let remedy = record["steps"][0]["failure"]["remediation"]
        .as_str()
        .unwrap_or_else(|| panic!("{record}"));
    assert!(
        remedy.contains("ends with the API's version path"),
        "{remedy}"
    );
    assert!(remedy.contains("docsfab doctor --probe"), "{remedy}");
}
