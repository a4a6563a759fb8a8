//! host.yaml's `structuredOutput` through the real binary (issue 31, docs/structured-output.md):
//! doctor shows it with its source, setup keeps it, and a run records and `runs show` names the
//! constraint each attempt sent.

mod support;

use serde_json::Value;
use support::run::{Setup, Sim};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const CONTRACT: &str = r#"name: structured
model: sim-model
limits:
  timeoutMs: 20000
  maxOutputTokens: 256
steps:
  - id: outline
    access: read-only
    instructions: 'Return {"modules": [...]}.'
    tools: [list_files]
    contract:
      schema: {type: object, additionalProperties: false, required: [modules], properties: {modules: {type: array, items: {type: string}}}}
"#;

const ANSWER: &str = "responses:\n  - answer:\n      json: {modules: [lib]}\n";

#[test]
fn issue31_doctor_shows_the_setting_and_its_source() {
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s.docsfab().arg("doctor").output().unwrap();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Provider default structuredOutput: json-schema (the API's default)"),
        "{stdout}"
    );
    let s = Setup::new("http://127.0.0.1:9/v1", "    structuredOutput: off\n");
    let out = s.docsfab().args(["doctor", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["providers"][0]["structuredOutput"],
        serde_json::json!({"mode": "off", "source": "host.yaml"})
    );
    // setup writes it back as the operator wrote it.
    let out = s
        .docsfab()
        .args(["setup", "--model", "other-model"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let host = std::fs::read_to_string(s.home().join("host.yaml")).unwrap();
    assert!(
        host.contains("    structuredOutput: 'off'\n")
            || host.contains("    structuredOutput: \"off\"\n"),
        "{host}"
    );
}

#[test]
fn issue31_a_run_sends_the_schema_and_runs_show_names_it() {
    // What went on the wire is checked byte for byte in docsfab-runtime's
    // tests/e2e_structured_output.rs; here, what the operator sees.
    for (api, extra, recorded) in [
        ("openai-chat", "", Some("json-schema-strict")),
        ("anthropic-messages", "", Some("json-schema-strict")),
        ("openai-chat", "    structuredOutput: off\n", None),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("sim.jsonl");
        let sim = Sim::start_logging(tmp.path(), ANSWER, &log);
        let s = Setup::with_api(api, &sim.base_url, extra);
        let comp = s.composition(CONTRACT);
        let out = s.run_command(&comp).args(["--json"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let id = stdout.lines().next().unwrap().to_owned();
        let record = s.show_json(&id);
        let attempt = &record["steps"][0]["attempts"][0];
        assert_eq!(
            attempt.get("outputConstraint").and_then(Value::as_str),
            recorded,
            "{api} {extra}"
        );
        let show = s.docsfab().args(["runs", "show", &id]).output().unwrap();
        let show = text(&show.stdout);
        match recorded {
            Some(c) => assert!(
                show.contains(&format!("structured output asked for: {c}")),
                "{show}"
            ),
            None => assert!(!show.contains("structured output asked for"), "{show}"),
        }
    }
}
