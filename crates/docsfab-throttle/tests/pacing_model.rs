//! The pure core against model providers of the shapes real providers document, in virtual
//! time, with the real replay policy (`docsfab_policy::replay::decide`) deciding each 429's
//! replay wait. No HTTP, no processes: the decision logic alone, so every shape runs in
//! milliseconds. The end-to-end runs on the simulator are the benchmark (docs/throttle.md).
//!
//! The workload is issue 20's: one request (the read step that lists the modules), then N
//! fan-out instances, one request each, 8 at a time; answers take 200 ms, a 429 comes back in
//! 20 ms. The throttle is never told the capacity.
//!
//! The shapes (issue 20, "A provider zoo"):
//! - a bucket of one refilled every 0.5 s behind a per-minute `limit` of 120 (OpenAI: "rate
//!   limits can be quantized ... 60,000 requests/minute may be enforced as 1,000
//!   requests/second"; Anthropic documents the same of its per-minute limits);
//! - the same with a bucket of ten; with Retry-After in milliseconds or absent; with no
//!   rate-limit headers at all; with a client outside docsfab taking 30 % of the key;
//! - a prompt-token limit of 60,000 a minute in a bucket of ten seconds' worth.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::{PastReplay, ReplayDecision, ReplayLimits, decide};
use docsfab_throttle::headers::{BudgetKind, Observation};
use docsfab_throttle::{Admit, Ask, Mode, Outcome, RateHeaders, Settings, ThrottleState};

const ANSWER_MS: u64 = 200;
const REFUSAL_MS: u64 = 20;
const CONCURRENCY: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq)]
enum RetryAfter {
    /// `retry-after` in whole seconds, rounded up.
    Seconds,
    /// `retry-after-ms`, exact.
    Millis,
    None,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    per_minute: f64,
    burst: f64,
    headers: bool,
    retry_after: RetryAfter,
    /// The share of the request capacity a client outside docsfab takes.
    outside: f64,
    /// Whether that client sends at irregular times and retries its refusals (an SDK), or at
    /// a steady pace, skipping an arrival that finds no capacity (the simulator's model).
    outside_retries: bool,
    /// Prompt tokens a minute and the bucket's span in seconds.
    tokens: Option<(f64, f64)>,
}

const fn shape(name: &'static str, burst: f64) -> Shape {
    Shape {
        name,
        per_minute: 120.0,
        burst,
        headers: true,
        retry_after: RetryAfter::Seconds,
        outside: 0.0,
        outside_retries: false,
        tokens: None,
    }
}

const BURST1: Shape = shape("burst 1, per-minute limit", 1.0);
const BURST10: Shape = shape("burst 10", 10.0);
const RA_MS: Shape = Shape {
    retry_after: RetryAfter::Millis,
    ..shape("burst 1, retry-after-ms", 1.0)
};
const RA_NONE: Shape = Shape {
    retry_after: RetryAfter::None,
    ..shape("burst 1, no Retry-After", 1.0)
};
const NO_HEADERS: Shape = Shape {
    headers: false,
    ..shape("burst 1, no rate-limit headers", 1.0)
};
const NO_HEADERS_10: Shape = Shape {
    headers: false,
    ..shape("burst 10, no rate-limit headers", 10.0)
};
const OUTSIDE: Shape = Shape {
    outside: 0.3,
    ..shape("burst 1, 30 % taken outside", 1.0)
};
const OUTSIDE_SDK: Shape = Shape {
    outside: 0.3,
    outside_retries: true,
    ..shape("burst 1, 30 % taken by a retrying SDK", 1.0)
};
const TOKENS: Shape = Shape {
    per_minute: 600.0,
    burst: 600.0,
    tokens: Some((60_000.0, 10.0)),
    ..shape("prompt tokens 60k/min, 10 s bucket", 600.0)
};

/// A token bucket, continuously refilled.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    size: f64,
    level: f64,
    per_ms: f64,
}

impl Bucket {
    fn new(per_minute: f64, size: f64) -> Bucket {
        Bucket {
            size,
            level: size,
            per_ms: per_minute / 60_000.0,
        }
    }

    fn refill(&mut self, ms: f64) {
        self.level = (self.level + self.per_ms * ms).min(self.size);
    }

