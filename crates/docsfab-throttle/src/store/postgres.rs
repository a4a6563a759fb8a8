//! The throttle's shared state in PostgreSQL: the run store's database, so every docsfab
//! process on every host that uses it shares one cap, one hold and one pacing schedule per
//! provider.
//!
//! The same three things as `throttle.db`, in `throttle_permits`, `throttle_waiters` and
//! `throttle_providers`, and the same decision: one transaction that first locks the provider's
//! row (`FOR UPDATE`, so decisions about one provider take turns across hosts while other
//! providers go on), gives back the permits and queue places of dead holders, loads the state,
//! counts the live permits and the waiters ahead, asks the core and writes back.
//!
//! - A holder is a worker (`docsfab_pg::worker`, one per process and database) plus the row's
//!   own id; it is dead when its worker row stopped or stopped beating. A pid means nothing on
//!   another host, and no lock is dropped for us when a host disappears.
//! - Time is the database's clock (`clock_timestamp()`, read after the lock is taken), not the
//!   host's: holds and pacing instants are compared across hosts, and two hosts whose clocks
//!   disagree by a minute must still agree on when a hold ends. Rate-limit headers, read by the
//!   host's clock, are moved onto the database's clock by the difference between the two.
//! - Every wait for the provider's lock is bounded (`lock_timeout`), as SQLite's busy timeout
//!   bounds it there.
//! - Statements go as typed queries (`query_typed`: parse, bind and run in one round trip) and
//!   are merged where one snapshot serves, so a decision costs a handful of round trips.

use docsfab_pg::postgres::types::Type;
use docsfab_pg::postgres::{Client, Error, Transaction};
use docsfab_pg::{Pg, PgUrl, migrate, worker};

use super::{
    LeaseAnswer, LeaseTx, Others, RowAfter, SharedState, StoreAdmit, StoreError, Ticket, Want,
    decide_lease, decode_state, encode_state, store_admit,
};
use crate::core::{Outcome, Settings, ThrottleState};
use crate::headers::RateHeaders;

/// Schema versions of the "throttle" component (`docsfab_migrations`); append, never edit.
const STEPS: &[&str] = &[
    "
CREATE TABLE throttle_providers (
    provider TEXT PRIMARY KEY,
    state    TEXT
);
CREATE TABLE throttle_permits (
    id         BIGSERIAL PRIMARY KEY,
    provider   TEXT NOT NULL,
    worker_id  TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    granted_ms BIGINT NOT NULL
);
CREATE INDEX throttle_permits_by_provider ON throttle_permits (provider);
CREATE TABLE throttle_waiters (
    id        BIGSERIAL PRIMARY KEY,
    provider  TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    since_ms  BIGINT NOT NULL
);
CREATE INDEX throttle_waiters_by_provider ON throttle_waiters (provider, id);
",
    "
-- A lease row holds several slots (a process admitting in-process); a permit row one.
ALTER TABLE throttle_permits ADD COLUMN slots BIGINT NOT NULL DEFAULT 1;
",
    "
-- What a lease row's process wants in flight: the others make room for it (fair leases).
ALTER TABLE throttle_permits ADD COLUMN want BIGINT NOT NULL DEFAULT 1;
",
];

/// Per decision: how long it waits for another host's decision about the same provider, and
/// no wait for the WAL flush at commit. The state is soft (as `synchronous = NORMAL` makes it
/// in `throttle.db`): a database crash may lose the last fraction of a second of decisions,
/// which loosens the throttle once; waiting for the disk would multiply a decision's cost.
const DECISION_SETTINGS: &str = "SET LOCAL lock_timeout = '5s'; SET LOCAL synchronous_commit = off";

pub(crate) struct PgStore {
    pg: Pg,
    /// This process's worker id in the database.
    me: String,
    calls: u64,
}

impl PgStore {
    /// Registers this process as a worker (starting its heartbeat) and brings the tables to
    /// this version's schema.
    pub fn open(url: &PgUrl) -> Result<PgStore, StoreError> {
        let me = worker::this_process(url)?.as_str().to_owned();
        let pg = Pg::connect(url)?;
        migrate(&pg, "throttle", STEPS)?;
        Ok(PgStore { pg, me, calls: 0 })
    }

