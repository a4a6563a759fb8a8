//! The pure half of the OpenTelemetry export: the wall-clock times of a run's progress events
//! ([`Timeline`]) joined with its stored record into a span tree and metric points ([`plan`]).
//! No exporter, no clock: the caller stamps the events and says when the run ended, so the
//! whole shape is testable without a collector.
//!
//! What goes out is chosen, never copied wholesale: names and enumerated values of the record
//! (statuses, budgets, classes, rules, codes), counts, token usage and times. No prompt, answer,
//! tool argument, workspace path or message text; the few free strings that do go out (rule,
//! code, failure class, tool call id) pass through the run's [`Redactor`] first.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use docsfab_boundary::redact::Redactor;
use docsfab_record::{
    Api, AttemptRecord, AttemptStatus, CallOutcome, CallResult, RejectReason, ReplayCause,
    ReplayRecord, RetryDecision, RunRecord, RunStatus, StepRecord, ToolCallEntry, TurnRecord,
    TurnStatus, Usage,
};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::executor::Progress;
use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;

/// A start and an end, each once seen (a fan-out instance reports its end but not its start).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Times {
    start: Option<SystemTime>,
    end: Option<SystemTime>,
}

impl Times {
    fn started(&mut self, now: SystemTime) {
        self.start.get_or_insert(now);
    }

    fn ended(&mut self, now: SystemTime) {
        self.end = Some(now);
    }
}

type AttemptKey = (String, u32);
type TurnKey = (String, u32, u32);

/// When each part of the run began and ended, as the progress events arrived.
#[derive(Debug, Default)]
pub struct Timeline {
    run_start: Option<SystemTime>,
    steps: HashMap<String, Times>,
    attempts: HashMap<AttemptKey, Times>,
    turns: HashMap<TurnKey, Times>,
    replays: HashMap<TurnKey, Vec<SystemTime>>,
}

impl Timeline {
    /// Stamps `event` with `now`. Called inline by the progress sink, so it only files times.
    pub fn observe(&mut self, event: &Progress, now: SystemTime) {
        match event {
            Progress::RunStarted { .. } => {
                self.run_start.get_or_insert(now);
            }
            Progress::StepStarted { step_id, .. } => {
                self.steps.entry(step_id.clone()).or_default().started(now);
            }
            // A reused step has no span of its own: its attempts are in the run it came from.
            Progress::StepReused { .. } => {}
            Progress::StepFinished { step_id, .. } => {
                self.steps.entry(step_id.clone()).or_default().ended(now);
            }
            Progress::AttemptStarted {
                step_id, attempt, ..
            } => {
                let key = (step_id.clone(), *attempt);
                self.attempts.entry(key).or_default().started(now);
            }
            Progress::AttemptFinished {
                step_id, attempt, ..
            } => {
                let key = (step_id.clone(), *attempt);
                self.attempts.entry(key).or_default().ended(now);
            }
            Progress::Turn {
                step_id,
                attempt,
                event,
            } => {
                let key = |turn: u32| (step_id.clone(), *attempt, turn);
                match event {
                    TurnEvent::Request { turn, .. } => {
                        self.turns.entry(key(*turn)).or_default().started(now);
                    }
                    TurnEvent::Replay { turn, .. } => {
                        self.replays.entry(key(*turn)).or_default().push(now);
                    }
                    TurnEvent::Finished { turn, .. } => {
                        self.turns.entry(key(*turn)).or_default().ended(now);
                    }
                    // A hold's length is in the record (`heldMs`, an attribute of the turn's
                    // chat span); its event adds no time of its own.
                    TurnEvent::Held { .. }
                    | TurnEvent::ThrottleUnavailable { .. }
                    | TurnEvent::Warning { .. } => {}
                }
            }
            Progress::Backoff { .. } => {}
        }
    }

    /// A step's times; a step whose start was not reported starts with its first attempt.
    fn step(&self, s: &StepRecord) -> Times {
        let mut t = self.steps.get(&s.step_id).copied().unwrap_or_default();
        if t.start.is_none() {
            t.start = s
                .attempts
                .iter()
                .filter_map(|a| self.attempts.get(&(s.step_id.clone(), a.attempt))?.start)
                .min();
        }
        t
    }
}

