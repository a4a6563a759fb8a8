//! The async side: `Throttle::acquire` sleeps until the shared state admits a send (or the
//! caller cancels, or the attempt deadline would pass), and `Permit::finish` feeds back how it
//! went.
//!
//! Waking up: a hold or a pacing wait ends at a known instant, so the waiter sleeps until then.
//! A slot freed by a finish in this process wakes waiters at once (a `Notify`); a slot freed by
//! another process, or by the death of one, is seen at the next poll.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{Mode, Outcome, Reason, Settings, ThrottleState};
use crate::headers::{RateHeaders, unix_ms};
use crate::lease::{self, Leases, Step};
use crate::store::{Backend, Store, StoreAdmit, StoreError, Ticket, Want};

/// How often a waiter for a slot looks again when no finish in this process woke it.
pub const DEFAULT_POLL: Duration = Duration::from_millis(50);

/// Why `acquire` returned without a permit.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("the request was cancelled while the provider throttle held it")]
    Cancelled { held_ms: u64 },
    #[error(
        "the attempt deadline passed while the provider throttle held the request ({}, {held_ms} ms)",
        reason.as_str()
    )]
    Deadline { held_ms: u64, reason: Reason },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The wall clock the shared state is kept in. Tests run it from tokio's paused clock.
pub(crate) trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

struct Inner {
    /// `None` when every configured provider has `throttle: off`.
    store: Option<Arc<Mutex<Store>>>,
    /// The leases this process admits from without asking the store (the fast path).
    leases: Arc<Leases>,
    providers: HashMap<String, Settings>,
    released: Notify,
    poll: Duration,
    clock: Box<dyn Clock>,
}

impl Drop for Inner {
    /// A process may open and drop throttles while it lives (`serve` opens one per job): the
    /// leases go back with it, or their slots would count until the process ends.
    fn drop(&mut self) {
        if let Some(store) = &self.store {
            let now_ms = unix_ms(self.clock.now());
            self.leases.hand_back(store, &self.providers, now_ms);
        }
    }
}

/// The provider throttle of one process, shared with every process on the same
/// `DOCSFAB_HOME` through `throttle.db`, or with every process on the same PostgreSQL database
/// through its tables. Cheap to clone.
#[derive(Clone)]
pub struct Throttle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("providers", &self.inner.providers)
            .field("poll", &self.inner.poll)
            .finish()
    }
}

impl Throttle {
    /// Opens (creating if needed) the shared state at `path` (`DOCSFAB_HOME/throttle.db`) for
    /// the providers named with their host.yaml settings. A provider not named is throttled
    /// with the defaults.
    pub fn open(
        path: &Path,
        providers: impl IntoIterator<Item = (String, Settings)>,
    ) -> Result<Throttle, StoreError> {
        Throttle::open_with(path, providers, DEFAULT_POLL)
    }

    /// [`Throttle::open`] with the poll interval chosen (how soon a slot freed by another
    /// process is noticed).
    pub fn open_with(
        path: &Path,
        providers: impl IntoIterator<Item = (String, Settings)>,
        poll: Duration,
    ) -> Result<Throttle, StoreError> {
        Throttle::open_at(&Backend::Sqlite(path.to_owned()), providers, poll)
    }

    /// Opens the shared state wherever `backend` keeps it; the throttle behaves the same on
    /// either. PostgreSQL registers this process as a worker of that database (its heartbeat
    /// keeps its permits alive) and decides by the database's clock.
    pub fn open_at(
        backend: &Backend,
        providers: impl IntoIterator<Item = (String, Settings)>,
        poll: Duration,
    ) -> Result<Throttle, StoreError> {
        Throttle::build(
            backend,
            providers.into_iter().collect(),
            poll,
            Box::new(SystemClock),
        )
    }

    pub(crate) fn build(
        backend: &Backend,
        providers: HashMap<String, Settings>,
        poll: Duration,
        clock: Box<dyn Clock>,
    ) -> Result<Throttle, StoreError> {
        let all_off = !providers.is_empty() && providers.values().all(|s| s.mode == Mode::Off);
        let store = if all_off {
            None
        } else {
            Some(Arc::new(Mutex::new(Store::open(backend)?)))
        };
        let leases = Arc::new(Leases::default());
        if let Some(store) = &store {
            lease::spawn_settler(
                Arc::downgrade(&leases),
                Arc::downgrade(store),
                providers.clone(),
            );
        }
        Ok(Throttle {
            inner: Arc::new(Inner {
                store,
                leases,
                providers,
                released: Notify::new(),
                poll,
                clock,
            }),
        })
    }

