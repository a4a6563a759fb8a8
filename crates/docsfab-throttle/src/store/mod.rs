//! Where the throttle's shared state lives, and the one interface the driver uses for it.
//!
//! Two backends keep the same three things (permits in flight, the FIFO queue of waiters, the
//! pure core's state per provider) with the same decision transaction:
//! - [`sqlite`]: `DOCSFAB_HOME/throttle.db`, shared by the processes on one home; a holder is a
//!   process (pid + start time).
//! - [`postgres`]: tables in the run store's PostgreSQL database, shared by every process on
//!   every host using it; a holder is a registered worker (`docsfab_pg::worker`).
//!
//! Both implement [`SharedState`], each call written once in each; the driver holds a
//! [`Store`] and never asks which one it is.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use docsfab_pg::{PgError, PgUrl};

use crate::core::{
    Admit, Ask, Lease, LeaseReport, NoLease, Outcome, Reason, Settings, ThrottleState, fair_share,
};
use crate::headers::RateHeaders;

mod postgres;
mod sqlite;

use self::postgres::PgStore;
use self::sqlite::SqliteStore;

/// Where the shared state is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file, normally `DOCSFAB_HOME/throttle.db`.
    Sqlite(PathBuf),
    /// The `throttle_*` tables of a PostgreSQL database (the run store's).
    Postgres(PgUrl),
}

impl fmt::Display for Backend {
    /// The file's path, or the database's URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Sqlite(path) => write!(f, "{}", path.display()),
            Backend::Postgres(url) => write!(f, "{url}"),
        }
    }
}

/// The throttle's shared state could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not create the directory {path} for the throttle state: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the throttle state {path} could not be used: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// `PgError` names the server by its redacted URL.
    #[error("the throttle state in PostgreSQL could not be used: {source}")]
    Postgres { source: PgError },
}

impl From<PgError> for StoreError {
    fn from(source: PgError) -> StoreError {
        StoreError::Postgres { source }
    }
}

/// A permit as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub id: i64,
    pub seq: u64,
}

#[derive(Debug)]
pub(crate) enum StoreAdmit {
    /// Reserved: send in `wait_ms` (0: now); `reason` is the gate that made it later.
    Go {
        ticket: Ticket,
        wait_ms: u64,
        reason: Option<Reason>,
    },
    /// No slot; the caller is queued as `waiter` (give it back with `leave` if it stops
    /// waiting) and asks again when a request finishes.
    Full { reason: Reason, waiter: i64 },
    /// The gates would hold it past its deadline; nothing was reserved.
    PastDeadline { reason: Reason },
}

/// One request's question, in durations from the decision's own "now" (each backend decides
/// by its own clock: PostgreSQL's is the database's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// The request's prompt tokens, estimated from its body.
    pub prompt_tokens: u64,
    /// How long the time gates may hold it at most (the policy's ceiling for this wait).
    pub patience_ms: u64,
    /// Time left to the attempt deadline, if there is one.
    pub deadline_in_ms: Option<u64>,
}

impl Want {
    /// As the core's absolute [`Ask`] on a clock reading `now_ms`.
    pub(crate) fn at(&self, now_ms: u64) -> Ask {
        Ask {
            prompt_tokens: self.prompt_tokens,
            patience_until_ms: now_ms.saturating_add(self.patience_ms),
            deadline_ms: self.deadline_in_ms.map(|d| now_ms.saturating_add(d)),
        }
    }
}

/// What the core said, as the store hands it to the driver (the permit row written on `Go`).
pub(crate) fn store_admit<E>(
    decision: Admit,
    now_ms: u64,
    ticket: impl FnOnce(u64) -> Result<Ticket, E>,
    waiter: impl FnOnce() -> Result<i64, E>,
) -> Result<StoreAdmit, E> {
    Ok(match decision {
        Admit::Go { seq, at_ms, reason } => StoreAdmit::Go {
            ticket: ticket(seq)?,
            wait_ms: at_ms.saturating_sub(now_ms),
            reason,
        },
        Admit::Full { reason } => StoreAdmit::Full {
            reason,
            waiter: waiter()?,
        },
        Admit::PastDeadline { reason, .. } => StoreAdmit::PastDeadline { reason },
    })
}

