//! Printing a run record for a person (`runs show`, `demo`) or a script (JSON).

use std::fmt::Write as _;

use docsfab_record::{
    AttemptRecord, AttemptStatus, CallOutcome, FileWritten, RunRecord, StepRecord, ToolCallEntry,
    TurnRecord, shown_cost,
};
use docsfab_runtime::progress::human_duration;
use serde::Serialize;

use crate::app::error::CliError;

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
pub fn shown(text: &str) -> String {
    static SHAPES_ONLY: std::sync::LazyLock<docsfab_boundary::Redactor> =
        std::sync::LazyLock::new(docsfab_boundary::Redactor::default);
    SHAPES_ONLY.line_capped(text.trim(), 4096)
}

pub fn or_dash<T: ToString>(v: Option<T>) -> String {
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
    let _ = writeln!(out, "  spent: {}, {}", r.usage, shown_cost(r.cost_usd));
    if let Some(t) = &r.truthfulness {
        let _ = writeln!(
            out,
            "  truthfulness: {} across {} judged step{}",
            shown_truthfulness(t),
            t.steps,
            if t.steps == 1 { "" } else { "s" }
        );
    }
    if let Some(from) = &r.resumed_from {
        let _ = writeln!(
            out,
            "  resumed from run {} (its finished steps carried over)",
            from.run_id
        );
    }
    // Once per run: the gateway its attempts came through and what it may have bent (issue 24).
    for line in crate::app::gateway::RunGateway::of_run(r)
        .iter()
        .flat_map(crate::app::gateway::RunGateway::lines)
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
        "Step {} ({}): {}, {} attempt{}, {}, {}",
        s.step_id,
        s.access.as_str(),
        s.status.as_str(),
        s.attempts.len(),
        if s.attempts.len() == 1 { "" } else { "s" },
        s.usage,
        shown_cost(s.cost_usd)
    );
    if let Some(t) = &s.truthfulness {
        let _ = writeln!(out, "  truthfulness: {}", shown_truthfulness(t));
    }
    if let Some(from) = &s.reused_from {
        let _ = writeln!(
            out,
            "  reused from run {} (step {}): its inputs were unchanged, no request was sent; its attempts are in that run's record",
            from.run_id, from.step_id
        );
    }
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

/// `12 of 13 cited names grounded (92.3%); 2 unknown names caught`: the figure of
/// docs/grounding.md.
fn shown_truthfulness(t: &docsfab_record::Truthfulness) -> String {
    let share = t
        .share
        .map_or_else(String::new, |s| format!(" ({:.1}%)", s * 100.0));
    let caught = match t.caught {
        0 => String::new(),
        n => format!("; {n} unknown name{} caught", if n == 1 { "" } else { "s" }),
    };
    format!(
        "{} of {} cited names grounded{share}{caught}",
        t.grounded, t.cited
    )
}

/// What a judged answer cited, and each name the workspace did not hold (docs/grounding.md).
fn render_grounding(out: &mut String, g: &docsfab_record::GroundingRecord) {
    let external = match g.external {
        0 => String::new(),
        n => format!(", {n} external"),
    };
    let _ = writeln!(
        out,
        "    grounding: {} of {} cited grounded{external}",
        g.grounded, g.cited
    );
    for u in &g.unknown {
        let near = match u.nearest.is_empty() {
            true => String::new(),
            false => format!(" (nearest: {})", u.nearest.join(", ")),
        };
        let _ = writeln!(
            out,
            "      unknown {} {} in {}, line {}{near}",
            u.kind,
            shown(&u.text),
            u.member,
            u.line
        );
    }
}

fn render_attempt(out: &mut String, a: &AttemptRecord) {
    let _ = writeln!(
        out,
        "  Attempt {} ({} budget): {}, {}, {}, {}",
        a.attempt,
        a.budget.as_str(),
        a.status.as_str(),
        human_duration(a.duration_ms),
        a.usage,
        shown_cost(a.cost_usd)
    );
    if let Some(g) = &a.gateway {
        let _ = writeln!(out, "    through the gateway {}", g.describe());
    }
    if let Some(c) = a.output_constraint {
        let _ = writeln!(out, "    structured output asked for: {}", c.as_str());
    }
    if let Some(g) = &a.grounding {
        render_grounding(out, g);
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
    for w in &t.warnings {
        let _ = writeln!(out, "      warning: {}", w.describe());
    }
}