    /// How many times this process used the shared state (each a transaction or a read): the
    /// cost the fast path saves, for benchmarks and tests.
    pub fn store_calls(&self) -> u64 {
        self.inner
            .store
            .as_ref()
            .map_or(0, |s| s.lock().unwrap_or_else(|p| p.into_inner()).calls())
    }

    fn settings(&self, provider: &str) -> Settings {
        self.inner
            .providers
            .get(provider)
            .copied()
            .unwrap_or_default()
    }

    /// [`Throttle::acquire_for`] for a request with no token estimate that the time gates may
    /// hold until its deadline.
    pub async fn acquire(
        &self,
        provider: &str,
        cancel: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Permit, AcquireError> {
        self.acquire_for(provider, &Request::unbounded(), cancel, deadline)
            .await
    }

    /// Waits until `provider` may be sent `request`, and returns the permit for it.
    ///
    /// The time gates (the hold after a 429, pacing, the first request alone) hold it at most
    /// `request.patience`; only the `maxConcurrentRequests` cap may hold it longer, and nothing
    /// past `deadline`: a wait known to end after it returns [`AcquireError::Deadline`] at
    /// once, and a wait for a slot returns it when the deadline comes. The time spent waiting
    /// is the permit's `held_ms`; it is not a replay.
    pub async fn acquire_for(
        &self,
        provider: &str,
        request: &Request,
        cancel: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Permit, AcquireError> {
        let ask = Asking {
            provider,
            settings: self.settings(provider),
            request,
            cancel,
            deadline,
            started: Instant::now(),
        };
        let mut held_for = None;
        if let Some(store) = self
            .inner
            .store
            .as_ref()
            .filter(|_| ask.settings.mode == Mode::Shared)
        {
            match self.admit_from_lease(store, &ask).await? {
                FromLease::Admitted(permit) => return Ok(permit),
                FromLease::Decide { waited_for } => held_for = waited_for,
            }
        }
        self.admit_from_store(&ask, held_for).await
    }

    /// The fast path: a permit from this process's lease, waiting here for one of its slots
    /// when they are all taken, until the lease says the store must decide.
    async fn admit_from_lease(
        &self,
        store: &Mutex<Store>,
        ask: &Asking<'_>,
    ) -> Result<FromLease, AcquireError> {
        let mut held_for = None;
        let mut waiting = WaitingHere {
            throttle: self,
            provider: ask.provider,
            on: false,
        };
        loop {
            if ask.cancel.is_cancelled() {
                return Err(AcquireError::Cancelled {
                    held_ms: ask.held_ms(),
                });
            }
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let host_now_ms = unix_ms(self.inner.clock.now());
            let step = self.inner.leases.step(
                store,
                ask.provider,
                &ask.settings,
                host_now_ms,
                &mut waiting.on,
            );
            match step {
                Step::Go { seq } => {
                    let held = Held {
                        throttle: self.clone(),
                        provider: ask.provider.to_owned(),
                        settings: ask.settings,
                        kind: HeldKind::Lease {
                            seq,
                            prompt_tokens: ask.request.prompt_tokens,
                        },
                    };
                    return Ok(FromLease::Admitted(Permit {
                        held_ms: if held_for.is_some() { ask.held_ms() } else { 0 },
                        held_for,
                        ticket: Some(held),
                    }));
                }
                Step::Full => {
                    held_for = Some(Reason::Concurrency);
                    self.wait_for_a_finish(ask, released, Reason::Concurrency)
                        .await?;
                }
                Step::Slow => {
                    return Ok(FromLease::Decide {
                        waited_for: held_for,
                    });
                }
            }
        }
    }

    /// The slow path: the store decides, queueing the request for a slot and reserving its
    /// instant; then it sleeps until that instant.
    async fn admit_from_store(
        &self,
        ask: &Asking<'_>,
        mut held_for: Option<Reason>,
    ) -> Result<Permit, AcquireError> {
        let (provider, settings) = (ask.provider, ask.settings);
        // This request's place in the shared queue once it has had to wait for a slot.
        let mut queued = Queued {
            throttle: self,
            waiter: None,
        };
        loop {
            if ask.cancel.is_cancelled() {
                return Err(AcquireError::Cancelled {
                    held_ms: ask.held_ms(),
                });
            }
            // Registered before the decision, so a finish between the two is not missed.
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let now = Instant::now();
            let want = Want {
                prompt_tokens: ask.request.prompt_tokens,
                patience_ms: duration_ms(
                    ask.request.patience.saturating_sub(ask.started.elapsed()),
                ),
                deadline_in_ms: ask
                    .deadline
                    .map(|d| duration_ms(d.saturating_duration_since(now))),
            };
            let host_now_ms = unix_ms(self.inner.clock.now());
            let decision =
                self.try_admit(provider, &settings, host_now_ms, &want, queued.waiter)?;
            let (ticket, wait_ms, reason) = match decision {
                Decision::Go {
                    ticket,
                    wait_ms,
                    reason,
                } => {
                    // The store took the waiter out of the queue with the grant.
                    queued.waiter = None;
                    (ticket, wait_ms, reason)
                }
                Decision::PastDeadline { reason } => {
                    return Err(AcquireError::Deadline {
                        held_ms: ask.held_ms(),
                        reason,
                    });
                }
                Decision::Full { reason, waiter } => {
                    queued.waiter = waiter;
                    held_for = Some(reason);
                    self.wait_for_a_finish(ask, released, reason).await?;
                    continue;
                }
            };
            let mut permit = Permit {
                held_ms: 0,
                held_for: reason.or(held_for),
                ticket: ticket.map(|ticket| Held {
                    throttle: self.clone(),
                    provider: provider.to_owned(),
                    settings,
                    kind: HeldKind::Store(ticket),
                }),
            };
            if let (true, Some(seq)) = (wait_ms > 0, ticket.map(|t| t.seq)) {
                let patience_end = ask.started.checked_add(ask.request.patience);
                self.wait_out(
                    provider,
                    seq,
                    wait_ms,
                    patience_end,
                    ask.cancel,
                    ask.deadline,
                )
                .await
                .map_err(|e| e.with_held(ask.held_ms()))?;
            }
            if permit.held_for.is_some() {
                permit.held_ms = ask.held_ms();
            }
            return Ok(permit);
        }
    }

    /// Waits for a finish in this process (`released`) or the next poll; a cancel or the
    /// deadline ends the request, the deadline as held for `reason`.
    async fn wait_for_a_finish(
        &self,
        ask: &Asking<'_>,
        released: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        reason: Reason,
    ) -> Result<(), AcquireError> {
        tokio::select! {
            biased;
            _ = ask.cancel.cancelled() => Err(AcquireError::Cancelled { held_ms: ask.held_ms() }),
            _ = sleep_until_opt(ask.deadline) => {
                Err(AcquireError::Deadline { held_ms: ask.held_ms(), reason })
            }
            _ = released => Ok(()),
            _ = tokio::time::sleep(self.inner.poll) => Ok(()),
        }
    }

    /// Sleeps until a reservation `wait_ms` away, then as much longer as a refusal or a hold
    /// elsewhere moved it meanwhile, never past the request's patience; a move past the
    /// deadline ends the wait as a deadline.
    async fn wait_out(
        &self,
        provider: &str,
        seq: u64,
        wait_ms: u64,
        patience_end: Option<Instant>,
        cancel: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<(), AcquireError> {
        let mut until = Instant::now() + Duration::from_millis(wait_ms);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(AcquireError::Cancelled { held_ms: 0 }),
                _ = tokio::time::sleep_until(until) => {}
            }
            if patience_end.is_some_and(|end| Instant::now() >= end) {
                return Ok(());
            }
            // The reservation stands when the state cannot be read.
            let more_ms = self.confirm_ms(provider, seq).unwrap_or_default();
            if more_ms == 0 {
                return Ok(());
            }
            until = Instant::now() + Duration::from_millis(more_ms);
            if let Some(end) = patience_end {
                until = until.min(end);
            }
            if deadline.is_some_and(|d| until > d) {
                return Err(AcquireError::Deadline {
                    held_ms: 0,
                    reason: Reason::Hold,
                });
            }
        }
    }

    fn confirm_ms(&self, provider: &str, seq: u64) -> Result<u64, StoreError> {
        let Some(store) = self.inner.store.as_ref() else {
            return Ok(0);
        };
        let now_ms = unix_ms(self.inner.clock.now());
        store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .confirm_ms(provider, seq, now_ms)
    }

    fn try_admit(
        &self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        want: &Want,
        waiter: Option<i64>,
    ) -> Result<Decision, StoreError> {
        let Some(store) = self
            .inner
            .store
            .as_ref()
            .filter(|_| settings.mode == Mode::Shared)
        else {
            return Ok(Decision::Go {
                ticket: None,
                wait_ms: 0,
                reason: None,
            });
        };
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        Ok(
            match store.try_admit(provider, settings, now_ms, want, waiter)? {
                StoreAdmit::Go {
                    ticket,
                    wait_ms,
                    reason,
                } => Decision::Go {
                    ticket: Some(ticket),
                    wait_ms,
                    reason,
                },
                StoreAdmit::Full { reason, waiter } => Decision::Full {
                    reason,
                    waiter: Some(waiter),
                },
                StoreAdmit::PastDeadline { reason } => Decision::PastDeadline { reason },
            },
        )
    }

    fn finish(
        &self,
        held: &Held,
        outcome: Outcome,
        headers: &RateHeaders,
    ) -> Result<(), StoreError> {
        let Some(store) = self.inner.store.as_ref() else {
            return Ok(());
        };
        let now_ms = unix_ms(self.inner.clock.now());
        let result = match held.kind {
            HeldKind::Store(ticket) => {
                let done = store.lock().unwrap_or_else(|p| p.into_inner()).finish(
                    &held.provider,
                    &held.settings,
                    ticket,
                    outcome,
                    headers,
                    now_ms,
                );
                // An answer that says the provider is far from its limits: a lease may be
                // worth asking for again at once.
                if matches!(outcome, Outcome::Success { .. })
                    && ThrottleState::head_is_ample(headers)
                {
                    self.inner.leases.worth_asking(&held.provider);
                }
                done
            }
            HeldKind::Lease { seq, prompt_tokens } => self.inner.leases.finish(
                store,
                &held.provider,
                &held.settings,
                seq,
                prompt_tokens,
                outcome,
                headers,
                now_ms,
            ),
        };
        self.inner.released.notify_waiters();
        result
    }
}

/// One request asking for a permit: what `acquire_for` was given, and when it began.
struct Asking<'a> {
    provider: &'a str,
    settings: Settings,
    request: &'a Request,
    cancel: &'a CancellationToken,
    deadline: Option<Instant>,
    started: Instant,
}

