//! The fault model: what a provider answers to one request.
//!
//! Two hidden states (good, bad) form a Markov chain stepped once per request, so faults come in
//! bursts. Each state has its own fault probabilities by class. After an HTTP 429 the next request
//! is throttled again with a probability that may depend on the wait before it.

use docsfab_policy::class::ProviderFailure;
use docsfab_record::FaultKind;
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Per-request fault probabilities by class; what is left over is success.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassProbabilities {
    /// HTTP 429 on the response head.
    #[serde(default)]
    pub rate_limit: f64,
    /// HTTP 503 on the response head.
    #[serde(default)]
    pub server: f64,
    /// HTTP 408 on the response head.
    #[serde(default)]
    pub timeout: f64,
    /// A refused or dropped connection.
    #[serde(default)]
    pub network: f64,
    /// A stream that ended without its final event, after answer content was published.
    #[serde(default)]
    pub stream_incomplete: f64,
}

impl ClassProbabilities {
    fn total(&self) -> f64 {
        self.rate_limit + self.server + self.timeout + self.network + self.stream_incomplete
    }
}

/// A latency range in milliseconds, drawn uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Latency {
    pub min_ms: u64,
    pub max_ms: u64,
}

/// One point of the 429-repeat curve: after a wait of at least `after_wait_ms`, another 429
/// follows with `probability` (until the next point).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepeatPoint {
    pub after_wait_ms: u64,
    pub probability: f64,
}

/// A provider's behaviour, as the simulator draws it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultModel {
    /// Fault probabilities outside a burst.
    pub good: ClassProbabilities,
    /// Fault probabilities inside a burst.
    pub bad: ClassProbabilities,
    /// Chance, per request, that a burst starts.
    pub good_to_bad: f64,
    /// Chance, per request, that a burst ends.
    pub bad_to_good: f64,
    /// P(429 | the previous request got 429) by the wait in between; empty means no correlation.
    #[serde(default)]
    pub repeat_after_429: Vec<RepeatPoint>,
    /// The Retry-After a 429 carries, if the provider sends one.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// Time to a successful answer.
    pub ok_latency: Latency,
    /// Time to a fault (a status or a dropped connection).
    pub fault_latency: Latency,
    /// Time until a stream that breaks off does so.
    pub stream_latency: Latency,
}

/// What one request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer; the attempt succeeds.
    Ok,
    /// A failure, as the transport would classify it.
    Fault(ProviderFailure),
}

/// The provider's side of a simulated step: the chain's state and the last outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provider {
    bad: bool,
    last_was_429: bool,
}

impl FaultModel {
    /// Why the model cannot be used, as one sentence fragment naming the field; `None` if sound.
    pub fn problem(&self) -> Option<String> {
        let prob = |name: &str, p: f64| {
            (!(0.0..=1.0).contains(&p))
                .then(|| format!("{name} is {p}, not a probability between 0 and 1"))
        };
        for (state, c) in [("good", &self.good), ("bad", &self.bad)] {
            for (k, p) in [
                ("rateLimit", c.rate_limit),
                ("server", c.server),
                ("timeout", c.timeout),
                ("network", c.network),
                ("streamIncomplete", c.stream_incomplete),
            ] {
                if let Some(e) = prob(&format!("{state}.{k}"), p) {
                    return Some(e);
                }
            }
            if c.total() > 1.0 + 1e-9 {
                return Some(format!(
                    "the {state} probabilities add up to {}, more than 1",
                    c.total()
                ));
            }
        }
        if let Some(e) =
            prob("goodToBad", self.good_to_bad).or_else(|| prob("badToGood", self.bad_to_good))
        {
            return Some(e);
        }
        for (i, r) in self.repeat_after_429.iter().enumerate() {
            if let Some(e) = prob(&format!("repeatAfter429[{i}].probability"), r.probability) {
                return Some(e);
            }
            if i > 0 && r.after_wait_ms <= self.repeat_after_429[i - 1].after_wait_ms {
                return Some(format!(
                    "repeatAfter429[{i}].afterWaitMs must be larger than the point before it"
                ));
            }
        }
        for (name, l) in [
            ("okLatency", self.ok_latency),
            ("faultLatency", self.fault_latency),
            ("streamLatency", self.stream_latency),
        ] {
            if l.min_ms > l.max_ms {
                return Some(format!("{name}.minMs is above {name}.maxMs"));
            }
        }
        None
    }

