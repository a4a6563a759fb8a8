//! `docsfab runs list`, `docsfab runs show ID`, `docsfab runs diff ID` and `docsfab runs stats`:
//! the run store, read back (the diff itself is `runs_diff`, the figures `runs_stats`).
//!
//! They open the run store `--store` (or `DOCSFAB_STORE`) names, by default
//! `sqlite:DOCSFAB_HOME/runs.db` ([`store_url`]), and opening it marks every run whose process
//! died while it was `running` as `interrupted`, so a run killed with `kill -9` shows up as such
//! here. None reads host.yaml: looking at old runs must work whatever the configuration says
//! today.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use docsfab_runtime::ledger::{CallOutcome, ToolCallEntry};
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::record::{
    AttemptRecord, AttemptStatus, FileWritten, RunRecord, StepRecord, TurnRecord,
};
use docsfab_runtime::stats::{Filter, Stats};
use docsfab_runtime::store::{BusyRetry, RunListing, RunStore, StoreError, StoreOptions, StoreUrl};
use serde::Serialize;

use crate::error::{CliError, emit, plain_reason};
use crate::home::Home;

/// The file name of the run store inside `DOCSFAB_HOME`.
pub const STORE_FILE_NAME: &str = "runs.db";

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
        /// Show at most N runs (the newest).
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

pub fn run(args: &RunsArgs, store: Option<&str>) -> Result<(), CliError> {
    let home = Home::locate()?;
    let path = store_url(&home.dir, store)?;
    match &args.command {
        RunsCommand::List { json, limit } => list(&path, *json, *limit),
        RunsCommand::Show { id, json, html } => match html {
            Some(target) => show_html(&path, id, target),
            None => show(&path, id, *json),
        },
        RunsCommand::Diff { id, stat } => diff(&path, id, *stat),
        RunsCommand::Stats {
            since,
            provider,
            json,
        } => stats(&path, since.as_deref(), provider.as_deref(), *json),
    }
}

/// The run store a command uses: the `--store` flag's value (clap fills it from
/// `DOCSFAB_STORE` when the flag is absent), else `sqlite:HOME/runs.db`. A value that is not a
/// store URL is bad input.
pub fn store_url(home_dir: &Path, flag: Option<&str>) -> Result<StoreUrl, CliError> {
    match flag {
        None => Ok(StoreUrl::Sqlite(home_dir.join(STORE_FILE_NAME))),
        Some(text) => StoreUrl::parse(text)
            .map_err(|e| CliError::bad_input(format!("--store (or DOCSFAB_STORE): {e}."))),
    }
}

/// How messages name a store: a SQLite store by its file path (as before there was a choice),
/// PostgreSQL by its URL without the password.
pub fn store_place(url: &StoreUrl) -> String {
    match url {
        StoreUrl::Sqlite(path) => path.display().to_string(),
        StoreUrl::Postgres(pg) => pg.to_string(),
    }
}

/// Whether the store holds anything yet; reading commands create no SQLite file where there
/// is none. A PostgreSQL store is a server's database: it is opened (and migrated) to look.
fn store_exists(url: &StoreUrl) -> bool {
    match url {
        StoreUrl::Sqlite(path) => path.exists(),
        StoreUrl::Postgres(_) => true,
    }
}

