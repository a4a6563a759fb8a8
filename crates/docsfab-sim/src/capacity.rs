//! The provider's capacity: a token bucket for requests and, optionally, one for tokens.
//!
//! Pure logic: the caller passes the instant, so the arithmetic is unit-tested without a clock.
//! Buckets start full, refill continuously (not in fixed windows), and a refused request takes
//! nothing from them. Every duration this module returns is real time: the scenario's
//! `timeScale` speeds up the refill, so the waits a client is told to honour shrink with it.

use std::time::Duration;

use tokio::time::Instant;

/// Upper bounds of the checked fields.
const MAX_REQUESTS_PER_MINUTE: u64 = 1_000_000;
const MAX_TOKENS_PER_MINUTE: u64 = 1_000_000_000;
const MIN_TIME_SCALE: f64 = 0.001;
const MAX_TIME_SCALE: f64 = 10_000.0;

/// Slack for floating-point refill: a client that waited exactly the advertised time must fit.
const EPSILON: f64 = 1e-6;

/// A checked `capacity:` block.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Capacity {
    pub requests_per_minute: u64,
    pub tokens_per_minute: Option<u64>,
    /// The request bucket's size: how many requests fit at once after a quiet spell.
    pub burst: u64,
    /// Simulated seconds per real second.
    pub time_scale: f64,
}

impl Capacity {
    /// Checks the scenario's values; the message names the field and the allowed range.
    pub(crate) fn check(
        requests_per_minute: u64,
        tokens_per_minute: Option<u64>,
        burst: Option<u64>,
        time_scale: Option<f64>,
    ) -> Result<Capacity, String> {
        if !(1..=MAX_REQUESTS_PER_MINUTE).contains(&requests_per_minute) {
            return Err(format!(
                "capacity.requestsPerMinute must be between 1 and {MAX_REQUESTS_PER_MINUTE}, not {requests_per_minute}"
            ));
        }
        if let Some(tpm) = tokens_per_minute
            && !(1..=MAX_TOKENS_PER_MINUTE).contains(&tpm)
        {
            return Err(format!(
                "capacity.tokensPerMinute must be between 1 and {MAX_TOKENS_PER_MINUTE}, not {tpm}"
            ));
        }
        let burst = burst.unwrap_or(requests_per_minute);
        if !(1..=requests_per_minute).contains(&burst) {
            return Err(format!(
                "capacity.burst must be between 1 and capacity.requestsPerMinute ({requests_per_minute}), not {burst}"
            ));
        }
        let time_scale = time_scale.unwrap_or(1.0);
        if !(MIN_TIME_SCALE..=MAX_TIME_SCALE).contains(&time_scale) {
            return Err(format!(
                "capacity.timeScale must be between {MIN_TIME_SCALE} and {MAX_TIME_SCALE}, not {time_scale}"
            ));
        }
        Ok(Capacity {
            requests_per_minute,
            tokens_per_minute,
            burst,
            time_scale,
        })
    }

    /// The token bucket holds the same span of budget as the request bucket: `burst` requests
    /// are `burst / requestsPerMinute` minutes, so it holds that many minutes of tokens.
    fn token_bucket_size(&self) -> Option<u64> {
        self.tokens_per_minute.map(|tpm| {
            let size =
                u128::from(tpm) * u128::from(self.burst) / u128::from(self.requests_per_minute);
            u64::try_from(size).unwrap_or(u64::MAX).max(1)
        })
    }
}

/// Which budget a refused request ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dimension {
    Requests,
    Tokens,
}

/// One budget as the rate-limit headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gauge {
    /// The bucket's size.
    pub limit: u64,
    /// Whole units available now (after this request was charged, when it was admitted).
    pub remaining: u64,
    /// Real time until the bucket is full again.
    pub reset: Duration,
}

/// Why a request was refused and when it would fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub by: Dimension,
    /// Real time until this request would be admitted, if nobody else takes the capacity first.
    pub wait: Duration,
    /// What the request asked of the budget it ran out of (1 for requests).
    pub requested: u64,
}

/// The limiter's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub requests: Gauge,
    pub tokens: Option<Gauge>,
    pub refused: Option<Refusal>,
}

#[derive(Debug)]
struct Bucket {
    size: f64,
    level: f64,
    /// Units added per real second.
    per_second: f64,
}

impl Bucket {
    fn full(size: u64, per_minute: u64, time_scale: f64) -> Bucket {
        Bucket {
            size: size as f64,
            level: size as f64,
            per_second: per_minute as f64 / 60.0 * time_scale,
        }
    }

