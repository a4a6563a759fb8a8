//! Fan-out steps through the real CLI (issue 12): start-up refusals of `forEach`, `concurrency`
//! and the item placeholders, and a fan-out run against `docsfab sim serve` whose event lines
//! name each instance.

mod support;

use docsfab_runtime::record::validate_against_schema;
use support::run::{FAST_CATALOG, SECRET, Setup, Sim, looks_like_run_id};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An outline and a fan-out write step over its modules.
const FAN: &str = r#"name: fan
limits:
  timeoutMs: 60000
steps:
  - id: outline
    access: read-only
    instructions: List the modules.
    contract:
      schema: {type: object, required: [modules], properties: {modules: {type: array}, title: {type: string}}}
  - id: pages
    access: write
    forEach: steps.outline.output.modules
    concurrency: 2
    instructions: "Write docs/{{item.name}}.md about [{{item.name}}]."
    tools: [write_file]
    writeRoots: [docs/]
"#;

#[test]
fn issue12_fan_out_mistakes_known_at_start_up_exit_2_with_one_sentence_and_write_nothing() {
    // Nothing listens here: a refusal must come before any request.
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let cases = [
        (
            FAN.replace("steps.outline.output.modules", "steps.later.output.modules"),
            "names step \"later\", a step that does not exist",
        ),
        (
            FAN.replace("steps.outline.output.modules", "steps.outline.output.title"),
            "declares as string, not an array",
        ),
        (
            FAN.replace("concurrency: 2", "concurrency: 17"),
            "must be a whole number from 1 to 16",
        ),
        (
            FAN.replace("    forEach: steps.outline.output.modules\n", ""),
            "concurrency but no forEach",
        ),
        (
            FAN.replace(
                "    forEach: steps.outline.output.modules\n    concurrency: 2\n",
                "",
            ),
            "which only a step with forEach has",
        ),
    ];
    for (composition, want) in cases {
        let comp = s.composition(&composition);
        let out = s.run_command(&comp).output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{want}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(want), "{want}: {stderr}");
        assert!(stderr.trim_end().ends_with('.'), "{stderr}");
        assert!(out.stdout.is_empty());
        assert!(!s.store().exists(), "the run store was created");
    }
}

#[test]
fn issue12_a_cli_fan_out_run_names_each_instance_on_its_event_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let lane = |n: &str| {
        format!(
            "  - contains: \"[{n}]\"\n    responses:\n      - answer: {{tool_calls: [{{id: w, name: write_file, arguments: {{path: docs/{n}.md, content: \"{n}\"}}}}]}}\n      - answer: {{text: done {n}}}\n"
        )
    };
    let scenario = format!(
        "responses:\n  - answer: {{json: {{modules: [{{name: core}}, {{name: cli}}, {{name: sim}}]}}}}\nlanes:\n{}{}{}",
        lane("core"),
        lane("cli"),
        lane("sim")
    );
    let sim = Sim::start(tmp.path(), &scenario);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(FAN);
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap().to_owned();
    assert!(looks_like_run_id(&id), "first line: {id:?}");
    for (i, n) in ["core", "cli", "sim"].iter().enumerate() {
        assert!(
            stderr.contains(&format!("step pages[{i}] (write)")),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("  pages[{i}]: attempt 1 succeeded")),
            "{stderr}"
        );
        assert_eq!(
            std::fs::read_to_string(s.workspace().join(format!("docs/{n}.md"))).unwrap(),
            *n
        );
    }
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    let ids: Vec<&str> = record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stepId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["outline", "pages[0]", "pages[1]", "pages[2]"]);
    assert_eq!(record["steps"][2]["forEach"]["item"]["name"], "cli");
}