    /// Runs one decision's transaction, again through an outage of the server for up to the
    /// stale limit (the caller may be an async server's thread: `route serve`). A grant, a lease
    /// row or a queue place whose `COMMIT` was cut is asked after (`txid_status`) instead of
    /// being left in the tables unknown to this process, where it would hold a slot, or a place
    /// ahead of every other waiter, for as long as this process lives.
    fn transact<T: Send + 'static>(
        &mut self,
        f: impl Fn(&mut Transaction<'_>) -> Result<T, Error> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        let url = self.pg.url().to_string();
        self.calls += 1;
        let result = self
            .pg
            .transaction_through_outages(worker::stale_after(), false, f)?;
        Ok(result.map_err(|source| docsfab_pg::PgError::Query { url, source })?)
    }

    /// Runs one call of the store on the connection's thread, counted.
    fn call<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.calls += 1;
        Ok(self.pg.call(f)?)
    }
}

impl SharedState for PgStore {
    fn calls(&self) -> u64 {
        self.calls
    }

    /// By the database's clock: `_now_ms`, the host's, is not asked.
    fn try_admit(
        &mut self,
        provider: &str,
        settings: &Settings,
        _now_ms: u64,
        want: &Want,
        waiter: Option<i64>,
    ) -> Result<StoreAdmit, StoreError> {
        let (provider, settings, want, me) =
            (provider.to_owned(), *settings, *want, self.me.clone());
        let alive = worker::alive_condition("w");
        // After an outage this process holds back from giving away others' permits.
        let judge = worker::may_judge(self.pg.url());
        self.transact(move |tx| {
            let (mut state, now_ms) = lock_provider(tx, &provider)?;
            if judge {
                reclaim_dead(tx, &provider, &me, &alive)?;
            }
            let (permits, ahead) = in_flight(tx, &provider, waiter)?;
            state.set_in_flight(permits.saturating_add(ahead));
            let decision = state.admit(&settings, now_ms, &want.at(now_ms));
            // The closures below share the transaction one at a time.
            let tx = std::cell::RefCell::new(tx);
            let admit = store_admit(
                decision,
                now_ms,
                |seq| {
                    let mut tx = tx.borrow_mut();
                    if let Some(id) = waiter {
                        tx.execute_typed(
                            "DELETE FROM throttle_waiters WHERE id = $1",
                            &[(&id, Type::INT8)],
                        )?;
                    }
                    let id: i64 = tx
                        .query_typed_one(
                            "INSERT INTO throttle_permits (provider, worker_id, seq, granted_ms)
                             VALUES ($1, $2, $3, $4) RETURNING id",
                            &[
                                (&provider, Type::TEXT),
                                (&me, Type::TEXT),
                                (&to_i64(seq), Type::INT8),
                                (&to_i64(now_ms), Type::INT8),
                            ],
                        )?
                        .get(0);
                    Ok(Ticket { id, seq })
                },
                || match waiter {
                    Some(id) => Ok(id),
                    None => join_queue(&mut tx.borrow_mut(), &provider, &me, now_ms),
                },
            )?;
            let tx = tx.into_inner();
            if matches!(admit, StoreAdmit::Go { .. }) {
                save(tx, &provider, &state)?;
            }
            Ok(admit)
        })
    }

    /// By the database's clock: `_now_ms`, the host's, is not asked.
    fn confirm_ms(&mut self, provider: &str, seq: u64, _now_ms: u64) -> Result<u64, StoreError> {
        let provider = provider.to_owned();
        let row = self.call(move |c| {
            c.query_typed_opt(
                "SELECT state, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                 FROM throttle_providers WHERE provider = $1",
                &[(&provider, Type::TEXT)],
            )
        })?;
        Ok(row.map_or(0, |row| {
            let state: Option<String> = row.get(0);
            let now_ms = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
            decode_state(state.as_deref())
                .confirm(seq, now_ms)
                .saturating_sub(now_ms)
        }))
    }

