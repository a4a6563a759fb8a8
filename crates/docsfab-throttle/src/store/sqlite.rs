//! The throttle's shared state in one SQLite file, `DOCSFAB_HOME/throttle.db`, that every docsfab
//! process on the same home opens.
//!
//! Three tables: `permits` (one row per request in flight: provider, holder pid and start time,
//! its send seq), `waiters` (one row per request waiting, in arrival order) and `providers`
//! (the pure core's state per provider, as JSON). Every decision
//! is one short `BEGIN IMMEDIATE` transaction: give back the permits of dead holders, load the
//! state, count the live permits, ask the core, write back. SQLite's lock is a file lock the
//! kernel drops when its holder dies, and the busy timeout bounds every wait for it, so a
//! killed process can neither keep its permits nor wedge the others.
//!
//! Waiters are served first come, first served across processes: the waiters queued ahead of a
//! request count as in flight for its decision. Without the queue the process whose own finish
//! wakes its waiters at once would starve the others, which only notice at their next poll.
//!
//! The state is soft: a row that does not parse (written by another version) starts afresh.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{
    LeaseAnswer, LeaseTx, Others, RowAfter, SharedState, StoreAdmit, StoreError, Ticket, Want,
    decide_lease, decode_state, encode_state, store_admit,
};
use crate::core::{Outcome, Settings, ThrottleState};
use crate::headers::RateHeaders;
use crate::process::Holder;

/// How long one transaction waits for another process's lock before it gives up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often opening the file is tried when its first-time setup meets another process's.
const OPEN_TRIES: u32 = 8;
/// The first pause between those tries; it doubles, up to half a second.
const OPEN_RETRY_PAUSE: Duration = Duration::from_millis(20);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS permits (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    provider   TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    pid_start  INTEGER,
    seq        INTEGER NOT NULL,
    granted_ms INTEGER NOT NULL,
    slots      INTEGER NOT NULL DEFAULT 1,
    want       INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS permits_by_provider ON permits (provider);
CREATE TABLE IF NOT EXISTS waiters (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    provider  TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    pid_start INTEGER,
    since_ms  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS waiters_by_provider ON waiters (provider);
CREATE TABLE IF NOT EXISTS providers (
    provider TEXT PRIMARY KEY,
    state    TEXT NOT NULL
);
";

pub(crate) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    me: Holder,
    calls: u64,
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.to_owned(),
                source,
            })?;
        }
        let wrap = |source| StoreError::Sqlite {
            path: path.to_owned(),
            source,
        };
        // Several processes often start at once. Turning a new file into WAL, or creating the
        // schema, can meet SQLITE_BUSY without SQLite's busy handler ever waiting (a second
        // connection in the middle of the same first-time setup), so the setup is retried.
        let mut pause = OPEN_RETRY_PAUSE;
        let mut tries = 1;
        let conn = loop {
            match Self::connect(path) {
                Err(e) if is_busy(&e) && tries < OPEN_TRIES => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(500));
                    tries += 1;
                }
                other => break other.map_err(wrap)?,
            }
        };
        Ok(SqliteStore {
            conn,
            path: path.to_owned(),
            me: Holder::current(),
            calls: 0,
        })
    }

    /// One attempt at opening the file and making sure of its mode and schema.
    fn connect(path: &Path) -> Result<Connection, rusqlite::Error> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update(None, "journal_mode", "WAL")?;
        }
        // Soft state: losing the last decisions to a power cut only loosens the throttle once.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)?;
        // A file made before leases: a permit row then counted one request.
        let has_slots: bool = tx
            .prepare("SELECT 1 FROM pragma_table_info('permits') WHERE name = 'slots'")?
            .exists([])?;
        if !has_slots {
            tx.execute_batch("ALTER TABLE permits ADD COLUMN slots INTEGER NOT NULL DEFAULT 1")?;
        }
        // A file made before fair leases: every row wanted what it held.
        let has_want: bool = tx
            .prepare("SELECT 1 FROM pragma_table_info('permits') WHERE name = 'want'")?
            .exists([])?;
        if !has_want {
            tx.execute_batch("ALTER TABLE permits ADD COLUMN want INTEGER NOT NULL DEFAULT 1")?;
        }
        tx.commit()?;
        Ok(conn)
    }

    /// Runs one call of the store on the file (a transaction or a read), counted, with its
    /// error naming the file.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Connection, Holder) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.calls += 1;
        f(&mut self.conn, self.me).map_err(|source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        })
    }
}

impl SharedState for SqliteStore {
    fn calls(&self) -> u64 {
        self.calls
    }