/// Opens the run store for a command. A failure of a SQLite file is the operator's to fix
/// (permissions, a file that is not a database), so it is bad input; except a store other
/// docsfab processes kept locked past every retry, which is a failure to try again later, as is
/// a PostgreSQL server that does not answer.
///
/// Says on stderr which runs this open found orphaned and marked `interrupted`, and each retry
/// while another docsfab process holds the store past the busy timeout, so a slow command says
/// why it waits.
pub fn open_store_url(url: &StoreUrl) -> Result<RunStore, CliError> {
    let options = StoreOptions {
        on_busy: Some(std::sync::Arc::new(|b: &BusyRetry| {
            let _ = writeln!(
                std::io::stderr(),
                "note: the run store is busy with another docsfab process while {}; trying again ({} of {}).",
                b.operation,
                b.retry,
                b.max_retries
            );
        })),
        ..StoreOptions::default()
    };
    let place = store_place(url);
    let store = RunStore::open_url(url, options).map_err(|e| match (e, url) {
        // Not the operator's configuration: another process kept the store locked.
        (e @ StoreError::Busy { .. }, _) => CliError::failed(format!(
            "cannot open the run store {place} ({e}); try again when the other docsfab commands on this DOCSFAB_HOME have finished."
        )),
        // The server answered and refused the URL's credentials or database: configuration.
        (StoreError::Postgres(e), _) if is_config_refusal(&e) => CliError::bad_input(format!(
            "cannot open the run store {place}: {e}; correct the user, password or database in the store URL (--store or DOCSFAB_STORE)."
        )),
        (e, StoreUrl::Postgres(_)) => CliError::failed(format!(
            "cannot open the run store {place} ({e}); check that the PostgreSQL server is running and that the URL's user may create tables in that database."
        )),
        (e, StoreUrl::Sqlite(_)) => {
            let reason = plain_reason(
                &e.to_string(),
                "it is not a docsfab run store of this version, or it is damaged",
            );
            CliError::bad_input(format!(
                "cannot open the run store {place} ({reason}); check that DOCSFAB_HOME is a writable directory and the file is a docsfab run store, or move it aside."
            ))
        }
    })?;
    for id in store.interrupted_on_open() {
        let _ = writeln!(
            std::io::stderr(),
            "note: run {id} was left running by a process that no longer exists; it is now marked interrupted."
        );
    }
    Ok(store)
}

/// [`open_store_url`] for a SQLite file: `docsfab serve` (h15-serve) opens its store this way
/// until the lead hands it the `--store` URL at merge.
#[allow(dead_code)]
pub fn open_store(path: &Path) -> Result<RunStore, CliError> {
    open_store_url(&StoreUrl::Sqlite(path.to_owned()))
}

pub(crate) fn read_failed(url: &StoreUrl, e: impl std::fmt::Display) -> CliError {
    let reason = plain_reason(&e.to_string(), "it is damaged or not a docsfab run store");
    CliError::failed(format!(
        "cannot read the run store {} ({reason}); check the file, or move it aside to start a new one.",
        store_place(url)
    ))
}

fn list(path: &StoreUrl, json: bool, limit: u32) -> Result<(), CliError> {
    // Listing must not create a store where there is none.
    let runs = if store_exists(path) {
        open_store_url(path)?
            .list_run_rows(limit)
            .map_err(|e| read_failed(path, e))?
    } else {
        Vec::new()
    };
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
            shown(&s.composition),
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
    emit(&crate::runs_diff::render(&record, &rows, stat))
}

fn show_html(path: &StoreUrl, id: &str, target: &Path) -> Result<(), CliError> {
    let (store, record) = load(path, id)?;
    let rows = store.written_files(id).map_err(|e| read_failed(path, e))?;
    let page = crate::report_html::render(&record, &crate::runs_diff::per_file(&rows))?;
    crate::report_html::write(&page, target)
}

fn show(path: &StoreUrl, id: &str, json: bool) -> Result<(), CliError> {
    let (_, record) = load(path, id)?;
    if json {
        emit(&format!("{}\n", to_json(&record)?))
    } else {
        emit(&render_run(&record))
    }
}

pub fn to_json<T: Serialize>(value: &T) -> Result<String, CliError> {
    serde_json::to_string_pretty(value)
        .map_err(|e| CliError::failed(format!("cannot format the run record as JSON ({e}).")))
}

