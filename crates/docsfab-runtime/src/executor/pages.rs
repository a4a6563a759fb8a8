//! A pages step (`pages: [...]`, docs/pages.md): writes the pages earlier read-only steps
//! answered, with no provider request.
//!
//! Every page reached here through its step's contract and grounding, so writing is all that is
//! left: under the step's `writeRoots` jail, each write's intent committed before it runs, one
//! attempt recorded with `filesWritten` like any write step's. Nothing is written when the pages
//! cannot all be written: a malformed or duplicate page, a path outside the jail, or (with an
//! earlier run to compare with) pages the earlier run wrote that this one would drop while
//! their sources still exist; the step fails before its first write. A write that fails midway
//! has the step's earlier writes undone. The step is never retried: no model could answer
//! differently.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use docsfab_record::{
    AttemptRecord, AttemptStatus, Budget, CallResult, Disposition, LeaseRecord, LeaseStop, Retry,
    RetryDecision, RunStatus, StepFailure, Usage, rfc3339_utc,
};
use serde_json::{Value, json};

use super::config::RunError;
use super::ctx::{Ctx, emit_finished, step_start};
use crate::composition::{Step, Tool};
use crate::progress::Progress;
use crate::snapshot::WrittenFile;
use crate::store::{RunStore, StepEnd};
use crate::tools::{Authorized, StepTools, ToolPolicy};
use crate::written::classify;

/// One page to write: where, what, the sources it describes, and the step that answered it.
#[derive(Debug, Clone, PartialEq)]
struct Page {
    path: String,
    markdown: String,
    sources: Vec<String>,
    from: String,
}

/// Why the step stops before it writes anything.
struct Refusal {
    code: &'static str,
    category: &'static str,
    message: String,
    remediation: String,
}

impl Refusal {
    fn into_failure(self) -> StepFailure {
        StepFailure {
            category: self.category.to_owned(),
            failure_class: "policy".to_owned(),
            code: self.code.to_owned(),
            message: self.message,
            remediation: self.remediation,
            context: None,
        }
    }
}

/// Runs pages step `step` over the accepted `outputs` of the steps before it.
pub(super) fn run_pages_step(
    ctx: &Ctx<'_>,
    store: &mut RunStore,
    step: &Step,
    outputs: &BTreeMap<String, String>,
) -> Result<(RunStatus, Option<String>), RunError> {
    let step_index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
    ctx.emit(Progress::StepStarted {
        step_id: step.id.clone(),
        access: step.access,
    });
    let planned = gather(step, outputs).and_then(|pages| {
        let lost = lost_pages(ctx, step, &pages);
        match lost {
            Some(refusal) => Err(refusal),
            None => Ok(pages),
        }
    });
    let pages = match planned {
        Ok(pages) => pages,
        Err(refusal) => {
            let end = failed(refusal.into_failure());
            store.finish_step(ctx.run_id, step_index, &end)?;
            return Ok((end.status, None));
        }
    };
    ctx.emit(Progress::AttemptStarted {
        step_id: step.id.clone(),
        attempt: 1,
        budget: Budget::Initial,
    });
    let (record, written, failure) = match write(ctx, store, step, step_index, &pages)? {
        Outcome::Refused(failure) => {
            let end = failed(failure);
            store.finish_step(ctx.run_id, step_index, &end)?;
            return Ok((end.status, None));
        }
        Outcome::Attempted {
            record,
            written,
            failure,
        } => (record, written, failure),
    };
    let kept: Vec<_> = match failure {
        // Undone: the record keeps what was written, the store no contents.
        Some(_) => Vec::new(),
        None => written
            .iter()
            .map(|f| (f.clone(), classify(f, |_| false)))
            .collect(),
    };
    store.record_attempt_with_files(ctx.run_id, step_index, &record, &kept)?;
    emit_finished(ctx, step, &record);
    let end = match failure {
        Some(f) => failed(f),
        None => {
            let output = written_output(&pages);
            StepEnd {
                status: RunStatus::Succeeded,
                failure: None,
                output: Some(output),
                basis: None,
            }
        }
    };
    store.finish_step(ctx.run_id, step_index, &end)?;
    let text = end.output.as_ref().map(Value::to_string);
    Ok((end.status, text))
}

fn failed(failure: StepFailure) -> StepEnd {
    StepEnd {
        status: RunStatus::Failed,
        failure: Some(failure),
        output: None,
        basis: None,
    }
}

