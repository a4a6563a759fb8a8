//! The provider's capacity: a token bucket for requests and, optionally, one for tokens.
//!
//! Pure logic: the caller passes the instant, so the arithmetic is unit-tested without a clock.
//! Buckets start full, refill continuously (not in fixed windows), and a refused request takes
//! nothing from them. Every duration this module returns is real time: the scenario's
//! `timeScale` speeds up the refill, so the waits a client is told to honour shrink with it.
//!
//! A scenario may also say how the provider reports the budget (`limitHeader`, `headers`,
//! `retryAfter`), what the token budget counts (`tokens`, `tokenBurstSeconds`), and that a client
//! outside docsfab shares the key (`outsideShare`): the provider shapes real documentation
//! describes, so the throttle can be tested against each.

use std::time::Duration;

use tokio::time::Instant;

/// Upper bounds of the checked fields.
const MAX_REQUESTS_PER_MINUTE: u64 = 1_000_000;
const MAX_TOKENS_PER_MINUTE: u64 = 1_000_000_000;
const MIN_TIME_SCALE: f64 = 0.001;
const MAX_TIME_SCALE: f64 = 10_000.0;
const MAX_TOKEN_BURST_SECONDS: u64 = 60;
const MAX_OUTSIDE_SHARE: f64 = 0.9;

/// Slack for floating-point refill: a client that waited exactly the advertised time must fit.
const EPSILON: f64 = 1e-6;

/// What the rate-limit headers' `limit` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitHeader {
    /// Requests (tokens) per minute, as OpenAI and Anthropic document their `limit` headers.
    PerMinute,
    /// The bucket's size: how much fits at once.
    Bucket,
}

/// Which rate-limit header family the responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderFamily {
    /// The family of the API that was called.
    Api,
    Openai,
    Anthropic,
    /// No rate-limit headers at all.
    None,
}

/// What a 429 over capacity says about when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAfter {
    /// `retry-after` in seconds, plus `retry-after-ms` on the OpenAI API.
    Both,
    Seconds,
    Milliseconds,
    None,
}

/// What a request costs the token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenCharge {
    /// Input plus output, as the answer's usage reports them.
    Total,
    /// The prompt only (the body estimate), like Anthropic's input-tokens-per-minute limit.
    Prompt,
}

/// The `capacity:` block as written, before it is checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct CapacitySpec {
    pub requests_per_minute: u64,
    pub tokens_per_minute: Option<u64>,
    pub burst: Option<u64>,
    pub time_scale: Option<f64>,
    pub limit_header: Option<String>,
    pub headers: Option<String>,
    pub retry_after: Option<String>,
    pub token_burst_seconds: Option<u64>,
    pub tokens: Option<String>,
    pub outside_share: Option<f64>,
}

/// A checked `capacity:` block.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Capacity {
    pub requests_per_minute: u64,
    pub tokens_per_minute: Option<u64>,
    /// The request bucket's size: how many requests fit at once after a quiet spell.
    pub burst: u64,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    pub limit_header: LimitHeader,
    pub headers: HeaderFamily,
    pub retry_after: RetryAfter,
    /// The token bucket's span in seconds of `tokensPerMinute`; `None`: the request bucket's span.
    pub token_burst_seconds: Option<u64>,
    pub tokens: TokenCharge,
    /// The share of the request capacity a client outside docsfab takes (0: none).
    pub outside_share: f64,
}

/// Reads one of a field's named values, or says which ones it takes.
fn one_of<T: Copy>(
    field: &str,
    given: Option<&str>,
    default: T,
    values: &[(&str, T)],
) -> Result<T, String> {
    let Some(given) = given else {
        return Ok(default);
    };
    values
        .iter()
        .find(|(name, _)| *name == given)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = values.iter().map(|(n, _)| *n).collect();
            let (last, rest) = names.split_last().expect("at least one value");
            format!(
                "capacity.{field} must be {} or {last}, not {given}",
                rest.join(", ")
            )
        })
}