    /// By the database's clock; `host_now_ms` is the clock the reported heads were read by.
    fn lease_tx(
        &mut self,
        provider: &str,
        settings: &Settings,
        host_now_ms: u64,
        lease: &LeaseTx<'_>,
    ) -> Result<LeaseAnswer, StoreError> {
        let (provider, settings, me) = (provider.to_owned(), *settings, self.me.clone());
        let (row, keep, want) = (lease.row, lease.keep, lease.want);
        let report = lease.report.clone();
        let finished = lease.finished.map(|(seq, o, h)| (seq, o, h.clone()));
        let alive = worker::alive_condition("w");
        let judge = worker::may_judge(self.pg.url());
        self.transact(move |tx| {
            let (mut state, now_ms) = lock_provider(tx, &provider)?;
            if judge {
                reclaim_dead(tx, &provider, &me, &alive)?;
            }
            let shift = |h: &RateHeaders| {
                let skew = i128::from(now_ms) - i128::from(host_now_ms);
                h.shifted(i64::try_from(skew).unwrap_or(0))
            };
            let mut report = report.clone();
            report.newest_head = report.newest_head.map(|(seq, h)| (seq, shift(&h)));
            let finished = finished.as_ref().map(|(seq, o, h)| (*seq, *o, shift(h)));
            let (others, exists) = others(tx, &provider, row)?;
            let lease_tx = LeaseTx {
                row,
                keep,
                report: &report,
                finished: finished.as_ref().map(|(seq, o, h)| (*seq, *o, h)),
                want,
            };
            let (after, granted) = decide_lease(&mut state, &settings, now_ms, &others, &lease_tx);
            let row = match (row, after) {
                (Some(id), RowAfter { slots: 0, want: 0 }) => {
                    tx.execute_typed(
                        "DELETE FROM throttle_permits WHERE id = $1",
                        &[(&id, Type::INT8)],
                    )?;
                    None
                }
                (None, RowAfter { slots: 0, want: 0 }) => None,
                (Some(id), after) if exists => {
                    tx.execute_typed(
                        "UPDATE throttle_permits SET slots = $2, want = $3 WHERE id = $1",
                        &[
                            (&id, Type::INT8),
                            (&i64::from(after.slots), Type::INT8),
                            (&i64::from(after.want), Type::INT8),
                        ],
                    )?;
                    Some(id)
                }
                (_, after) => {
                    let first = granted.map_or(0, |l| to_i64(l.first_seq));
                    let id: i64 = tx
                        .query_typed_one(
                            "INSERT INTO throttle_permits
                                 (provider, worker_id, seq, granted_ms, slots, want)
                             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                            &[
                                (&provider, Type::TEXT),
                                (&me, Type::TEXT),
                                (&first, Type::INT8),
                                (&to_i64(now_ms), Type::INT8),
                                (&i64::from(after.slots), Type::INT8),
                                (&i64::from(after.want), Type::INT8),
                            ],
                        )?
                        .get(0);
                    Some(id)
                }
            };
            save(tx, &provider, &state)?;
            Ok(LeaseAnswer {
                row,
                granted,
                now_ms,
            })
        })
    }

    /// Through an outage too: a place left in the queue would stand ahead of every later
    /// waiter for as long as this process lives.
    fn leave(&mut self, waiter: i64) -> Result<(), StoreError> {
        self.transact(move |tx| {
            tx.execute_typed(
                "DELETE FROM throttle_waiters WHERE id = $1",
                &[(&waiter, Type::INT8)],
            )
        })?;
        Ok(())
    }