/// What the record does not say about the run's provider, from the run's configuration.
pub struct RunFacts {
    pub api: Api,
    /// The model the run asked for (`gen_ai.request.model`).
    pub model: String,
    /// The provider's host and port (`server.address`, `server.port`).
    pub server: Option<(String, u16)>,
    /// Built from the run's API key: every free string passes through it.
    pub redactor: Arc<Redactor>,
}

impl RunFacts {
    /// `gen_ai.provider.name`: the semantic conventions' name for the API docsfab spoke.
    fn provider_name(&self) -> &'static str {
        match self.api {
            Api::OpenaiChat => "openai",
            Api::AnthropicMessages => "anthropic",
        }
    }

    fn text(&self, s: &str) -> String {
        self.redactor.line_capped(s, 200)
    }
}

/// One span to export, with its children.
#[derive(Debug, Clone)]
pub struct PlannedSpan {
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<PlannedEvent>,
    /// Exported with status `Error`.
    pub failed: bool,
    pub children: Vec<PlannedSpan>,
}

impl PlannedSpan {
    /// This span and all below it.
    pub fn count(&self) -> usize {
        1 + self.children.iter().map(PlannedSpan::count).sum::<usize>()
    }
}

/// A span event (an in-turn replay).
#[derive(Debug, Clone)]
pub struct PlannedEvent {
    pub name: &'static str,
    pub at: SystemTime,
    pub attributes: Vec<KeyValue>,
}

/// The metric points of a run, each with its attributes.
#[derive(Debug, Default)]
pub struct MetricPoints {
    /// `gen_ai.client.operation.duration`: one per chat turn, in seconds.
    pub durations: Vec<(f64, Vec<KeyValue>)>,
    /// `gen_ai.client.token.usage`: input and output of each chat turn.
    pub tokens: Vec<(u64, Vec<KeyValue>)>,
    /// `docsfab.replays`: one per in-turn replay.
    pub replays: Vec<Vec<KeyValue>>,
    /// `docsfab.step_retries`: one per attempt whose failure scheduled another attempt.
    pub step_retries: Vec<Vec<KeyValue>>,
    /// `docsfab.steps`: one per step of the run, marked whether it was carried over from an
    /// earlier run, so a backend can read the reuse rate.
    pub steps: Vec<Vec<KeyValue>>,
}

/// The span name of the run span, and the `gen_ai.operation.name` values used.
pub const INVOKE_AGENT: &str = "invoke_agent";
pub const CHAT: &str = "chat";
pub const EXECUTE_TOOL: &str = "execute_tool";
/// The span event of an in-turn replay.
pub const REPLAY_EVENT: &str = "docsfab.replay";

/// The run's span tree (run > steps > attempts > chat turns > tool calls) and metric points.
/// Times come from `times`; a part with no stamped time (an event the run never sent) takes its
/// parent's, so the tree stays well nested. `run_end` is when the run returned.
pub fn plan(
    record: &RunRecord,
    times: &Timeline,
    facts: &RunFacts,
    run_end: SystemTime,
) -> (PlannedSpan, MetricPoints) {
    let run_start = times.run_start.unwrap_or(run_end).min(run_end);
    let mut points = MetricPoints::default();
    let children = record
        .steps
        .iter()
        .map(|s| step_span(s, times, facts, (run_start, run_end), &mut points))
        .collect();
    let mut attributes = vec![
        kv("gen_ai.operation.name", INVOKE_AGENT),
        kv("gen_ai.agent.name", facts.text(&record.composition)),
        kv("gen_ai.provider.name", facts.provider_name()),
        kv("gen_ai.request.model", facts.text(&facts.model)),
        kv("docsfab.run.id", record.run_id.clone()),
        kv("docsfab.run.status", record.status.as_str()),
    ];
    attributes.extend(usage_attributes(&record.usage, record.cost_usd));
    let reused = record
        .steps
        .iter()
        .filter(|s| s.reused_from.is_some())
        .count();
    attributes.push(int("docsfab.run.steps", record.steps.len() as u64));
    attributes.push(int("docsfab.run.reused_steps", reused as u64));
    if let Some(p) = &record.provider {
        attributes.push(kv("docsfab.provider.name", facts.text(&p.name)));
    }
    let failed = record.status != RunStatus::Succeeded;
    if failed {
        attributes.push(kv("error.type", record.status.as_str()));
    }
    let span = PlannedSpan {
        name: format!("{INVOKE_AGENT} {}", facts.text(&record.composition)),
        kind: SpanKind::Internal,
        start: run_start,
        end: run_end,
        attributes,
        events: Vec::new(),
        failed,
        children,
    };
    (span, points)
}