/// The kebab-case name serde gives an enum value (stop reasons, faults, statuses).
pub fn name_of<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Free text of a record as one terminal-safe line. docsfab redacts provider text before it is
/// recorded; this also covers a record written by an older docsfab (which stored escapes and
/// line breaks as the provider sent them). Key shapes only: `runs show` does not read keys.
fn shown(text: &str) -> String {
    static SHAPES_ONLY: std::sync::LazyLock<docsfab_boundary::Redactor> =
        std::sync::LazyLock::new(docsfab_boundary::Redactor::default);
    SHAPES_ONLY.line_capped(text.trim(), 4096)
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The readable view of a run, as `docsfab runs show` and `docsfab demo` print it.
pub fn render_run(r: &RunRecord) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Run {}: {}", r.run_id, r.status.as_str());
    let _ = writeln!(out, "  composition: {}", r.composition);
    render_context(&mut out, r);
    let _ = writeln!(
        out,
        "  started {}, ended {}",
        r.started_at,
        r.ended_at.as_deref().unwrap_or("- (still running)")
    );
    if let Some(reason) = &r.end_reason {
        let _ = writeln!(out, "  why it ended: {}", shown(reason));
    }
    // Once per run: the gateway its attempts came through and what it may have bent (issue 24).
    for line in crate::gateway::RunGateway::of_run(r)
        .iter()
        .flat_map(crate::gateway::RunGateway::lines)
    {
        let _ = writeln!(out, "{line}");
    }
    if r.steps.is_empty() {
        let _ = writeln!(out, "  no step started");
    }
    for step in &r.steps {
        render_step(&mut out, step);
    }
    out
}

/// Where and with what the run worked. A record from before docsfab kept these has none, and
/// its lines are left out.
fn render_context(out: &mut String, r: &RunRecord) {
    if let Some(w) = &r.workspace {
        let _ = writeln!(out, "  workspace: {}", shown(w));
    }
    if let Some(p) = &r.provider {
        let _ = writeln!(
            out,
            "  provider: {} ({} at {}), model {}",
            shown(&p.name),
            p.api.as_str(),
            shown(&p.host),
            r.model.as_deref().map_or_else(|| "-".to_owned(), shown)
        );
    }
    if let Some(v) = &r.docsfab_version {
        let _ = writeln!(out, "  docsfab {}", shown(v));
    }
}

fn render_step(out: &mut String, s: &StepRecord) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Step {} ({}): {}, {} attempt{}",
        s.step_id,
        s.access.as_str(),
        s.status.as_str(),
        s.attempts.len(),
        if s.attempts.len() == 1 { "" } else { "s" }
    );
    let t = &s.transport_retry;
    let _ = writeln!(
        out,
        "  maxRetries: configured {}, effective {}; transport budget: {} retries, wait <= {}, elapsed <= {}, base {}",
        s.configured_max_retries,
        s.effective_max_retries,
        t.max_transport_retries,
        human_duration(t.transport_max_delay_ms),
        human_duration(t.transport_max_elapsed_ms),
        human_duration(t.base_delay_ms)
    );
    for a in &s.attempts {
        render_attempt(out, a);
    }
    if let Some(i) = &s.interrupted_attempt {
        let paths: Vec<&str> = i.write_intents.iter().map(|w| w.path.as_str()).collect();
        let _ = writeln!(
            out,
            "  Attempt {}: interrupted (its process died) after it began {} write{}; not restored, check: {}",
            i.attempt,
            paths.len(),
            if paths.len() == 1 { "" } else { "s" },
            paths.join(", ")
        );
    }
    if let Some(f) = &s.failure {
        let _ = writeln!(
            out,
            "  step failure: {} / {} / {}",
            f.category, f.failure_class, f.code
        );
        let _ = writeln!(out, "    {}", shown(&f.message));
        let _ = writeln!(out, "    what to do: {}", f.remediation.trim());
    }
    if let Some(output) = &s.output {
        let _ = writeln!(out, "  output: {output}");
    }
}