/// The step's output, kept in the record: each page written and the sources it describes,
/// which the next run's lost-pages check compares with.
fn written_output(pages: &[Page]) -> Value {
    let pages: Vec<Value> = pages
        .iter()
        .map(|p| json!({"path": p.path, "sources": p.sources, "from": p.from}))
        .collect();
    json!({ "pages": pages })
}

/// The pages the step's sources answered, in order: each source's answer is a page or (a
/// fan-out step) an array of pages. Refused when one is not a page or two share a path.
fn gather(step: &Step, outputs: &BTreeMap<String, String>) -> Result<Vec<Page>, Refusal> {
    let mut pages: Vec<Page> = Vec::new();
    for source in &step.pages {
        let answer: Value = outputs
            .get(source)
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null);
        let answers: Vec<(String, &Value)> = match &answer {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("{source}[{i}]"), v))
                .collect(),
            one => vec![(source.clone(), one)],
        };
        for (from, value) in answers {
            let page = page_of(value, &from, &step.id)?;
            if let Some(first) = pages.iter().find(|p| p.path == page.path) {
                return Err(Refusal {
                    code: "page-duplicate",
                    category: "invalid-pages",
                    message: format!(
                        "Steps {} and {} both answered the page {}; step {} wrote nothing.",
                        first.from, page.from, page.path, step.id
                    ),
                    remediation: "Give each page its own path (for example from the component's name in the map).".to_owned(),
                });
            }
            pages.push(page);
        }
    }
    Ok(pages)
}