/// One lease transaction: what the process's lease row (`row`) did since it was last written,
/// and whether it wants a new lease. The row keeps counting the `keep` requests still in
/// flight under it; it goes when it counts none and no lease is granted.
pub(crate) struct LeaseTx<'a> {
    pub row: Option<i64>,
    pub keep: u32,
    pub report: &'a LeaseReport,
    /// A leased request whose end must reach the state now (a refusal), with its seq.
    pub finished: Option<(u64, Outcome, &'a RateHeaders)>,
    /// Slots wanted for a new lease (this process's demand, kept on the row so other holders
    /// make room for it); `None` hands the lease back.
    pub want: Option<u32>,
}

/// The other holders of a provider's cap, as one lease decision sees them.
#[derive(Debug, Default)]
pub(crate) struct Others {
    /// Slots they hold (permit rows one each, lease rows their slots) plus the waiters queued.
    pub in_flight: u32,
    /// What each other row wants: a permit one, a lease its demand (at least its slots).
    pub wants: Vec<u32>,
    /// Waiters queued in the store: each wants one.
    pub waiters: u32,
}

/// What a lease transaction left: the row (if any) and the new lease, with the decision's
/// clock (the lease's `until_ms` is on it).
#[derive(Debug)]
pub(crate) struct LeaseAnswer {
    pub row: Option<i64>,
    pub granted: Result<Lease, NoLease>,
    pub now_ms: u64,
}

/// The throttle's shared state as each backend keeps it: every call the driver makes on it,
/// written once per backend (`sqlite.rs`, `postgres.rs`). Each call is one transaction or one
/// read.
pub(crate) trait SharedState {
    /// Calls made on the shared state so far through this handle (decisions, finishes,
    /// leases).
    fn calls(&self) -> u64;

    /// One admission decision for `provider`, for the caller queued as `waiter` (if it waited
    /// before). On `Go` the permit row is written in the same transaction, so no two holders
    /// can both take the last slot; on `Full` the caller keeps (or gets) its place in the
    /// queue. `now_ms` is this host's clock; PostgreSQL decides by the database's clock
    /// instead, so hosts whose clocks disagree still share one hold and one pacing schedule.
    fn try_admit(
        &mut self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        want: &Want,
        waiter: Option<i64>,
    ) -> Result<StoreAdmit, StoreError>;

    /// How much longer the reserved send `seq` must wait (0: go now), by the store's clock
    /// (`now_ms` on SQLite, the database's on PostgreSQL). Asked by a request that slept until
    /// its reservation: a refusal or a hold elsewhere may have moved the reservations not sent
    /// yet meanwhile (see `ThrottleState::confirm`).
    fn confirm_ms(&mut self, provider: &str, seq: u64, now_ms: u64) -> Result<u64, StoreError>;

    /// Settles a lease and, when asked, grants a new one (see [`LeaseTx`]); one transaction.
    /// `now_ms` is this host's clock (the one the reported heads were read by).
    fn lease_tx(
        &mut self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        tx: &LeaseTx<'_>,
    ) -> Result<LeaseAnswer, StoreError>;

    /// Takes a waiter out of the queue (it was cancelled or ran out of time).
    fn leave(&mut self, waiter: i64) -> Result<(), StoreError>;

    /// Gives the permit back and feeds its outcome to the provider's state. `now_ms` is this
    /// host's clock, the one `headers` were read by.
    fn finish(
        &mut self,
        provider: &str,
        settings: &Settings,
        ticket: Ticket,
        outcome: Outcome,
        headers: &RateHeaders,
        now_ms: u64,
    ) -> Result<(), StoreError>;
}

/// The shared state, open in the backend [`Backend`] names. Its calls are the backend's own
/// ([`SharedState`], through `Deref`).
pub(crate) struct Store(Box<dyn SharedState + Send>);

impl Store {
    pub fn open(backend: &Backend) -> Result<Store, StoreError> {
        Ok(Store(match backend {
            Backend::Sqlite(path) => Box::new(SqliteStore::open(path)?),
            Backend::Postgres(url) => Box::new(PgStore::open(url)?),
        }))
    }
}

impl Deref for Store {
    type Target = dyn SharedState + Send;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl DerefMut for Store {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.0
    }
}

/// A provider's state as stored; a missing row or one another version wrote that this one
/// cannot read starts afresh (the state is soft).
fn decode_state(text: Option<&str>) -> ThrottleState {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// What a lease transaction writes to the lease row: its slots and the demand it records.
/// Both 0: the row goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowAfter {
    pub slots: u32,
    pub want: u32,
}

