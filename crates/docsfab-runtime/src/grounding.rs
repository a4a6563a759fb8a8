//! Grounding a contract answer in the workspace (`contract.grounding`, docs/grounding.md).
//!
//! [`index_workspace`] reads the tree once per step (the only I/O here); [`check`] is pure: the
//! answer object, the members the contract names and the index in, a [`GroundingRecord`] out.
//! An answer with an unknown citation is a contract violation (`contract-ungrounded`), retried
//! from the contract budget with [`correction`]: every unknown name and the nearest real ones.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use docsfab_grounding::{Citation, Index, Kind, extract};
use docsfab_record::{CitedLines, GroundingRecord, UnknownCitation};
use serde_json::Value;

/// What a step's answers are judged against: the workspace as read for the step, and the
/// paths of the pages the run has answered before it (a link to one of them resolves).
#[derive(Debug, Clone)]
pub struct GroundingBasis {
    pub index: Arc<Index>,
    pub pages: BTreeSet<String>,
}

/// Directories that hold no source a page describes: build output, VCS data, installs.
const SKIPPED_DIRS: &[&str] = &[
    "target",
    "node_modules",
    ".git",
    "__pycache__",
    ".venv",
    "venv",
];
/// Larger files are not read into the index (generated data, not source to cite).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most files indexed; a larger tree is indexed in part (walk order) and says so.
pub const MAX_FILES: usize = 50_000;

/// The workspace at `root` as an index; files named in `prose_only` (pages being checked)
/// ground nothing of their own. `Cargo.toml` and `package.json` files add their dependency
/// names. Returns the index and whether the tree had more than [`MAX_FILES`] files.
pub fn index_workspace(root: &Path, prose_only: &BTreeSet<String>) -> (Index, bool) {
    let mut files = Vec::new();
    walk(root, &mut |p| files.push(p.to_path_buf()));
    let cut = files.len() > MAX_FILES;
    files.truncate(MAX_FILES);
    let mut index = Index::default();
    for file in files {
        // Named as the walk reached it, so a file behind a followed link keeps the link's path.
        let rel = file.strip_prefix(root).unwrap_or(&file);
        let rel = rel.to_string_lossy().replace('\\', "/");
        let small = std::fs::metadata(&file).is_ok_and(|m| m.len() <= MAX_FILE_BYTES);
        let text = small
            .then(|| std::fs::read_to_string(&file).ok())
            .flatten()
            .unwrap_or_default();
        if rel.ends_with("Cargo.toml") || rel.ends_with("package.json") {
            index.add_dependencies(dependency_names(&text).iter().map(String::as_str));
        }
        let text = if prose_only.contains(&rel) { "" } else { &text };
        index.add_file(&rel, text);
    }
    (index, cut)
}

/// The names a manifest declares as dependencies: the keys under a `[...dependencies]` table
/// of a Cargo.toml, or of a package.json's `dependencies`/`devDependencies`.
fn dependency_names(manifest: &str) -> Vec<String> {
    if let Ok(v) = serde_json::from_str::<Value>(manifest) {
        return ["dependencies", "devDependencies", "peerDependencies"]
            .iter()
            .filter_map(|k| v.get(k).and_then(Value::as_object))
            .flat_map(|d| d.keys().cloned())
            .collect();
    }
    let mut names = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line.trim_matches(['[', ']']).ends_with("dependencies");
        } else if in_deps && let Some((key, _)) = line.split_once('=') {
            let key = key.trim().trim_matches('"');
            names.push(key.split('.').next().unwrap_or(key).to_owned());
        }
    }
    names
}

/// Every regular file under `dir`, skipping hidden and build directories. A symbolic link is
/// followed when it points inside `dir`'s tree, never out of it, and a linked directory once
/// (no circles). Unreadable directories are skipped.
pub fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
    let root = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut seen = BTreeSet::from([root.clone()]);
    walk_inside(dir, &root, &mut seen, visit);
}

fn walk_inside(
    dir: &Path,
    root: &Path,
    seen: &mut BTreeSet<PathBuf>,
    visit: &mut dyn FnMut(&Path),
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let skipped = name.starts_with('.') || SKIPPED_DIRS.contains(&name.as_ref());
        if kind.is_dir() && !skipped {
            walk_inside(&entry.path(), root, seen, visit);
        } else if kind.is_file() {
            visit(&entry.path());
        } else if kind.is_symlink()
            && !skipped
            && let Ok(target) = std::fs::canonicalize(entry.path())
            && target.starts_with(root)
        {
            if target.is_file() {
                visit(&entry.path());
            } else if target.is_dir() && seen.insert(target) {
                walk_inside(&entry.path(), root, seen, visit);
            }
        }
    }
}

/// Judges the citations of `members` of `answer` against `index`. A string member is read as
/// Markdown, as a page at the `path` beside it when its object has one (so its relative links
/// resolve from there); an array of strings as workspace paths. `pages` are the paths of pages
/// the run has answered so far: a link to one of them, or to a page of this answer, resolves.
pub fn check(
    answer: &Value,
    members: &[String],
    index: &Index,
    pages: &BTreeSet<String>,
) -> GroundingRecord {
    let mut pages = pages.clone();
    pages.extend(page_paths(answer));
    let mut record = GroundingRecord::default();
    for member in members {
        for Selected { at, value, page } in select(answer, member) {
            let citations = citations_of(value);
            let report = index.judge(page, &citations, &pages);
            record.cited += report.cited;
            record.grounded += report.grounded;
            record.external += report.external;
            record.lines.extend(report.judged.iter().filter_map(|j| {
                Some(CitedLines {
                    member: at.clone(),
                    text: j.text.clone(),
                    sha256: j.lines_sha256.clone()?,
                })
            }));
            record
                .unknown
                .extend(report.unknown.into_iter().map(|u| UnknownCitation {
                    member: at.clone(),
                    text: u.text,
                    kind: u.kind.as_str().to_owned(),
                    line: u.line,
                    nearest: u.nearest,
                }));
        }
    }
    record
}

