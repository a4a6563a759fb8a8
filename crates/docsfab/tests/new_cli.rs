//! `docsfab new [TEMPLATE] [--output PATH]` (docs/new.md), through the real binary: the list,
//! each template written, parsed and passed by `doctor`, the refusals (an existing file, an
//! unknown template, a directory that is not there), and the wiki template run end to end
//! against `docsfab sim serve`: every page and the index land under docs/wiki/, and the write
//! step sends no request.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use docsfab_runtime::composition::Composition;
use serde_json::{Value, json};
use support::run::{FAST_CATALOG, Setup, Sim, docsfab_at};

/// `docsfab` in `dir`, with an empty DOCSFAB_HOME of its own.
fn docsfab_in(dir: &Path) -> Command {
    let home = dir.join(".home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = docsfab_at(&home);
    cmd.current_dir(dir);
    cmd
}

fn new(dir: &Path, args: &[&str]) -> Output {
    docsfab_in(dir).arg("new").args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The entries of `dir` (its own home left out), sorted.
fn entries_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".home")
        .collect();
    names.sort();
    names
}

/// A refusal: exit 2, nothing on stdout, one line on stderr containing `needle`.
fn assert_refused(out: &Output, needle: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(text(&out.stdout), "");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(needle), "{stderr}");
}

#[test]
fn issue32_new_without_a_template_lists_each_with_one_sentence() {
    let tmp = tempfile::tempdir().unwrap();
    let out = new(tmp.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, name) in lines.iter().zip(["wiki", "quickstart"]) {
        let about = line.strip_prefix(name).unwrap_or_else(|| panic!("{line}"));
        let about = about.trim_start();
        assert!(about.len() > 20 && about.ends_with('.'), "{line}");
        assert_eq!(
            about.matches(". ").count(),
            0,
            "more than one sentence: {line}"
        );
    }
    assert_eq!(entries_of(tmp.path()), Vec::<String>::new(), "it wrote");
}

#[test]
fn issue32_new_wiki_writes_a_composition_that_parses_and_passes_doctor() {
    let tmp = tempfile::tempdir().unwrap();
    let out = new(tmp.path(), &["wiki"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("wiki.yaml"), "{stdout}");
    assert!(
        stdout.contains("docsfab run wiki.yaml --workspace ."),
        "{stdout}"
    );
    assert_eq!(
        entries_of(tmp.path()),
        ["wiki.yaml"],
        "a temporary file was left"
    );

    let yaml = std::fs::read_to_string(tmp.path().join("wiki.yaml")).unwrap();
    let c = Composition::parse(&yaml, "wiki.yaml").unwrap();
    let ids: Vec<&str> = c.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["map", "page", "index", "write"]);
    assert_eq!((c.limits.timeout_ms, c.limits.max_turns), (300_000, 16));
    let (map, page, index, write) = (&c.steps[0], &c.steps[1], &c.steps[2], &c.steps[3]);
    let schema = |s: &docsfab_runtime::composition::Step| s.contract.as_ref().unwrap().clone();
    let map_contract = schema(map);
    assert_eq!(map_contract.grounding, ["components.*.sources"]);
    let name = &map_contract.schema["properties"]["components"]["items"]["properties"]["name"];
    assert_eq!(name["pattern"], "^[a-z0-9][a-z0-9_-]*$");
    let fan = page.fan_out.as_ref().unwrap();
    assert_eq!(
        (fan.source().as_str(), fan.concurrency),
        ("steps.map.output.components", 4)
    );
    let page_contract = schema(page);
    assert_eq!(page_contract.grounding, ["markdown", "sources"]);
    let pattern = page_contract.schema["properties"]["path"]["pattern"]
        .as_str()
        .unwrap();
    assert!(
        pattern.starts_with("^docs/wiki/") && pattern.ends_with(r"\.md$"),
        "{pattern}"
    );
    assert!(page.instructions.contains("docs/wiki/{{item.name}}.md"));
    assert!(index.instructions.contains("{{steps.map.output}}"));
    assert_eq!(schema(index).grounding, ["markdown"]);
    assert_eq!(write.pages, ["page", "index"]);
    assert_eq!(write.write_roots, ["docs/wiki/"]);

    // Doctor needs no provider to check it.
    let out = docsfab_in(tmp.path())
        .args(["doctor", "--composition", "wiki.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Composition: wiki (wiki.yaml) steps=4"));
}

#[test]
fn issue32_new_quickstart_writes_the_bundled_example_where_output_says() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("conf")).unwrap();
    let out = new(tmp.path(), &["quickstart", "--output", "conf/first.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("docsfab run conf/first.yaml --workspace ."),
        "{}",
        text(&out.stdout)
    );
    let written = std::fs::read_to_string(tmp.path().join("conf/first.yaml")).unwrap();
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/composition.yaml"
    );
    assert_eq!(written, std::fs::read_to_string(example).unwrap());
    Composition::parse(&written, "first.yaml").unwrap();

    // Without --output it is quickstart.yaml here.
    let out = new(tmp.path(), &["quickstart"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(entries_of(tmp.path()), ["conf", "quickstart.yaml"]);
    let out = docsfab_in(tmp.path())
        .args(["doctor", "--composition", "quickstart.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn issue32_new_refuses_to_overwrite_and_leaves_the_file_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("wiki.yaml"), "mine\n").unwrap();
    let out = new(tmp.path(), &["wiki"]);
    assert_refused(&out, "wiki.yaml already exists; pass --output PATH");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("wiki.yaml")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        entries_of(tmp.path()),
        ["wiki.yaml"],
        "a temporary file was left"
    );

    std::fs::write(tmp.path().join("other.yaml"), "theirs\n").unwrap();
    let out = new(tmp.path(), &["quickstart", "--output", "other.yaml"]);
    assert_refused(&out, "other.yaml already exists");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("other.yaml")).unwrap(),
        "theirs\n"
    );
}

