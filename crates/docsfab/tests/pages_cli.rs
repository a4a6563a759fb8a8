//! Pages written from accepted answers (issue 32, docs/pages.md), through the real CLI against
//! `docsfab sim serve` with its request log: the pages step sends no request and writes only
//! grounded pages; an index that links a page the run does not have is retried with the
//! unknown link; and `--reuse` after a map that drops a component whose source still exists
//! stops before writing, naming the page, unless `--allow-lost-pages`.

mod support;

use std::path::Path;

use docsfab_runtime::record::validate_against_schema;
use serde_json::{Value, json};
use support::run::{FAST_CATALOG, Setup, Sim};

/// A map of components, one grounded page per component, a grounded index that links them,
/// and the step that writes them all.
const WIKI: &str = r#"name: wiki
limits:
  timeoutMs: 60000
steps:
  - id: map
    access: read-only
    instructions: "[map] List the components of src/ with their source files."
    tools: [list_files]
    contract:
      schema:
        type: object
        required: [components]
        properties:
          components:
            type: array
            items: {type: object, required: [name, sources]}
      grounding: [components.*.sources]
  - id: page
    access: read-only
    forEach: steps.map.output.components
    concurrency: 2
    instructions: "[page-{{item.name}}] Write docs/wiki/{{item.name}}.md from {{item.sources}}."
    tools: [read_file]
    contract:
      schema:
        type: object
        required: [path, markdown, sources]
        properties: {path: {type: string}, markdown: {type: string}, sources: {type: array}}
      grounding: [markdown, sources]
  - id: index
    access: read-only
    instructions: "[index] Write docs/wiki/index.md linking every page: {{steps.page.output}}"
    contract:
      schema:
        type: object
        required: [path, markdown]
        properties: {path: {type: string}, markdown: {type: string}}
      grounding: [markdown]
  - id: write
    access: write
    pages: [page, index]
    writeRoots: [docs/wiki/]
"#;

/// The simulator's script: the map lists src/ and answers `components`; each page's lane
/// answers its page; the index first links a page nobody wrote, then only real ones.
fn scenario(components: &[&str]) -> String {
    let map = json!({"components": components.iter().map(|c| json!({"name": c, "sources": [format!("src/{c}.rs")]})).collect::<Vec<_>>()});
    let mut lanes: Vec<Value> = components
        .iter()
        .map(|c| {
            json!({"contains": format!("[page-{c}]"), "responses": [{"answer": {"json": {
                "path": format!("docs/wiki/{c}.md"),
                "markdown": format!("# {c}\n\n`{c}()` lives in `src/{c}.rs`.\n"),
                "sources": [format!("src/{c}.rs")],
            }}}]})
        })
        .collect();
    let links: Vec<String> = components
        .iter()
        .map(|c| format!("- [{c}]({c}.md)"))
        .collect();
    lanes.push(json!({"contains": "[index]", "responses": [
        {"answer": {"json": {"path": "docs/wiki/index.md", "markdown": format!("# Wiki\n\n{}\n- [gone](gone.md)\n", links.join("\n"))}}},
        {"answer": {"json": {"path": "docs/wiki/index.md", "markdown": format!("# Wiki\n\n{}\n", links.join("\n"))}}}
    ]}));
    json!({
        "responses": [
            {"answer": {"tool_calls": [{"id": "l", "name": "list_files", "arguments": {"path": "src"}}]}},
            {"answer": {"json": map}}
        ],
        "lanes": lanes,
    })
    .to_string()
}

