//! `docsfab runs list`, `docsfab runs show ID`, `docsfab runs diff ID` and `docsfab runs stats`:
//! the run store, read back (the diff itself is `app::diff`, the figures `stats`).
//!
//! They open the run store `--store` (or `DOCSFAB_STORE`) names, by default
//! `sqlite:DOCSFAB_HOME/runs.db` ([`store_url`]), and opening it marks every run whose process
//! died while it was `running` as `interrupted`, so a run killed with `kill -9` shows up as such
//! here. None but `resume` reads host.yaml: looking at old runs must work whatever the
//! configuration says today. `runs resume ID` (module `resume`) starts a new run, checked as
//! `docsfab run` checks one.

pub mod resume;
pub mod stale;
pub mod stats;

use std::fmt::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use docsfab_record::RunRecord;
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::stats::{Filter, Stats};
use docsfab_runtime::store::{RunListing, RunStore, StoreUrl};

use crate::app::carry::ResumeFlags;
use crate::app::error::{CliError, emit};
use crate::app::home::Home;
use crate::app::print::{render_run, shown, to_json};
use crate::app::progress::ColorChoice;
use crate::app::store::{
    load_records, open_store_url, read_failed, store_exists, store_place, store_url,
};

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Recent runs, newest first: id, status, composition, start, duration, steps, attempts.
    List {
        /// Print an array of {runId, composition, status, startedAt, endedAt}.
        #[arg(long)]
        json: bool,
        /// Show at most N runs (the newest); when there are more, a note on stderr says so.
        #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// One run: its steps, attempts, turns and each attempt's retry decision.
    Show {
        /// The run id (the first line `docsfab run` prints).
        id: String,
        /// Print the run record (docs/run-record.md) instead of the readable view.
        #[arg(long)]
        json: bool,
        /// Write the run as one self-contained HTML page (timeline, attempts, diffs) to FILE,
        /// or to standard output with `-`.
        #[arg(long, value_name = "FILE", conflicts_with = "json")]
        html: Option<std::path::PathBuf>,
    },
    /// Everything a run wrote, as a unified diff (`git apply` takes it), from each file's
    /// content before the run to its content after.
    Diff {
        /// The run id (the first line `docsfab run` prints).
        id: String,
        /// Print a summary (`PATH | N +++--` per file and the totals) instead of the diff.
        #[arg(long)]
        stat: bool,
    },
    /// Start a run that ended failed, cancelled or interrupted again, as a new run that carries
    /// over every step it finished (docs/resume.md).
    Resume {
        /// The run id.
        id: String,
        /// Run again the finished steps whose files changed since (and what depends on them),
        /// instead of refusing.
        #[arg(long)]
        rerun_changed: bool,
        /// Keep the files an interrupted write left as they are, instead of refusing until
        /// they are restored.
        #[arg(long)]
        accept_workspace: bool,
        /// After the id line, print the new run's record instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// The line ranges a run's accepted answers cited (`src/lib.rs:12-30`) that changed in its
    /// workspace since: exit 0 when none did, 1 when one changed or is gone (docs/grounding.md).
    Stale {
        /// The run id.
        id: String,
        /// The tree to read, when it is no longer where the run's record says (a clone, a move).
        #[arg(long, value_name = "DIR")]
        workspace: Option<std::path::PathBuf>,
        /// Print {runId, workspace, checked, unchanged, changed, gone, carriedOver} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Retry figures across recorded runs: requests, replays and step retries by class and
    /// rule, fault bursts, 429 after 429 by wait, time waiting, tokens of failed attempts.
    Stats {
        /// Only runs started within this long before now: 7d, 24h, 90m, 30s.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Only runs whose record names this provider (`(unknown)`: runs recorded before
        /// records named their provider).
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// Print the figures as JSON (docs/observability.md, `runs stats`).
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: &RunsArgs, store: Option<&str>, color: ColorChoice) -> Result<(), CliError> {
    let home = Home::locate()?;
    let path = store_url(&home.dir, store)?;
    match &args.command {
        RunsCommand::Resume {
            id,
            rerun_changed,
            accept_workspace,
            json,
        } => {
            let ask = resume::Resume {
                id,
                flags: ResumeFlags {
                    rerun_changed: *rerun_changed,
                    accept_workspace: *accept_workspace,
                },
                json: *json,
            };
            resume::resume(&path, store, &ask, color)
        }
        RunsCommand::List { json, limit } => list(&path, *json, *limit),
        RunsCommand::Show { id, json, html } => match html {
            Some(target) => show_html(&path, id, target),
            None => show(&path, id, *json),
        },
        RunsCommand::Diff { id, stat } => diff(&path, id, *stat),
        RunsCommand::Stale {
            id,
            workspace,
            json,
        } => stale::stale(&load(&path, id)?.1, workspace.as_deref(), *json),
        RunsCommand::Stats {
            since,
            provider,
            json,
        } => stats(&path, since.as_deref(), provider.as_deref(), *json),
    }
}

fn list(path: &StoreUrl, json: bool, limit: u32) -> Result<(), CliError> {
    // Listing must not create a store where there is none.
    let mut runs = if store_exists(path) {
        // One more than asked for says whether the list was cut.
        open_store_url(path)?
            .list_run_rows(limit.saturating_add(1))
            .map_err(|e| read_failed(path, e))?
    } else {
        Vec::new()
    };
    if runs.len() > limit as usize {
        runs.truncate(limit as usize);
        // On stderr, so a script reading the JSON on stdout still gets valid JSON, and is told.
        eprintln!(
            "note: the list stops at --limit {limit} (the newest); {} holds more runs: pass a larger --limit N to see them.",
            store_place(path)
        );
    }
    if json {
        let summaries: Vec<_> = runs.iter().map(|r| &r.summary).collect();
        return emit(&format!("{}\n", to_json(&summaries)?));
    }
    if runs.is_empty() {
        return emit(&format!(
            "No runs yet in {}; start one with `docsfab run COMPOSITION` or `docsfab demo`.\n",
            store_place(path)
        ));
    }
    emit(&render_list(&runs))
}

const LIST_HEADER: [&str; 7] = [
    "RUN ID",
    "STATUS",
    "COMPOSITION",
    "STARTED",
    "DURATION",
    "STEPS",
    "ATTEMPTS",
];

/// The `runs list` table: a header, then one row per run, columns padded to their widest cell.
fn render_list(runs: &[RunListing]) -> String {
    let mut rows: Vec<[String; 7]> = vec![LIST_HEADER.map(str::to_owned)];
    for r in runs {
        let s = &r.summary;
        rows.push([
            s.run_id.clone(),
            s.status.as_str().to_owned(),
            match &s.resumed_from {
                // The lineage: a resume names the run it carried on.
                Some(from) => format!("{} (resumes {})", shown(&s.composition), from.run_id),
                None => shown(&s.composition),
            },
            s.started_at.clone(),
            r.duration_ms.map_or_else(|| "-".to_owned(), human_duration),
            r.steps.to_string(),
            r.attempts.to_string(),
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            // Counts read best right-aligned; text left-aligned.
            if i >= 5 {
                let _ = write!(line, "{cell:>w$}");
            } else {
                let _ = write!(line, "{cell:<w$}");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The store and the record of run `id`; an unknown id is bad input.
fn load(path: &StoreUrl, id: &str) -> Result<(RunStore, RunRecord), CliError> {
    let unknown = || {
        CliError::bad_input(format!(
            "there is no run {id:?} in {}; list the known runs with `docsfab runs list`.",
            store_place(path)
        ))
    };
    if !store_exists(path) {
        return Err(unknown());
    }
    let store = open_store_url(path)?;
    let record = store
        .load_run(id)
        .map_err(|e| read_failed(path, e))?
        .ok_or_else(unknown)?;
    Ok((store, record))
}

fn diff(path: &StoreUrl, id: &str, stat: bool) -> Result<(), CliError> {
    let (store, record) = load(path, id)?;
    let rows = store.written_files(id).map_err(|e| read_failed(path, e))?;
    emit(&crate::app::diff::render(&record, &rows, stat))
}

fn show_html(path: &StoreUrl, id: &str, target: &Path) -> Result<(), CliError> {
    let (store, record) = load(path, id)?;
    let rows = store.written_files(id).map_err(|e| read_failed(path, e))?;
    let page = crate::app::report::render(&record, &crate::app::diff::per_file(&rows))?;
    crate::app::report::write(&page, target)
}

fn show(path: &StoreUrl, id: &str, json: bool) -> Result<(), CliError> {
    let (_, record) = load(path, id)?;
    if json {
        emit(&format!("{}\n", to_json(&record)?))
    } else {
        emit(&render_run(&record))
    }
}

/// `docsfab runs stats`: the records in the window, summed by `docsfab_runtime::stats`.
fn stats(
    path: &StoreUrl,
    since: Option<&str>,
    provider: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let since = since.map(stats::parse_since).transpose()?;
    let filter = Filter {
        started_at_or_after: since.map(|d| {
            docsfab_record::rfc3339_utc(SystemTime::now().checked_sub(d).unwrap_or(UNIX_EPOCH))
        }),
        provider: provider.map(str::to_owned),
    };
    let records = load_records(path, &filter)?;
    let stats = Stats::from_records(&records, &filter);
    if json {
        emit(&format!("{}\n", to_json(&stats)?))
    } else {
        emit(&stats::render(&stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 9, finding 2: a record stored before provider text was redacted still prints as
    /// one line without terminal escapes.
    #[test]
    fn hardening_terminal_an_old_record_message_is_shown_escaped() {
        assert_eq!(
            shown("  type \u{1b}[2J\r\nstep outline succeeded  "),
            "type \\u{1b}[2J\\r\\nstep outline succeeded"
        );
        assert_eq!(shown(&"x".repeat(5000)).chars().count(), 4096);
    }
}