fn step_span(
    s: &StepRecord,
    times: &Timeline,
    facts: &RunFacts,
    parent: (SystemTime, SystemTime),
    points: &mut MetricPoints,
) -> PlannedSpan {
    let (start, end) = within(Some(&times.step(s)), parent, None);
    let mut attributes = vec![
        kv("docsfab.step.id", facts.text(&s.step_id)),
        kv("docsfab.step.access", s.access.as_str()),
        kv("docsfab.step.status", s.status.as_str()),
        int("docsfab.step.attempts", s.attempts.len() as u64),
        kv("docsfab.step.reused", s.reused_from.is_some()),
    ];
    points.steps.push(vec![
        kv("docsfab.step.reused", s.reused_from.is_some()),
        kv("docsfab.step.status", s.status.as_str()),
    ]);
    if let Some(f) = &s.for_each {
        attributes.push(kv("docsfab.step.for_each", facts.text(&f.step)));
        attributes.push(int("docsfab.step.index", u64::from(f.index)));
    }
    if let Some(f) = &s.failure {
        attributes.push(kv("error.type", facts.text(&f.category)));
    }
    let children = s
        .attempts
        .iter()
        .map(|a| attempt_span(s, a, times, facts, (start, end), points))
        .collect();
    PlannedSpan {
        name: format!("step {}", facts.text(&s.step_id)),
        kind: SpanKind::Internal,
        start,
        end,
        attributes,
        events: Vec::new(),
        failed: s.status != RunStatus::Succeeded,
        children,
    }
}

fn attempt_span(
    s: &StepRecord,
    a: &AttemptRecord,
    times: &Timeline,
    facts: &RunFacts,
    parent: (SystemTime, SystemTime),
    points: &mut MetricPoints,
) -> PlannedSpan {
    let key = (s.step_id.clone(), a.attempt);
    let recorded = Duration::from_millis(a.duration_ms);
    let (start, end) = within(times.attempts.get(&key), parent, Some(recorded));
    let decision = decision_str(a.retry.decision);
    let mut attributes = vec![
        int("docsfab.attempt", u64::from(a.attempt)),
        kv("docsfab.attempt.status", a.status.as_str()),
        kv("docsfab.retry.budget", a.budget.as_str()),
        kv("docsfab.retry.decision", decision),
    ];
    attributes.extend(usage_attributes(&a.usage, a.cost_usd));
    let rule = a.retry_rule.as_deref().map(|r| facts.text(r));
    if let Some(r) = &rule {
        attributes.push(kv("docsfab.retry.rule", r.clone()));
    }
    if let Some(w) = a.wait_ms {
        attributes.push(int("docsfab.retry.wait_ms", w));
    }
    let error = error_type(a).map(|c| facts.text(&c));
    for (key, value) in [
        ("docsfab.failure.category", &a.failure_category),
        ("docsfab.failure.class", &a.failure_class),
        ("docsfab.failure.code", &a.code),
    ] {
        if let Some(v) = value {
            attributes.push(kv(key, facts.text(v)));
        }
    }
    if let Some(e) = &error {
        attributes.push(kv("error.type", e.clone()));
    }
    if let Some(p) = a.provider_error_class {
        attributes.push(kv("docsfab.provider_error_class", p.as_str()));
    }
    if let Some(h) = a.http_status {
        attributes.push(int("http.response.status_code", u64::from(h)));
    }
    if let Some(r) = a.retry_after_ms {
        attributes.push(int("docsfab.retry_after_ms", r));
    }
    if a.retry.decision == RetryDecision::Scheduled {
        points.step_retries.push(vec![
            kv("error.type", error.clone().unwrap_or_default()),
            kv("docsfab.retry.rule", rule.clone().unwrap_or_default()),
        ]);
    }
    let last_turn = a.turns.last().map(|t| t.turn);
    let children = a
        .turns
        .iter()
        .map(|t| {
            let failure = if Some(t.turn) == last_turn {
                a.provider_error_class.map(|c| c.as_str())
            } else {
                None
            };
            chat_span(&key, t, failure, times, facts, (start, end), points)
        })
        .collect();
    PlannedSpan {
        name: format!("attempt {}", a.attempt),
        kind: SpanKind::Internal,
        start,
        end,
        attributes,
        events: Vec::new(),
        failed: error.is_some(),
        children,
    }
}