fn render_attempt(out: &mut String, a: &AttemptRecord) {
    let _ = writeln!(
        out,
        "  Attempt {} ({} budget): {}, {}, tokens in {} / out {}",
        a.attempt,
        a.budget.as_str(),
        a.status.as_str(),
        human_duration(a.duration_ms),
        a.usage.input_tokens,
        a.usage.output_tokens
    );
    if let Some(g) = &a.gateway {
        let _ = writeln!(out, "    through the gateway {}", g.describe());
    }
    if a.provider_error_class.is_some() || a.failure_category.is_some() {
        let _ = writeln!(
            out,
            "    failure: category {}, class {}, code {}; provider error class {}, HTTP status {}, Retry-After {}{}",
            or_dash(a.failure_category.as_deref()),
            or_dash(a.failure_class.as_deref()),
            or_dash(a.code.as_deref()),
            or_dash(a.provider_error_class.map(|c| c.as_str())),
            or_dash(a.http_status),
            a.retry_after_ms
                .map_or_else(|| "-".to_owned(), human_duration),
            a.timeout_kind
                .map(|k| format!(", timeout {}", name_of(&k)))
                .unwrap_or_default(),
        );
    }
    if let Some(m) = &a.message {
        let _ = writeln!(out, "    message: {}", shown(m));
    }
    // What the model answered is what a failed contract needs to be understood by.
    if a.status == AttemptStatus::Failed
        && let Some(excerpt) = &a.answer_excerpt
    {
        let size = a
            .answer_bytes
            .map(|n| format!(" ({n} bytes in all)"))
            .unwrap_or_default();
        let _ = writeln!(out, "    answer{size}: {}", shown(excerpt));
    }
    let decision = name_of(&a.retry.decision);
    let _ = writeln!(
        out,
        "    retry decision: {} (retryDecision {decision}{})",
        a.retry_rule.as_deref().unwrap_or("none"),
        a.wait_ms
            .map(|w| format!(", next attempt after {}", human_duration(w)))
            .unwrap_or_default()
    );
    if let Some(ws) = &a.write_settlement {
        let _ = writeln!(
            out,
            "    write settlement: {}{}",
            ws.as_str(),
            a.write_restore
                .map(|r| format!(", workspace {}", r.as_str()))
                .unwrap_or_default()
        );
    }
    if let Some(files) = a.files_written.as_ref().filter(|f| !f.is_empty()) {
        let _ = writeln!(out, "    files written: {}", files_written(files));
    }
    let l = &a.lease;
    let _ = writeln!(
        out,
        "    lease: {}/{} turns, {} tool calls executed, stop {} ({}){}",
        l.turns_used,
        l.max_turns,
        l.executed_tool_calls,
        name_of(&l.stop_reason),
        name_of(&l.disposition),
        l.evidence
            .as_deref()
            .map(|e| format!(": {}", shown(e)))
            .unwrap_or_default()
    );
    for t in &a.turns {
        render_turn(out, t);
    }
}

