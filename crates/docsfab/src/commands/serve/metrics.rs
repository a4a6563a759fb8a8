//! `GET /metrics`: Prometheus text exposition. Run counts by status come from the store (every
//! process sharing it sees the same); the throttle holds, replays and step retries are counted
//! from the records of the runs this process finished, through `runs stats`' own figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use docsfab_runtime::record::{RunRecord, RunStatus};
use docsfab_runtime::stats::{Filter, Stats};

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
    out
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
}