    fn wait_for(&self, need: f64) -> u64 {
        ((need - self.level).max(0.0) / self.per_ms).ceil() as u64
    }

    fn observation(&self, kind: BudgetKind, limit_per_minute: f64, now: u64) -> Observation {
        Observation {
            kind,
            limit: Some(limit_per_minute as u64),
            remaining: (self.level + 1e-9).floor().max(0.0) as u64,
            reset_at_ms: now + ((self.size - self.level).max(0.0) / self.per_ms).ceil() as u64,
        }
    }
}

struct Provider {
    shape: Shape,
    requests: Bucket,
    tokens: Option<Bucket>,
    at_ms: u64,
    /// The outside client's next arrival, its refused requests' retry times, its randomness.
    outside_next: f64,
    outside_retries: Vec<f64>,
    seed: u64,
}

impl Provider {
    fn new(shape: Shape) -> Provider {
        Provider {
            shape,
            requests: Bucket::new(shape.per_minute, shape.burst),
            tokens: shape
                .tokens
                .map(|(tpm, secs)| Bucket::new(tpm, tpm / 60.0 * secs)),
            at_ms: 0,
            outside_next: 0.0,
            outside_retries: vec![],
            seed: 7,
        }
    }

    fn advance(&mut self, now: u64) {
        // The outside client. Steady: one arrival every period, skipped when it finds no
        // capacity (the simulator's `outsideShare`). Retrying: arrivals at irregular times (a
        // fixed pseudo-random sequence averaging its share), each refused one retried a second
        // later, as an SDK that honours Retry-After would.
        if self.shape.outside > 0.0 {
            let mean = 60_000.0 / (self.shape.per_minute * self.shape.outside);
            loop {
                let next_arrival = self.outside_next;
                let next_retry = self
                    .outside_retries
                    .iter()
                    .copied()
                    .fold(f64::MAX, f64::min);
                let t = next_arrival.min(next_retry);
                if t > now as f64 {
                    break;
                }
                self.requests.refill(t - self.at_ms as f64);
                self.at_ms = t as u64;
                if t == next_retry {
                    let i = self.outside_retries.iter().position(|&r| r == t).unwrap();
                    self.outside_retries.remove(i);
                } else if self.shape.outside_retries {
                    self.seed = self
                        .seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (self.seed >> 33) as f64 / (1u64 << 31) as f64;
                    self.outside_next += mean * (0.25 + 1.5 * u);
                } else {
                    self.outside_next += mean;
                }
                if self.requests.level >= 1.0 {
                    self.requests.level -= 1.0;
                } else if self.shape.outside_retries {
                    self.outside_retries.push(t + 1_000.0);
                }
            }
        }
        let dt = now.saturating_sub(self.at_ms) as f64;
        self.requests.refill(dt);
        if let Some(t) = self.tokens.as_mut() {
            t.refill(dt);
        }
        self.at_ms = self.at_ms.max(now);
    }

    /// Whether a request of `prompt` tokens is served at `now`, and its head.
    fn take(&mut self, now: u64, prompt: f64) -> (bool, RateHeaders) {
        self.advance(now);
        let need = self.tokens.map(|t| prompt.min(t.size));
        let mut wait = self.requests.wait_for(1.0);
        if let (Some(t), Some(n)) = (self.tokens, need) {
            wait = wait.max(t.wait_for(n));
        }
        let served = wait == 0;
        if served {
            self.requests.level -= 1.0;
            if let (Some(t), Some(n)) = (self.tokens.as_mut(), need) {
                t.level -= n;
            }
        }
        let mut observations = vec![];
        if self.shape.headers {
            observations.push(self.requests.observation(
                BudgetKind::Requests,
                self.shape.per_minute,
                now,
            ));
            if let (Some(t), Some((tpm, _))) = (self.tokens, self.shape.tokens) {
                observations.push(t.observation(BudgetKind::Tokens, tpm, now));
            }
        }
        let retry_after_ms = (!served)
            .then(|| match self.shape.retry_after {
                RetryAfter::Seconds => Some(wait.div_ceil(1000) * 1000),
                RetryAfter::Millis => Some(wait),
                RetryAfter::None => None,
            })
            .flatten();
        (
            served,
            RateHeaders {
                at_ms: Some(now),
                retry_after_ms,
                observations,
            },
        )
    }
}