impl Asking<'_> {
    /// How long the request has been held so far.
    fn held_ms(&self) -> u64 {
        duration_ms(self.started.elapsed())
    }
}

/// What the fast path made of a request.
enum FromLease {
    Admitted(Permit),
    /// The store must decide; `waited_for` is why it waited here first, if it did.
    Decide {
        waited_for: Option<Reason>,
    },
}

/// A request waiting for one of its process's lease slots: counted in the demand the process
/// reports, until it is admitted or gives up.
struct WaitingHere<'a> {
    throttle: &'a Throttle,
    provider: &'a str,
    on: bool,
}

impl Drop for WaitingHere<'_> {
    fn drop(&mut self) {
        if self.on {
            self.throttle.inner.leases.stop_waiting(self.provider);
        }
    }
}

enum Decision {
    Go {
        ticket: Option<Ticket>,
        wait_ms: u64,
        reason: Option<Reason>,
    },
    Full {
        reason: Reason,
        waiter: Option<i64>,
    },
    PastDeadline {
        reason: Reason,
    },
}

/// What one request asks of the throttle (see [`Throttle::acquire_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The request's prompt tokens, estimated from the body it sends.
    pub prompt_tokens: u64,
    /// How long the time gates may hold it at most: the retry policy's ceiling for the wait
    /// before this send, less the part of it the caller already waited.
    pub patience: Duration,
}

