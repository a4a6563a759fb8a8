//! Many steps of one policy, summed into the figures `docsfab sim goodput` prints.

use serde::Serialize;

use crate::model::FaultModel;
use crate::policy::Policy;
use crate::rng::Rng;
use crate::sim::{Bound, step};

/// A 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

/// The figures for one policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub policy: String,
    pub steps: u64,
    pub succeeded: u64,
    pub success_rate: f64,
    /// Wilson score interval, 95 %.
    pub success_ci95: Interval,
    pub p50_step_ms: u64,
    pub p99_step_ms: u64,
    /// Requests sent per successful step (all requests, failed steps' included).
    pub requests_per_success: f64,
    pub mean_attempts: f64,
    /// Mean time per step spent waiting before a replay or retry.
    pub mean_wait_ms: f64,
    /// Share of steps in which each bound ended a turn, an attempt or the step.
    pub bounds_hit: Vec<(String, f64)>,
}

/// Runs `steps` steps of `policy` from `seed`. The same arguments always give the same summary.
pub fn simulate(name: &str, policy: &Policy, model: &FaultModel, steps: u64, seed: u64) -> Summary {
    let mut rng = Rng::new(seed);
    let mut times = Vec::with_capacity(usize::try_from(steps).unwrap_or(0));
    let (mut ok, mut requests, mut attempts, mut waited) = (0u64, 0u64, 0u64, 0u64);
    let mut hits = [0u64; Bound::ALL.len()];
    for _ in 0..steps {
        let r = step(policy, model, &mut rng);
        ok += u64::from(r.success);
        requests += u64::from(r.requests);
        attempts += u64::from(r.attempts);
        waited += r.waited_ms;
        times.push(r.elapsed_ms);
        for (i, b) in Bound::ALL.iter().enumerate() {
            hits[i] += u64::from(r.hit(*b));
        }
    }
    times.sort_unstable();
    let n = steps.max(1) as f64;
    Summary {
        policy: name.to_string(),
        steps,
        succeeded: ok,
        success_rate: ok as f64 / n,
        success_ci95: wilson(ok, steps),
        p50_step_ms: percentile(&times, 0.50),
        p99_step_ms: percentile(&times, 0.99),
        requests_per_success: if ok == 0 {
            f64::INFINITY
        } else {
            requests as f64 / ok as f64
        },
        mean_attempts: attempts as f64 / n,
        mean_wait_ms: waited as f64 / n,
        bounds_hit: Bound::ALL
            .iter()
            .zip(hits)
            .filter(|(_, h)| *h > 0)
            .map(|(b, h)| (b.as_str().to_string(), h as f64 / n))
            .collect(),
    }
}

/// The Wilson score interval for `k` successes in `n` trials at 95 %.
pub fn wilson(k: u64, n: u64) -> Interval {
    if n == 0 {
        return Interval {
            low: 0.0,
            high: 1.0,
        };
    }
    let z = 1.959_964f64;
    let n = n as f64;
    let p = k as f64 / n;
    let denom = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / denom;
    Interval {
        low: (centre - half).max(0.0),
        high: (centre + half).min(1.0),
    }
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_a_hand_computed_interval() {
        // 90 of 100: the textbook Wilson interval is [0.8256, 0.9448].
        let i = wilson(90, 100);
        assert!((i.low - 0.8256).abs() < 1e-3, "{i:?}");
        assert!((i.high - 0.9448).abs() < 1e-3, "{i:?}");
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
    }
}