/// `error.type` of a failed attempt, the most specific class the record gives: the provider
/// error class (`rate-limit`), else the failure code (`contract-prose`), else the category,
/// else the status (a cancelled attempt).
fn error_type(a: &AttemptRecord) -> Option<String> {
    if a.status == AttemptStatus::Succeeded {
        return None;
    }
    Some(
        a.provider_error_class
            .map(|c| c.as_str().to_owned())
            .or_else(|| a.code.clone())
            .or_else(|| a.failure_category.clone())
            .unwrap_or_else(|| a.status.as_str().to_owned()),
    )
}

fn chat_span(
    key: &AttemptKey,
    t: &TurnRecord,
    provider_failure: Option<&'static str>,
    times: &Timeline,
    facts: &RunFacts,
    parent: (SystemTime, SystemTime),
    points: &mut MetricPoints,
) -> PlannedSpan {
    let turn_key = (key.0.clone(), key.1, t.turn);
    let (start, end) = within(times.turns.get(&turn_key), parent, None);
    let mut common = vec![
        kv("gen_ai.operation.name", CHAT),
        kv("gen_ai.provider.name", facts.provider_name()),
        kv("gen_ai.request.model", facts.text(&facts.model)),
    ];
    if let Some((host, port)) = &facts.server {
        common.push(kv("server.address", host.clone()));
        common.push(int("server.port", u64::from(*port)));
    }
    let error_type = match t.status {
        TurnStatus::Completed => None,
        _ => Some(provider_failure.unwrap_or(t.status.as_str())),
    };
    if let Some(e) = error_type {
        common.push(kv("error.type", e));
    }
    points.durations.push((
        end.duration_since(start).unwrap_or_default().as_secs_f64(),
        common.clone(),
    ));
    // An unknown count is no data point: 0 would read as free.
    for (kind, n) in [
        ("input", t.usage.input_tokens),
        ("output", t.usage.output_tokens),
    ]
    .into_iter()
    .filter_map(|(kind, n)| Some((kind, n?)))
    {
        let mut attrs: Vec<KeyValue> = common
            .iter()
            .filter(|k| k.key.as_str() != "error.type")
            .cloned()
            .collect();
        attrs.push(kv("gen_ai.token.type", kind));
        points.tokens.push((n, attrs));
    }
    let stamps = times.replays.get(&turn_key);
    let events = t
        .replays
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let at = stamps
                .and_then(|s| s.get(i).copied())
                .unwrap_or(start)
                .clamp(start, end);
            points.replays.push(vec![kv(
                "docsfab.replay.class",
                r.provider_error_class.as_str(),
            )]);
            replay_event(r, at)
        })
        .collect();
    let mut attributes = common;
    attributes.extend(usage_attributes(&t.usage, t.cost_usd));
    attributes.extend([
        int("docsfab.turn", u64::from(t.turn)),
        kv("docsfab.turn.status", t.status.as_str()),
        int("docsfab.replays", t.replays.len() as u64),
        int("docsfab.throttle.held_ms", t.held_ms),
    ]);
    let children = t
        .tool_batch
        .calls
        .iter()
        .map(|c| tool_span(c, end, facts))
        .collect();
    PlannedSpan {
        name: format!("{CHAT} {}", facts.text(&facts.model)),
        kind: SpanKind::Client,
        start,
        end,
        attributes,
        events,
        failed: error_type.is_some(),
        children,
    }
}