/// The part of a lease transaction that is the same on every backend, between loading the
/// state and writing the row: `others` are the holders that are not the row, and every waiter
/// (a lease never jumps the queue). Returns what the row becomes and the grant.
pub(crate) fn decide_lease(
    state: &mut ThrottleState,
    settings: &Settings,
    now_ms: u64,
    others: &Others,
    tx: &LeaseTx<'_>,
) -> (RowAfter, Result<Lease, NoLease>) {
    if let Some((seq, outcome, headers)) = tx.finished {
        state.set_in_flight(others.in_flight.saturating_add(1));
        state.on_response(settings, seq, outcome, headers, now_ms);
    }
    state.settle(settings, tx.report, now_ms);
    state.set_in_flight(others.in_flight);
    let granted = match tx.want {
        Some(want) => {
            let want = want.max(tx.keep);
            let share = fair_share(settings.max_concurrent(), &others.wants, others.waiters);
            state.lease(settings, now_ms, want, share)
        }
        None => Err(NoLease::Paced),
    };
    let slots = granted.map_or(0, |l| l.slots).max(tx.keep);
    // A process that found the cap full keeps its demand on record (a row of no slots), so
    // the holders shrink to their fair part at their next renewal.
    let want = match (tx.want, granted) {
        (Some(want), Ok(_) | Err(NoLease::Full)) => want.max(slots),
        _ => slots,
    };
    (RowAfter { slots, want }, granted)
}