#[derive(Debug)]
struct Result {
    wall_ms: u64,
    floor_ms: u64,
    refused: u32,
    sent: u32,
    failed: u32,
}

impl Result {
    fn ratio(&self) -> f64 {
        self.wall_ms as f64 / self.floor_ms as f64
    }

    fn share(&self) -> f64 {
        f64::from(self.refused) / f64::from(self.sent)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A worker wants to send its job's next request (first or a replay).
    Ready {
        worker: usize,
    },
    /// The reserved instant of a granted send.
    Send {
        worker: usize,
        seq: u64,
    },
    Answer {
        worker: usize,
        seq: u64,
    },
}

struct Worker {
    job: Option<usize>,
    past: Vec<PastReplay>,
    /// The policy's ceiling for the wait before this send, less the replay wait already spent.
    patience_ms: u64,
    /// The instant the time gates must let the current send go.
    patience_end: u64,
    outcome: Option<(bool, RateHeaders)>,
}

fn prompt_tokens(job: usize) -> u64 {
    // About 1,000 tokens, not all alike.
    800 + (job as u64 * 37) % 400
}

/// One run in virtual time: the throttle's state, the model provider, the workers and the
/// events still to happen, by instant and then by the order they were scheduled in.
struct Model {
    settings: Settings,
    limits: ReplayLimits,
    state: ThrottleState,
    provider: Provider,
    /// The first request and the fan-out instances.
    jobs: usize,
    next_job: usize,
    done: usize,
    failed: u32,
    refused: u32,
    sent: u32,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    order: u64,
    workers: Vec<Worker>,
    /// Workers the throttle found no free slot for; they ask again when a request finishes.
    waiting_for_slot: Vec<usize>,
}

impl Model {
    /// The first step alone is ready at 0; the fan-out waits for its answer.
    fn new(shape: Shape, instances: usize, mode: Mode) -> Model {
        let limits = ReplayLimits::default();
        let mut model = Model {
            settings: Settings::new(mode, 8).unwrap(),
            limits,
            state: ThrottleState::new(),
            provider: Provider::new(shape),
            jobs: instances + 1,
            next_job: 0,
            done: 0,
            failed: 0,
            refused: 0,
            sent: 0,
            heap: BinaryHeap::new(),
            order: 0,
            workers: (0..CONCURRENCY)
                .map(|_| Worker {
                    job: None,
                    past: vec![],
                    patience_ms: 0,
                    patience_end: 0,
                    outcome: None,
                })
                .collect(),
            waiting_for_slot: vec![],
        };
        model.workers[0].job = Some(0);
        model.workers[0].patience_ms = limits.max_delay_ms;
        model.next_job = model.next_job.max(1);
        model.push(0, Event::Ready { worker: 0 });
        model
    }

    fn push(&mut self, at: u64, e: Event) {
        self.order += 1;
        self.heap.push(Reverse((at, self.order, e)));
    }

    /// A worker asks the throttle for its send: granted at an instant, or queued for a slot.
    fn ready(&mut self, worker: usize, now: u64) {
        if self.workers[worker].patience_end == 0 {
            self.workers[worker].patience_end = now + self.workers[worker].patience_ms;
        }
        let ask = Ask {
            prompt_tokens: prompt_tokens(self.workers[worker].job.unwrap()),
            patience_until_ms: self.workers[worker].patience_end,
            deadline_ms: None,
        };
        match self.state.admit(&self.settings, now, &ask) {
            Admit::Go { seq, at_ms, .. } => self.push(at_ms, Event::Send { worker, seq }),
            Admit::Full { .. } => self.waiting_for_slot.push(worker),
            Admit::PastDeadline { .. } => unreachable!("no deadline"),
        }
    }

    /// At its reserved instant a granted send reaches the provider (unless the throttle moved
    /// it later), which answers or refuses it.
    fn send(&mut self, worker: usize, seq: u64, now: u64) {
        let job = self.workers[worker].job.unwrap();
        // As the driver does after sleeping until its reservation.
        let go_at = self.state.confirm(seq, now);
        if go_at > now {
            self.push(go_at, Event::Send { worker, seq });
            return;
        }
        self.sent += 1;
        let (served, head) = self.provider.take(now, prompt_tokens(job) as f64);
        let latency = if served { ANSWER_MS } else { REFUSAL_MS };
        self.workers[worker].outcome = Some((served, head));
        self.push(now + latency, Event::Answer { worker, seq });
    }

