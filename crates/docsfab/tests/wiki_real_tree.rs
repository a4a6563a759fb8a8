//! The wiki template (`docsfab new wiki`, issue 32) on a real multi-module tree of hundreds of
//! files: tokio's published sources from the cargo registry cache (every build of this
//! workspace fetches them). The simulator stands in for the model, but everything else is real:
//! the map's `list_files` lists the real tree, each page reads its real source, every answer is
//! grounded against the whole tree, and `check-docs` re-checks what landed on disk.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::run::{FAST_CATALOG, Setup, Sim};

/// tokio's sources in the registry cache, or `None` (after saying so) when no build fetched
/// them here.
fn tokio_sources() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock"))
            .ok()?;
    // The version this workspace builds, so the tree is the one the lock file fetched.
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"tokio\"\n"))?
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))?
        .trim_end_matches('"')
        .to_owned();
    let found = std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .filter_map(Result::ok)
        .map(|d| d.path().join(format!("tokio-{version}")))
        .find(|p| p.join("src/lib.rs").is_file());
    if found.is_none() {
        eprintln!("skipped: tokio-{version} is not in the cargo registry cache");
    }
    found
}

fn copy_tree(from: &Path, to: &Path) -> usize {
    let mut files = 0;
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            files += copy_tree(&entry.path(), &target);
        } else if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), &target).unwrap();
            files += 1;
        }
    }
    files
}

/// One component per directory under `src/` that holds a `mod.rs`: its name, its first
/// twenty `.rs` files, and a name one of them declares.
struct Component {
    name: String,
    sources: Vec<String>,
    cites: String,
}

fn components(ws: &Path) -> Vec<Component> {
    let mut out = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(ws.join("src"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|d| d.path().join("mod.rs").is_file())
        .collect();
    dirs.sort_by_key(|d| d.file_name());
    for dir in dirs {
        let name = dir.file_name().to_string_lossy().into_owned();
        let mut sources: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".rs"))
            .map(|f| format!("src/{name}/{f}"))
            .collect();
        sources.sort();
        sources.retain(|s| !s.ends_with("/mod.rs"));
        sources.insert(0, format!("src/{name}/mod.rs"));
        sources.truncate(20);
        let Some(cites) = sources
            .iter()
            .find_map(|s| declared(&std::fs::read_to_string(ws.join(s)).unwrap_or_default()))
        else {
            continue;
        };
        out.push(Component {
            name,
            sources,
            cites,
        });
    }
    out
}

/// The first function, struct, enum or trait a source text declares, as a page would cite it.
fn declared(text: &str) -> Option<String> {
    const KINDS: [(&str, &str); 5] = [
        ("fn ", "()"),
        ("struct ", ""),
        ("enum ", ""),
        ("trait ", ""),
        ("type ", ""),
    ];
    text.lines().find_map(|line| {
        let l = line.trim_start();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        let (rest, suffix) = KINDS
            .iter()
            .find_map(|(kind, suffix)| l.strip_prefix(kind).map(|r| (r, *suffix)))?;
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (name.len() > 2).then(|| format!("{name}{suffix}"))
    })
}

/// The script: the map lists the root and `src`, then answers the components; each page reads
/// its `mod.rs` and answers; the first page first cites a function tokio does not have.
fn scenario(components: &[Component]) -> String {
    let map: Vec<Value> = components
        .iter()
        .map(|c| json!({"name": c.name, "summary": format!("The {} module.", c.name), "sources": c.sources}))
        .collect();
    let links: Vec<String> = components
        .iter()
        .map(|c| format!("- [{0}]({0}.md): `{1}`.", c.name, c.sources[0]))
        .collect();
    let mut lanes = vec![json!({"contains": "index page of the wiki", "responses": [
        {"answer": {"json": {"path": "docs/wiki/index.md",
            "markdown": format!("# tokio\n\nThe modules of `src/lib.rs`:\n\n{}\n", links.join("\n"))}}}
    ]})];
    for (i, c) in components.iter().enumerate() {
        let page = |cites: &str| {
            json!({"answer": {"json": {
                "path": format!("docs/wiki/{}.md", c.name),
                "markdown": format!("# {}\n\nStart with `{}`, which declares `{cites}`.\n", c.name, c.sources[0]),
                "sources": c.sources,
            }}})
        };
        let read = json!({"answer": {"tool_calls": [{"id": "r", "name": "read_file",
            "arguments": {"path": c.sources[0], "length": 4000}}]}});
        let mut responses = vec![read];
        if i == 0 {
            responses.push(page("spawn_blocking_tasks()"));
        }
        responses.push(page(&c.cites));
        lanes.push(json!({"contains": format!("Component [{}]", c.name), "responses": responses}));
    }
    json!({
        "responses": [
            {"answer": {"tool_calls": [{"id": "l", "name": "list_files", "arguments": {"path": "."}}]}},
            {"answer": {"tool_calls": [{"id": "s", "name": "list_files", "arguments": {"path": "src"}}]}},
            {"answer": {"json": {"components": map}}}
        ],
        "lanes": lanes,
    })
    .to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn issue32_the_wiki_on_tokios_real_tree_writes_only_grounded_pages() {
    let Some(tokio) = tokio_sources() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9", FAST_CATALOG);
    let ws = s.workspace();
    std::fs::remove_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let files = copy_tree(&tokio, &ws);
    assert!(files > 300, "a tree of hundreds of files: {files}");
    let comps = components(&ws);
    let names: Vec<&str> = comps.iter().map(|c| c.name.as_str()).collect();
    assert!(comps.len() >= 8, "{names:?}");

    let comp = s.dir.path().join("wiki.yaml");
    let out = s
        .docsfab()
        .args(["new", "wiki", "--output", comp.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let sim = Sim::start(tmp.path(), &scenario(&comps));
    s.repoint(&sim.base_url);
    let out = s
        .run_command(&comp)
        .env("DOCSFAB_RETRY_BASE_DELAY_MS", "10")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    drop(sim);

    // Every page and the index are on disk, and an independent check finds nothing unknown.
    for c in &comps {
        assert!(
            ws.join(format!("docs/wiki/{}.md", c.name)).is_file(),
            "{}",
            c.name
        );
    }
    let check = s
        .docsfab()
        .args(["check-docs", "docs/wiki", "--workspace", "."])
        .current_dir(&ws)
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        text(&check.stdout),
        text(&check.stderr)
    );

    let record = s.show_json(stdout.lines().next().unwrap());
    let steps = record["steps"].as_array().unwrap();
    // The invented function was caught on the real tree, with tokio's real neighbours.
    let first = steps.iter().find(|s| s["stepId"] == "page[0]").unwrap();
    let refused = &first["attempts"][0];
    assert_eq!(refused["code"], "contract-ungrounded", "{first:#}");
    let unknown = &refused["grounding"]["unknown"][0];
    assert_eq!(unknown["text"], "spawn_blocking_tasks()");
    assert!(
        unknown["nearest"].as_array().is_some_and(|n| !n.is_empty()),
        "{unknown}"
    );
    let figure = &record["truthfulness"];
    assert_eq!(figure["share"], 1.0, "{figure}");
    assert_eq!(figure["caught"], 1, "{figure}");
    assert_eq!(figure["steps"], json!(comps.len() + 2), "{figure}");
    let write = steps.iter().find(|s| s["stepId"] == "write").unwrap();
    let written = write["attempts"][0]["filesWritten"].as_array().unwrap();
    assert_eq!(written.len(), comps.len() + 1);
}