/// The page paths an answer holds: the `path` of the answer itself when it is a page
/// (`{path, markdown}`), or of each page of an array of them (a fan-out step's output).
pub fn page_paths(answer: &Value) -> Vec<String> {
    let page = |v: &Value| {
        let path = v.get("path")?.as_str()?;
        v.get("markdown")?.as_str()?;
        Some(path.trim_start_matches("./").to_owned())
    };
    match answer {
        Value::Array(items) => items.iter().filter_map(page).collect(),
        other => page(other).into_iter().collect(),
    }
}

fn citations_of(value: &Value) -> Vec<Citation> {
    match value {
        Value::String(markdown) => extract(markdown),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(|path| Citation {
                text: path.to_owned(),
                kind: Kind::Path,
                line: 1,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// One value a member path selects: where it is (`pages.2.markdown`), the value, and the
/// `path` of the object that holds it ("" when it has none), the page it is read as.
struct Selected<'a> {
    at: String,
    value: &'a Value,
    page: &'a str,
}

/// The values at a dotted member path (`*` takes every array item).
fn select<'a>(answer: &'a Value, member: &str) -> Vec<Selected<'a>> {
    let mut found = vec![Selected {
        at: String::new(),
        value: answer,
        page: "",
    }];
    for part in member.split('.') {
        let mut next = Vec::new();
        for Selected { at, value, .. } in found {
            let join = |k: &str| match at.is_empty() {
                true => k.to_owned(),
                false => format!("{at}.{k}"),
            };
            match (part, value) {
                ("*", Value::Array(items)) => {
                    next.extend(items.iter().enumerate().map(|(i, v)| Selected {
                        at: join(&i.to_string()),
                        value: v,
                        page: "",
                    }));
                }
                (key, Value::Object(map)) => {
                    if let Some(v) = map.get(key) {
                        let page = map.get("path").and_then(Value::as_str).unwrap_or("");
                        next.push(Selected {
                            at: join(key),
                            value: v,
                            page: page.trim_start_matches("./"),
                        });
                    }
                }
                _ => {}
            }
        }
        found = next;
    }
    found
}

/// The correction an ungrounded answer earns: each unknown name, where it was, and the
/// nearest real names (at most 20 names, so the correction stays short).
pub fn correction(record: &GroundingRecord) -> String {
    let mut text = String::from(
        "Your previous answer cited names that are not in the workspace. Cite only files and names you read there; correct or leave out these:",
    );
    for u in record.unknown.iter().take(20) {
        let near = match u.nearest.is_empty() {
            true => String::new(),
            false => format!(" (the workspace has: {})", u.nearest.join(", ")),
        };
        text.push_str(&format!(
            "\n- {} `{}` in {}, line {}{near}",
            u.kind, u.text, u.member, u.line
        ));
    }
    if record.unknown.len() > 20 {
        text.push_str(&format!("\n- and {} more", record.unknown.len() - 20));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn index() -> Index {
        let mut index = Index::default();
        index.add_file("src/count.rs", "pub fn count_words() {}\n");
        index.add_file("src/lib.rs", "pub mod count;\n");
        index
    }

    #[test]
    fn a_cited_line_range_keeps_the_hash_of_its_lines() {
        let answer = json!({"markdown": "See `src/count.rs:1` and `src/lib.rs:2-9`."});
        let r = check(&answer, &["markdown".into()], &index(), &BTreeSet::new());
        assert_eq!(r.lines.len(), 1, "{r:?}");
        assert_eq!(r.lines[0].text, "src/count.rs:1");
        assert_eq!(r.lines[0].member, "markdown");
        let digest = <sha2::Sha256 as sha2::Digest>::digest("pub fn count_words() {}");
        assert_eq!(r.lines[0].sha256, hex::encode(digest));
        assert_eq!(r.unknown[0].text, "src/lib.rs:2-9", "past the file's end");
    }

    #[test]
    fn members_are_selected_through_arrays_and_judged() {
        let answer = json!({
            "pages": [
                {"markdown": "`count_words` in `src/count.rs`"},
                {"markdown": "`count_word` and [x](src/src.rb)"}
            ],
            "components": [{"paths": ["src/lib.rs", "count.js"]}]
        });
        let r = check(
            &answer,
            &["pages.*.markdown".into(), "components.*.paths".into()],
            &index(),
            &BTreeSet::new(),
        );
        assert_eq!((r.cited, r.grounded), (6, 3), "{r:?}");
        let unknown: Vec<(&str, &str)> = r
            .unknown
            .iter()
            .map(|u| (u.member.as_str(), u.text.as_str()))
            .collect();
        assert_eq!(
            unknown,
            vec![
                ("pages.1.markdown", "count_word"),
                ("pages.1.markdown", "src/src.rb"),
                ("components.0.paths", "count.js"),
            ]
        );
        let words = correction(&r);
        assert!(
            words.contains(
                "`count_word` in pages.1.markdown, line 1 (the workspace has: count_words)"
            ),
            "{words}"
        );
    }
}