/// The page `value` holds: a string `path` (workspace-relative) and a string `markdown`.
fn page_of(value: &Value, from: &str, step_id: &str) -> Result<Page, Refusal> {
    let path = value.get("path").and_then(Value::as_str);
    let markdown = value.get("markdown").and_then(Value::as_str);
    let (Some(path), Some(markdown)) = (path, markdown) else {
        return Err(Refusal {
            code: "page-malformed",
            category: "invalid-pages",
            message: format!(
                "The answer of step {from} is not a page (a string path and a string markdown); step {step_id} wrote nothing."
            ),
            remediation: "Declare path and markdown as strings in that step's contract schema."
                .to_owned(),
        });
    };
    let sources = value
        .get("sources")
        .and_then(Value::as_array)
        .map(|s| {
            s.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(Page {
        path: path.trim().trim_start_matches("./").to_owned(),
        markdown: markdown.to_owned(),
        sources,
        from: from.to_owned(),
    })
}

/// The pages the earlier run this one carries over from wrote with this step that this run
/// would not write, while what they describe is still there: a listed source still exists,
/// or, for a page that listed none, the page itself. `None` when nothing would be lost, when
/// there is no earlier run, or when the operator allowed it (`--allow-lost-pages`).
fn lost_pages(ctx: &Ctx<'_>, step: &Step, pages: &[Page]) -> Option<Refusal> {
    let carry = ctx.cfg.carry.as_ref().filter(|c| !c.allow_lost_pages)?;
    let earlier = carry.reference.succeeded_output(&step.id)?;
    let now: BTreeSet<&str> = pages.iter().map(|p| p.path.as_str()).collect();
    let exists = |path: &str| ctx.workspace.root().join(path).exists();
    let lost: Vec<String> = earlier
        .get("pages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let path = p.get("path")?.as_str()?;
            let sources: Vec<&str> = p
                .get("sources")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let described = match sources.is_empty() {
                true => exists(path),
                false => sources.iter().any(|s| exists(s)),
            };
            (!now.contains(path) && described).then(|| path.to_owned())
        })
        .collect();
    if lost.is_empty() {
        return None;
    }
    Some(Refusal {
        code: "lost-pages",
        category: "lost-pages",
        message: format!(
            "Step {} would drop {} page(s) that run {} wrote and whose sources still exist: {}; it wrote nothing.",
            step.id,
            lost.len(),
            carry.reference.run_id(),
            lost.join(", ")
        ),
        remediation: "Check why the map left those components out; run again with --allow-lost-pages to write the smaller set anyway.".to_owned(),
    })
}

/// What became of the step's writes.
enum Outcome {
    /// Nothing was written: the workspace failed its preflight or a path is outside the jail.
    Refused(StepFailure),
    /// Attempt 1 ran: its record, the files it wrote, and its failure when a write failed
    /// (the earlier writes undone).
    Attempted {
        record: Box<AttemptRecord>,
        written: Vec<WrittenFile>,
        failure: Option<StepFailure>,
    },
}

/// Writes `pages` as attempt 1 of the step: every path authorized before the first write, each
/// write's intent committed before it runs.
fn write(
    ctx: &Ctx<'_>,
    store: &mut RunStore,
    step: &Step,
    step_index: u32,
    pages: &[Page],
) -> Result<Outcome, RunError> {
    let started_at = rfc3339_utc(SystemTime::now());
    let clock = Instant::now();
    let policy = ToolPolicy {
        offered: vec![Tool::WriteFile],
        write_roots: step.write_roots.clone(),
        source_read_bytes: 0,
    };
    let mut tools = StepTools::for_attempt(ctx.workspace, policy);
    if let Err(f) = tools.preflight() {
        return Ok(Outcome::Refused(host_failure(step, &f.evidence)));
    }
    let calls = match authorize_all(&tools, pages) {
        Ok(calls) => calls,
        Err((page, why)) => return Ok(Outcome::Refused(refused_path(step, page, &why))),
    };
    let mut executed = 0u32;
    let mut failure = None;
    for (page, call) in calls {
        store.record_write_intent(
            ctx.run_id,
            step_index,
            1,
            Tool::WriteFile.name(),
            &page.path,
        )?;
        executed += 1;
        let problem = match tools.execute(call) {
            Ok(r) if r.result == CallResult::Ok => continue,
            Ok(r) => r.text,
            Err(host) => host.evidence,
        };
        failure = Some(write_failed(step, page, &problem, &tools));
        break;
    }
    let written = tools.snapshots().written_files();
    let duration_ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut record = attempt_record(started_at, duration_ms, executed, &written);
    if let Some(f) = &failure {
        record.status = AttemptStatus::Failed;
        record.retry = Retry {
            decision: RetryDecision::Terminal,
        };
        record.message = Some(f.message.clone());
        record.failure_category = Some(f.category.clone());
        record.failure_class = Some(f.failure_class.clone());
        record.code = Some(f.code.clone());
        record.lease.disposition = Disposition::Failed;
    }
    Ok(Outcome::Attempted {
        record: Box::new(record),
        written,
        failure,
    })
}

/// Every page's write, authorized under the jail; the first page refused, with why, fails
/// them all.
fn authorize_all<'p>(
    tools: &StepTools<'_>,
    pages: &'p [Page],
) -> Result<Vec<(&'p Page, Authorized)>, (&'p Page, String)> {
    pages
        .iter()
        .map(|page| {
            let args = json!({"path": page.path, "content": page.markdown}).to_string();
            let call = tools
                .validate("write_file", &args)
                .map_err(|r| (page, r.to_string()))?;
            let authorized = tools.authorize(call).map_err(|r| (page, r.to_string()))?;
            Ok((page, authorized))
        })
        .collect()
}

/// The succeeded attempt of a pages step as the record keeps it: no request, so no turns, no
/// usage and no provider; one executed write per page.
fn attempt_record(
    started_at: String,
    duration_ms: u64,
    executed: u32,
    written: &[WrittenFile],
) -> AttemptRecord {
    AttemptRecord {
        attempt: 1,
        budget: Budget::Initial,
        status: AttemptStatus::Succeeded,
        started_at,
        provider_error_class: None,
        http_status: None,
        retry_after_ms: None,
        gateway: None,
        failure_category: None,
        failure_class: None,
        code: None,
        message: None,
        answer_excerpt: None,
        answer_bytes: None,
        timeout_kind: None,
        output_constraint: None,
        grounding: None,
        retry_rule: None,
        retry: Retry {
            decision: RetryDecision::None,
        },
        wait_ms: None,
        write_settlement: None,
        write_restore: None,
        files_written: Some(written.iter().map(WrittenFile::record).collect()),
        usage: Usage::ZERO,
        cost_usd: None,
        duration_ms,
        lease: LeaseRecord {
            max_turns: 0,
            turns_used: 0,
            executed_tool_calls: executed,
            tool_counters: BTreeMap::from([(Tool::WriteFile.name().to_owned(), executed)]),
            stop_reason: LeaseStop::PagesWritten,
            disposition: Disposition::Completed,
            evidence: None,
        },
        turns: Vec::new(),
    }
}