fn replay_event(r: &ReplayRecord, at: SystemTime) -> PlannedEvent {
    let mut attributes = vec![
        kv("docsfab.replay.class", r.provider_error_class.as_str()),
        int("docsfab.replay.wait_ms", r.wait_ms),
    ];
    match r.cause {
        ReplayCause::Status(s) => attributes.push(int("http.response.status_code", u64::from(s))),
        ReplayCause::Fault(f) => attributes.push(kv("docsfab.replay.fault", f.as_str())),
    }
    if let Some(ra) = r.retry_after_ms {
        attributes.push(int("docsfab.replay.retry_after_ms", ra));
    }
    PlannedEvent {
        name: REPLAY_EVENT,
        at,
        attributes,
    }
}

/// A tool call. The runtime reports a turn's end after its tool batch ran and does not time
/// calls one by one, so each call is a zero-length span at its turn's end. A tool the step does
/// not offer is named `unknown`: that name is whatever the model wrote.
fn tool_span(c: &ToolCallEntry, at: SystemTime, facts: &RunFacts) -> PlannedSpan {
    let unknown = matches!(
        c.outcome,
        CallOutcome::Rejected {
            reason: RejectReason::UnknownTool,
            ..
        }
    );
    let name = if unknown {
        "unknown".to_owned()
    } else {
        facts.text(&c.tool)
    };
    let (outcome, error) = match &c.outcome {
        CallOutcome::Rejected { reason, .. } => ("rejected", Some(reject_str(*reason))),
        CallOutcome::Refused { .. } => ("refused", Some("refused")),
        CallOutcome::Executed {
            result: Some(CallResult::ToolError),
        } => ("executed", Some("tool-error")),
        CallOutcome::Executed { result: None } => ("executed", Some("no-result")),
        CallOutcome::Executed { .. } => ("executed", None),
    };
    let mut attributes = vec![
        kv("gen_ai.operation.name", EXECUTE_TOOL),
        kv("gen_ai.tool.name", name.clone()),
        kv("gen_ai.tool.call.id", facts.text(&c.id)),
        kv("docsfab.tool.outcome", outcome),
    ];
    if let Some(e) = error {
        attributes.push(kv("error.type", e));
    }
    PlannedSpan {
        name: format!("{EXECUTE_TOOL} {name}"),
        kind: SpanKind::Internal,
        start: at,
        end: at,
        attributes,
        events: Vec::new(),
        failed: error.is_some(),
        children: Vec::new(),
    }
}

/// The part's stamped interval, else its parent's (an attempt without stamps runs for its
/// recorded duration from its parent's start); always inside the parent and never reversed.
fn within(
    stamped: Option<&Times>,
    parent: (SystemTime, SystemTime),
    recorded: Option<Duration>,
) -> (SystemTime, SystemTime) {
    let start = stamped
        .and_then(|t| t.start)
        .unwrap_or(parent.0)
        .clamp(parent.0, parent.1);
    let end = stamped
        .and_then(|t| t.end)
        .or_else(|| recorded.map(|d| start + d))
        .unwrap_or(parent.1)
        .clamp(start, parent.1.max(start));
    (start, end)
}

fn decision_str(d: RetryDecision) -> &'static str {
    match d {
        RetryDecision::None => "none",
        RetryDecision::Scheduled => "scheduled",
        RetryDecision::Exhausted => "exhausted",
        RetryDecision::Terminal => "terminal",
        RetryDecision::Declined => "declined",
    }
}

fn reject_str(r: RejectReason) -> &'static str {
    match r {
        RejectReason::UnknownTool => "unknown-tool",
        RejectReason::InvalidArguments => "invalid-arguments",
        RejectReason::TruncatedArguments => "truncated-arguments",
        RejectReason::SchemaMismatch => "schema-mismatch",
    }
}

fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

