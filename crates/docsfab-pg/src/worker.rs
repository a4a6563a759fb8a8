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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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

/// SQL that is true when the `docsfab_workers` row `alias` is alive.
pub fn alive_condition(alias: &str) -> String {
    format!(
        "({alias}.stopped_at IS NULL AND {alias}.heartbeat_at > now() - interval '{} milliseconds')",
        stale_after().as_millis()
    )
}

/// The workers table, for components whose own migrations refer to it.
pub fn migrate_registry(pg: &Pg) -> Result<(), PgError> {
    migrate(pg, "workers", MIGRATIONS)
}

fn registry() -> &'static Mutex<HashMap<PgUrl, WorkerId>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PgUrl, WorkerId>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// This process's worker id in the database at `url`, registering it and starting its
/// heartbeat the first time. The heartbeat lives as long as the process.
pub fn this_process(url: &PgUrl) -> Result<WorkerId, PgError> {
    let mut known = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(id) = known.get(url) {
        return Ok(id.clone());
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
    spawn_heartbeat(pg, id.clone());
    known.insert(url.clone(), id.clone());
    Ok(id)
}

/// Says this process will own nothing more in `url`'s database: others may reap what it left
/// at once instead of waiting for its heartbeat to go stale. A clean shutdown calls it last.
pub fn stop(url: &PgUrl) -> Result<(), PgError> {
    let id = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(url)
        .cloned();
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

fn spawn_heartbeat(pg: Pg, id: WorkerId) {
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
                // other failure (a restart, a network blip) is tried again next beat.
                if let Err(e) = beat
                    && e.code() == Some(&postgres::error::SqlState::INVALID_CATALOG_NAME)
                {
                    return;
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