/// `docs/a.md (new, 12 bytes), docs/b.md (changed, 40 bytes)`: what an attempt wrote.
fn files_written(files: &[FileWritten]) -> String {
    let one = |f: &FileWritten| {
        let how = match (&f.sha256_before, &f.sha256_after) {
            (None, _) => "new",
            (Some(_), None) => "gone",
            (Some(_), Some(_)) => "changed",
        };
        format!("{} ({how}, {} bytes)", shown(&f.path), f.bytes)
    };
    files.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// `read_file (ok)`, `write_file (refused: ...)`: one call of a turn's tool batch as
/// `runs show` names it. The record keeps the tool and its outcome, not its arguments.
fn call_text(c: &ToolCallEntry) -> String {
    let outcome = match &c.outcome {
        CallOutcome::Executed { result: Some(r) } => name_of(r),
        CallOutcome::Executed { result: None } => "executed, result not recorded".to_string(),
        CallOutcome::Rejected { detail, .. } => format!("rejected: {}", shown(detail)),
        CallOutcome::Refused { detail } => format!("refused: {}", shown(detail)),
    };
    format!("{} ({outcome})", shown(&c.tool))
}

fn render_turn(out: &mut String, t: &TurnRecord) {
    let b = &t.tool_batch;
    let tools = if b.requested == 0 {
        String::new()
    } else {
        format!(
            "; tools requested {}, rejected {}, executed {}",
            b.requested, b.rejected, b.executed
        )
    };
    let reason = t
        .reason
        .as_deref()
        .map(|r| format!(" ({})", shown(r)))
        .unwrap_or_default();
    // Absent when nothing was held, so records without holds print as before.
    let held = if t.held_ms == 0 {
        String::new()
    } else {
        format!(
            "; held {} by the provider throttle",
            human_duration(t.held_ms)
        )
    };
    let _ = writeln!(
        out,
        "    Turn {}: {}{reason}, {} provider retr{}{tools}{held}",
        t.turn,
        t.status.as_str(),
        t.provider_retries(),
        if t.provider_retries() == 1 {
            "y"
        } else {
            "ies"
        }
    );
    for (i, r) in t.replays.iter().enumerate() {
        let _ = writeln!(
            out,
            "      replay {}: {} ({}), waited {}{}",
            i + 1,
            r.cause,
            r.provider_error_class.as_str(),
            human_duration(r.wait_ms),
            r.retry_after_ms
                .map(|ms| format!(", Retry-After {}", human_duration(ms)))
                .unwrap_or_default()
        );
    }
    if !b.calls.is_empty() {
        let calls: Vec<String> = b.calls.iter().map(call_text).collect();
        let _ = writeln!(out, "      tools: {}", calls.join(", "));
    }
}

/// `docsfab runs stats`: the records in the window, summed by `docsfab_runtime::stats`.
fn stats(
    path: &StoreUrl,
    since: Option<&str>,
    provider: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let since = since.map(crate::runs_stats::parse_since).transpose()?;
    let filter = Filter {
        started_at_or_after: since.map(|d| {
            docsfab_runtime::record::rfc3339_utc(
                SystemTime::now().checked_sub(d).unwrap_or(UNIX_EPOCH),
            )
        }),
        provider: provider.map(str::to_owned),
    };
    let records = load_records(path, &filter)?;
    let stats = Stats::from_records(&records, &filter);
    if json {
        emit(&format!("{}\n", to_json(&stats)?))
    } else {
        emit(&crate::runs_stats::render(&stats))
    }
}

/// The records of the runs that started in the window (all of them without `--since`); none,
/// and no store created, when there is no store yet.
pub(crate) fn load_records(
    path: &StoreUrl,
    filter: &Filter,
) -> Result<Vec<docsfab_runtime::record::RunRecord>, CliError> {
    if !store_exists(path) {
        return Ok(Vec::new());
    }
    records_of(&open_store_url(path)?, path, filter)
}

/// [`load_records`] from a store already open at `path`.
pub(crate) fn records_of(
    store: &RunStore,
    path: &StoreUrl,
    filter: &Filter,
) -> Result<Vec<docsfab_runtime::record::RunRecord>, CliError> {
    let failed = |e: docsfab_runtime::store::StoreError| read_failed(path, e);
    let mut records = Vec::new();
    for summary in store.list_runs().map_err(failed)? {
        // The summary's start is enough to skip a run outside the window unread.
        if filter
            .started_at_or_after
            .as_deref()
            .is_some_and(|cut| summary.started_at.as_str() < cut)
        {
            continue;
        }
        if let Some(record) = store.load_run(&summary.run_id).map_err(failed)? {
            records.push(record);
        }
    }
    Ok(records)
}

/// A PostgreSQL refusal that only a corrected URL can fix (bad credentials, no such database).
fn is_config_refusal(e: &docsfab_pg::PgError) -> bool {
    use docsfab_pg::postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(c)
    })
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