    fn refill(&mut self, elapsed: Duration) {
        self.level = (self.level + self.per_second * elapsed.as_secs_f64()).min(self.size);
    }

    fn fits(&self, need: f64) -> bool {
        self.level + EPSILON >= need
    }

    fn wait_for(&self, need: f64) -> Duration {
        seconds((need - self.level).max(0.0) / self.per_second)
    }

    fn gauge(&self) -> Gauge {
        Gauge {
            limit: self.size as u64,
            remaining: (self.level + EPSILON).floor().max(0.0) as u64,
            reset: seconds((self.size - self.level).max(0.0) / self.per_second),
        }
    }
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// The running buckets of one simulator.
#[derive(Debug)]
pub(crate) struct Limiter {
    requests: Bucket,
    tokens: Option<Bucket>,
    last: Instant,
}

impl Limiter {
    pub(crate) fn new(capacity: &Capacity, now: Instant) -> Limiter {
        Limiter {
            requests: Bucket::full(
                capacity.burst,
                capacity.requests_per_minute,
                capacity.time_scale,
            ),
            tokens: capacity
                .token_bucket_size()
                .zip(capacity.tokens_per_minute)
                .map(|(size, tpm)| Bucket::full(size, tpm, capacity.time_scale)),
            last: now,
        }
    }

    /// Charges one request costing `tokens` if both buckets can pay, else refuses it.
    ///
    /// A request costing more tokens than the bucket holds is charged a full bucket, so it waits
    /// for a full bucket instead of being refused forever.
    pub(crate) fn admit(&mut self, now: Instant, tokens: u64) -> Verdict {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        self.requests.refill(elapsed);
        if let Some(t) = self.tokens.as_mut() {
            t.refill(elapsed);
        }
        let token_need = self.tokens.as_ref().map(|t| (tokens as f64).min(t.size));
        let mut refusals = Vec::with_capacity(2);
        if !self.requests.fits(1.0) {
            refusals.push(Refusal {
                by: Dimension::Requests,
                wait: self.requests.wait_for(1.0),
                requested: 1,
            });
        }
        if let (Some(t), Some(need)) = (&self.tokens, token_need)
            && !t.fits(need)
        {
            refusals.push(Refusal {
                by: Dimension::Tokens,
                wait: t.wait_for(need),
                requested: need as u64,
            });
        }
        // The longest wait is the honest one: the request fits only once both budgets allow it.
        let refused = refusals.into_iter().max_by_key(|r| r.wait);
        if refused.is_none() {
            self.requests.level = (self.requests.level - 1.0).max(0.0);
            if let (Some(t), Some(need)) = (self.tokens.as_mut(), token_need) {
                t.level = (t.level - need).max(0.0);
            }
        }
        Verdict {
            requests: self.requests.gauge(),
            tokens: self.tokens.as_ref().map(Bucket::gauge),
            refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the arrival pattern, no span of time admits more than a full bucket plus what
        /// refilled during it, and every refusal's wait is enough: a retry after exactly that
        /// wait (with nothing else in between) is admitted.
        #[test]
        fn admissions_never_exceed_burst_plus_refill(
            rpm in 1u64..600,
            burst_pick in 0u64..600,
            scale in prop::sample::select(vec![0.5, 1.0, 10.0, 60.0]),
            gaps_ms in prop::collection::vec(0u64..400, 1..80),
        ) {
            let burst = 1 + burst_pick % rpm;
            let capacity = Capacity::check(rpm, None, Some(burst), Some(scale)).unwrap();
            let start = Instant::now();
            let mut limiter = Limiter::new(&capacity, start);
            let mut now = start;
            let mut admitted_at = Vec::new();
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                let v = limiter.admit(now, 1);
                match v.refused {
                    None => admitted_at.push(now),
                    Some(r) => {
                        prop_assert!(r.wait > Duration::ZERO);
                        let mut probe = Limiter { requests: Bucket { ..limiter.requests }, tokens: None, last: limiter.last };
                        prop_assert!(probe.admit(now + r.wait, 1).refused.is_none());
                    }
                }
                prop_assert!(v.requests.remaining <= burst);
            }
            let per_second = rpm as f64 / 60.0 * scale;
            for (i, first) in admitted_at.iter().enumerate() {
                for (j, last) in admitted_at.iter().enumerate().skip(i) {
                    let span = last.duration_since(*first).as_secs_f64();
                    let allowed = burst as f64 + per_second * span + 1e-6;
                    prop_assert!((j - i + 1) as f64 <= allowed, "{} admitted in {span} s", j - i + 1);
                }
            }
        }
    }