    /// The answer reaches the throttle; a refusal is replayed or given up as the replay policy
    /// decides, and a finished job makes room for the next.
    fn answer(&mut self, worker: usize, seq: u64, now: u64) {
        let (served, head) = self.workers[worker].outcome.take().unwrap();
        let job = self.workers[worker].job.unwrap();
        let outcome = if served {
            Outcome::Success {
                input_tokens: Some(prompt_tokens(job)),
                output_tokens: Some(20),
            }
        } else {
            self.refused += 1;
            Outcome::RateLimited
        };
        self.state
            .on_response(&self.settings, seq, outcome, &head, now);
        // A finish frees a slot: the waiters ask again.
        for w in std::mem::take(&mut self.waiting_for_slot) {
            self.push(now, Event::Ready { worker: w });
        }
        let finished = if served {
            self.done += 1;
            true
        } else {
            self.replay_or_give_up(worker, head.retry_after_ms, now)
        };
        if finished {
            self.workers[worker].job = None;
            self.workers[worker].past.clear();
            self.start_next_jobs(job, now);
        }
    }

    /// A 429 as the replay policy sees it: a replay after its wait, or the job given up.
    /// Whether the worker is done with its job.
    fn replay_or_give_up(&mut self, worker: usize, retry_after_ms: Option<u64>, now: u64) -> bool {
        let failure = ProviderFailure::from_http_status(429, retry_after_ms);
        let w = &mut self.workers[worker];
        match decide(&self.limits, &w.past, &failure, 0, None) {
            ReplayDecision::Replay { wait_ms, .. } => {
                w.past.push(PastReplay { failure, wait_ms });
                w.patience_ms = self.limits.max_delay_ms.saturating_sub(wait_ms);
                w.patience_end = 0;
                self.push(now + wait_ms, Event::Ready { worker });
                false
            }
            ReplayDecision::Stop { .. } => {
                self.failed += 1;
                self.done += 1;
                true
            }
        }
    }

