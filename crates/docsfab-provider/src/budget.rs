//! The run's spend budget: `limits.maxRunTokens` (composition) and `budget.maxRunCostUsd`
//! (host.yaml, per provider), shared by every instance of every step of one run.
//!
//! Before each send (a turn's first request and each replay) the driver reserves that
//! request's worst case: its prompt tokens, estimated conservatively from its bytes, plus the
//! step's `maxOutputTokens`. A request whose worst case does not fit beside what was spent and
//! what is reserved in flight is never sent, so no request leaves that could cross a bound.
//! When the answer ends, the reservation becomes what the provider reported; an unknown usage
//! keeps the worst case as spent (nothing may read unknown as free), and an estimated one is
//! taken as it is.
//!
//! Plain state behind a mutex: no clock, no I/O.

use std::sync::{Arc, Mutex, MutexGuard};

use docsfab_record::{Pricing, Usage};

/// The bounds one run spends under. Either may be absent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendLimits {
    pub max_run_tokens: Option<u64>,
    /// The cost bound and the prices it is counted in.
    pub max_run_cost_usd: Option<(f64, Pricing)>,
}

/// The run's account, shared by reference count across its fan-out.
#[derive(Debug, Clone)]
pub struct RunBudget {
    limits: SpendLimits,
    ledger: Arc<Mutex<Ledger>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Ledger {
    spent_tokens: u64,
    reserved_tokens: u64,
    spent_usd: f64,
    reserved_usd: f64,
}

/// A request that did not fit: the bound's name and its one-sentence message, in the style of
/// the spec's bound messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// `run-max-tokens-bound` or `run-max-cost-bound`.
    pub bound: &'static str,
    pub message: String,
}

/// One request's claim on the budget, until its answer ends.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Mutex<Ledger>>,
    pricing: Option<Pricing>,
    tokens: u64,
    usd: f64,
    settled: bool,
}

/// A request's worst-case prompt tokens from its bytes: one token per three bytes, which
/// over-counts English and JSON (about four bytes a token) so the reservation stays above what
/// the provider will report.
pub fn worst_prompt_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(3).max(1)
}

impl RunBudget {
    /// `None` when there is no bound to keep.
    pub fn new(limits: SpendLimits) -> Option<RunBudget> {
        if limits.max_run_tokens.is_none() && limits.max_run_cost_usd.is_none() {
            return None;
        }
        Some(RunBudget {
            limits,
            ledger: Arc::default(),
        })
    }

    pub fn limits(&self) -> SpendLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // The ledger is plain numbers: a panic elsewhere cannot leave it half-written.
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves a request of `prompt_tokens` that may answer up to `max_output_tokens`, or says
    /// which bound it would cross.
    pub fn reserve(
        &self,
        prompt_tokens: u64,
        max_output_tokens: u64,
    ) -> Result<Reservation, Exhausted> {
        let tokens = prompt_tokens.saturating_add(max_output_tokens);
        let pricing = self.limits.max_run_cost_usd.map(|(_, p)| p);
        let usd = pricing.map_or(0.0, |p| p.worst_case(prompt_tokens, max_output_tokens));
        let mut l = self.lock();
        if let Some(max) = self.limits.max_run_tokens {
            let committed = l.spent_tokens.saturating_add(l.reserved_tokens);
            if committed.saturating_add(tokens) > max {
                return Err(Exhausted {
                    bound: "run-max-tokens-bound",
                    message: format!(
                        "run-max-tokens-bound: the next request could take {tokens} tokens ({prompt_tokens} prompt + {max_output_tokens} maxOutputTokens), and {} spent plus {} reserved would exceed limits.maxRunTokens = {max} tokens; it was not sent.",
                        l.spent_tokens, l.reserved_tokens
                    ),
                });
            }
        }
        if let Some((max, _)) = self.limits.max_run_cost_usd
            && l.spent_usd + l.reserved_usd + usd > max
        {
            return Err(Exhausted {
                bound: "run-max-cost-bound",
                message: format!(
                    "run-max-cost-bound: the next request could cost ${usd:.6}, and ${:.6} spent plus ${:.6} reserved would exceed budget.maxRunCostUsd = ${max}; it was not sent.",
                    l.spent_usd, l.reserved_usd
                ),
            });
        }
        l.reserved_tokens = l.reserved_tokens.saturating_add(tokens);
        l.reserved_usd += usd;
        Ok(Reservation {
            ledger: Arc::clone(&self.ledger),
            pricing,
            tokens,
            usd,
            settled: false,
        })
    }

