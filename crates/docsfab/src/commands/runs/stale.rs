//! `docsfab runs stale ID`: which line ranges a run's accepted answers cited have changed in
//! its workspace since (docs/grounding.md, "Stale claims"). Each judged answer's record keeps
//! the SHA-256 of every cited range (`grounding.lines`); this hashes the same lines as the files
//! hold them now. Reads files only: it changes nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use docsfab_grounding::stale::{Freshness, cited_path, freshness};
use docsfab_record::{AttemptStatus, RunRecord, StepRecord};
use serde::Serialize;

use crate::app::error::{CliError, emit};
use crate::app::print::{shown, to_json};

/// A file larger than this is judged gone rather than read (the grounding index reads no more).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One cited range of an accepted answer, and what became of it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Claim {
    /// The step (`STEP[INDEX]` for a fan-out instance).
    step: String,
    member: String,
    text: String,
    #[serde(skip)]
    sha256: String,
    #[serde(skip)]
    freshness: Option<Freshness>,
}

/// A step carried over from an earlier run: its claims are in that run's record.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CarriedOver {
    step: String,
    run_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Verdict<'a> {
    run_id: &'a str,
    workspace: String,
    checked: usize,
    unchanged: usize,
    changed: Vec<&'a Claim>,
    gone: Vec<&'a Claim>,
    carried_over: Vec<CarriedOver>,
}

/// Judges the run's claims against `workspace` (else the one its record names) and prints
/// them; exit 1 when one changed or is gone.
pub fn stale(record: &RunRecord, workspace: Option<&Path>, json: bool) -> Result<(), CliError> {
    let root = root(record, workspace)?;
    let mut claims = claims(record);
    for c in &mut claims {
        let file = cited_path(&c.text).and_then(|p| read_inside(&root, p));
        c.freshness = Some(freshness(&c.text, &c.sha256, file.as_deref()));
    }
    let pick = |f: Freshness| -> Vec<&Claim> {
        claims.iter().filter(|c| c.freshness == Some(f)).collect()
    };
    let verdict = Verdict {
        run_id: &record.run_id,
        workspace: root.display().to_string(),
        checked: claims.len(),
        unchanged: pick(Freshness::Unchanged).len(),
        changed: pick(Freshness::Changed),
        gone: pick(Freshness::Gone),
        carried_over: carried_over(record),
    };
    let all_fresh = verdict.changed.is_empty() && verdict.gone.is_empty();
    if json {
        emit(&format!("{}\n", to_json(&verdict)?))?;
    } else {
        emit(&render(&verdict))?;
    }
    if all_fresh {
        return Ok(());
    }
    Err(CliError::failed(format!(
        "some lines run {} cited have changed since (listed above); run its composition again with `--reuse {}` to regenerate the answers that cite them.",
        record.run_id, record.run_id
    )))
}

/// The workspace to read: `--workspace`, else the record's; it must be a directory.
fn root(record: &RunRecord, workspace: Option<&Path>) -> Result<PathBuf, CliError> {
    let given = workspace.is_some();
    let dir = match (workspace, &record.workspace) {
        (Some(w), _) => w.to_path_buf(),
        (None, Some(w)) => PathBuf::from(w),
        (None, None) => {
            return Err(CliError::bad_input(format!(
                "run {}'s record names no workspace (an older record); pass --workspace DIR with the tree it documented.",
                record.run_id
            )));
        }
    };
    match std::fs::canonicalize(&dir) {
        Ok(d) if d.is_dir() => Ok(d),
        _ if given => Err(CliError::bad_input(format!(
            "--workspace {} is not a directory; pass the tree run {} documented.",
            dir.display(),
            record.run_id
        ))),
        _ => Err(CliError::bad_input(format!(
            "run {}'s workspace {} is not a directory here (moved, or a clone that is gone); pass --workspace DIR with the same tree.",
            record.run_id,
            shown(&dir.display().to_string())
        ))),
    }
}

/// The cited ranges of every accepted answer of the run, in step order.
fn claims(record: &RunRecord) -> Vec<Claim> {
    record
        .steps
        .iter()
        .flat_map(|step| {
            let label = label(step);
            step.attempts
                .iter()
                .filter(|a| a.status == AttemptStatus::Succeeded)
                .filter_map(|a| a.grounding.as_ref())
                .flat_map(|g| g.lines.iter())
                .map(move |l| Claim {
                    step: label.clone(),
                    member: l.member.clone(),
                    text: l.text.clone(),
                    sha256: l.sha256.clone(),
                    freshness: None,
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn carried_over(record: &RunRecord) -> Vec<CarriedOver> {
    record
        .steps
        .iter()
        .filter_map(|s| {
            s.reused_from.as_ref().map(|from| CarriedOver {
                step: label(s),
                run_id: from.run_id.clone(),
            })
        })
        .collect()
}

fn label(step: &StepRecord) -> String {
    match &step.for_each {
        Some(f) => format!("{}[{}]", f.step, f.index),
        None => step.step_id.clone(),
    }
}

/// The text of `path` inside `root`, when it is a regular file there of at most 1 MiB. A path
/// that leaves the root (`..`, an absolute path, a link out) counts as gone.
fn read_inside(root: &Path, path: &str) -> Option<String> {
    let p = Path::new(path);
    if p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return None;
    }
    let full = std::fs::canonicalize(root.join(p)).ok()?;
    let meta = std::fs::metadata(&full).ok()?;
    if !full.starts_with(root) || !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    std::fs::read_to_string(full).ok()
}

fn render(v: &Verdict<'_>) -> String {
    let mut out = format!(
        "run {} (workspace {}): {} cited line range{}, {} unchanged, {} changed, {} gone\n",
        v.run_id,
        shown(&v.workspace),
        v.checked,
        if v.checked == 1 { "" } else { "s" },
        v.unchanged,
        v.changed.len(),
        v.gone.len()
    );
    for (word, list) in [("changed", &v.changed), ("gone", &v.gone)] {
        for c in list.iter() {
            let _ = writeln!(
                out,
                "{word:<8} {}  (step {}, {})",
                shown(&c.text),
                shown(&c.step),
                shown(&c.member)
            );
        }
    }
    for c in &v.carried_over {
        let _ = writeln!(
            out,
            "note: step {} was carried over from run {}: check that run for its claims.",
            c.step, c.run_id
        );
    }
    out
}