/// The capacity's named choices (`limitHeader`, `headers`, `retryAfter`, `tokens`), each one
/// of its words or its default.
fn named_choices(
    spec: &CapacitySpec,
) -> Result<(LimitHeader, HeaderFamily, RetryAfter, TokenCharge), String> {
    let limit_header = one_of(
        "limitHeader",
        spec.limit_header.as_deref(),
        LimitHeader::PerMinute,
        &[
            ("perMinute", LimitHeader::PerMinute),
            ("bucket", LimitHeader::Bucket),
        ],
    )?;
    let headers = one_of(
        "headers",
        spec.headers.as_deref(),
        HeaderFamily::Api,
        &[
            ("api", HeaderFamily::Api),
            ("openai", HeaderFamily::Openai),
            ("anthropic", HeaderFamily::Anthropic),
            ("none", HeaderFamily::None),
        ],
    )?;
    let retry_after = one_of(
        "retryAfter",
        spec.retry_after.as_deref(),
        RetryAfter::Both,
        &[
            ("both", RetryAfter::Both),
            ("seconds", RetryAfter::Seconds),
            ("milliseconds", RetryAfter::Milliseconds),
            ("none", RetryAfter::None),
        ],
    )?;
    let tokens = one_of(
        "tokens",
        spec.tokens.as_deref(),
        TokenCharge::Total,
        &[
            ("total", TokenCharge::Total),
            ("prompt", TokenCharge::Prompt),
        ],
    )?;
    Ok((limit_header, headers, retry_after, tokens))
}

impl Capacity {
    /// Checks the scenario's values; the message names the field and the allowed range.
    pub(crate) fn check(spec: CapacitySpec) -> Result<Capacity, String> {
        let requests_per_minute = spec.requests_per_minute;
        if !(1..=MAX_REQUESTS_PER_MINUTE).contains(&requests_per_minute) {
            return Err(format!(
                "capacity.requestsPerMinute must be between 1 and {MAX_REQUESTS_PER_MINUTE}, not {requests_per_minute}"
            ));
        }
        let tokens_per_minute = spec.tokens_per_minute;
        if let Some(tpm) = tokens_per_minute
            && !(1..=MAX_TOKENS_PER_MINUTE).contains(&tpm)
        {
            return Err(format!(
                "capacity.tokensPerMinute must be between 1 and {MAX_TOKENS_PER_MINUTE}, not {tpm}"
            ));
        }
        let burst = spec.burst.unwrap_or(requests_per_minute);
        if !(1..=requests_per_minute).contains(&burst) {
            return Err(format!(
                "capacity.burst must be between 1 and capacity.requestsPerMinute ({requests_per_minute}), not {burst}"
            ));
        }
        let time_scale = spec.time_scale.unwrap_or(1.0);
        if !(MIN_TIME_SCALE..=MAX_TIME_SCALE).contains(&time_scale) {
            return Err(format!(
                "capacity.timeScale must be between {MIN_TIME_SCALE} and {MAX_TIME_SCALE}, not {time_scale}"
            ));
        }
        let (limit_header, headers, retry_after, tokens) = named_choices(&spec)?;
        if let Some(n) = spec.token_burst_seconds
            && !(1..=MAX_TOKEN_BURST_SECONDS).contains(&n)
        {
            return Err(format!(
                "capacity.tokenBurstSeconds must be between 1 and {MAX_TOKEN_BURST_SECONDS}, not {n}"
            ));
        }
        // Both only shape the token budget: without one they would be silently ignored.
        for (field, given) in [
            ("tokenBurstSeconds", spec.token_burst_seconds.is_some()),
            ("tokens", spec.tokens.is_some()),
        ] {
            if given && tokens_per_minute.is_none() {
                return Err(format!(
                    "capacity.{field} needs capacity.tokensPerMinute, the token budget it shapes"
                ));
            }
        }
        let outside_share = spec.outside_share.unwrap_or(0.0);
        if !(0.0..=MAX_OUTSIDE_SHARE).contains(&outside_share) {
            return Err(format!(
                "capacity.outsideShare must be between 0 and {MAX_OUTSIDE_SHARE}, not {outside_share}"
            ));
        }
        Ok(Capacity {
            requests_per_minute,
            tokens_per_minute,
            burst,
            time_scale,
            limit_header,
            headers,
            retry_after,
            token_burst_seconds: spec.token_burst_seconds,
            tokens,
            outside_share,
        })
    }

