//! `docsfab check-docs PATH... --workspace DIR [--json]`: whether existing Markdown cites only
//! what the tree holds (docs/grounding.md). Exit 0 when every cited name is grounded, 1 when
//! one is not, 2 on bad input.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use docsfab_grounding::{Index, Report, extract};
use docsfab_runtime::grounding::{MAX_FILES, index_workspace, walk};
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
            });
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

/// The workspace as an index (the run's own reading, `docsfab_runtime::grounding`); the pages
/// being checked ground nothing of their own.
fn index(root: &Path, checked: &BTreeSet<String>) -> Result<Index, CliError> {
    let (index, cut) = index_workspace(root, checked);
    if cut {
        return Err(CliError::bad_input(format!(
            "the workspace {} has more than {MAX_FILES} files; point --workspace at the project itself.",
            root.display()
        )));
    }
    Ok(index)
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
                // Each grounded line range with the SHA-256 of its lines, for a later check
                // of which claims went stale (docs/grounding.md).
                "lines": r.judged.iter().filter_map(|j| Some(json!({
                    "text": j.text, "line": j.line, "sha256": j.lines_sha256.as_ref()?,
                }))).collect::<Vec<_>>(),
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