fn encode_state(state: &ThrottleState) -> String {
    // Serialising plain numbers and vectors cannot fail.
    serde_json::to_string(state).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Mode, Reason};

    const W: Want = Want {
        prompt_tokens: 0,
        patience_ms: u64::MAX,
        deadline_in_ms: None,
    };

    /// Runs `body` once with a store factory per backend: a SQLite file, and (when
    /// `DOCSFAB_TEST_POSTGRES` names a server) a fresh PostgreSQL database. Every store the
    /// factory opens shares the same state.
    fn each_backend(label: &str, body: impl Fn(&dyn Fn() -> Store, &Backend)) {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Backend::Sqlite(dir.path().join("throttle.db"));
        body(&|| Store::open(&sqlite).unwrap(), &sqlite);
        if let Some(db) = docsfab_pg::testing::fresh_database(label) {
            let pg = Backend::Postgres(db.url.clone());
            body(&|| Store::open(&pg).unwrap(), &pg);
        }
    }

    fn ok() -> Outcome {
        Outcome::Success {
            input_tokens: None,
            output_tokens: None,
        }
    }

    /// Runs one statement on the backend's database, as another program would.
    fn exec(backend: &Backend, sql: &'static str) {
        match backend {
            Backend::Sqlite(path) => {
                rusqlite::Connection::open(path)
                    .unwrap()
                    .execute_batch(sql)
                    .unwrap();
            }
            Backend::Postgres(url) => {
                let pg = docsfab_pg::Pg::connect(url).unwrap();
                pg.call(move |c| c.batch_execute(sql)).unwrap();
            }
        }
    }

    #[test]
    fn a_freed_slot_goes_to_the_earliest_waiter_not_to_the_process_that_freed_it() {
        each_backend("freed_slot_fifo", |open, backend| {
            let (mut here, mut there) = (open(), open());
            let one = Settings::new(Mode::Shared, 1).unwrap();
            let StoreAdmit::Go { ticket, .. } = here.try_admit("p", &one, 0, &W, None).unwrap()
            else {
                panic!("{backend}: the first request goes");
            };
            let StoreAdmit::Full { waiter, .. } = there.try_admit("p", &one, 1, &W, None).unwrap()
            else {
                panic!("{backend}: the cap is full");
            };
            here.finish("p", &one, ticket, ok(), &RateHeaders::none(), 2)
                .unwrap();
            match here.try_admit("p", &one, 3, &W, None).unwrap() {
                StoreAdmit::Full {
                    reason,
                    waiter: mine,
                } => {
                    assert_eq!(reason, Reason::Concurrency, "{backend}");
                    assert!(mine > waiter, "{backend}");
                    here.leave(mine).unwrap();
                }
                _ => panic!("{backend}: a newcomer jumped the queue"),
            }
            assert!(
                matches!(
                    there.try_admit("p", &one, 4, &W, Some(waiter)).unwrap(),
                    StoreAdmit::Go { .. }
                ),
                "{backend}"
            );
        });
    }

    #[test]
    fn a_state_row_this_version_cannot_read_starts_afresh() {
        each_backend("unreadable_state", |open, backend| {
            let mut store = open();
            let table = match backend {
                Backend::Sqlite(_) => {
                    "INSERT INTO providers (provider, state) VALUES ('p', '{\"future\": true')"
                }
                Backend::Postgres(_) => {
                    "INSERT INTO throttle_providers (provider, state) VALUES ('p', '{\"future\": true')"
                }
            };
            exec(backend, table);
            let two = Settings::new(Mode::Shared, 2).unwrap();
            assert!(
                matches!(
                    store.try_admit("p", &two, 0, &W, None).unwrap(),
                    StoreAdmit::Go { .. }
                ),
                "{backend}"
            );
        });
    }

    #[test]
    fn issue15_providers_are_throttled_apart_on_both_backends() {
        each_backend("providers_apart", |open, backend| {
            let mut store = open();
            let one = Settings::new(Mode::Shared, 1).unwrap();
            let StoreAdmit::Go { .. } = store.try_admit("a", &one, 0, &W, None).unwrap() else {
                panic!("{backend}: a goes");
            };
            assert!(
                matches!(
                    store.try_admit("b", &one, 0, &W, None).unwrap(),
                    StoreAdmit::Go { .. }
                ),
                "{backend}: a full cap on a does not hold b"
            );
            assert!(
                matches!(
                    store.try_admit("a", &one, 0, &W, None).unwrap(),
                    StoreAdmit::Full { .. }
                ),
                "{backend}"
            );
        });
    }

    /// Three connections (three processes, as far as the store can tell) take and give back
    /// permits as fast as they can, one more than the cap, so the queue is often empty and two
    /// newcomers often decide at once: the decision transaction admits at most the cap. Without
    /// the provider lock both would count one free slot and both take it.
    #[test]
    fn issue15_many_connections_deciding_at_once_never_exceed_the_cap() {
        use std::sync::atomic::{AtomicU32, Ordering};
        each_backend("cap_race", |open, backend| {
            let two = Settings::new(Mode::Shared, 2).unwrap();
            let (now, peak) = (AtomicU32::new(0), AtomicU32::new(0));
            let stores: Vec<Store> = (0..3).map(|_| open()).collect();
            // The provider's first answer lifts the one-at-a-time start.
            let mut first = open();
            let StoreAdmit::Go { ticket: t, .. } = first.try_admit("p", &two, 0, &W, None).unwrap()
            else {
                panic!("{backend}: the first request goes");
            };
            first
                .finish("p", &two, t, ok(), &RateHeaders::none(), 0)
                .unwrap();
            std::thread::scope(|scope| {
                for mut store in stores {
                    let (now, peak) = (&now, &peak);
                    scope.spawn(move || {
                        for _ in 0..60 {
                            let mut waiter = None;
                            let ticket = loop {
                                match store.try_admit("p", &two, 0, &W, waiter).unwrap() {
                                    StoreAdmit::Go { ticket, .. } => break ticket,
                                    StoreAdmit::Full { waiter: w, .. } => {
                                        waiter = Some(w);
                                        std::thread::sleep(std::time::Duration::from_millis(1));
                                    }
                                    StoreAdmit::PastDeadline { .. } => unreachable!(),
                                }
                            };
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(n, Ordering::SeqCst);
                            // Until the cap has been seen reached, hold the permit a while so a
                            // slow backend (a PostgreSQL decision takes milliseconds) lets a
                            // second holder in; after that, hold it only briefly.
                            let mut held = 0;
                            while peak.load(Ordering::SeqCst) < 2 && held < 500 {
                                std::thread::sleep(std::time::Duration::from_millis(1));
                                held += 1;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            now.fetch_sub(1, Ordering::SeqCst);
                            store
                                .finish("p", &two, ticket, ok(), &RateHeaders::none(), 0)
                                .unwrap();
                        }
                    });
                }
            });
            let peak = peak.load(Ordering::SeqCst);
            assert!(peak <= 2, "{backend}: {peak} in flight at once");
            assert_eq!(
                peak, 2,
                "{backend}: the cap was reached, so the test could fail"
            );
        });
    }
}
