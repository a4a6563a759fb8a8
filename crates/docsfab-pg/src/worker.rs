//! The registry of docsfab processes using one PostgreSQL database, and their heartbeat.
//!
//! On one machine a run's owner is a pid that the kernel can be asked about; across machines
//! it cannot. So every process that owns runs or throttle permits in PostgreSQL registers a row
//! in `docsfab_workers` and a thread of its own refreshes `heartbeat_at` every
//! [`heartbeat_interval`]. A worker whose heartbeat is older than [`stale_after`] (five missed
//! beats) is dead: others mark its runs `interrupted` and give back its permits. Ages are
//! measured with the database's clock only (`now()` on both sides), so clock skew between
//! machines cannot kill or resurrect a worker.
//!
//! A worker that was judged dead and comes back (a long stall, a network partition) finds its
//! runs no longer `running`: its next write is refused, and the run stays `interrupted`.
//!
//! An outage must not look like death. While the database is down or unreachable, no worker
//! can beat, so when it comes back every worker is stale at once. Two rules keep the first one
//! back from reaping the rest: nobody counts as dead while the server itself has been up for
//! less than the stale limit ([`alive_condition`]), and a process whose own beat failed within
//! the stale limit judges nobody ([`may_judge`]) until the others have had time to beat again.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{Pg, PgError, PgUrl, migrate};

const MIGRATIONS: &[&str] = &["CREATE TABLE docsfab_workers (
        worker_id    TEXT PRIMARY KEY,
        host         TEXT NOT NULL,
        pid          INTEGER NOT NULL,
        started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        stopped_at   TIMESTAMPTZ
    )"];

/// Default beat; `DOCSFAB_HEARTBEAT_MS` changes it (tests use a short one).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Beats a worker may miss before the others call it dead.
const MISSED_BEATS: u32 = 5;

/// This process's name in `docsfab_workers`: `HOST/PID/NONCE`. The nonce tells apart two
/// processes that got the same pid (a restarted container is often pid 1).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WorkerId(String);

impl WorkerId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({})", self.0)
    }
}