    fn try_admit(
        &mut self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        want: &Want,
        waiter: Option<i64>,
    ) -> Result<StoreAdmit, StoreError> {
        self.call(|conn, me| {
            let (tx, mut state) = begin_decision(conn, provider, me)?;
            let ahead = waiters_ahead(&tx, provider, waiter)?;
            state.set_in_flight(live_permits(&tx, provider)?.saturating_add(ahead));
            let decision = state.admit(settings, now_ms, &want.at(now_ms));
            let admit = store_admit(
                decision,
                now_ms,
                |seq| {
                    if let Some(id) = waiter {
                        tx.execute("DELETE FROM waiters WHERE id = ?1", [id])?;
                    }
                    tx.execute(
                        "INSERT INTO permits (provider, pid, pid_start, seq, granted_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![
                            provider,
                            i64::from(me.pid),
                            me.start_ticks.and_then(|t| i64::try_from(t).ok()),
                            i64::try_from(seq).unwrap_or(i64::MAX),
                            i64::try_from(now_ms).unwrap_or(i64::MAX),
                        ],
                    )?;
                    Ok(Ticket {
                        id: tx.last_insert_rowid(),
                        seq,
                    })
                },
                || match waiter {
                    Some(id) => Ok(id),
                    None => join_queue(&tx, provider, me, now_ms),
                },
            )?;
            if matches!(admit, StoreAdmit::Go { .. }) {
                save(&tx, provider, &state)?;
            }
            tx.commit()?;
            Ok(admit)
        })
    }

    fn confirm_ms(&mut self, provider: &str, seq: u64, now_ms: u64) -> Result<u64, StoreError> {
        let text: Option<String> = self.call(|conn, _| {
            conn.query_row(
                "SELECT state FROM providers WHERE provider = ?1",
                [provider],
                |r| r.get(0),
            )
            .optional()
        })?;
        let state = decode_state(text.as_deref());
        Ok(state.confirm(seq, now_ms).saturating_sub(now_ms))
    }

    fn lease_tx(
        &mut self,
        provider: &str,
        settings: &Settings,
        now_ms: u64,
        lease: &LeaseTx<'_>,
    ) -> Result<LeaseAnswer, StoreError> {
        self.call(|conn, me| {
            let (tx, mut state) = begin_decision(conn, provider, me)?;
            let others = others(&tx, provider, lease.row)?;
            let (after, granted) = decide_lease(&mut state, settings, now_ms, &others, lease);
            let exists = match lease.row {
                Some(id) => tx
                    .query_row("SELECT 1 FROM permits WHERE id = ?1", [id], |_| Ok(()))
                    .optional()?
                    .is_some(),
                None => false,
            };
            let row = match (lease.row, after) {
                (Some(id), RowAfter { slots: 0, want: 0 }) => {
                    tx.execute("DELETE FROM permits WHERE id = ?1", [id])?;
                    None
                }
                (None, RowAfter { slots: 0, want: 0 }) => None,
                (Some(id), after) if exists => {
                    tx.execute(
                        "UPDATE permits SET slots = ?2, want = ?3 WHERE id = ?1",
                        params![id, i64::from(after.slots), i64::from(after.want)],
                    )?;
                    Some(id)
                }
                (_, after) => {
                    tx.execute(
                        "INSERT INTO permits (provider, pid, pid_start, seq, granted_ms, slots, want)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        params![
                            provider,
                            i64::from(me.pid),
                            me.start_ticks.and_then(|t| i64::try_from(t).ok()),
                            granted.map_or(0, |l| i64::try_from(l.first_seq).unwrap_or(i64::MAX)),
                            i64::try_from(now_ms).unwrap_or(i64::MAX),
                            i64::from(after.slots),
                            i64::from(after.want),
                        ],
                    )?;
                    Some(tx.last_insert_rowid())
                }
            };
            save(&tx, provider, &state)?;
            tx.commit()?;
            Ok(LeaseAnswer {
                row,
                granted,
                now_ms,
            })
        })
    }

    fn leave(&mut self, waiter: i64) -> Result<(), StoreError> {
        self.call(|conn, _| {
            conn.execute("DELETE FROM waiters WHERE id = ?1", [waiter])
                .map(|_| ())
        })
    }

    fn finish(
        &mut self,
        provider: &str,
        settings: &Settings,
        ticket: Ticket,
        outcome: Outcome,
        headers: &RateHeaders,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.call(|conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut state = load(&tx, provider)?;
            state.set_in_flight(live_permits(&tx, provider)?);
            state.on_response(settings, ticket.seq, outcome, headers, now_ms);
            tx.execute("DELETE FROM permits WHERE id = ?1", [ticket.id])?;
            save(&tx, provider, &state)?;
            tx.commit()
        })
    }
}