#[test]
fn issue32_new_refuses_an_unknown_template_naming_the_templates() {
    let tmp = tempfile::tempdir().unwrap();
    let out = new(tmp.path(), &["wikki"]);
    assert_refused(&out, "\"wikki\"");
    assert!(text(&out.stderr).contains("wiki, quickstart"));
    assert_eq!(entries_of(tmp.path()), Vec::<String>::new());
}

#[test]
fn issue32_new_refuses_a_directory_that_is_not_there() {
    let tmp = tempfile::tempdir().unwrap();
    let out = new(tmp.path(), &["wiki", "--output", "missing/wiki.yaml"]);
    assert_refused(&out, "missing does not exist");
    assert!(!tmp.path().join("missing").exists());

    std::fs::write(tmp.path().join("plain"), "").unwrap();
    let out = new(tmp.path(), &["wiki", "--output", "plain/wiki.yaml"]);
    assert_refused(&out, "plain is not a directory");
    assert_eq!(entries_of(tmp.path()), ["plain"]);
}

/// Three components in three directories, each with a code name its page cites.
const TREE: [(&str, &str, &str); 3] = [
    (
        "parser",
        "parser/src/lib.rs",
        "pub fn parse_line(s: &str) {}\n",
    ),
    ("render", "render/src/lib.rs", "pub struct Renderer;\n"),
    (
        "cli",
        "cli/src/main.rs",
        "fn main() { run_cli(); }\nfn run_cli() {}\n",
    ),
];

/// The simulator's script for the wiki template. The lanes match text the template's own
/// instructions carry: the index's "index page of the wiki" (first, so that it wins whatever
/// the pages it is given say) and each page's "Component [NAME]". The map, which no lane
/// takes, lists the root and answers the components.
fn wiki_scenario() -> String {
    let cite = |name: &str| match name {
        "parser" => "`parse_line()`",
        "render" => "`Renderer`",
        _ => "`run_cli()`",
    };
    let components: Vec<Value> = TREE
        .iter()
        .map(|(name, path, _)| json!({"name": name, "summary": format!("The {name}."), "sources": [path]}))
        .collect();
    let links: Vec<String> = TREE
        .iter()
        .map(|(name, _, _)| format!("- [{name}]({name}.md): {}.", cite(name)))
        .collect();
    let mut lanes = vec![json!({"contains": "index page of the wiki", "responses": [
        {"answer": {"json": {"path": "docs/wiki/index.md",
            "markdown": format!("# Wiki\n\n{}\n", links.join("\n"))}}}
    ]})];
    lanes.extend(TREE.iter().map(|(name, path, _)| {
        json!({"contains": format!("Component [{name}]"), "responses": [{"answer": {"json": {
            "path": format!("docs/wiki/{name}.md"),
            "markdown": format!("# {name}\n\n{} lives in `{path}`.\n", cite(name)),
            "sources": [path],
        }}}]})
    }));
    json!({
        "responses": [
            {"answer": {"tool_calls": [{"id": "l", "name": "list_files", "arguments": {"path": "."}}]}},
            {"answer": {"json": {"components": components}}}
        ],
        "lanes": lanes,
    })
    .to_string()
}

/// The `entry` of every request in the simulator's log.
fn logged(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["entry"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn step<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stepId"] == id)
        .unwrap_or_else(|| panic!("no step {id}: {record:#}"))
}

#[test]
fn issue32_the_wiki_template_runs_end_to_end_and_its_write_step_sends_no_request() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9", FAST_CATALOG);
    for (_, path, code) in TREE {
        let file = s.workspace().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, code).unwrap();
    }
    let comp = s.dir.path().join("wiki.yaml");
    let out = new(s.dir.path(), &["wiki", "--output", comp.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let log = tmp.path().join("requests.jsonl");
    let sim = Sim::start_logging(tmp.path(), &wiki_scenario(), &log);
    s.repoint(&sim.base_url);
    let out = s.run_command(&comp).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    drop(sim);

    let wiki = s.workspace().join("docs/wiki");
    for (name, path, _) in TREE {
        let page = std::fs::read_to_string(wiki.join(format!("{name}.md"))).unwrap();
        assert!(page.contains(path), "{page}");
    }
    let index = std::fs::read_to_string(wiki.join("index.md")).unwrap();
    for (name, _, _) in TREE {
        assert!(index.contains(&format!("]({name}.md)")), "{index}");
    }
    // The map (two turns), one request per page, the index: the write step asked nothing.
    let entries = logged(&log);
    assert_eq!(entries.len(), 2 + TREE.len() + 1, "{entries:?}\n{stderr}");
    for lane in 0..=TREE.len() {
        let prefix = format!("lanes[{lane}] ");
        let n = entries.iter().filter(|e| e.starts_with(&prefix)).count();
        assert_eq!(n, 1, "lane {lane}: {entries:?}");
    }

    let record = s.show_json(stdout.lines().next().unwrap());
    let write = step(&record, "write");
    assert_eq!(write["status"], "succeeded", "{write:#}");
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
            "docs/wiki/cli.md",
            "docs/wiki/index.md",
            "docs/wiki/parser.md",
            "docs/wiki/render.md"
        ]
    );
    // Every page passed its grounding on the first attempt.
    for i in 0..TREE.len() {
        let page = step(&record, &format!("page[{i}]"));
        assert_eq!(page["attempts"].as_array().unwrap().len(), 1, "{page:#}");
    }
}