    /// Tokens and USD spent so far (reservations of requests still in flight excluded).
    pub fn spent(&self) -> (u64, f64) {
        let l = self.lock();
        (l.spent_tokens, l.spent_usd)
    }
}

impl Reservation {
    /// The answer ended with `usage`: the reservation becomes that spend. Unknown counts keep
    /// their share of the worst case.
    pub fn settle(mut self, usage: &Usage) {
        let tokens = match usage.total() {
            Some(t) => t,
            None => self.tokens,
        };
        let usd = match (self.pricing, usage.is_known()) {
            (Some(p), true) => p.cost(usage).unwrap_or(self.usd),
            _ => self.usd,
        };
        self.book(tokens, usd);
    }

    fn book(&mut self, tokens: u64, usd: f64) {
        let mut l = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        l.reserved_tokens = l.reserved_tokens.saturating_sub(self.tokens);
        l.reserved_usd = (l.reserved_usd - self.usd).max(0.0);
        l.spent_tokens = l.spent_tokens.saturating_add(tokens);
        l.spent_usd += usd;
        self.settled = true;
    }
}

impl Drop for Reservation {
    /// A request dropped in flight (cancel, deadline) may still be billed: its worst case stays
    /// spent.
    fn drop(&mut self) {
        if !self.settled {
            let (tokens, usd) = (self.tokens, self.usd);
            self.book(tokens, usd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(max: u64) -> RunBudget {
        RunBudget::new(SpendLimits {
            max_run_tokens: Some(max),
            max_run_cost_usd: None,
        })
        .unwrap()
    }

    fn used(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
            ..Usage::ZERO
        }
    }

    #[test]
    fn a_request_that_could_cross_the_bound_is_refused_while_others_are_in_flight() {
        let b = tokens(1000);
        let first = b.reserve(100, 400).unwrap();
        let second = b.reserve(100, 400).unwrap();
        let refused = b.reserve(1, 1).unwrap_err();
        assert_eq!(refused.bound, "run-max-tokens-bound");
        assert!(refused.message.starts_with("run-max-tokens-bound: "));
        // Settling releases what the answer did not use.
        first.settle(&used(100, 50));
        second.settle(&used(100, 50));
        assert_eq!(b.spent().0, 300);
        assert!(b.reserve(100, 600).is_ok());
    }

    #[test]
    fn unknown_usage_and_dropped_requests_keep_their_worst_case() {
        let b = tokens(1000);
        b.reserve(100, 400).unwrap().settle(&Usage::UNKNOWN);
        drop(b.reserve(100, 400).unwrap());
        assert_eq!(b.spent().0, 1000);
        assert!(b.reserve(1, 0).is_err());
    }

    #[test]
    fn the_cost_bound_prices_the_worst_case() {
        let p = Pricing {
            input_per_million: 1.0,
            output_per_million: 10.0,
            cache_write_per_million: None,
            cache_read_per_million: None,
        };
        let b = RunBudget::new(SpendLimits {
            max_run_tokens: None,
            max_run_cost_usd: Some((0.01, p)),
        })
        .unwrap();
        // 1000 prompt ($0.001) + 500 output ($0.005) = $0.006 fits; a second does not.
        let r = b.reserve(1000, 500).unwrap();
        let e = b.reserve(1000, 500).unwrap_err();
        assert_eq!(e.bound, "run-max-cost-bound");
        r.settle(&used(1000, 100));
        assert!((b.spent().1 - 0.002).abs() < 1e-9);
        assert!(b.reserve(1000, 500).is_ok());
    }
}