/// The `entry` of every request in the simulator's log.
fn entries(log: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["entry"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn seed(s: &Setup, components: &[&str]) {
    for c in components {
        let text = format!("pub fn {c}() {{}}\n");
        std::fs::write(s.workspace().join(format!("src/{c}.rs")), text).unwrap();
    }
}

fn run(s: &Setup, comp: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = s.run_command(comp).args(extra).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn step<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["stepId"] == id)
        .unwrap_or_else(|| panic!("no step {id}: {record:#}"))
}

/// The first run of the wiki over alpha, beta and gamma, checked; returns its id.
fn first_run(s: &Setup, tmp: &Path, comp: &Path) -> String {
    let log = tmp.join("first.jsonl");
    let sim = Sim::start_logging(tmp, &scenario(&["alpha", "beta", "gamma"]), &log);
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = run(s, comp, &[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    drop(sim);
    // map (2 turns), three pages, the index twice: the write step asked nothing.
    assert_eq!(entries(&log).len(), 2 + 3 + 2, "{stderr}");
    stdout.lines().next().unwrap().to_owned()
}

#[test]
fn issue32_the_pages_step_writes_grounded_pages_and_sends_no_request() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9", FAST_CATALOG);
    seed(&s, &["alpha", "beta", "gamma"]);
    let comp = s.composition(WIKI);
    let id = first_run(&s, tmp.path(), &comp);

    let wiki = s.workspace().join("docs/wiki");
    for c in ["alpha", "beta", "gamma"] {
        let page = std::fs::read_to_string(wiki.join(format!("{c}.md"))).unwrap();
        assert!(page.contains(&format!("`{c}()`")), "{page}");
    }
    let index = std::fs::read_to_string(wiki.join("index.md")).unwrap();
    assert!(
        !index.contains("gone.md"),
        "the ungrounded index reached the tree: {index}"
    );

    let record = s.show_json(&id);
    validate_against_schema(&record).unwrap();
    // The index's link to a page nobody wrote was retried with the link named.
    let index_step = step(&record, "index");
    let attempts = index_step["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{index_step:#}");
    assert_eq!(attempts[0]["code"], "contract-ungrounded");
    assert_eq!(attempts[0]["grounding"]["unknown"][0]["text"], "gone.md");
    assert_eq!(attempts[0]["grounding"]["unknown"][0]["kind"], "link");
    assert_eq!(attempts[1]["grounding"]["grounded"], 3);
    // The pages step: one attempt, no turns, no tokens, four files written.
    let write = step(&record, "write");
    assert_eq!(write["status"], "succeeded");
    let attempt = &write["attempts"][0];
    assert_eq!(attempt["lease"]["stopReason"], "pages-written");
    assert_eq!(attempt["turns"], json!([]));
    assert_eq!(attempt["usage"]["inputTokens"], 0);
    let mut written: Vec<&str> = attempt["filesWritten"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    written.sort_unstable();
    assert_eq!(
        written,
        [
            "docs/wiki/alpha.md",
            "docs/wiki/beta.md",
            "docs/wiki/gamma.md",
            "docs/wiki/index.md"
        ]
    );
    assert_eq!(
        write["output"]["pages"][0]["sources"],
        json!(["src/alpha.rs"])
    );
}

#[test]
fn issue32_reuse_after_the_map_drops_a_component_whose_source_exists_stops_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9", FAST_CATALOG);
    seed(&s, &["alpha", "beta", "gamma"]);
    let comp = s.composition(WIKI);
    first_run(&s, tmp.path(), &comp);
    let before = std::fs::read_to_string(s.workspace().join("docs/wiki/index.md")).unwrap();

    // A new file changes the listing the map read, so the map asks again, and this time it
    // leaves gamma out although src/gamma.rs is still there.
    seed(&s, &["delta"]);
    let dir = tmp.path().join("second");
    std::fs::create_dir(&dir).unwrap();
    let log = dir.join("second.jsonl");
    let sim = Sim::start_logging(&dir, &scenario(&["alpha", "beta"]), &log);
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = run(&s, &comp, &["--reuse"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let id = stdout.lines().next().unwrap();
    let record = s.show_json(id);
    let write = step(&record, "write");
    assert_eq!(write["failure"]["code"], "lost-pages", "{write:#}");
    let message = write["failure"]["message"].as_str().unwrap();
    assert!(message.contains("docs/wiki/gamma.md"), "{message}");
    assert_eq!(write["attempts"], json!([]), "it wrote nothing");
    // alpha and beta were carried over: their sources did not change.
    assert!(step(&record, "page[0]")["reusedFrom"].is_object());
    assert_eq!(
        std::fs::read_to_string(s.workspace().join("docs/wiki/index.md")).unwrap(),
        before,
        "the index was rewritten although the step stopped"
    );
    drop(sim);

    // The operator allows it: the smaller set is written.
    let dir = tmp.path().join("third");
    std::fs::create_dir(&dir).unwrap();
    let sim = Sim::start_logging(&dir, &scenario(&["alpha", "beta"]), &dir.join("log.jsonl"));
    s.repoint(&sim.base_url);
    let (code, stdout, stderr) = run(&s, &comp, &["--reuse", "--allow-lost-pages"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let index = std::fs::read_to_string(s.workspace().join("docs/wiki/index.md")).unwrap();
    assert!(!index.contains("gamma"), "{index}");
}