fn refused_path(step: &Step, page: &Page, why: &str) -> StepFailure {
    Refusal {
        code: "page-path-refused",
        category: "invalid-pages",
        message: format!(
            "Page {} (from step {}) cannot be written by step {}: {why}; nothing was written.",
            page.path, page.from, step.id
        ),
        remediation: format!(
            "Constrain the page path in step {}'s contract schema (a pattern under the write roots) or widen writeRoots ({}).",
            page.from.split('[').next().unwrap_or(&page.from),
            step.write_roots.join(", ")
        ),
    }
    .into_failure()
}

fn host_failure(step: &Step, evidence: &str) -> StepFailure {
    StepFailure {
        category: "host-failure".to_owned(),
        failure_class: "host".to_owned(),
        code: "preflight-failed".to_owned(),
        message: format!("Step {} cannot write its pages: {evidence}.", step.id),
        remediation: "Fix the workspace (permissions, free space) and run again.".to_owned(),
        context: None,
    }
}

/// A write that failed midway: the step's earlier writes are undone, and the failure says
/// whether that worked.
fn write_failed(step: &Step, page: &Page, problem: &str, tools: &StepTools<'_>) -> StepFailure {
    let (code, undone) = match tools.snapshots().restore() {
        Ok(()) => (
            "page-write-failed",
            "the pages written before it were undone".to_owned(),
        ),
        Err(e) => (
            "write-restore-failed",
            format!("undoing the pages written before it failed too ({e})"),
        ),
    };
    StepFailure {
        category: "host-failure".to_owned(),
        failure_class: "host".to_owned(),
        code: code.to_owned(),
        message: format!(
            "Step {} could not write page {}: {problem}; {undone}.",
            step.id, page.path
        ),
        remediation: "Fix the workspace (permissions, free space) and run again; the pages' answers are in the record.".to_owned(),
        context: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> Step {
        Step {
            id: "write".into(),
            access: docsfab_record::Access::Write,
            instructions: String::new(),
            tools: Vec::new(),
            contract: None,
            write_roots: vec!["docs/".into()],
            line: 1,
            fan_out: None,
            pages: vec!["page".into(), "index".into()],
        }
    }

    #[test]
    fn pages_are_gathered_from_fan_out_arrays_and_single_answers_in_order() {
        let outputs = BTreeMap::from([
            (
                "page".to_owned(),
                json!([
                    {"path": "./docs/a.md", "markdown": "# A", "sources": ["src/a.rs"]},
                    {"path": "docs/b.md", "markdown": "# B"}
                ])
                .to_string(),
            ),
            (
                "index".to_owned(),
                json!({"path": "docs/index.md", "markdown": "[a](a.md)"}).to_string(),
            ),
        ]);
        let Ok(pages) = gather(&step(), &outputs) else {
            panic!("refused")
        };
        let got: Vec<(&str, &str, usize)> = pages
            .iter()
            .map(|p| (p.path.as_str(), p.from.as_str(), p.sources.len()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("docs/a.md", "page[0]", 1),
                ("docs/b.md", "page[1]", 0),
                ("docs/index.md", "index", 0)
            ]
        );
    }

    #[test]
    fn two_pages_with_one_path_are_refused_naming_both_steps() {
        let outputs = BTreeMap::from([
            (
                "page".to_owned(),
                json!([{"path": "docs/a.md", "markdown": "1"}]).to_string(),
            ),
            (
                "index".to_owned(),
                json!({"path": "docs/a.md", "markdown": "2"}).to_string(),
            ),
        ]);
        let Err(refusal) = gather(&step(), &outputs) else {
            panic!("accepted")
        };
        assert_eq!(refusal.code, "page-duplicate");
        assert!(
            refusal.message.contains("page[0] and index"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn an_answer_without_markdown_is_no_page() {
        let outputs = BTreeMap::from([
            (
                "page".to_owned(),
                json!([{"path": "docs/a.md"}]).to_string(),
            ),
            (
                "index".to_owned(),
                json!({"path": "x", "markdown": ""}).to_string(),
            ),
        ]);
        let Err(refusal) = gather(&step(), &outputs) else {
            panic!("accepted")
        };
        assert_eq!(refusal.code, "page-malformed");
        assert!(refusal.message.contains("page[0]"), "{}", refusal.message);
    }
}
