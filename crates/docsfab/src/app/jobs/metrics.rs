//! `GET /metrics`: Prometheus text exposition. Run counts by status come from the store (every
//! process sharing it sees the same); the throttle holds, replays, step retries, spend and
//! reuse are counted from the records of the runs this process finished, through `runs stats`'
//! own figures.
//!
//! Spend is labelled by the provider (host.yaml's name) and model each record names. Usage that
//! is unknown is never read as 0: those attempts are left out of the token sums and counted in
//! a family of their own, and a provider and model without any cost get no cost series at all.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use docsfab_record::round_usd;
use docsfab_record::{RunRecord, RunStatus};
use docsfab_runtime::stats::{Filter, Stats, Tokens, UNKNOWN_PROVIDER, provider_of};

/// Sums over the records of the runs this process finished.
#[derive(Debug, Default)]
pub struct Counters {
    inner: Mutex<Sums>,
}

#[derive(Debug, Default, Clone)]
struct Sums {
    held_turns: u64,
    held_ms: u64,
    replays: BTreeMap<String, u64>,
    step_retries: BTreeMap<String, u64>,
    /// By (provider, model).
    spend: BTreeMap<(String, String), Spend>,
    runs: u64,
    runs_with_reused_steps: u64,
    steps: u64,
    reused_steps: u64,
}

/// What the attempts of one provider and model spent.
#[derive(Debug, Default, Clone)]
struct Spend {
    /// Attempts whose usage is known: the token series exist only when some did.
    known_usage_attempts: u64,
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    unknown_usage_attempts: u64,
    estimated_attempts: u64,
    /// `None` until some attempt had a cost.
    cost_usd: Option<f64>,
    unpriced_attempts: u64,
}

impl Spend {
    fn add(&mut self, t: &Tokens) {
        self.known_usage_attempts += t.attempts - t.unknown_usage_attempts;
        self.input += t.input_tokens;
        self.output += t.output_tokens;
        self.cache_read += t.cache_read_tokens;
        self.cache_write += t.cache_write_tokens;
        self.unknown_usage_attempts += t.unknown_usage_attempts;
        self.estimated_attempts += t.estimated_attempts;
        self.unpriced_attempts += t.unpriced_attempts;
        if let Some(c) = t.cost_usd {
            self.cost_usd = Some(round_usd(self.cost_usd.unwrap_or(0.0) + c));
        }
    }
}

impl Counters {
    pub fn add_record(&self, record: &RunRecord) {
        let stats = Stats::from_records([record], &Filter::default());
        let held_turns = record
            .steps
            .iter()
            .flat_map(|s| &s.attempts)
            .flat_map(|a| &a.turns)
            .filter(|t| t.held_ms > 0)
            .count() as u64;
        let mut sums = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        sums.held_turns += held_turns;
        sums.held_ms += stats.waiting_ms.throttle_holds;
        for (class, n) in &stats.replays.by_class {
            *sums.replays.entry(class.clone()).or_default() += n;
        }
        for (class, n) in &stats.step_retries.by_class {
            *sums.step_retries.entry(class.clone()).or_default() += n;
        }
        if stats.spent.attempts > 0 {
            let model = record.model.as_deref().unwrap_or(UNKNOWN_PROVIDER);
            let key = (provider_of(record).to_owned(), model.to_owned());
            sums.spend.entry(key).or_default().add(&stats.spent);
        }
        sums.runs += stats.runs;
        sums.runs_with_reused_steps += stats.runs_with_reused_steps;
        sums.steps += stats.steps;
        sums.reused_steps += stats.reused_steps;
    }