/// The `gen_ai.usage.*` attributes of what was reported or estimated; a count nobody knows is
/// left out (OpenTelemetry has no null, and 0 would read as free). Cache parts, the estimate
/// mark and the cost are docsfab's own.
fn usage_attributes(u: &Usage, cost_usd: Option<f64>) -> Vec<KeyValue> {
    let mut out = Vec::new();
    if let Some(n) = u.input_tokens {
        out.push(int("gen_ai.usage.input_tokens", n));
    }
    if let Some(n) = u.output_tokens {
        out.push(int("gen_ai.usage.output_tokens", n));
    }
    if u.cache_read_tokens > 0 {
        out.push(int("docsfab.usage.cache_read_tokens", u.cache_read_tokens));
    }
    if u.cache_write_tokens > 0 {
        out.push(int(
            "docsfab.usage.cache_write_tokens",
            u.cache_write_tokens,
        ));
    }
    if u.estimated {
        out.push(kv("docsfab.usage.estimated", true));
    }
    if let Some(c) = cost_usd {
        out.push(kv("docsfab.cost_usd", c));
    }
    out
}

/// An integer attribute (OTLP integers are signed; record counts never come near the limit).
fn int(key: &'static str, value: u64) -> KeyValue {
    KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_record::{Access, Budget};

    /// The demo's golden record, its placeholders filled in.
    fn demo_record() -> RunRecord {
        let text = include_str!("../../../tests/fixtures/demo-record.golden.json");
        let mut value: serde_json::Value = serde_json::from_str(text).unwrap();
        fill(&mut value);
        serde_json::from_value(value).unwrap()
    }

    fn fill(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (key, item) in map.iter_mut() {
                    if key == "durationMs" && item.is_string() {
                        *item = 250.into();
                    } else {
                        fill(item);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(fill),
            _ => {}
        }
    }

    fn facts() -> RunFacts {
        RunFacts {
            api: Api::OpenaiChat,
            model: "demo-model".into(),
            server: Some(("127.0.0.1".into(), 4000)),
            redactor: Arc::new(Redactor::new(&["CnryK3y-7h2Qx9"])),
        }
    }

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(ms)
    }

    fn value(s: &PlannedSpan, key: &str) -> Option<String> {
        s.attributes
            .iter()
            .find(|k| k.key.as_str() == key)
            .map(|k| k.value.to_string())
    }

    /// Every span inside its parent's interval, and no span reversed.
    fn assert_nested(s: &PlannedSpan) {
        assert!(s.start <= s.end, "{} reversed", s.name);
        for c in &s.children {
            assert!(
                s.start <= c.start && c.end <= s.end,
                "{} outside {}",
                c.name,
                s.name
            );
            assert_nested(c);
        }
        for e in &s.events {
            assert!(s.start <= e.at && e.at <= s.end, "event outside {}", s.name);
        }
    }

    #[test]
    fn issue13_the_demo_record_plans_run_steps_attempts_turns_and_tools() {
        let record = demo_record();
        let (run, points) = plan(&record, &Timeline::default(), &facts(), at(9_000));
        assert_nested(&run);
        assert_eq!(run.name, "invoke_agent quickstart");
        let outline = &run.children[0];
        assert_eq!(outline.name, "step outline");
        let budgets: Vec<String> = outline
            .children
            .iter()
            .map(|a| value(a, "docsfab.retry.budget").unwrap())
            .collect();
        assert_eq!(
            budgets,
            [Budget::Initial, Budget::Transport, Budget::Contract].map(|b| b.as_str().to_owned())
        );
        let a1 = &outline.children[0];
        assert_eq!(value(a1, "error.type").unwrap(), "stream-incomplete");
        assert_eq!(
            value(a1, "docsfab.failure.code").unwrap(),
            "provider-stream-incomplete"
        );
        assert_eq!(
            value(&outline.children[1], "error.type").unwrap(),
            "contract-prose"
        );
        let t1 = &a1.children[0];
        assert_eq!(
            (t1.name.as_str(), t1.kind.clone()),
            ("chat demo-model", SpanKind::Client)
        );
        assert_eq!(t1.events.len(), 3);
        assert_eq!(t1.children[0].name, "execute_tool list_files");
        // A failed attempt's last turn carries the attempt's provider class.
        assert_eq!(
            value(&a1.children[2], "error.type").unwrap(),
            "stream-incomplete"
        );
        assert_eq!(points.replays.len(), 4);
        // run, 2 steps, 4 attempts, 10 turns, 6 tool calls
        assert_eq!(run.count(), 23);
        assert_eq!(points.step_retries.len(), 2);
        let turns = record
            .steps
            .iter()
            .flat_map(|s| &s.attempts)
            .flat_map(|a| &a.turns)
            .count();
        assert_eq!(points.durations.len(), turns);
        assert_eq!(points.tokens.len(), 2 * turns);
        assert_eq!(run.children[1].children[0].children[0].children.len(), 1);
        assert_eq!(
            value(&run.children[1], "docsfab.step.access").unwrap(),
            Access::Write.as_str()
        );
    }

    #[test]
    fn issue13_no_path_message_or_content_goes_into_an_attribute() {
        let record = demo_record();
        let (run, _) = plan(&record, &Timeline::default(), &facts(), at(1));
        fn walk(s: &PlannedSpan, out: &mut Vec<String>) {
            out.extend(s.attributes.iter().map(|k| k.value.to_string()));
            for e in &s.events {
                out.extend(e.attributes.iter().map(|k| k.value.to_string()));
            }
            s.children.iter().for_each(|c| walk(c, out));
        }
        let mut values = Vec::new();
        walk(&run, &mut values);
        for v in &values {
            assert!(!v.contains("src/") && !v.contains("docs/"), "a path: {v}");
            assert!(
                !v.contains("stream closed") && !v.contains("modules"),
                "text: {v}"
            );
        }
    }

    #[test]
    fn issue13_stamped_events_give_the_spans_their_times() {
        let record = demo_record();
        let mut t = Timeline::default();
        let turn = |step: &str, attempt, event| Progress::Turn {
            step_id: step.into(),
            attempt,
            event,
        };
        t.observe(&Progress::RunStarted { run_id: "r".into() }, at(0));
        // No StepStarted (as for a fan-out instance): the step starts with its first attempt.
        t.observe(
            &Progress::StepFinished {
                step_id: "outline".into(),
                status: RunStatus::Succeeded,
            },
            at(4_000),
        );
        t.observe(
            &Progress::AttemptStarted {
                step_id: "outline".into(),
                attempt: 1,
                budget: Budget::Initial,
            },
            at(20),
        );
        let request = TurnEvent::Request {
            turn: 1,
            digest: String::new(),
            payload: Default::default(),
        };
        t.observe(&turn("outline", 1, request), at(30));
        let replay = record.steps[0].attempts[0].turns[0].replays[0];
        let entry = TurnEvent::Replay {
            turn: 1,
            entry: docsfab_provider::ReplayEntry {
                cause: replay.cause,
                provider_error_class: replay.provider_error_class,
                wait_ms: replay.wait_ms,
                retry_after_ms: replay.retry_after_ms,
                window: docsfab_policy::replay::Window::General,
                held_ms: replay.held_ms,
            },
        };
        t.observe(&turn("outline", 1, entry), at(130));
        let finished = TurnEvent::Finished {
            turn: 1,
            status: TurnStatus::Completed,
            requested: 1,
            rejected: 0,
            executed: 1,
            calls: Vec::new(),
            reason: None,
        };
        t.observe(&turn("outline", 1, finished), at(900));
        let (run, points) = plan(&record, &t, &facts(), at(5_000));
        assert_nested(&run);
        assert_eq!(run.start, at(0));
        assert_eq!(
            (run.children[0].start, run.children[0].end),
            (at(20), at(4_000))
        );
        let a1 = &run.children[0].children[0];
        assert_eq!(a1.start, at(20));
        // Not finished in the timeline: the recorded 250 ms.
        assert_eq!(a1.end, at(270));
        let t1 = &a1.children[0];
        assert_eq!((t1.start, t1.events[0].at), (at(30), at(130)));
        // The turn's end is clamped into the attempt's recorded interval.
        assert_eq!(t1.end, at(270));
        assert_eq!(t1.children[0].start, t1.end);
        assert!((points.durations[0].0 - 0.24).abs() < 1e-9);
    }
}