/// How often a worker beats: `DOCSFAB_HEARTBEAT_MS` (50..=60000) or 2 s.
pub fn heartbeat_interval() -> Duration {
    std::env::var("DOCSFAB_HEARTBEAT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| (50..=60_000).contains(ms))
        .map_or(DEFAULT_INTERVAL, Duration::from_millis)
}

/// How long after its last beat a worker counts as dead: five beats (10 s by default).
pub fn stale_after() -> Duration {
    heartbeat_interval() * MISSED_BEATS
}

/// SQL that is true when the `docsfab_workers` row `alias` is alive: it has not stopped, and it
/// beat within the stale limit or the server has not been up that long (a restarted server
/// had nobody beating while it was down).
pub fn alive_condition(alias: &str) -> String {
    let stale = format!("interval '{} milliseconds'", stale_after().as_millis());
    format!(
        "({alias}.stopped_at IS NULL AND ({alias}.heartbeat_at > now() - {stale} \
         OR pg_postmaster_start_time() > now() - {stale}))"
    )
}

/// Whether this process may judge other workers of `url` dead now (reap their runs, give back
/// their permits): not while its own heartbeat failed within the last stale limit plus one
/// beat, since the others' beats failed in the same outage and they have not all beaten since.
/// A process with no heartbeat there yet has seen no failure.
pub fn may_judge(url: &PgUrl) -> bool {
    let health = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(url)
        .map(|w| Arc::clone(&w.last_failure));
    let last_failure = health.and_then(|h| *h.lock().unwrap_or_else(|p| p.into_inner()));
    judging_allowed(
        last_failure,
        Instant::now(),
        stale_after() + heartbeat_interval(),
    )
}

/// [`may_judge`]'s rule, with the time passed in.
fn judging_allowed(last_failure: Option<Instant>, now: Instant, quiet: Duration) -> bool {
    last_failure.is_none_or(|t| now.saturating_duration_since(t) >= quiet)
}

/// The workers table, for components whose own migrations refer to it.
pub fn migrate_registry(pg: &Pg) -> Result<(), PgError> {
    migrate(pg, "workers", MIGRATIONS)
}

/// This process's registration in one database: its id, and when its heartbeat last failed.
struct Registered {
    id: WorkerId,
    last_failure: Arc<Mutex<Option<Instant>>>,
}

fn registry() -> &'static Mutex<HashMap<PgUrl, Registered>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PgUrl, Registered>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// This process's worker id in the database at `url`, registering it and starting its
/// heartbeat the first time. The heartbeat lives as long as the process.
pub fn this_process(url: &PgUrl) -> Result<WorkerId, PgError> {
    let mut known = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(w) = known.get(url) {
        return Ok(w.id.clone());
    }
    let pg = Pg::connect(url)?;
    migrate_registry(&pg)?;
    let id = new_id();
    let (worker, host) = (id.0.clone(), hostname());
    let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    pg.call(move |c| {
        c.execute(
            "INSERT INTO docsfab_workers (worker_id, host, pid) VALUES ($1, $2, $3)
             ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL",
            &[&worker, &host, &pid],
        )
    })?;
    let last_failure = Arc::new(Mutex::new(None));
    spawn_heartbeat(pg, id.clone(), Arc::clone(&last_failure));
    known.insert(
        url.clone(),
        Registered {
            id: id.clone(),
            last_failure,
        },
    );
    Ok(id)
}

/// Says this process will own nothing more in `url`'s database: others may reap what it left
/// at once instead of waiting for its heartbeat to go stale. A clean shutdown calls it last.
pub fn stop(url: &PgUrl) -> Result<(), PgError> {
    let id = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(url)
        .map(|w| w.id.clone());
    let Some(id) = id else { return Ok(()) };
    let pg = Pg::connect(url)?;
    pg.call(move |c| {
        c.execute(
            "UPDATE docsfab_workers SET stopped_at = now() WHERE worker_id = $1",
            &[&id.0],
        )
    })?;
    Ok(())
}

fn spawn_heartbeat(pg: Pg, id: WorkerId, last_failure: Arc<Mutex<Option<Instant>>>) {
    let interval = heartbeat_interval();
    let spawned = std::thread::Builder::new()
        .name("docsfab-heartbeat".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                let worker = id.0.clone();
                let beat = pg.call(move |c| {
                    c.execute(
                        "UPDATE docsfab_workers SET heartbeat_at = now() WHERE worker_id = $1",
                        &[&worker],
                    )
                });
                // A database that no longer exists (a test's, dropped) ends the beat; any
                // other failure (a restart, a network blip) is tried again next beat, and
                // holds this process back from judging others for a while (`may_judge`).
                if let Err(e) = beat {
                    if e.code() == Some(&postgres::error::SqlState::INVALID_CATALOG_NAME) {
                        return;
                    }
                    *last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                }
            }
        });
    // Without a thread the worker looks dead after `stale_after`: its runs would be reaped
    // while running. Failing to spawn a thread means the process is out of resources anyway.
    if spawned.is_err() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"warning: could not start the PostgreSQL heartbeat thread; other workers will treat this process as dead\n",
        );
    }
}

fn new_id() -> WorkerId {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    WorkerId(format!(
        "{}/{}/{:x}",
        hostname(),
        std::process::id(),
        nanos & 0xff_ffff_ffff
    ))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_a_process_whose_beat_failed_judges_nobody_for_a_while() {
        let now = Instant::now();
        let quiet = Duration::from_secs(12);
        assert!(judging_allowed(None, now, quiet), "no failure seen");
        let failed = now;
        assert!(!judging_allowed(Some(failed), now, quiet));
        assert!(!judging_allowed(
            Some(failed),
            now + Duration::from_secs(11),
            quiet
        ));
        assert!(judging_allowed(
            Some(failed),
            now + Duration::from_secs(12),
            quiet
        ));
    }
}