    fn snapshot(&self) -> Sums {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The exposition text.
pub fn render(counts: &[(RunStatus, u64)], running_here: u64, counters: &Counters) -> String {
    let sums = counters.snapshot();
    let mut out = String::new();
    family(
        &mut out,
        "docsfab_runs",
        "gauge",
        "Runs in the store by status (queued: submitted, not yet claimed).",
    );
    // Every status, zeros included, whatever the backend lists.
    for status in RunStatus::ALL {
        let n = counts
            .iter()
            .filter(|(s, _)| *s == status)
            .map(|(_, n)| n)
            .sum::<u64>();
        let _ = writeln!(out, "docsfab_runs{{status=\"{}\"}} {n}", status.as_str());
    }
    family(
        &mut out,
        "docsfab_jobs_running_here",
        "gauge",
        "Runs this process is running now.",
    );
    let _ = writeln!(out, "docsfab_jobs_running_here {running_here}");
    family(
        &mut out,
        "docsfab_throttle_held_turns_total",
        "counter",
        "Turns the shared provider throttle held, in runs this process finished.",
    );
    let _ = writeln!(out, "docsfab_throttle_held_turns_total {}", sums.held_turns);
    family(
        &mut out,
        "docsfab_throttle_held_seconds_total",
        "counter",
        "Seconds requests waited for the shared provider throttle, in runs this process finished.",
    );
    let _ = writeln!(
        out,
        "docsfab_throttle_held_seconds_total {}",
        sums.held_ms as f64 / 1000.0
    );
    by_class(
        &mut out,
        "docsfab_replays_total",
        "In-turn replays by provider error class, in runs this process finished.",
        &sums.replays,
    );
    by_class(
        &mut out,
        "docsfab_step_retries_total",
        "Step retries by failure class, in runs this process finished.",
        &sums.step_retries,
    );
    spend_families(&mut out, &sums.spend);
    reuse_families(&mut out, &sums);
    out
}

/// Tokens, cost and the attempts left out of them, by provider and model.
fn spend_families(out: &mut String, spend: &BTreeMap<(String, String), Spend>) {
    let labels = |(provider, model): &(String, String)| {
        format!(
            "provider=\"{}\",model=\"{}\"",
            label_value(provider),
            label_value(model)
        )
    };
    family(
        out,
        "docsfab_tokens_total",
        "counter",
        "Tokens of attempts whose usage is known, failed attempts included, by provider, model and direction (input counts its cached parts too), in runs this process finished.",
    );
    let known = || spend.iter().filter(|(_, s)| s.known_usage_attempts > 0);
    for (key, s) in known() {
        for (direction, n) in [("input", s.input), ("output", s.output)] {
            let _ = writeln!(
                out,
                "docsfab_tokens_total{{{},direction=\"{direction}\"}} {n}",
                labels(key)
            );
        }
    }
    family(
        out,
        "docsfab_cache_tokens_total",
        "counter",
        "Input tokens that read or wrote the provider's prompt cache (parts of docsfab_tokens_total's input), in runs this process finished.",
    );
    for (key, s) in known() {
        for (operation, n) in [("read", s.cache_read), ("write", s.cache_write)] {
            let _ = writeln!(
                out,
                "docsfab_cache_tokens_total{{{},operation=\"{operation}\"}} {n}",
                labels(key)
            );
        }
    }
    family(
        out,
        "docsfab_cost_usd_total",
        "counter",
        "Cost in US dollars of attempts with a cost, failed attempts included; absent for a provider and model without any price, in runs this process finished.",
    );
    for (key, s) in spend {
        if let Some(c) = s.cost_usd {
            let _ = writeln!(out, "docsfab_cost_usd_total{{{}}} {c}", labels(key));
        }
    }
    for (name, help, pick) in ATTEMPT_COUNTS {
        family(out, name, "counter", help);
        for (key, s) in spend {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(key), pick(s));
        }
    }
}

/// The attempt counts beside the sums: name, help, and the figure.
type AttemptCount = (&'static str, &'static str, fn(&Spend) -> u64);
const ATTEMPT_COUNTS: [AttemptCount; 3] = [
    (
        "docsfab_unknown_usage_attempts_total",
        "Attempts whose usage is unknown, so not in docsfab_tokens_total or the cost, in runs this process finished.",
        |s| s.unknown_usage_attempts,
    ),
    (
        "docsfab_estimated_usage_attempts_total",
        "Attempts whose usage docsfab estimated in part (a request cut before its usage), in runs this process finished.",
        |s| s.estimated_attempts,
    ),
    (
        "docsfab_unpriced_attempts_total",
        "Attempts without a cost (no pricing set, or usage unknown), so not in docsfab_cost_usd_total, in runs this process finished.",
        |s| s.unpriced_attempts,
    ),
];

/// Runs and steps finished here, and those carried over from an earlier run.
fn reuse_families(out: &mut String, sums: &Sums) {
    let plain: [(&str, &str, u64); 4] = [
        (
            "docsfab_finished_runs_total",
            "Runs this process finished.",
            sums.runs,
        ),
        (
            "docsfab_runs_with_reused_steps_total",
            "Runs this process finished that carried at least one step over from an earlier run.",
            sums.runs_with_reused_steps,
        ),
        (
            "docsfab_finished_steps_total",
            "Steps of the runs this process finished, reused ones included.",
            sums.steps,
        ),
        (
            "docsfab_reused_steps_total",
            "Steps carried over from an earlier run instead of run (reusedFrom), in runs this process finished.",
            sums.reused_steps,
        ),
    ];
    for (name, help, n) in plain {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {n}");
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn by_class(out: &mut String, name: &str, help: &str, counts: &BTreeMap<String, u64>) {
    family(out, name, "counter", help);
    for (class, n) in counts {
        let _ = writeln!(out, "{name}{{class=\"{}\"}} {n}", label_value(class));
    }
}

/// A label value as the exposition format wants it: backslash, quote and newline escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_metrics_families_have_help_and_type_and_escape_labels() {
        let c = Counters::default();
        c.inner.lock().unwrap().replays.insert("ser\"ver".into(), 2);
        let text = render(&[(RunStatus::Succeeded, 3)], 1, &c);
        assert!(text.contains("# TYPE docsfab_runs gauge\n"));
        assert!(text.contains("docsfab_runs{status=\"succeeded\"} 3\n"));
        assert!(text.contains("docsfab_runs{status=\"queued\"} 0\n"));
        assert!(text.contains("docsfab_replays_total{class=\"ser\\\"ver\"} 2\n"));
        assert!(text.contains("docsfab_throttle_held_seconds_total 0\n"));
    }

    /// Issue 34: a provider and model without any cost has no cost series (not 0), one whose
    /// usage was never known has no token series, and attempts of unknown usage are counted
    /// apart.
    #[test]
    fn issue34_spend_series_leave_unknowns_out_of_the_sums() {
        let c = Counters::default();
        {
            let mut sums = c.inner.lock().unwrap();
            sums.spend.insert(
                ("default".into(), "m".into()),
                Spend {
                    known_usage_attempts: 1,
                    input: 120,
                    output: 8,
                    cache_read: 20,
                    cost_usd: Some(0.0012),
                    ..Spend::default()
                },
            );
            sums.spend.insert(
                ("local".into(), "(unknown)".into()),
                Spend {
                    unknown_usage_attempts: 2,
                    unpriced_attempts: 2,
                    ..Spend::default()
                },
            );
            (sums.steps, sums.reused_steps) = (3, 1);
        }
        let text = render(&[], 0, &c);
        for line in [
            "docsfab_tokens_total{provider=\"default\",model=\"m\",direction=\"input\"} 120\n",
            "docsfab_tokens_total{provider=\"default\",model=\"m\",direction=\"output\"} 8\n",
            "docsfab_cache_tokens_total{provider=\"default\",model=\"m\",operation=\"read\"} 20\n",
            "docsfab_cost_usd_total{provider=\"default\",model=\"m\"} 0.0012\n",
            "docsfab_unknown_usage_attempts_total{provider=\"local\",model=\"(unknown)\"} 2\n",
            "docsfab_unknown_usage_attempts_total{provider=\"default\",model=\"m\"} 0\n",
            "# TYPE docsfab_cost_usd_total counter\n",
            "docsfab_finished_steps_total 3\n",
            "docsfab_reused_steps_total 1\n",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
        for absent in [
            "docsfab_cost_usd_total{provider=\"local\"",
            "docsfab_tokens_total{provider=\"local\"",
        ] {
            assert!(!text.contains(absent), "{absent} in:\n{text}");
        }
    }
}