    /// The chance of a 429 right after a 429 and a wait of `wait_ms`, if the model sets one.
    fn repeat_429(&self, wait_ms: u64) -> Option<f64> {
        self.repeat_after_429
            .iter()
            .take_while(|p| p.after_wait_ms <= wait_ms)
            .last()
            .or(self.repeat_after_429.first())
            .map(|p| p.probability)
    }

    /// Draws the answer to the next request, `wait_ms` after the previous one ended, and how long
    /// it took. Steps the burst chain first.
    pub fn draw(&self, p: &mut Provider, wait_ms: u64, rng: &mut Rng) -> (Outcome, u64) {
        let flip = if p.bad {
            self.bad_to_good
        } else {
            self.good_to_bad
        };
        if rng.unit() < flip {
            p.bad = !p.bad;
        }
        let probs = if p.bad { &self.bad } else { &self.good };
        let outcome = match (p.last_was_429, self.repeat_429(wait_ms)) {
            (true, Some(repeat)) if rng.unit() < repeat => Outcome::Fault(self.throttled()),
            // The repeat curve decided "no 429": draw among the other classes only.
            (true, Some(_)) => self.class_draw(
                probs,
                rng.unit() * (1.0 - probs.rate_limit) + probs.rate_limit,
            ),
            _ => self.class_draw(probs, rng.unit()),
        };
        p.last_was_429 = matches!(outcome, Outcome::Fault(f) if f.http_status == Some(429));
        let latency = match outcome {
            Outcome::Ok => self.ok_latency,
            Outcome::Fault(f) if f.content_published => self.stream_latency,
            Outcome::Fault(_) => self.fault_latency,
        };
        (outcome, rng.range_ms(latency.min_ms, latency.max_ms))
    }

    fn throttled(&self) -> ProviderFailure {
        ProviderFailure::from_http_status(429, self.retry_after_ms)
    }

    /// The class for a uniform draw `u`, laid out as [429 | 503 | 408 | network | stream | ok].
    fn class_draw(&self, c: &ClassProbabilities, u: f64) -> Outcome {
        let mut edge = c.rate_limit;
        if u < edge {
            return Outcome::Fault(self.throttled());
        }
        edge += c.server;
        if u < edge {
            return Outcome::Fault(ProviderFailure::from_http_status(503, None));
        }
        edge += c.timeout;
        if u < edge {
            return Outcome::Fault(ProviderFailure::from_http_status(408, None));
        }
        edge += c.network;
        if u < edge {
            return Outcome::Fault(ProviderFailure::from_fault(FaultKind::ConnectionDropped));
        }
        edge += c.stream_incomplete;
        if u < edge {
            let mut f = ProviderFailure::from_fault(FaultKind::StreamIncomplete);
            f.content_published = true;
            return Outcome::Fault(f);
        }
        Outcome::Ok
    }

    /// The model built from the retry spec's published measurements (derivation: docs/budgets.md).
    pub fn seed() -> FaultModel {
        // 3 of 56 bursts lasted 3+ faults. A burst is a run of bad-state requests whose length is
        // geometric: P(len >= 3) = stay^2 = 3/56, so stay = 0.2315 and badToGood = 0.7685.
        let stay = (3.0f64 / 56.0).sqrt();
        FaultModel {
            good: ClassProbabilities {
                // Assumed onset rates (the spec publishes none): 2 % throttled, 0.5 % 503,
                // 0.2 % dropped connections, 0.2 % streams cut after content.
                rate_limit: 0.02,
                server: 0.005,
                timeout: 0.0,
                network: 0.002,
                stream_incomplete: 0.002,
            },
            // The measured bursts were 408s answered within milliseconds.
            bad: ClassProbabilities {
                timeout: 1.0,
                ..ClassProbabilities::default()
            },
            good_to_bad: 0.01,
            bad_to_good: 1.0 - stay,
            // "near 0.7 whether DocsFab had waited 0.5 s or 20 s".
            repeat_after_429: vec![RepeatPoint {
                after_wait_ms: 0,
                probability: 0.7,
            }],
            retry_after_ms: None,
            ok_latency: Latency {
                min_ms: 2_000,
                max_ms: 20_000,
            },
            fault_latency: Latency {
                min_ms: 5,
                max_ms: 50,
            },
            stream_latency: Latency {
                min_ms: 1_000,
                max_ms: 10_000,
            },
        }
    }