impl Request {
    /// No token estimate; held as long as the deadline allows.
    pub fn unbounded() -> Request {
        Request {
            prompt_tokens: 0,
            patience: Duration::MAX,
        }
    }
}

impl AcquireError {
    fn with_held(self, held_ms: u64) -> AcquireError {
        match self {
            AcquireError::Cancelled { .. } => AcquireError::Cancelled { held_ms },
            AcquireError::Deadline { reason, .. } => AcquireError::Deadline { held_ms, reason },
            other => other,
        }
    }
}

/// A place in the shared queue, given up when `acquire` returns without a permit (cancelled,
/// deadline, or its future dropped).
struct Queued<'a> {
    throttle: &'a Throttle,
    waiter: Option<i64>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let (Some(waiter), Some(store)) = (self.waiter, self.throttle.inner.store.as_ref()) {
            // A row left behind is reclaimed when this process ends.
            let _ = store
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .leave(waiter);
        }
    }
}

/// The right to send one request. Give it back with [`Permit::finish`]; dropping it gives it
/// back as abandoned (no feedback).
#[derive(Debug)]
#[must_use = "a permit holds a slot until it is finished or dropped"]
pub struct Permit {
    held_ms: u64,
    held_for: Option<Reason>,
    /// `None` for a provider with `throttle: off`.
    ticket: Option<Held>,
}

struct Held {
    throttle: Throttle,
    provider: String,
    settings: Settings,
    kind: HeldKind,
}