    /// By default the token bucket holds the same span of budget as the request bucket: `burst`
    /// requests are `burst / requestsPerMinute` minutes, so it holds that many minutes of tokens.
    /// `tokenBurstSeconds` sets the span on its own, as providers size the two independently.
    fn token_bucket_size(&self) -> Option<u64> {
        self.tokens_per_minute.map(|tpm| {
            let size = match self.token_burst_seconds {
                Some(secs) => u128::from(tpm) * u128::from(secs) / 60,
                None => {
                    u128::from(tpm) * u128::from(self.burst) / u128::from(self.requests_per_minute)
                }
            };
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
    /// What the `limit` header says: per minute, or the bucket's size (`limitHeader`).
    pub limit: u64,
    /// The bucket's size.
    pub size: u64,
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

/// What the outside client (`outsideShare`) got so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutsideCounts {
    /// Its arrivals that found room in the buckets and took it.
    pub admitted: u64,
    /// Its arrivals that found the buckets too low and took nothing.
    pub refused: u64,
}

#[derive(Debug, Clone)]
struct Bucket {
    size: f64,
    level: f64,
    /// Units added per real second.
    per_second: f64,
    per_minute: u64,
}

impl Bucket {
    fn full(size: u64, per_minute: u64, time_scale: f64) -> Bucket {
        Bucket {
            size: size as f64,
            level: size as f64,
            per_second: per_minute as f64 / 60.0 * time_scale,
            per_minute,
        }
    }

    fn refill(&mut self, elapsed_secs: f64) {
        self.level = (self.level + self.per_second * elapsed_secs).min(self.size);
    }

    fn fits(&self, need: f64) -> bool {
        self.level + EPSILON >= need
    }

    fn take(&mut self, need: f64) {
        self.level = (self.level - need).max(0.0);
    }

    fn wait_for(&self, need: f64) -> Duration {
        seconds((need - self.level).max(0.0) / self.per_second)
    }

    fn gauge(&self, limit_header: LimitHeader) -> Gauge {
        let size = self.size as u64;
        Gauge {
            limit: match limit_header {
                LimitHeader::PerMinute => self.per_minute,
                LimitHeader::Bucket => size,
            },
            size,
            remaining: (self.level + EPSILON).floor().max(0.0) as u64,
            reset: seconds((self.size - self.level).max(0.0) / self.per_second),
        }
    }
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

/// The client outside docsfab: `rate` deterministic arrivals per real second (arrival k at
/// `k / rate` seconds after the limiter started), each taking one request and `tokens` tokens if
/// the buckets hold them. Deterministic so a test's counts do not depend on a seed or the clock.
#[derive(Debug, Clone)]
struct Outside {
    rate: f64,
    /// Tokens per arrival: an average request's share of the token budget.
    tokens: f64,
    /// The number of the next arrival not yet played.
    next: u64,
    counts: OutsideCounts,
}

/// The running buckets of one simulator.
#[derive(Debug, Clone)]
pub(crate) struct Limiter {
    requests: Bucket,
    tokens: Option<Bucket>,
    outside: Option<Outside>,
    limit_header: LimitHeader,
    start: Instant,
    /// Real seconds since `start` that the buckets have been brought up to.
    last: f64,
}

impl Limiter {
    pub(crate) fn new(capacity: &Capacity, now: Instant) -> Limiter {
        let rpm = capacity.requests_per_minute;
        let outside = (capacity.outside_share > 0.0).then(|| Outside {
            rate: capacity.outside_share * rpm as f64 / 60.0 * capacity.time_scale,
            tokens: capacity
                .tokens_per_minute
                .map_or(0.0, |tpm| tpm as f64 / rpm as f64),
            next: 1,
            counts: OutsideCounts::default(),
        });
        Limiter {
            requests: Bucket::full(capacity.burst, rpm, capacity.time_scale),
            tokens: capacity
                .token_bucket_size()
                .zip(capacity.tokens_per_minute)
                .map(|(size, tpm)| Bucket::full(size, tpm, capacity.time_scale)),
            outside,
            limit_header: capacity.limit_header,
            start: now,
            last: 0.0,
        }
    }

    /// Refills both buckets up to `t` (seconds since start); an earlier `t` changes nothing.
    fn refill_to(&mut self, t: f64) {
        let elapsed = (t - self.last).max(0.0);
        self.last = self.last.max(t);
        self.requests.refill(elapsed);
        if let Some(b) = self.tokens.as_mut() {
            b.refill(elapsed);
        }
    }

    /// Brings the buckets to `t`, playing the outside client's arrivals on the way.
    fn advance(&mut self, t: f64) {
        if let Some(mut outside) = self.outside.take() {
            self.play_outside(&mut outside, t);
            self.outside = Some(outside);
        }
        self.refill_to(t);
    }

    fn play_outside(&mut self, o: &mut Outside, t: f64) {
        // Arrivals 1..=due have happened by `t` (the slack keeps arrival k at k / rate from
        // being missed by a rounding error at exactly that instant).
        let due = (t * o.rate + EPSILON).floor() as u64;
        while o.next <= due {
            self.refill_to(o.next as f64 / o.rate);
            let token_need = self.tokens.as_ref().map(|b| o.tokens.min(b.size));
            let fits = self.requests.fits(1.0)
                && match (&self.tokens, token_need) {
                    (Some(b), Some(need)) => b.fits(need),
                    _ => true,
                };
            if !fits {
                o.counts.refused += 1;
                o.next += 1;
                continue;
            }
            // Admitted. Between two arrivals each bucket refills more than one arrival takes
            // (1 / outsideShare > 1 requests), so every later arrival up to `t` is admitted too,
            // and after n more the level is min(size - take, level + n × (refill - take)): jump
            // there instead of looping, which could be millions of arrivals after a quiet spell.
            let rest = (due - o.next) as f64;
            self.requests.take(1.0);
            jump(&mut self.requests, 1.0, o.rate, rest);
            if let (Some(b), Some(need)) = (self.tokens.as_mut(), token_need) {
                b.take(need);
                jump(b, need, o.rate, rest);
            }
            self.last = self.last.max(due as f64 / o.rate);
            o.counts.admitted += 1 + (due - o.next);
            o.next = due + 1;
        }
    }

    /// The outside client's counts, with its arrivals played up to `now`; `None` without one.
    pub(crate) fn outside(&mut self, now: Instant) -> Option<OutsideCounts> {
        self.outside.as_ref()?;
        self.advance(self.seconds_at(now));
        self.outside.as_ref().map(|o| o.counts)
    }

    fn seconds_at(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Charges one request costing `tokens` if both buckets can pay, else refuses it.
    ///
    /// A request costing more tokens than the bucket holds is charged a full bucket, so it waits
    /// for a full bucket instead of being refused forever.
    pub(crate) fn admit(&mut self, now: Instant, tokens: u64) -> Verdict {
        self.advance(self.seconds_at(now));
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
            self.requests.take(1.0);
            if let (Some(t), Some(need)) = (self.tokens.as_mut(), token_need) {
                t.take(need);
            }
        }
        Verdict {
            requests: self.requests.gauge(self.limit_header),
            tokens: self.tokens.as_ref().map(|b| b.gauge(self.limit_header)),
            refused,
        }
    }
}

/// `rest` more outside arrivals, `rate` a second, each admitted and taking `take`.
fn jump(b: &mut Bucket, take: f64, rate: f64, rest: f64) {
    let net = b.per_second / rate - take;
    b.level = (b.level + rest * net).min(b.size - take).max(0.0);
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
            let capacity = cap(rpm, None, Some(burst), Some(scale));
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
                        let mut probe = limiter.clone();
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

    fn spec(rpm: u64, tpm: Option<u64>, burst: Option<u64>, scale: Option<f64>) -> CapacitySpec {
        CapacitySpec {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            burst,
            time_scale: scale,
            ..CapacitySpec::default()
        }
    }

    fn cap(rpm: u64, tpm: Option<u64>, burst: Option<u64>, scale: Option<f64>) -> Capacity {
        Capacity::check(spec(rpm, tpm, burst, scale)).unwrap()
    }

    #[test]
    fn checks_name_the_field_and_the_range() {
        let err = |r, t, b, s| Capacity::check(spec(r, t, b, s)).unwrap_err();
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

    fn zoo(f: impl FnOnce(&mut CapacitySpec)) -> Capacity {
        let mut spec = spec(120, None, Some(1), None);
        f(&mut spec);
        Capacity::check(spec).unwrap()
    }

    #[test]
    fn the_limit_is_per_minute_by_default_and_the_bucket_on_request() {
        // OpenAI's quantized limit: 120 a minute enforced one request at a time.
        let start = Instant::now();
        let mut limiter = Limiter::new(&cap(120, Some(6000), Some(1), None), start);
        let v = limiter.admit(start, 10);
        let requests = v.requests;
        assert_eq!(
            (requests.limit, requests.remaining, requests.reset),
            (120, 0, Duration::from_millis(500))
        );
        assert_eq!(requests.size, 1);
        let tokens = v.tokens.unwrap();
        // The token bucket spans the request bucket's half second: 50 tokens.
        assert_eq!(
            (tokens.limit, tokens.size, tokens.remaining),
            (6000, 50, 40)
        );

        let bucket = zoo(|s| {
            s.tokens_per_minute = Some(6000);
            s.limit_header = Some("bucket".into());
        });
        let v = Limiter::new(&bucket, start).admit(start, 10);
        assert_eq!((v.requests.limit, v.requests.remaining), (1, 0));
        assert_eq!(v.tokens.unwrap().limit, 50);
    }

    #[test]
    fn token_burst_seconds_sizes_the_token_bucket_on_its_own() {
        let start = Instant::now();
        // 60,000 tokens a minute, ten seconds' worth at once: 10,000, whatever the burst.
        let c = zoo(|s| {
            s.requests_per_minute = 600;
            s.burst = Some(600);
            s.tokens_per_minute = Some(60_000);
            s.token_burst_seconds = Some(10);
        });
        let mut limiter = Limiter::new(&c, start);
        let v = limiter.admit(start, 4_000);
        let tokens = v.tokens.unwrap();
        assert_eq!((tokens.size, tokens.remaining), (10_000, 6_000));
        // 1,000 tokens a second refill it: the missing 4,000 are back in 4 s.
        assert_eq!(tokens.reset, Duration::from_secs(4));
        assert!(limiter.admit(start, 6_000).refused.is_none());
        let refused = limiter.admit(start, 1).refused.unwrap();
        assert_eq!(refused.by, Dimension::Tokens);
        assert_eq!(refused.wait, Duration::from_millis(1));
        // Without it, the token bucket spans the request bucket (a minute here).
        let c = zoo(|s| {
            s.requests_per_minute = 600;
            s.burst = Some(600);
            s.tokens_per_minute = Some(60_000);
        });
        let v = Limiter::new(&c, start).admit(start, 0);
        assert_eq!(v.tokens.unwrap().size, 60_000);
    }

    #[test]
    fn the_outside_client_takes_its_share_when_the_capacity_is_free() {
        let start = Instant::now();
        let hour = start + Duration::from_secs(3600);
        // 120 a minute is 7,200 an hour; a 0.3 share arrives every 1/0.6 s: 2,160 times.
        let c = zoo(|s| s.outside_share = Some(0.3));
        let counts = Limiter::new(&c, start).outside(hour).unwrap();
        assert_eq!((counts.admitted, counts.refused), (2_160, 0));
        // Time scale: ten times faster, ten times the arrivals in the same real hour.
        let fast = zoo(|s| {
            s.outside_share = Some(0.3);
            s.time_scale = Some(10.0);
        });
        assert_eq!(
            Limiter::new(&fast, start).outside(hour).unwrap().admitted,
            21_600
        );
        // It takes tokens too, tokensPerMinute / requestsPerMinute (10) per arrival: at 1 s it
        // takes the request and 10 of the bucket's 10 tokens (burst 1 spans half a second).
        let tokens = zoo(|s| {
            s.outside_share = Some(0.5);
            s.tokens_per_minute = Some(1_200);
        });
        let mut limiter = Limiter::new(&tokens, start);
        let v = limiter.admit(start + Duration::from_secs(1), 1);
        assert_eq!(limiter.outside(start).unwrap().admitted, 1);
        assert_eq!(v.refused.map(|r| r.by), Some(Dimension::Requests));
        assert_eq!(v.tokens.unwrap().remaining, 0);
        // The headers keep the full per-minute limit: the point of the shape.
        assert_eq!(v.requests.limit, 120);
        assert!(
            Limiter::new(&cap(120, None, Some(1), None), start)
                .outside(hour)
                .is_none()
        );
    }

    #[test]
    fn the_outside_client_and_docsfab_never_get_more_than_the_capacity_together() {
        let start = Instant::now();
        let c = zoo(|s| s.outside_share = Some(0.3));
        // Ask every `gap` ms for an hour. A client that asks at the capacity's own pace leaves
        // the outside client the arrivals that land on a full bucket; one that asks much faster
        // than the refill takes every unit as it comes back and the outside client gets none:
        // the outside client takes only capacity nobody else has taken first.
        for (gap, outside_admitted) in [(500, 720), (10, 0)] {
            let mut limiter = Limiter::new(&c, start);
            let mut admitted = 0u64;
            let mut t = 0;
            while t < 3_600_000 {
                t += gap;
                let at = start + Duration::from_millis(t);
                admitted += u64::from(limiter.admit(at, 1).refused.is_none());
            }
            let outside = limiter.outside(start + Duration::from_millis(t)).unwrap();
            assert_eq!(outside.admitted + outside.refused, 2_160, "gap {gap}");
            assert_eq!(outside.admitted, outside_admitted, "gap {gap}");
            // One bucket (1) plus an hour's refill (7,200), shared.
            let together = admitted + outside.admitted;
            assert!((7_199..=7_201).contains(&together), "gap {gap}: {together}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The outside client's arrivals are played in one jump after a quiet spell: looking at
        /// the limiter more often (which plays them a few at a time) changes no verdict.
        #[test]
        fn playing_outside_arrivals_in_one_jump_or_many_agrees(
            share in prop::sample::select(vec![0.1, 0.3, 0.5, 0.9]),
            burst in 1u64..5,
            gaps_ms in prop::collection::vec(0u64..20_000, 1..60),
        ) {
            let c = Capacity::check(CapacitySpec {
                outside_share: Some(share),
                tokens_per_minute: Some(600),
                ..spec(60, None, Some(burst), None)
            })
            .unwrap();
            let start = Instant::now();
            let (mut once, mut often) = (Limiter::new(&c, start), Limiter::new(&c, start));
            let mut t = Duration::ZERO;
            for gap in gaps_ms {
                for k in 1..=10u32 {
                    often.outside(start + t + Duration::from_millis(gap) * k / 10);
                }
                t += Duration::from_millis(gap);
                let (a, b) = (once.admit(start + t, 7), often.admit(start + t, 7));
                prop_assert_eq!(a.refused.is_some(), b.refused.is_some());
                prop_assert_eq!(a.requests.remaining, b.requests.remaining);
                prop_assert_eq!(a.tokens.unwrap().remaining, b.tokens.unwrap().remaining);
            }
            prop_assert_eq!(once.outside(start + t), often.outside(start + t));
        }
    }

    #[test]
    fn the_provider_options_are_checked_with_one_sentence_each() {
        let err = |f: fn(&mut CapacitySpec)| {
            let mut s = spec(120, None, None, None);
            f(&mut s);
            Capacity::check(s).unwrap_err()
        };
        assert_eq!(
            err(|s| s.limit_header = Some("minute".into())),
            "capacity.limitHeader must be perMinute or bucket, not minute"
        );
        assert_eq!(
            err(|s| s.headers = Some("OpenAI".into())),
            "capacity.headers must be api, openai, anthropic or none, not OpenAI"
        );
        assert_eq!(
            err(|s| s.retry_after = Some("ms".into())),
            "capacity.retryAfter must be both, seconds, milliseconds or none, not ms"
        );
        assert_eq!(
            err(|s| {
                s.tokens_per_minute = Some(1000);
                s.tokens = Some("input".into());
            }),
            "capacity.tokens must be total or prompt, not input"
        );
        assert_eq!(
            err(|s| {
                s.tokens_per_minute = Some(1000);
                s.token_burst_seconds = Some(61);
            }),
            "capacity.tokenBurstSeconds must be between 1 and 60, not 61"
        );
        assert_eq!(
            err(|s| s.token_burst_seconds = Some(10)),
            "capacity.tokenBurstSeconds needs capacity.tokensPerMinute, the token budget it shapes"
        );
        assert_eq!(
            err(|s| s.tokens = Some("prompt".into())),
            "capacity.tokens needs capacity.tokensPerMinute, the token budget it shapes"
        );
        assert_eq!(
            err(|s| s.outside_share = Some(1.5)),
            "capacity.outsideShare must be between 0 and 0.9, not 1.5"
        );
        assert!(err(|s| s.outside_share = Some(-0.1)).starts_with("capacity.outsideShare"));
        assert!(err(|s| s.outside_share = Some(f64::NAN)).starts_with("capacity.outsideShare"));
        // The defaults: today's behaviour, except the limit header, now per minute.
        let c = cap(120, Some(1000), None, None);
        assert_eq!(
            (c.limit_header, c.headers, c.retry_after, c.tokens),
            (
                LimitHeader::PerMinute,
                HeaderFamily::Api,
                RetryAfter::Both,
                TokenCharge::Total
            )
        );
        assert_eq!((c.outside_share, c.token_burst_seconds), (0.0, None));
    }
}