    /// Every request fails with HTTP `status`, instantly: the hand-computable extreme.
    #[cfg(any(test, feature = "testing"))]
    pub fn always(status: u16) -> FaultModel {
        let mut c = ClassProbabilities::default();
        match status {
            429 => c.rate_limit = 1.0,
            408 => c.timeout = 1.0,
            _ => c.server = 1.0,
        }
        FaultModel {
            good: c,
            bad: c,
            good_to_bad: 0.0,
            bad_to_good: 0.0,
            repeat_after_429: Vec::new(),
            retry_after_ms: None,
            ok_latency: Latency {
                min_ms: 0,
                max_ms: 0,
            },
            fault_latency: Latency {
                min_ms: 0,
                max_ms: 0,
            },
            stream_latency: Latency {
                min_ms: 0,
                max_ms: 0,
            },
        }
    }

    /// Every request succeeds after `latency_ms`.
    #[cfg(any(test, feature = "testing"))]
    pub fn always_ok(latency_ms: u64) -> FaultModel {
        let mut m = FaultModel::always(503);
        m.good = ClassProbabilities::default();
        m.bad = ClassProbabilities::default();
        m.ok_latency = Latency {
            min_ms: latency_ms,
            max_ms: latency_ms,
        };
        m
    }
}

/// What the run store observed, in the shape `runs stats` counts it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Provider requests sent.
    pub requests: u64,
    /// Turns by the faults in a row they saw (answered or given up alike).
    pub bursts: Vec<(u32, u64)>,
    /// Faults by provider error class (`rate-limit`, `server`, `timeout`, `network`, ...).
    pub faults_by_class: Vec<(String, u64)>,
    /// The 429-after-429 figure: (the shortest wait of the bucket, the probability, if sampled).
    pub repeats_after_429: Vec<(u64, Option<f64>)>,
}

impl FaultModel {
    /// A model fitted from recorded runs; `None` when they saw no request.
    ///
    /// Faults in a row are read as a burst of the bad state: the mean burst length `L` gives
    /// `badToGood = 1/L`, and bursts per fault-free request give `goodToBad`. The bad state
    /// draws the observed class mix; the good state never faults. The 429 repeat curve is the
    /// store's, bucket by bucket. Latencies are not recorded per request, so the seed model's
    /// are kept.
    pub fn fit(o: &Observed) -> Option<FaultModel> {
        if o.requests == 0 {
            return None;
        }
        let (mut bursts, mut faults) = (0u64, 0u64);
        for &(len, turns) in &o.bursts {
            if len > 0 {
                bursts += turns;
                faults += u64::from(len) * turns;
            }
        }
        let mut mix = ClassProbabilities::default();
        let classified: u64 = o.faults_by_class.iter().map(|(_, n)| n).sum();
        for (class, n) in &o.faults_by_class {
            let share = *n as f64 / classified.max(1) as f64;
            match class.as_str() {
                "rate-limit" => mix.rate_limit += share,
                "server" => mix.server += share,
                "timeout" => mix.timeout += share,
                "stream-incomplete" => mix.stream_incomplete += share,
                // Connection faults and any class the model has no slot for.
                _ => mix.network += share,
            }
        }
        if classified == 0 {
            mix.server = 1.0;
        }
        let seed = FaultModel::seed();
        let clean = o.requests.saturating_sub(faults).max(1);
        Some(FaultModel {
            good: ClassProbabilities::default(),
            bad: mix,
            good_to_bad: (bursts as f64 / clean as f64).min(1.0),
            bad_to_good: if bursts == 0 {
                1.0
            } else {
                (bursts as f64 / faults as f64).min(1.0)
            },
            repeat_after_429: o
                .repeats_after_429
                .iter()
                .filter_map(|&(after_wait_ms, p)| {
                    p.map(|probability| RepeatPoint {
                        after_wait_ms,
                        probability,
                    })
                })
                .collect(),
            retry_after_ms: None,
            ..seed
        })
    }
}