    fn cap(rpm: u64, tpm: Option<u64>, burst: Option<u64>, scale: Option<f64>) -> Capacity {
        Capacity::check(rpm, tpm, burst, scale).unwrap()
    }

    #[test]
    fn checks_name_the_field_and_the_range() {
        let err = |r, t, b, s| Capacity::check(r, t, b, s).unwrap_err();
        assert!(err(0, None, None, None).starts_with("capacity.requestsPerMinute must be"));
        assert!(err(2_000_000, None, None, None).contains("not 2000000"));
        assert!(err(60, Some(0), None, None).starts_with("capacity.tokensPerMinute"));
        assert_eq!(
            err(60, None, Some(61), None),
            "capacity.burst must be between 1 and capacity.requestsPerMinute (60), not 61"
        );
        assert!(err(60, None, Some(0), None).starts_with("capacity.burst"));
        assert!(err(60, None, None, Some(0.0)).starts_with("capacity.timeScale"));
        assert!(err(60, None, None, Some(f64::NAN)).starts_with("capacity.timeScale"));
        let c = cap(120, None, None, None);
        assert_eq!((c.burst, c.time_scale), (120, 1.0));
    }

    #[test]
    fn a_full_bucket_admits_burst_requests_then_refuses_with_the_refill_time() {
        let start = Instant::now();
        // 60 rpm at scale 1: one request a second, three at once.
        let mut limiter = Limiter::new(&cap(60, None, Some(3), None), start);
        let remaining: Vec<u64> = (0..3)
            .map(|_| limiter.admit(start, 1).requests.remaining)
            .collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = limiter.admit(start, 1);
        let refusal = refused.refused.unwrap();
        assert_eq!(refusal.by, Dimension::Requests);
        assert_eq!(refusal.wait, Duration::from_secs(1));
        assert_eq!(refused.requests.reset, Duration::from_secs(3));
        // Refused requests take nothing: after the advertised wait the next one fits.
        let later = start + refusal.wait;
        let v = limiter.admit(later, 1);
        assert!(v.refused.is_none());
        assert_eq!(v.requests.remaining, 0);
    }

    #[test]
    fn the_time_scale_speeds_up_the_refill() {
        let start = Instant::now();
        // 120 rpm at scale 60: 120 requests per real second.
        let mut limiter = Limiter::new(&cap(120, None, Some(1), Some(60.0)), start);
        assert!(limiter.admit(start, 1).refused.is_none());
        let wait = limiter.admit(start, 1).refused.unwrap().wait;
        assert_eq!(wait.as_micros(), 8333);
        assert!(limiter.admit(start + wait, 1).refused.is_none());
    }

    #[test]
    fn tokens_refuse_on_their_own_and_oversized_requests_wait_for_a_full_bucket() {
        let start = Instant::now();
        // 60 rpm, 600 tpm, burst 60: the token bucket holds a minute, 600 tokens.
        let mut limiter = Limiter::new(&cap(60, Some(600), None, None), start);
        let v = limiter.admit(start, 500);
        assert_eq!(v.tokens.unwrap().remaining, 100);
        let refused = limiter.admit(start, 200).refused.unwrap();
        assert_eq!(refused.by, Dimension::Tokens);
        assert_eq!(refused.requested, 200);
        // 100 tokens missing at 10 tokens a second.
        assert_eq!(refused.wait, Duration::from_secs(10));
        // 5000 tokens is more than the bucket: charged 600, so it waits for a full bucket.
        let big = limiter.admit(start, 5000).refused.unwrap();
        assert_eq!(big.requested, 600);
        assert_eq!(big.wait, Duration::from_secs(50));
        let v = limiter.admit(start + big.wait, 5000);
        assert!(v.refused.is_none());
        assert_eq!(v.tokens.unwrap().remaining, 0);
    }

    #[test]
    fn the_longer_wait_names_the_budget() {
        let start = Instant::now();
        let mut limiter = Limiter::new(&cap(60, Some(60), Some(1), None), start);
        // Both buckets hold one unit; the request costs 1 token.
        assert!(limiter.admit(start, 1).refused.is_none());
        let r = limiter.admit(start, 1).refused.unwrap();
        assert_eq!(r.wait, Duration::from_secs(1));
        // An instant older than the last one (a connection that read its request earlier but
        // took the lock later) refills nothing and does not move the clock back.
        let half = start + Duration::from_millis(500);
        assert_eq!(
            limiter.admit(half, 1).refused.unwrap().wait,
            Duration::from_millis(500)
        );
        let r2 = limiter.admit(start, 1).refused.unwrap();
        assert_eq!(r2.wait, Duration::from_millis(500));
    }
}
