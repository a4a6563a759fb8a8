//! `docsfab runs stats`: the pure parts of the command — its `--since` flag and the readable
//! rendering. The figures are `docsfab_runtime::stats`; `runs` reads the records from the
//! store (one read per admitted run: thousands of runs take a moment, and no second copy of the
//! figures has to be kept in step with the records).

use std::fmt::Write as _;
use std::time::Duration;

use docsfab_runtime::progress::human_duration;
use docsfab_runtime::stats::{Counts, Stats, UNKNOWN_PROVIDER};

use crate::app::error::CliError;

/// `--since`: `7d`, `24h`, `90m` or `30s`, a whole positive number and one unit.
pub fn parse_since(text: &str) -> Result<Duration, CliError> {
    let bad = || {
        CliError::bad_input(format!(
            "--since {text:?} is not a duration; give a whole number and a unit s, m, h or d, for example 7d, 24h or 90m."
        ))
    };
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (digits, unit) = text.split_at_checked(split).ok_or_else(bad)?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = digits
        .parse()
        .ok()
        .filter(|n| *n > 0 && digits.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(bad)?;
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// `rate-limit 2, server 4`, or `none`.
fn counts(c: &Counts) -> String {
    if c.is_empty() {
        return "none".to_owned();
    }
    c.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `0 faults: 5 turns, 2 faults: 1 turn`.
fn bursts(b: &std::collections::BTreeMap<u32, u64>) -> String {
    if b.is_empty() {
        return "none".to_owned();
    }
    let plural = |n: u64, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    b.iter()
        .map(|(len, n)| {
            format!(
                "{}: {}",
                plural(u64::from(*len), "fault"),
                plural(*n, "turn")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The readable view.
pub fn render(s: &Stats) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Runs: {} (by provider: {})",
        s.runs,
        counts(&s.runs_by_provider)
    );
    if s.runs == 0 {
        out.push_str("No recorded run matches; `docsfab runs list` shows what the store holds.\n");
        return out;
    }
    let _ = writeln!(
        out,
        "Requests: {} in {} turns, {} attempts, {} steps",
        s.requests, s.turns, s.attempts, s.steps
    );
    let _ = writeln!(out, "{}", reuse_line(s));
    let _ = writeln!(
        out,
        "In-turn replays: {}; by class: {}; by cause: {}",
        s.replays.total,
        counts(&s.replays.by_class),
        counts(&s.replays.by_cause)
    );
    let _ = writeln!(
        out,
        "Step retries: {}; by class: {}; by rule: {}",
        s.step_retries.total,
        counts(&s.step_retries.by_class),
        counts(&s.step_retries.by_rule)
    );
    let _ = writeln!(
        out,
        "Steps that exhausted a budget: {}; by rule: {}",
        s.exhausted_steps.total,
        counts(&s.exhausted_steps.by_rule)
    );
    let _ = writeln!(
        out,
        "Faults in a row within a turn, before an answer: {}",
        bursts(&s.fault_bursts.before_success)
    );
    let _ = writeln!(
        out,
        "Faults in a row within a turn, before it gave up: {}",
        bursts(&s.fault_bursts.before_give_up)
    );
    out.push_str("Another 429 after a 429, by the wait before the next request:\n");
    for b in &s.rate_limit_repeats {
        let share = match b.probability {
            Some(p) => format!("{} of {} ({:.0} %)", b.another_429, b.after_429, p * 100.0),
            None => "no sample".to_owned(),
        };
        let _ = writeln!(out, "  {:<6} {share}", b.wait);
    }
    let w = &s.waiting_ms;
    let _ = writeln!(
        out,
        "Waiting: {} in replay waits, {} in step backoffs, {} held by the provider throttle ({} in all)",
        human_duration(w.replay_waits),
        human_duration(w.step_backoffs),
        human_duration(w.throttle_holds),
        human_duration(w.total)
    );
    for (what, t) in [
        ("all attempts", &s.spent),
        ("attempts that failed", &s.failed_attempt_tokens),
        ("step retries", &s.retry_attempt_tokens),
    ] {
        let _ = writeln!(out, "Spent by {what}: {}", spent_line(t));
    }
    if let Some(n) = s.runs_by_provider.get(UNKNOWN_PROVIDER) {
        let _ = writeln!(
            out,
            "note: {n} run(s) were recorded before records named their provider; they count under {UNKNOWN_PROVIDER}."
        );
    }
    out
}

/// `Reused steps: 2 of 5 (40 %), carried over by 1 run(s)`: steps taken from an earlier run
/// instead of run.
fn reuse_line(s: &Stats) -> String {
    let share = s
        .reuse_rate
        .map_or_else(String::new, |r| format!(" ({:.0} %)", r * 100.0));
    format!(
        "Reused steps: {} of {}{share}, carried over by {} run(s)",
        s.reused_steps, s.steps, s.runs_with_reused_steps
    )
}

/// One spend total: the known sums, what is not in them and why, and the cost.
fn spent_line(t: &docsfab_runtime::stats::Tokens) -> String {
    let mut line = format!(
        "{} input, {} output tokens over {} attempt(s)",
        t.input_tokens, t.output_tokens, t.attempts
    );
    if t.cache_read_tokens > 0 || t.cache_write_tokens > 0 {
        line.push_str(&format!(
            " (cache read {}, write {})",
            t.cache_read_tokens, t.cache_write_tokens
        ));
    }
    if t.unknown_usage_attempts > 0 {
        line.push_str(&format!(
            "; {} attempt(s) with unknown usage are not in these sums",
            t.unknown_usage_attempts
        ));
    }
    if t.estimated_attempts > 0 {
        line.push_str(&format!("; {} estimated in part", t.estimated_attempts));
    }
    line.push_str(&match t.cost_usd {
        Some(c) => format!("; ${c:.6}"),
        None => "; cost unknown".to_owned(),
    });
    if t.cost_usd.is_some() && t.unpriced_attempts > 0 {
        line.push_str(&format!(
            " ({} attempt(s) without a cost)",
            t.unpriced_attempts
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue13_since_takes_a_number_and_a_unit() {
        assert_eq!(parse_since("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_since("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_since("90m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_since("30s").unwrap(), Duration::from_secs(30));
        for bad in [
            "",
            "d",
            "7",
            "0d",
            "-1h",
            "+1h",
            "1.5h",
            "7w",
            "7 d",
            "99999999999999999d",
        ] {
            assert!(parse_since(bad).is_err(), "{bad:?}");
        }
    }
}