/// Opens a decision about `provider`: takes the file's write lock, gives back what dead
/// holders left, and loads the provider's state. Every decision and lease starts here.
fn begin_decision<'c>(
    conn: &'c mut Connection,
    provider: &str,
    me: Holder,
) -> rusqlite::Result<(rusqlite::Transaction<'c>, ThrottleState)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    reclaim_dead(&tx, "permits", provider, me)?;
    reclaim_dead(&tx, "waiters", provider, me)?;
    let state = load(&tx, provider)?;
    Ok((tx, state))
}

/// Deletes the rows of `table` (permits or waiters) whose process is no longer alive.
fn reclaim_dead(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    provider: &str,
    me: Holder,
) -> rusqlite::Result<()> {
    let holders: Vec<(i64, Option<i64>)> = {
        let mut stmt = tx.prepare(&format!(
            "SELECT DISTINCT pid, pid_start FROM {table} WHERE provider = ?1"
        ))?;
        stmt.query_map([provider], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?
    };
    for (pid, start) in holders {
        let holder = Holder {
            pid: u32::try_from(pid).unwrap_or(0),
            start_ticks: start.and_then(|s| u64::try_from(s).ok()),
        };
        if holder == me || (holder.pid != 0 && holder.is_alive()) {
            continue;
        }
        tx.execute(
            &format!("DELETE FROM {table} WHERE provider = ?1 AND pid = ?2 AND pid_start IS ?3"),
            params![provider, pid, start],
        )?;
    }
    Ok(())
}

/// How many requests queued before `waiter` (all of them for one not queued yet).
fn waiters_ahead(
    tx: &rusqlite::Transaction<'_>,
    provider: &str,
    waiter: Option<i64>,
) -> rusqlite::Result<u32> {
    let n: i64 = tx.query_row(
        "SELECT COUNT(*) FROM waiters WHERE provider = ?1 AND id < ?2",
        params![provider, waiter.unwrap_or(i64::MAX)],
        |r| r.get(0),
    )?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

fn join_queue(
    tx: &rusqlite::Transaction<'_>,
    provider: &str,
    me: Holder,
    now_ms: u64,
) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO waiters (provider, pid, pid_start, since_ms) VALUES (?1, ?2, ?3, ?4)",
        params![
            provider,
            i64::from(me.pid),
            me.start_ticks.and_then(|t| i64::try_from(t).ok()),
            i64::try_from(now_ms).unwrap_or(i64::MAX),
        ],
    )?;
    Ok(tx.last_insert_rowid())
}

/// Requests in flight: a permit row counts one, a lease row the slots it holds.
fn live_permits(tx: &rusqlite::Transaction<'_>, provider: &str) -> rusqlite::Result<u32> {
    let n: i64 = tx.query_row(
        "SELECT COALESCE(SUM(slots), 0) FROM permits WHERE provider = ?1",
        [provider],
        |r| r.get(0),
    )?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The holders of `provider`'s cap other than the lease row `row`, and the waiters queued.
fn others(
    tx: &rusqlite::Transaction<'_>,
    provider: &str,
    row: Option<i64>,
) -> rusqlite::Result<Others> {
    let mut stmt = tx.prepare_cached(
        "SELECT slots, max(slots, want) FROM permits WHERE provider = ?1 AND id IS NOT ?2",
    )?;
    let mut others = Others::default();
    let rows = stmt.query_map(params![provider, row], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
    })?;
    for held in rows {
        let (slots, want) = held?;
        let count = |n: i64| u32::try_from(n).unwrap_or(0);
        others.in_flight = others.in_flight.saturating_add(count(slots));
        others.wants.push(count(want));
    }
    others.waiters = waiters_ahead(tx, provider, None)?;
    others.in_flight = others.in_flight.saturating_add(others.waiters);
    Ok(others)
}

fn load(tx: &rusqlite::Transaction<'_>, provider: &str) -> rusqlite::Result<ThrottleState> {
    let text: Option<String> = tx
        .query_row(
            "SELECT state FROM providers WHERE provider = ?1",
            [provider],
            |r| r.get(0),
        )
        .optional()?;
    Ok(decode_state(text.as_deref()))
}

fn save(
    tx: &rusqlite::Transaction<'_>,
    provider: &str,
    state: &ThrottleState,
) -> rusqlite::Result<()> {
    let text = encode_state(state);
    tx.execute(
        "INSERT INTO providers (provider, state) VALUES (?1, ?2)
         ON CONFLICT (provider) DO UPDATE SET state = excluded.state",
        params![provider, text],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Processes starting together all open a new throttle file: the first-time setup (WAL,
    /// schema) of one must not make another fail with "database is locked".
    #[test]
    fn many_connections_opening_a_new_file_at_once_all_succeed() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("throttle.db");
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let opened: Vec<_> = (0..8)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteStore::open(&path).map(|_| ())
                    })
                })
                .collect();
            for t in opened {
                let result = t.join().unwrap();
                assert!(result.is_ok(), "round {round}: {result:?}");
            }
        }
    }
}
