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

use crate::core::{Admit, Mode, Outcome, Reason, Settings};
use crate::headers::{RateHeaders, unix_ms};
use crate::store::{Backend, Store, StoreAdmit, StoreError, Ticket};

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
    store: Option<Mutex<Store>>,
    providers: HashMap<String, Settings>,
    released: Notify,
    poll: Duration,
    clock: Box<dyn Clock>,
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
            Some(Mutex::new(Store::open(backend)?))
        };
        Ok(Throttle {
            inner: Arc::new(Inner {
                store,
                providers,
                released: Notify::new(),
                poll,
                clock,
            }),
        })
    }

    fn settings(&self, provider: &str) -> Settings {
        self.inner
            .providers
            .get(provider)
            .copied()
            .unwrap_or_default()
    }

    /// Waits until `provider` may be sent one request, and returns the permit for it.
    ///
    /// Never waits past `deadline`: a wait known to end after it returns
    /// [`AcquireError::Deadline`] at once, and a wait for a slot returns it when the deadline
    /// comes. The time spent waiting is the permit's `held_ms`; it is not a replay.
    pub async fn acquire(
        &self,
        provider: &str,
        cancel: &CancellationToken,
        deadline: Option<Instant>,
    ) -> Result<Permit, AcquireError> {
        let started = Instant::now();
        let held_ms = || duration_ms(started.elapsed());
        let settings = self.settings(provider);
        let mut held_for = None;
        // This request's place in the shared queue once it has had to wait.
        let mut queued = Queued {
            throttle: self,
            waiter: None,
        };
        loop {
            if cancel.is_cancelled() {
                return Err(AcquireError::Cancelled { held_ms: held_ms() });
            }
            // Registered before the decision, so a finish between the two is not missed.
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let host_now_ms = unix_ms(self.inner.clock.now());
            let decision = self.try_admit(provider, &settings, host_now_ms, queued.waiter)?;
            let (wait_ms, reason) = match decision {
                Decision::Go(ticket) => {
                    // The store took the waiter out of the queue with the grant.
                    queued.waiter = None;
                    return Ok(Permit {
                        held_ms: if held_for.is_some() { held_ms() } else { 0 },
                        held_for,
                        ticket: ticket.map(|ticket| Held {
                            throttle: self.clone(),
                            provider: provider.to_owned(),
                            settings,
                            ticket,
                        }),
                    });
                }
                Decision::Wait {
                    until_ms,
                    reason,
                    waiter,
                    now_ms,
                } => {
                    queued.waiter = waiter;
                    // `until_ms` is on the clock the store decided by (the database's for
                    // PostgreSQL), so the wait is measured from that clock's now.
                    (until_ms.map(|u| u.saturating_sub(now_ms)), reason)
                }
            };
            held_for = Some(reason);
            let wake = match wait_ms {
                Some(ms) => Instant::now() + Duration::from_millis(ms),
                None => Instant::now() + self.inner.poll,
            };
            // A wait that is known to end after the deadline would only burn the attempt.
            if wait_ms.is_some() && deadline.is_some_and(|d| wake > d) {
                return Err(AcquireError::Deadline {
                    held_ms: held_ms(),
                    reason,
                });
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(AcquireError::Cancelled { held_ms: held_ms() }),
                _ = sleep_until_opt(deadline) => {
                    return Err(AcquireError::Deadline { held_ms: held_ms(), reason });
                }
                _ = &mut released, if wait_ms.is_none() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    fn try_admit(
        &self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        waiter: Option<i64>,
    ) -> Result<Decision, StoreError> {
        let Some(store) = self
            .inner
            .store
            .as_ref()
            .filter(|_| settings.mode == Mode::Shared)
        else {
            return Ok(Decision::Go(None));
        };
        let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match store.try_admit(provider, settings, now_ms, waiter)? {
            StoreAdmit::Go(ticket) => Decision::Go(Some(ticket)),
            StoreAdmit::Wait {
                admit: Admit::Wait { until_ms, reason },
                waiter,
                now_ms,
            } => Decision::Wait {
                until_ms,
                reason,
                waiter: Some(waiter),
                now_ms,
            },
            // The store turns every Go into a ticket.
            StoreAdmit::Wait { .. } => Decision::Go(None),
        })
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
        let result = store.lock().unwrap_or_else(|p| p.into_inner()).finish(
            &held.provider,
            &held.settings,
            held.ticket,
            outcome,
            headers,
            now_ms,
        );
        self.inner.released.notify_waiters();
        result
    }
}

enum Decision {
    Go(Option<Ticket>),
    Wait {
        until_ms: Option<u64>,
        reason: Reason,
        waiter: Option<i64>,
        /// The store's clock at the decision.
        now_ms: u64,
    },
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
    ticket: Ticket,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("provider", &self.provider)
            .field("ticket", &self.ticket)
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
        let probe = t.acquire("p", &cancel, None).await.unwrap();
        probe.finish(ok(), &RateHeaders::none()).unwrap();
        let first = t.acquire("p", &cancel, None).await.unwrap();
        let in_flight = t.acquire("p", &cancel, None).await.unwrap();
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: Some(700),
            observations: vec![],
        };
        first
            .finish(Outcome::RateLimited { wait_ms: Some(300) }, &head)
            .unwrap();
        let next = t.acquire("p", &cancel, None).await.unwrap();
        assert_eq!(next.held_for(), Some(Reason::Hold));
        assert!(next.held_ms() >= 700, "held {} ms", next.held_ms());
        // The request that was in flight during the hold finishes as usual.
        in_flight.finish(ok(), &RateHeaders::none()).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_ends_after_the_attempt_deadline_fails_at_once_as_a_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let t = throttle(dir.path(), 4, Mode::Shared);
        let cancel = CancellationToken::new();
        let first = t.acquire("p", &cancel, None).await.unwrap();
        first
            .finish(
                Outcome::RateLimited {
                    wait_ms: Some(5_000),
                },
                &RateHeaders::none(),
            )
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
            p.finish(
                Outcome::RateLimited {
                    wait_ms: Some(60_000),
                },
                &RateHeaders::none(),
            )
            .unwrap();
        }
        let p = t.acquire("p", &cancel, None).await.unwrap();
        assert_eq!(p.held_ms(), 0, "off shares no hold either");
        assert!(
            !dir.path().join("throttle.db").exists(),
            "off touches no file"
        );
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
            .finish(
                Outcome::RateLimited { wait_ms: Some(300) },
                &RateHeaders::none(),
            )
            .unwrap();
        let deadline = Some(Instant::now() + Duration::from_secs(30));
        let next = t.acquire("p", &cancel, deadline).await.unwrap();
        assert_eq!(next.held_for(), Some(Reason::Hold));
        next.finish(ok(), &RateHeaders::none()).unwrap();
    }
}