    /// By the database's clock; `host_now_ms` is the clock `headers` were read by.
    fn finish(
        &mut self,
        provider: &str,
        settings: &Settings,
        ticket: Ticket,
        outcome: Outcome,
        headers: &RateHeaders,
        host_now_ms: u64,
    ) -> Result<(), StoreError> {
        let (provider, settings, headers) = (provider.to_owned(), *settings, headers.clone());
        // A permit that is never given back would lower the provider's cap for as long as this
        // process lives: the release waits out an outage like a decision (`transact`).
        let release = move |tx: &mut Transaction<'_>| -> Result<(), Error> {
            let (mut state, now_ms) = lock_provider(tx, &provider)?;
            let skew = i128::from(now_ms) - i128::from(host_now_ms);
            let headers = headers.shifted(i64::try_from(skew).unwrap_or(0));
            state.set_in_flight(in_flight(tx, &provider, Some(i64::MIN))?.0);
            state.on_response(&settings, ticket.seq, outcome, &headers, now_ms);
            tx.execute_typed(
                "DELETE FROM throttle_permits WHERE id = $1",
                &[(&ticket.id, Type::INT8)],
            )?;
            save(tx, &provider, &state)
        };
        self.transact(release)
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

const LOCK_ROW: &str = "SELECT state, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     FROM throttle_providers WHERE provider = $1 FOR UPDATE";

/// Takes the provider's row lock (creating the row the first time) and returns its state and
/// the database's clock, read once the lock is held.
fn lock_provider(tx: &mut Transaction<'_>, provider: &str) -> Result<(ThrottleState, u64), Error> {
    tx.batch_execute(DECISION_SETTINGS)?;
    let row = match tx.query_typed_opt(LOCK_ROW, &[(&provider, Type::TEXT)])? {
        Some(row) => row,
        None => {
            tx.execute_typed(
                "INSERT INTO throttle_providers (provider) VALUES ($1)
                 ON CONFLICT (provider) DO NOTHING",
                &[(&provider, Type::TEXT)],
            )?;
            tx.query_typed_one(LOCK_ROW, &[(&provider, Type::TEXT)])?
        }
    };
    let state: Option<String> = row.get(0);
    let now_ms: i64 = row.get(1);
    Ok((
        decode_state(state.as_deref()),
        u64::try_from(now_ms).unwrap_or(0),
    ))
}

/// Deletes the permits and queue places whose worker is not alive (never this process's own:
/// it is alive by being here).
fn reclaim_dead(
    tx: &mut Transaction<'_>,
    provider: &str,
    me: &str,
    alive: &str,
) -> Result<(), Error> {
    let dead = |table: &str| {
        format!(
            "DELETE FROM {table} t WHERE t.provider = $1 AND t.worker_id <> $2
             AND NOT EXISTS (SELECT 1 FROM docsfab_workers w
                             WHERE w.worker_id = t.worker_id AND {alive})"
        )
    };
    // Both deletes run to completion whether or not the outer query reads them.
    tx.execute_typed(
        &format!(
            "WITH permits AS ({}), waiters AS ({}) SELECT 1",
            dead("throttle_permits"),
            dead("throttle_waiters")
        ),
        &[(&provider, Type::TEXT), (&me, Type::TEXT)],
    )?;
    Ok(())
}

/// The holders of `provider`'s cap other than the lease row `row`, the waiters queued, and
/// whether `row` is still there (its holder may have been judged dead), in one snapshot.
fn others(
    tx: &mut Transaction<'_>,
    provider: &str,
    row: Option<i64>,
) -> Result<(Others, bool), Error> {
    let rows = tx.query_typed(
        "SELECT id, slots, greatest(slots, want) FROM throttle_permits WHERE provider = $1
         UNION ALL
         SELECT NULL, count(*), 1 FROM throttle_waiters WHERE provider = $1",
        &[(&provider, Type::TEXT)],
    )?;
    let mut others = Others::default();
    let mut exists = false;
    for r in rows {
        let (id, slots, want): (Option<i64>, i64, i64) = (r.get(0), r.get(1), r.get(2));
        match id {
            None => others.waiters = count(slots),
            Some(id) if Some(id) == row => exists = true,
            Some(_) => {
                others.in_flight = others.in_flight.saturating_add(count(slots));
                others.wants.push(count(want));
            }
        }
    }
    others.in_flight = others.in_flight.saturating_add(others.waiters);
    Ok((others, exists))
}

/// The permits in flight, and how many requests queued before `waiter` (all of them for one
/// not queued yet), in one snapshot.
fn in_flight(
    tx: &mut Transaction<'_>,
    provider: &str,
    waiter: Option<i64>,
) -> Result<(u32, u32), Error> {
    let row = tx.query_typed_one(
        "SELECT (SELECT COALESCE(sum(slots), 0)::bigint FROM throttle_permits WHERE provider = $1),
                (SELECT count(*) FROM throttle_waiters WHERE provider = $1 AND id < $2)",
        &[
            (&provider, Type::TEXT),
            (&waiter.unwrap_or(i64::MAX), Type::INT8),
        ],
    )?;
    Ok((count(row.get(0)), count(row.get(1))))
}

fn join_queue(
    tx: &mut Transaction<'_>,
    provider: &str,
    me: &str,
    now_ms: u64,
) -> Result<i64, Error> {
    Ok(tx
        .query_typed_one(
            "INSERT INTO throttle_waiters (provider, worker_id, since_ms)
             VALUES ($1, $2, $3) RETURNING id",
            &[
                (&provider, Type::TEXT),
                (&me, Type::TEXT),
                (&to_i64(now_ms), Type::INT8),
            ],
        )?
        .get(0))
}

fn save(tx: &mut Transaction<'_>, provider: &str, state: &ThrottleState) -> Result<(), Error> {
    tx.execute_typed(
        "UPDATE throttle_providers SET state = $2 WHERE provider = $1",
        &[(&provider, Type::TEXT), (&encode_state(state), Type::TEXT)],
    )?;
    Ok(())
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

    fn sql(url: &PgUrl, text: &'static str) {
        let pg = Pg::connect(url).unwrap();
        pg.call(move |c| c.batch_execute(text)).unwrap();
    }

    fn rows(url: &PgUrl, query: &'static str) -> i64 {
        let pg = Pg::connect(url).unwrap();
        pg.call(move |c| c.query_one(query, &[]).map(|r| r.get(0)))
            .unwrap()
    }

    /// A worker of another process, as its own registration would write it.
    const OTHER_WORKER: &str = "
        INSERT INTO docsfab_workers (worker_id, host, pid) VALUES ('elsewhere/7/1', 'elsewhere', 7);
        INSERT INTO throttle_permits (provider, worker_id, seq, granted_ms)
            VALUES ('p', 'elsewhere/7/1', 1, 0), ('p', 'elsewhere/7/1', 2, 0);
        INSERT INTO throttle_waiters (provider, worker_id, since_ms) VALUES ('p', 'elsewhere/7/1', 0);";

    #[test]
    fn issue15_permits_and_queue_places_of_a_worker_that_stopped_beating_are_given_back() {
        let Some(db) = docsfab_pg::testing::fresh_database("pg_dead_worker") else {
            return;
        };
        let mut store = PgStore::open(&db.url).unwrap();
        sql(&db.url, OTHER_WORKER);
        let two = Settings::new(Mode::Shared, 2).unwrap();
        // Alive: its two permits fill the cap, and its waiter is ahead of this one.
        let StoreAdmit::Full { reason, waiter } = store.try_admit("p", &two, 0, &W, None).unwrap()
        else {
            panic!("a live worker's permits count");
        };
        assert_eq!(reason, Reason::Concurrency);
        // Its last beat is now older than the stale limit (no process beats for that row).
        sql(
            &db.url,
            "UPDATE docsfab_workers SET heartbeat_at = now() - interval '1 hour'
             WHERE worker_id = 'elsewhere/7/1'",
        );
        let admit = store.try_admit("p", &two, 0, &W, Some(waiter)).unwrap();
        assert!(matches!(admit, StoreAdmit::Go { .. }), "{admit:?}");
        let left = "SELECT (SELECT count(*) FROM throttle_permits WHERE worker_id = 'elsewhere/7/1')
                         + (SELECT count(*) FROM throttle_waiters WHERE worker_id = 'elsewhere/7/1')";
        assert_eq!(rows(&db.url, left), 0, "the dead worker's rows are gone");
    }

    #[test]
    fn issue15_a_worker_that_stopped_cleanly_gives_its_permits_back_at_once() {
        let Some(db) = docsfab_pg::testing::fresh_database("pg_stopped_worker") else {
            return;
        };
        let mut store = PgStore::open(&db.url).unwrap();
        sql(&db.url, OTHER_WORKER);
        sql(
            &db.url,
            "UPDATE docsfab_workers SET stopped_at = now() WHERE worker_id = 'elsewhere/7/1'",
        );
        let two = Settings::new(Mode::Shared, 2).unwrap();
        assert!(matches!(
            store.try_admit("p", &two, 0, &W, None).unwrap(),
            StoreAdmit::Go { .. }
        ));
    }

    /// Host A's clock says 1970 and host B's is two hours ahead; a 429 seen by A still holds B
    /// for the hold's length, because both decide by the database's clock.
    #[test]
    fn issue15_a_hold_ends_by_the_database_clock_whatever_the_hosts_clocks_say() {
        let Some(db) = docsfab_pg::testing::fresh_database("pg_db_clock") else {
            return;
        };
        let (mut a, mut b) = (
            super::super::Store::open(&super::super::Backend::Postgres(db.url.clone())).unwrap(),
            super::super::Store::open(&super::super::Backend::Postgres(db.url.clone())).unwrap(),
        );
        let eight = Settings::new(Mode::Shared, 8).unwrap();
        let StoreAdmit::Go { ticket, .. } = a.try_admit("p", &eight, 0, &W, None).unwrap() else {
            panic!("the first request goes");
        };
        let asked = RateHeaders {
            retry_after_ms: Some(60_000),
            ..RateHeaders::none()
        };
        a.finish("p", &eight, ticket, Outcome::RateLimited, &asked, 0)
            .unwrap();
        let host_b_now = crate::headers::unix_ms(std::time::SystemTime::now()) + 2 * 3_600_000;
        match b.try_admit("p", &eight, host_b_now, &W, None).unwrap() {
            // By host B's clock the hold would be long past: a wait proves the database's
            // clock decided.
            StoreAdmit::Go {
                wait_ms,
                reason: Some(Reason::Hold),
                ..
            } => assert!(
                (1..=60_000).contains(&wait_ms),
                "the hold ends {wait_ms} ms after the decision"
            ),
            _ => panic!("host B is held by host A's 429"),
        }
    }

    /// A host whose clock is an hour behind reads "no requests left until 2 s from now": on the
    /// database's clock that is still 2 s from now, so the next send waits for the pacing
    /// instead of taking the reset as an hour past.
    #[test]
    fn issue15_rate_limit_headers_read_by_a_skewed_host_pace_on_the_database_clock() {
        let Some(db) = docsfab_pg::testing::fresh_database("pg_skewed_headers") else {
            return;
        };
        let mut store = PgStore::open(&db.url).unwrap();
        let eight = Settings::new(Mode::Shared, 8).unwrap();
        let StoreAdmit::Go { ticket, .. } = store.try_admit("p", &eight, 0, &W, None).unwrap()
        else {
            panic!("the first request goes");
        };
        let host_now = crate::headers::unix_ms(std::time::SystemTime::now()) - 3_600_000;
        let head = RateHeaders::from_pairs(
            [
                ("x-ratelimit-limit-requests", "10"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "2s"),
            ],
            host_now,
        );
        let ok = Outcome::Success {
            input_tokens: None,
            output_tokens: None,
        };
        store
            .finish("p", &eight, ticket, ok, &head, host_now)
            .unwrap();
        match store.try_admit("p", &eight, host_now, &W, None).unwrap() {
            StoreAdmit::Go {
                wait_ms,
                reason: Some(Reason::Pacing),
                ..
            } => assert!(wait_ms > 0),
            _ => panic!("an empty budget paces the next send"),
        }
    }

    /// Many processes starting at once on a new database all get the tables (the migration is
    /// serialized, not raced).
    #[test]
    fn issue15_many_stores_opening_a_new_database_at_once_all_succeed() {
        let Some(db) = docsfab_pg::testing::fresh_database("pg_open_race") else {
            return;
        };
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
        let opened: Vec<_> = (0..6)
            .map(|_| {
                let (url, barrier) = (db.url.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    PgStore::open(&url).map(|_| ())
                })
            })
            .collect();
        for t in opened {
            let result = t.join().unwrap();
            assert!(result.is_ok(), "{result:?}");
        }
    }
}