    /// Hands jobs to free workers after `finished` ended: the whole fan-out's first round once
    /// the first step has answered, else one.
    fn start_next_jobs(&mut self, finished: usize, now: u64) {
        let starting = if finished == 0 { CONCURRENCY } else { 1 };
        for _ in 0..starting {
            if self.next_job >= self.jobs {
                break;
            }
            let free = self.workers.iter().position(|w| w.job.is_none()).unwrap();
            self.workers[free].job = Some(self.next_job);
            self.workers[free].patience_ms = self.limits.max_delay_ms;
            self.workers[free].patience_end = 0;
            self.next_job += 1;
            self.push(now, Event::Ready { worker: free });
        }
    }
}

/// What cannot be served faster however it is sent: everything beyond a full bucket, at the
/// refill rate (the issue's 41 requests at 120 a minute, bucket of one: 20 s).
fn floor_ms(shape: Shape, jobs: usize) -> u64 {
    let request_floor = ((jobs as f64 - shape.burst).max(0.0) / shape.per_minute * 60_000.0) as u64;
    let token_floor = shape.tokens.map_or(0, |(tpm, secs)| {
        let total: u64 = (0..jobs).map(prompt_tokens).sum();
        ((total as f64 - tpm / 60.0 * secs).max(0.0) / tpm * 60_000.0) as u64
    });
    request_floor.max(token_floor)
}

/// Runs `instances` fan-out instances after the one first request.
fn run(shape: Shape, instances: usize, mode: Mode) -> Result {
    let mut model = Model::new(shape, instances, mode);
    let mut now = 0;
    while let Some(Reverse((at, _, event))) = model.heap.pop() {
        now = at;
        match event {
            Event::Ready { worker } => model.ready(worker, now),
            Event::Send { worker, seq } => model.send(worker, seq, now),
            Event::Answer { worker, seq } => model.answer(worker, seq, now),
        }
        if model.done == model.jobs {
            break;
        }
    }
    Result {
        wall_ms: now,
        floor_ms: floor_ms(shape, model.jobs),
        refused: model.refused,
        sent: model.sent,
        failed: model.failed,
    }
}

fn report(shape: Shape, instances: usize) -> (Result, Result) {
    let shared = run(shape, instances, Mode::Shared);
    let off = run(shape, instances, Mode::Off);
    println!(
        "{:<38} {instances:>3} instances | shared: wall/floor {:.3}, 429s {:>3} of {:>3} ({:>4.1} %), failed {} | off: wall/floor {:.3}, 429s {:>3} of {:>3}",
        shape.name,
        shared.ratio(),
        shared.refused,
        shared.sent,
        shared.share() * 100.0,
        shared.failed,
        off.ratio(),
        off.refused,
        off.sent
    );
    (shared, off)
}

/// Issue 20's targets on the decision logic, shapes with rate-limit headers: 120 instances all
/// succeed within 1.15 x the floor with at most 2.5 % of requests refused, never slower than
/// `throttle: off` (40 instances are printed beside them, and held to "never slower").
#[test]
fn issue20_with_rate_limit_headers_every_shape_meets_the_target() {
    for shape in [BURST1, BURST10, RA_MS, RA_NONE, TOKENS] {
        for instances in [40, 120] {
            let (shared, off) = report(shape, instances);
            assert_eq!(shared.failed, 0, "{}", shape.name);
            assert!(
                shared.wall_ms <= off.wall_ms,
                "{}: slower than off",
                shape.name
            );
            if instances == 120 {
                assert!(
                    shared.share() <= 0.025,
                    "{}: {} of {} refused",
                    shape.name,
                    shared.refused,
                    shared.sent
                );
                assert!(
                    shared.ratio() <= 1.15,
                    "{}: {:.3} x the floor",
                    shape.name,
                    shared.ratio()
                );
            }
        }
    }
}

/// Without rate-limit headers the rate is learnt from refusals: 120 instances within 1.3 x the
/// floor, never slower than `throttle: off`. Refused: at most 5 % on the issue's shape (a bucket
/// of one); a bucket of ten hides the rate until it is drained (the requests in flight then are
/// refused together) and the rate is found in a few more refusals: at most 10 % there.
#[test]
fn issue20_without_headers_the_rate_learnt_from_refusals_meets_the_target() {
    for (shape, refused) in [(NO_HEADERS, 0.05), (NO_HEADERS_10, 0.10)] {
        for instances in [40, 120] {
            let (shared, off) = report(shape, instances);
            assert_eq!(shared.failed, 0, "{}", shape.name);
            assert!(
                shared.wall_ms <= off.wall_ms,
                "{}: slower than off",
                shape.name
            );
            if instances == 120 {
                assert!(
                    shared.share() <= refused,
                    "{}: {} of {} refused",
                    shape.name,
                    shared.refused,
                    shared.sent
                );
                assert!(
                    shared.ratio() <= 1.3,
                    "{}: {:.3} x the floor",
                    shape.name,
                    shared.ratio()
                );
            }
        }
    }
}

/// A key shared with a client outside docsfab: the headers overstate what is left for us.
/// Steady outside client (the simulator's): held to the header targets against the share
/// left to docsfab. A retrying SDK at irregular times takes the one unit of a burst-1 bucket
/// just before our send about as often as it sends, which no pacing can foresee: held to
/// "every instance succeeds, never slower than off".
#[test]
fn issue20_a_key_shared_with_an_outside_client() {
    for (shape, strict) in [(OUTSIDE, true), (OUTSIDE_SDK, false)] {
        for instances in [40, 120] {
            let (shared, off) = report(shape, instances);
            assert_eq!(shared.failed, 0);
            let floor_left = shared.floor_ms as f64 / (1.0 - shape.outside);
            let ratio = shared.wall_ms as f64 / floor_left;
            println!("  against the 70 % left to docsfab: wall/floor {ratio:.3}");
            assert!(
                shared.wall_ms <= off.wall_ms,
                "{}: slower than off",
                shape.name
            );
            if strict && instances == 120 {
                assert!(
                    shared.share() <= 0.025,
                    "{} of {}",
                    shared.refused,
                    shared.sent
                );
                assert!(ratio <= 1.15, "{ratio:.3}");
            }
        }
    }
}
