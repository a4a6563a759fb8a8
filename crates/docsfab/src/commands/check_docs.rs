//! `docsfab check-docs PATH... --workspace DIR [--json]`: whether existing Markdown cites only
//! what the tree holds (docs/grounding.md). Exit 0 when every cited name is grounded, 1 when
//! one is not, 2 on bad input.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use docsfab_grounding::{Index, Report, extract};
use serde_json::json;

use crate::app::error::{CliError, emit};

#[derive(Args, Debug)]
pub struct CheckDocsArgs {
    /// Markdown files or directories (every `*.md` under them) to check.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The source tree the pages describe (default: the current directory).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub workspace: PathBuf,
    /// Print `{"cited", "grounded", "files": [...]}` instead of text.
    #[arg(long)]
    pub json: bool,
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
/// A tree with more files than this is refused rather than read half.
const MAX_FILES: usize = 50_000;

pub fn run(args: &CheckDocsArgs) -> Result<(), CliError> {
    let root = std::fs::canonicalize(&args.workspace).map_err(|e| {
        CliError::bad_input(format!(
            "the workspace {} cannot be opened ({e}); pass an existing directory with --workspace.",
            args.workspace.display()
        ))
    })?;
    let pages = pages(&args.paths, &root)?;
    let checked: BTreeSet<String> = pages.iter().map(|(rel, _)| rel.clone()).collect();
    let index = index(&root, &checked)?;
    let reports: Vec<(String, Report)> = pages
        .iter()
        .map(|(rel, text)| {
            (
                rel.clone(),
                index.judge(rel, &extract(text), &BTreeSet::new()),
            )
        })
        .collect();
    emit(&if args.json {
        as_json(&reports)
    } else {
        as_text(&reports)
    })?;
    match reports.iter().all(|(_, r)| r.unknown.is_empty()) {
        true => Ok(()),
        false => Err(CliError::failed(
            "some cited names are not in the workspace (listed above).",
        )),
    }
}

/// The pages to check, each as (path relative to the workspace, text).
fn pages(paths: &[PathBuf], root: &Path) -> Result<Vec<(String, String)>, CliError> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| {
            CliError::bad_input(format!(
                "{} cannot be read ({e}); name existing Markdown files or directories.",
                path.display()
            ))
        })?;
        if meta.is_dir() {
            walk(path, &mut |p| {
                if p.extension().is_some_and(|e| e == "md") {
                    files.push(p.to_path_buf());
                }
            })?;
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    files.dedup();
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            CliError::bad_input(format!(
                "{} cannot be read as UTF-8 text ({e}); name Markdown files.",
                file.display()
            ))
        })?;
        out.push((relative(&file, root), text));
    }
    Ok(out)
}

/// `file` relative to `root` when it lies inside it (links resolve from there), else as given.
fn relative(file: &Path, root: &Path) -> String {
    let full = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let rel = full.strip_prefix(root).unwrap_or(file);
    rel.to_string_lossy().replace('\\', "/")
}

/// The workspace as an index; the pages being checked ground nothing of their own, and a
/// Cargo.toml or package.json adds its dependency names.
fn index(root: &Path, checked: &BTreeSet<String>) -> Result<Index, CliError> {
    let mut files = Vec::new();
    walk(root, &mut |p| files.push(p.to_path_buf()))?;
    if files.len() > MAX_FILES {
        return Err(CliError::bad_input(format!(
            "the workspace {} has more than {MAX_FILES} files; point --workspace at the project itself.",
            root.display()
        )));
    }
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
        let text = if checked.contains(&rel) { "" } else { &text };
        index.add_file(&rel, text);
    }
    Ok(index)
}

/// The names a manifest declares as dependencies: the keys under a `[...dependencies]` table
/// of a Cargo.toml, or of a package.json's `dependencies`/`devDependencies`.
fn dependency_names(manifest: &str) -> Vec<String> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(manifest) {
        return ["dependencies", "devDependencies", "peerDependencies"]
            .iter()
            .filter_map(|k| v.get(k).and_then(|d| d.as_object()))
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
/// followed when it points inside `dir`'s tree (`examples/quickstart` pointing into a crate),
/// never out of it, and a linked directory once (no circles).
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) -> Result<(), CliError> {
    let root = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut seen = BTreeSet::from([root.clone()]);
    walk_inside(dir, &root, &mut seen, visit)
}

fn walk_inside(
    dir: &Path,
    root: &Path,
    seen: &mut BTreeSet<PathBuf>,
    visit: &mut dyn FnMut(&Path),
) -> Result<(), CliError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| CliError::bad_input(format!("{} cannot be listed ({e}).", dir.display())))?;
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
            walk_inside(&entry.path(), root, seen, visit)?;
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
                walk_inside(&entry.path(), root, seen, visit)?;
            }
        }
    }
    Ok(())
}

fn as_json(reports: &[(String, Report)]) -> String {
    let files: Vec<serde_json::Value> = reports
        .iter()
        .map(|(path, r)| {
            json!({
                "path": path,
                "cited": r.cited,
                "grounded": r.grounded,
                "external": r.external,
                "unknown": r.unknown,
            })
        })
        .collect();
    let total = |f: fn(&Report) -> u32| reports.iter().map(|(_, r)| f(r)).sum::<u32>();
    let out = json!({
        "cited": total(|r| r.cited),
        "grounded": total(|r| r.grounded),
        "files": files,
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&out).unwrap_or_default()
    )
}

fn as_text(reports: &[(String, Report)]) -> String {
    let mut out = String::new();
    let (mut cited, mut grounded) = (0, 0);
    for (path, r) in reports {
        cited += r.cited;
        grounded += r.grounded;
        let _ = writeln!(out, "{path}: {} of {} cited grounded", r.grounded, r.cited);
        for u in &r.unknown {
            let near = match u.nearest.is_empty() {
                true => String::new(),
                false => format!(" (nearest: {})", u.nearest.join(", ")),
            };
            let _ = writeln!(
                out,
                "  line {}: {} {} is not in the workspace{near}",
                u.line,
                u.kind.as_str(),
                u.text
            );
        }
    }
    let share = match cited {
        0 => "nothing cited".to_owned(),
        _ => format!("{:.1} %", f64::from(grounded) * 100.0 / f64::from(cited)),
    };
    let _ = writeln!(out, "{grounded} of {cited} cited grounded ({share})");
    out
}