/// Where a permit came from: a decision of the store, or this process's lease.
#[derive(Debug, Clone, Copy)]
enum HeldKind {
    Store(Ticket),
    Lease { seq: u64, prompt_tokens: u64 },
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("provider", &self.provider)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Permit {
    /// How long `acquire` held the request before admitting it (0 when it did not wait): the
    /// turn's `heldMs`.
    pub fn held_ms(&self) -> u64 {
        self.held_ms
    }

    /// The last gate that made it wait, if any.
    pub fn held_for(&self) -> Option<Reason> {
        self.held_for
    }

    /// Gives the permit back with how the request went and its response head's hints. One short
    /// transaction on the shared state.
    pub fn finish(mut self, outcome: Outcome, headers: &RateHeaders) -> Result<(), StoreError> {
        match self.ticket.take() {
            Some(held) => held.throttle.finish(&held, outcome, headers),
            None => Ok(()),
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(held) = self.ticket.take() {
            // Nothing to report an error to; a permit that stays behind is reclaimed when this
            // process ends.
            let _ = held
                .throttle
                .finish(&held, Outcome::Abandoned, &RateHeaders::none());
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::RateHeaders;

    /// Wall time that moves with tokio's paused clock.
    struct PausedClock {
        base: SystemTime,
        start: Instant,
    }

    impl Clock for PausedClock {
        fn now(&self) -> SystemTime {
            self.base + self.start.elapsed()
        }
    }

    fn throttle(dir: &Path, max: u32, mode: Mode) -> Throttle {
        throttle_at(&Backend::Sqlite(dir.join("throttle.db")), max, mode)
    }

    /// `throttle.db` in `dir`, and a fresh PostgreSQL database when `DOCSFAB_TEST_POSTGRES`
    /// names a server (kept alive by the second element). For the tests about slots and the
    /// queue; the hold tests stay on SQLite, where the paused clock is the decisions' clock.
    fn backends(dir: &Path, label: &str) -> Vec<(Backend, Option<docsfab_pg::testing::TestDb>)> {
        let mut all = vec![(Backend::Sqlite(dir.join("throttle.db")), None)];
        if let Some(db) = docsfab_pg::testing::fresh_database(label) {
            all.push((Backend::Postgres(db.url.clone()), Some(db)));
        }
        all
    }

    fn throttle_at(backend: &Backend, max: u32, mode: Mode) -> Throttle {
        let providers = HashMap::from([("p".to_owned(), Settings::new(mode, max).unwrap())]);
        let clock = PausedClock {
            base: SystemTime::now(),
            start: Instant::now(),
        };
        Throttle::build(backend, providers, DEFAULT_POLL, Box::new(clock)).unwrap()
    }

    fn ok() -> Outcome {
        Outcome::Success {
            input_tokens: None,
            output_tokens: None,
        }
    }

    fn retry_after(ms: u64) -> RateHeaders {
        RateHeaders {
            retry_after_ms: Some(ms),
            ..RateHeaders::none()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_admitted_request_reports_held_ms_zero() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 2, Mode::Shared);
        let cancel = CancellationToken::new();
        let p = t.acquire("p", &cancel, None).await.unwrap();
        assert_eq!((p.held_ms(), p.held_for()), (0, None));
        p.finish(ok(), &RateHeaders::none()).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_holds_the_next_send_until_the_retry_after_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 4, Mode::Shared);
        let cancel = CancellationToken::new();
        // Two answers without rate-limit headers: two requests may be in flight.
        for _ in 0..2 {
            let probe = t.acquire("p", &cancel, None).await.unwrap();
            probe.finish(ok(), &RateHeaders::none()).unwrap();
        }
        let first = t.acquire("p", &cancel, None).await.unwrap();
        let in_flight = t.acquire("p", &cancel, None).await.unwrap();
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: Some(700),
            observations: vec![],
        };
        first.finish(Outcome::RateLimited, &head).unwrap();
        let next = t.acquire("p", &cancel, None).await.unwrap();
        assert_eq!(next.held_for(), Some(Reason::Hold));
        assert!(next.held_ms() >= 700, "held {} ms", next.held_ms());
        // The request that was in flight during the hold finishes as usual.
        in_flight.finish(ok(), &RateHeaders::none()).unwrap();
    }

    /// REP-8, issue 20: a 429 asking for 5 s holds a request whose policy allows it only 2 s
    /// more for 2 s; it then goes, as the policy would send it.
    #[tokio::test(start_paused = true)]
    async fn rep_8_a_hold_never_holds_a_request_past_its_patience() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 4, Mode::Shared);
        let cancel = CancellationToken::new();
        let first = t.acquire("p", &cancel, None).await.unwrap();
        first
            .finish(Outcome::RateLimited, &retry_after(5_000))
            .unwrap();
        let started = Instant::now();
        let request = Request {
            prompt_tokens: 10,
            patience: Duration::from_millis(2_000),
        };
        let next = t.acquire_for("p", &request, &cancel, None).await.unwrap();
        assert_eq!(next.held_for(), Some(Reason::Hold));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(2_000) && waited < Duration::from_millis(2_100),
            "held {waited:?}"
        );
        assert!(
            (2_000..2_100).contains(&next.held_ms()),
            "{}",
            next.held_ms()
        );
        next.finish(ok(), &RateHeaders::none()).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_ends_after_the_attempt_deadline_fails_at_once_as_a_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 4, Mode::Shared);
        let cancel = CancellationToken::new();
        let first = t.acquire("p", &cancel, None).await.unwrap();
        first
            .finish(Outcome::RateLimited, &retry_after(5_000))
            .unwrap();
        let started = Instant::now();
        let deadline = Some(started + Duration::from_secs(1));
        let err = t.acquire("p", &cancel, deadline).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::Deadline {
                    reason: Reason::Hold,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no wait that cannot end in time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cap_waits_for_a_finish_and_gives_up_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, _db) in backends(dir.path(), "driver_full_cap") {
            let t = throttle_at(&backend, 1, Mode::Shared);
            let cancel = CancellationToken::new();
            let only = t.acquire("p", &cancel, None).await.unwrap();
            let deadline = Some(Instant::now() + Duration::from_millis(200));
            let err = t.acquire("p", &cancel, deadline).await.unwrap_err();
            assert!(
                matches!(err, AcquireError::Deadline { reason: Reason::Concurrency, held_ms } if held_ms >= 200),
                "{backend}: {err:?}"
            );
            let waiter = {
                let t = t.clone();
                let cancel = cancel.clone();
                tokio::spawn(async move { t.acquire("p", &cancel, None).await })
            };
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(!waiter.is_finished(), "{backend}");
            only.finish(ok(), &RateHeaders::none()).unwrap();
            let next = waiter.await.unwrap().unwrap();
            assert_eq!(next.held_for(), Some(Reason::Concurrency), "{backend}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_a_waiter_ends_it_without_a_permit_and_frees_its_place_in_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, _db) in backends(dir.path(), "driver_cancel_waiter") {
            let t = throttle_at(&backend, 1, Mode::Shared);
            let cancel = CancellationToken::new();
            let only = t.acquire("p", &cancel, None).await.unwrap();
            let waiter_cancel = CancellationToken::new();
            let waiter = {
                let t = t.clone();
                let c = waiter_cancel.clone();
                tokio::spawn(async move { t.acquire("p", &c, None).await })
            };
            tokio::time::sleep(Duration::from_millis(120)).await;
            waiter_cancel.cancel();
            let err = waiter.await.unwrap().unwrap_err();
            assert!(
                matches!(err, AcquireError::Cancelled { .. }),
                "{backend}: {err:?}"
            );
            // The cancelled waiter left the queue: the next request is not queued behind it.
            drop(only);
            let next = t.acquire("p", &cancel, None).await.unwrap();
            assert_eq!(next.held_for(), None, "{backend}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_permit_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, _db) in backends(dir.path(), "driver_dropped_permit") {
            let t = throttle_at(&backend, 1, Mode::Shared);
            let cancel = CancellationToken::new();
            drop(t.acquire("p", &cancel, None).await.unwrap());
            let p = t.acquire("p", &cancel, None).await.unwrap();
            assert_eq!(p.held_ms(), 0, "{backend}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn throttle_off_never_waits_and_reports_held_ms_zero() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 1, Mode::Off);
        let cancel = CancellationToken::new();
        let mut permits = vec![];
        for _ in 0..5 {
            let p = t.acquire("p", &cancel, None).await.unwrap();
            assert_eq!((p.held_ms(), p.held_for()), (0, None));
            permits.push(p);
        }
        for p in permits {
            p.finish(Outcome::RateLimited, &retry_after(60_000))
                .unwrap();
        }
        let p = t.acquire("p", &cancel, None).await.unwrap();
        assert_eq!(p.held_ms(), 0, "off shares no hold either");
        assert!(
            !dir.path().join("throttle.db").exists(),
            "off touches no file"
        );
    }

    /// Answers enough requests, one at a time, for the probe window to open to the cap.
    async fn open_up(t: &Throttle) {
        let cancel = CancellationToken::new();
        for _ in 0..8 {
            t.acquire("p", &cancel, None)
                .await
                .unwrap()
                .finish(ok(), &RateHeaders::none())
                .unwrap();
        }
    }

    /// Issue 25: once the provider is known to be unpaced, a process admits from a lease: a
    /// hundred requests cost a handful of store calls, not two each.
    #[tokio::test]
    async fn issue25_an_unpaced_provider_is_admitted_from_a_lease_without_a_store_call_each() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle_real(dir.path(), 8);
        open_up(&t).await;
        let before = t.store_calls();
        let cancel = CancellationToken::new();
        for _ in 0..100 {
            let p = t.acquire("p", &cancel, None).await.unwrap();
            assert_eq!(p.held_ms(), 0);
            p.finish(ok(), &RateHeaders::none()).unwrap();
        }
        let calls = t.store_calls() - before;
        assert!(calls <= 10, "{calls} store calls for 100 requests");
    }

    /// Issue 25: a lease counts against the one cap: another process (another connection to
    /// the same file) sees its slots taken while it holds them, and free once it lapsed (the
    /// settler gives them back without any request of the holder).
    #[tokio::test]
    async fn issue25_a_lease_holds_its_slots_against_other_processes_until_it_lapses() {
        let dir = tempfile::tempdir().unwrap();
        let a = throttle_real(dir.path(), 2);
        open_up(&a).await;
        let cancel = CancellationToken::new();
        // Two at once: the lease grows to the cap.
        let p1 = a.acquire("p", &cancel, None).await.unwrap();
        let p2 = a.acquire("p", &cancel, None).await.unwrap();
        let b = throttle_real(dir.path(), 2);
        let soon = Some(Instant::now() + Duration::from_millis(100));
        let err = b.acquire("p", &cancel, soon).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::Deadline {
                    reason: Reason::Concurrency,
                    ..
                }
            ),
            "{err:?}"
        );
        p1.finish(ok(), &RateHeaders::none()).unwrap();
        p2.finish(ok(), &RateHeaders::none()).unwrap();
        // A is idle now; within a lease or two its row is shrunk to nothing.
        let later = Some(Instant::now() + Duration::from_secs(5));
        let q1 = b.acquire("p", &cancel, later).await.unwrap();
        let q2 = b.acquire("p", &cancel, later).await.unwrap();
        q1.finish(ok(), &RateHeaders::none()).unwrap();
        q2.finish(ok(), &RateHeaders::none()).unwrap();
    }

    /// Issue 25 (found by the fan-out spec tests): requests arriving together on an unpaced
    /// provider all go at once, up to the cap, without waiting for a finish: the lease grows
    /// with each one that wants in.
    #[tokio::test]
    async fn issue25_requests_arriving_together_grow_the_lease_without_waiting_for_a_finish() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle_real(dir.path(), 8);
        open_up(&t).await;
        let cancel = CancellationToken::new();
        let soon = Some(Instant::now() + Duration::from_millis(500));
        let mut held = vec![];
        for i in 0..8 {
            let p = t.acquire("p", &cancel, soon).await;
            assert!(p.is_ok(), "request {i} waited: {:?}", p.err());
            held.push(p.unwrap());
        }
        for p in held {
            assert_eq!(p.held_ms(), 0);
            p.finish(ok(), &RateHeaders::none()).unwrap();
        }
    }

    /// Issue 25: two processes that together want more than the cap both keep admitting from
    /// leases, in about equal parts: the one that came first shrinks to its fair part at its
    /// next renewal, and the other waits for its own slots instead of falling back to a store
    /// decision for every request. (Before, the second process polled the store queue and
    /// both together admitted a few hundred requests a second.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue25_two_processes_wanting_more_than_the_cap_share_it_fairly_from_leases() {
        let dir = tempfile::tempdir().unwrap();
        let a = throttle_real(dir.path(), 4);
        open_up(&a).await;
        let b = throttle_real(dir.path(), 4);
        let before = a.store_calls() + b.store_calls();
        let total = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut tasks = vec![];
        for (name, t) in [("a", &a), ("b", &b)] {
            for _ in 0..4 {
                let (t, total) = (t.clone(), total.clone());
                tasks.push(tokio::spawn(async move {
                    let cancel = CancellationToken::new();
                    let mut mine = 0u32;
                    while total.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2000 {
                        let p = t.acquire("p", &cancel, None).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        p.finish(ok(), &RateHeaders::none()).unwrap();
                        mine += 1;
                    }
                    (name, mine)
                }));
            }
        }
        let (mut got_a, mut got_b) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                ("a", n) => got_a += n,
                (_, n) => got_b += n,
            }
        }
        let calls = a.store_calls() + b.store_calls() - before;
        assert!(
            got_a.min(got_b) * 3 >= got_a.max(got_b),
            "a admitted {got_a}, b {got_b}: one took the cap"
        );
        assert!(
            calls * 4 <= u64::from(got_a + got_b),
            "{calls} store calls for {} admissions",
            got_a + got_b
        );
    }

    /// Issue 25: a throttle dropped while its process lives (serve opens one per job) hands its
    /// lease back at once: another can take every slot without waiting for it to lapse.
    #[tokio::test]
    async fn issue25_a_dropped_throttle_hands_its_lease_back() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let a = throttle_real(dir.path(), 2);
        open_up(&a).await;
        let p1 = a.acquire("p", &cancel, None).await.unwrap();
        let p2 = a.acquire("p", &cancel, None).await.unwrap();
        p1.finish(ok(), &RateHeaders::none()).unwrap();
        p2.finish(ok(), &RateHeaders::none()).unwrap();
        drop(a);
        let b = throttle_real(dir.path(), 2);
        let soon = Some(Instant::now() + Duration::from_millis(60));
        let q1 = b.acquire("p", &cancel, soon).await.unwrap();
        let q2 = b.acquire("p", &cancel, soon).await.unwrap();
        q1.finish(ok(), &RateHeaders::none()).unwrap();
        q2.finish(ok(), &RateHeaders::none()).unwrap();
    }

    /// Issue 25: a 429 under a lease reaches the shared state at once, ends the lease, and
    /// holds every other sender for its Retry-After.
    #[tokio::test]
    async fn issue25_a_429_under_a_lease_holds_the_others_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = throttle_real(dir.path(), 8);
        open_up(&a).await;
        let cancel = CancellationToken::new();
        let p = a.acquire("p", &cancel, None).await.unwrap();
        p.finish(Outcome::RateLimited, &retry_after(400)).unwrap();
        let limited_at = Instant::now();
        // The lease ended with the 429: its holder is held like everyone else.
        let own = a.acquire("p", &cancel, None).await.unwrap();
        assert_eq!(own.held_for(), Some(Reason::Hold));
        assert!(own.held_ms() >= 300, "held {} ms", own.held_ms());
        // And another process is held from the same instant on (then paced behind `own`).
        let b = throttle_real(dir.path(), 8);
        let next = b.acquire("p", &cancel, None).await.unwrap();
        assert!(next.held_for().is_some());
        assert!(limited_at.elapsed() >= Duration::from_millis(300));
        next.finish(ok(), &RateHeaders::none()).unwrap();
        own.finish(ok(), &RateHeaders::none()).unwrap();
    }

    /// A throttle on the real clock (leases lapse in real time).
    fn throttle_real(dir: &Path, max: u32) -> Throttle {
        let providers =
            HashMap::from([("p".to_owned(), Settings::new(Mode::Shared, max).unwrap())]);
        Throttle::build(
            &Backend::Sqlite(dir.join("throttle.db")),
            providers,
            DEFAULT_POLL,
            Box::new(SystemClock),
        )
        .unwrap()
    }

    /// A host whose clock is an hour behind. Over PostgreSQL its waits are measured on the
    /// database's clock, from the decision's own "now": a 300 ms hold is waited out, not taken
    /// for a hold an hour long and refused at once as past the deadline.
    struct HourBehind;

    impl Clock for HourBehind {
        fn now(&self) -> SystemTime {
            SystemTime::now() - Duration::from_secs(3_600)
        }
    }

    #[tokio::test]
    async fn issue15_a_host_with_a_skewed_clock_waits_out_a_postgres_hold_by_the_database_clock() {
        let Some(db) = docsfab_pg::testing::fresh_database("driver_skewed_host") else {
            return;
        };
        let providers = HashMap::from([("p".to_owned(), Settings::new(Mode::Shared, 4).unwrap())]);
        let t = Throttle::build(
            &Backend::Postgres(db.url.clone()),
            providers,
            DEFAULT_POLL,
            Box::new(HourBehind),
        )
        .unwrap();
        let cancel = CancellationToken::new();
        let first = t.acquire("p", &cancel, None).await.unwrap();
        first
            .finish(Outcome::RateLimited, &retry_after(300))
            .unwrap();
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let next = t.acquire("p", &cancel, deadline).await.unwrap();
        assert_eq!(next.held_for(), Some(Reason::Hold));
        next.finish(ok(), &RateHeaders::none()).unwrap();
    }
}
