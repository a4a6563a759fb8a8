//! Two real OS processes sharing one DOCSFAB_HOME share the throttle: the hold, the cap on
//! requests in flight, and the permits of a process killed with `kill -9` come back. The same
//! three tests run again with the state in PostgreSQL (`issue15_...`), where the processes are
//! two workers of one database, as docsfab workers on two hosts would be.
//!
//! The other process is this test binary run again with `DOCSFAB_THROTTLE_CHILD` naming its
//! role (see `child_role`). Times are scaled down; the assertions are about orderings and
//! counts, never about how long something took.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_pg::PgUrl;
use docsfab_throttle::{
    AcquireError, Backend, Mode, Outcome, RateHeaders, Reason, Settings, Throttle,
};
use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

const ROLE: &str = "DOCSFAB_THROTTLE_CHILD";
const HOME: &str = "DOCSFAB_THROTTLE_CHILD_HOME";
/// The PostgreSQL database the child keeps the state in; unset for `throttle.db`.
const PG: &str = "DOCSFAB_THROTTLE_CHILD_PG";
const HOLD_MS: u64 = 2_000;
const CAP: u32 = 2;

fn open(backend: &Backend, max: u32) -> Throttle {
    let settings = Settings::new(Mode::Shared, max).unwrap();
    Throttle::open_at(
        backend,
        [("sim".to_owned(), settings)],
        Duration::from_millis(10),
    )
    .unwrap()
}

/// Where a test keeps the shared state: `home/throttle.db`, or the database `pg`.
fn backend(home: &Path, pg: Option<&PgUrl>) -> Backend {
    match pg {
        Some(url) => Backend::Postgres(url.clone()),
        None => Backend::Sqlite(home.join("throttle.db")),
    }
}

fn ok() -> Outcome {
    Outcome::Success {
        input_tokens: None,
        output_tokens: None,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A child process that is killed when the test ends, passed or failed, so a failed assertion
/// leaves no process behind.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this test binary as a child playing `role` on `home` (and on the database `pg`).
fn spawn_child(role: &str, home: &Path, pg: Option<&PgUrl>) -> Kid {
    spawn_child_beating(role, home, pg, None)
}

/// [`spawn_child`] with the child's worker heartbeat every `beat_ms` (`DOCSFAB_HEARTBEAT_MS`):
/// a worker is dead after five missed beats *as its observer counts them*, so the children that
/// judge each other share one short beat and the test need not wait the default 10 s.
fn spawn_child_beating(role: &str, home: &Path, pg: Option<&PgUrl>, beat_ms: Option<u64>) -> Kid {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(ms) = beat_ms {
        command.env("DOCSFAB_HEARTBEAT_MS", ms.to_string());
    }
    command
        .args(["child_role", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(HOME, home)
        .env_remove(PG)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(url) = pg {
        command.env(PG, url.as_str());
    }
    Kid(command.spawn().unwrap())
}

/// Reads the child's stdout until a line holding `marker`, and returns the rest of it.
fn wait_for(child: &mut Kid, marker: &str) -> String {
    let out = child.0.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before printing {marker}");
        // The harness prints `test child_role ... ` before the child's first line.
        if let Some(at) = line.find(marker) {
            return line[at + marker.len()..].trim().to_owned();
        }
    }
}

/// The entry point of the child processes; as a test of its own it does nothing.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let home = std::path::PathBuf::from(std::env::var(HOME).unwrap());
    let pg = std::env::var(PG).ok().map(|u| PgUrl::parse(&u).unwrap());
    let state = backend(&home, pg.as_ref());
    let rt = runtime();
    let cancel = CancellationToken::new();
    match role.as_str() {
        // Sees a 429 whose Retry-After is HOLD_MS, says when, and exits.
        "hold" => rt.block_on(async {
            let t = open(&state, 8);
            let p = t.acquire("sim", &cancel, None).await.unwrap();
            let before_finish = unix_ms();
            let head = RateHeaders {
                retry_after_ms: Some(HOLD_MS),
                ..RateHeaders::none()
            };
            p.finish(Outcome::RateLimited, &head).unwrap();
            println!("limited-at {before_finish}");
        }),
        // Six requests through a cap of CAP, each counted in and out of the probe database.
        "cap" => rt.block_on(async {
            let t = open(&state, CAP);
            // Both children start their requests together.
            println!("ready");
            while !home.join("go").exists() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut tasks = vec![];
            for i in 0..6 {
                let t = t.clone();
                let cancel = cancel.clone();
                let probe = home.join("probe.db");
                tasks.push(tokio::spawn(async move {
                    // Arrivals spread out in both processes, faster than the cap lets them
                    // through, so both queue at once and a fair queue interleaves them.
                    tokio::time::sleep(Duration::from_millis(15 * i)).await;
                    let p = t.acquire("sim", &cancel, None).await.unwrap();
                    count(&probe, 1);
                    tokio::time::sleep(Duration::from_millis(60)).await;
                    count(&probe, -1);
                    p.finish(ok(), &RateHeaders::none()).unwrap();
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            println!("done");
        }),
        // Takes every slot and never gives them back (until it is killed).
        "hog" => rt.block_on(async {
            let t = open(&state, CAP);
            // Answered requests first: a provider that has said nothing of its limits gets 1, 1,
            // 2, ... requests at a time as it answers.
            for _ in 0..CAP {
                let probe = t.acquire("sim", &cancel, None).await.unwrap();
                probe.finish(ok(), &RateHeaders::none()).unwrap();
            }
            let mut held = vec![];
            for _ in 0..CAP {
                held.push(t.acquire("sim", &cancel, None).await.unwrap());
            }
            println!("holding {}", held.len());
            tokio::time::sleep(Duration::from_secs(120)).await;
        }),
        // Takes every slot, waiting as long as it takes a dead holder's to come back.
        "take" => rt.block_on(async {
            let t = open(&state, CAP);
            let later = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut held = vec![];
            for _ in 0..CAP {
                held.push(t.acquire("sim", &cancel, Some(later)).await.unwrap());
            }
            println!("took {}", held.len());
        }),
        other => panic!("unknown child role {other}"),
    }
}

/// Moves the probe's in-flight counter by `delta`, keeping its peak and the order of grants.
fn count(probe: &Path, delta: i64) {
    let mut conn = Connection::open(probe).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    tx.execute(
        "UPDATE probe SET now = now + ?1, peak = MAX(peak, now + ?1)",
        [delta],
    )
    .unwrap();
    if delta > 0 {
        tx.execute(
            "INSERT INTO grants (pid) VALUES (?1)",
            [i64::from(std::process::id())],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn a_429_in_one_process_holds_the_sends_of_another() {
    a_429_in_one_process_holds_the_sends_of_another_on(None);
}

#[test]
fn issue15_a_429_in_one_worker_holds_the_sends_of_another_over_postgres() {
    if let Some(db) = docsfab_pg::testing::fresh_database("cross_hold") {
        a_429_in_one_process_holds_the_sends_of_another_on(Some(&db.url));
    }
}

fn a_429_in_one_process_holds_the_sends_of_another_on(pg: Option<&PgUrl>) {
    let home = tempfile::tempdir().unwrap();
    let t = open(&backend(home.path(), pg), 8);
    let mut child = spawn_child("hold", home.path(), pg);
    let limited_at: u64 = wait_for(&mut child, "limited-at ").parse().unwrap();
    assert!(child.0.wait().unwrap().success());

    let rt = runtime();
    let cancel = CancellationToken::new();
    rt.block_on(async {
        // The hold the other process set is seen here, and a wait past the deadline is refused.
        let soon = tokio::time::Instant::now() + Duration::from_millis(300);
        let err = t.acquire("sim", &cancel, Some(soon)).await.unwrap_err();
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
        let p = t.acquire("sim", &cancel, None).await.unwrap();
        let granted_at = unix_ms();
        assert_eq!(p.held_for(), Some(Reason::Hold));
        assert!(
            granted_at >= limited_at + HOLD_MS,
            "granted at {granted_at}, the hold ran from {limited_at} for {HOLD_MS} ms"
        );
        p.finish(ok(), &RateHeaders::none()).unwrap();
    });
}

#[test]
fn two_processes_share_one_cap_on_requests_in_flight() {
    two_processes_share_one_cap_on_requests_in_flight_on(None);
}

/// Two workers of one database never have more than maxConcurrentRequests in flight together,
/// and a slot freed in one goes to the earliest waiter of either (FIFO across holders).
#[test]
fn issue15_two_workers_share_one_cap_and_one_queue_over_postgres() {
    if let Some(db) = docsfab_pg::testing::fresh_database("cross_cap") {
        two_processes_share_one_cap_on_requests_in_flight_on(Some(&db.url));
    }
}

fn two_processes_share_one_cap_on_requests_in_flight_on(pg: Option<&PgUrl>) {
    let home = tempfile::tempdir().unwrap();
    let probe = Connection::open(home.path().join("probe.db")).unwrap();
    probe
        .execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE probe (now INTEGER NOT NULL, peak INTEGER NOT NULL);
             INSERT INTO probe VALUES (0, 0);
             CREATE TABLE grants (seq INTEGER PRIMARY KEY AUTOINCREMENT, pid INTEGER NOT NULL);",
        )
        .unwrap();
    let mut a = spawn_child("cap", home.path(), pg);
    let mut b = spawn_child("cap", home.path(), pg);
    wait_for(&mut a, "ready");
    wait_for(&mut b, "ready");
    std::fs::write(home.path().join("go"), "").unwrap();
    wait_for(&mut a, "done");
    wait_for(&mut b, "done");
    assert!(a.0.wait().unwrap().success() && b.0.wait().unwrap().success());

    let (now, peak): (i64, i64) = probe
        .query_row("SELECT now, peak FROM probe", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let pids: Vec<i64> = probe
        .prepare("SELECT pid FROM grants ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!((now, pids.len()), (0, 12), "every request ran and finished");
    assert!(
        peak <= i64::from(CAP),
        "{peak} in flight at once across both processes"
    );
    // Both processes wanted slots at the same time and were served in arrival order (their
    // grants interleave), so a cap kept per process would have let 2 x CAP through.
    let switches = pids.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches >= 2, "grants did not interleave: {pids:?}");
}

#[test]
fn the_permits_of_a_process_killed_with_sigkill_are_reclaimed() {
    let home = tempfile::tempdir().unwrap();
    let t = open(&backend(home.path(), None), CAP);
    let mut hog = spawn_child("hog", home.path(), None);
    assert_eq!(wait_for(&mut hog, "holding "), CAP.to_string());

    let rt = runtime();
    let cancel = CancellationToken::new();
    rt.block_on(async {
        let soon = tokio::time::Instant::now() + Duration::from_millis(300);
        let err = t.acquire("sim", &cancel, Some(soon)).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::Deadline {
                    reason: Reason::Concurrency,
                    ..
                }
            ),
            "the live holder's permits count: {err:?}"
        );
        hog.0.kill().unwrap(); // SIGKILL: no destructor, no cleanup in the child
        hog.0.wait().unwrap();
        let later = tokio::time::Instant::now() + Duration::from_secs(30);
        let first = t.acquire("sim", &cancel, Some(later)).await.unwrap();
        let second = t.acquire("sim", &cancel, Some(later)).await.unwrap();
        first.finish(ok(), &RateHeaders::none()).unwrap();
        second.finish(ok(), &RateHeaders::none()).unwrap();
    });
}

/// A worker killed with SIGKILL stops beating; once it is stale another worker's decision gives
/// its permits back. The parent sees them held while the worker lives; a second child with the
/// same short beat as the dead one takes every slot after the kill.
#[test]
fn issue15_the_permits_of_a_worker_killed_with_sigkill_are_given_back_over_postgres() {
    let Some(db) = docsfab_pg::testing::fresh_database("cross_kill") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let t = open(&backend(home.path(), Some(&db.url)), CAP);
    let mut hog = spawn_child_beating("hog", home.path(), Some(&db.url), Some(100));
    assert_eq!(wait_for(&mut hog, "holding "), CAP.to_string());

    let rt = runtime();
    let cancel = CancellationToken::new();
    rt.block_on(async {
        let soon = tokio::time::Instant::now() + Duration::from_millis(300);
        let err = t.acquire("sim", &cancel, Some(soon)).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::Deadline {
                    reason: Reason::Concurrency,
                    ..
                }
            ),
            "the live worker's permits count: {err:?}"
        );
    });
    hog.0.kill().unwrap(); // SIGKILL: no destructor, no `stopped_at`, the heartbeat just stops
    hog.0.wait().unwrap();
    let mut taker = spawn_child_beating("take", home.path(), Some(&db.url), Some(100));
    assert_eq!(wait_for(&mut taker, "took "), CAP.to_string());
    assert!(taker.0.wait().unwrap().success());
}

/// Issue 34, found by the soak: a decision that meets an outage of the database (a restart)
/// waits it out instead of going around the throttle, and leaves no permit or queue place that
/// its process does not know of. Before, a `COMMIT` cut by the restart could leave a place in
/// the queue that stood ahead of every later waiter for as long as its process lived, and
/// every request of the fleet waited behind it until its attempt deadline.
#[test]
fn issue34_a_decision_during_a_database_outage_waits_it_out_and_leaves_no_stray_row() {
    let Some(db) = docsfab_pg::testing::fresh_database("throttle_outage") else {
        return;
    };
    let throttle = open(&Backend::Postgres(db.url.clone()), 1);
    let rt = runtime();
    let cancel = CancellationToken::new();
    // The provider's row and the tables exist; the one slot is free again.
    let warm = rt.block_on(throttle.acquire("sim", &cancel, None)).unwrap();
    warm.finish(ok(), &RateHeaders::none()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let permit = std::thread::scope(|scope| {
        db.start_outage();
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(400));
            db.end_outage();
        });
        rt.block_on(throttle.acquire("sim", &cancel, Some(deadline)))
    });
    let permit = permit.expect("the decision waits out the outage instead of failing");
    permit.finish(ok(), &RateHeaders::none()).unwrap();
    // This process's lease row is given back once its lease lapses (`LEASE_MS`); a row it
    // does not know of would stay for as long as it lives.
    let pg = docsfab_pg::Pg::connect(&db.url).unwrap();
    let rows = || -> (i64, i64) {
        pg.call(|c| {
            c.query_one(
                "SELECT (SELECT count(*) FROM throttle_permits),
                        (SELECT count(*) FROM throttle_waiters)",
                &[],
            )
            .map(|r| (r.get(0), r.get(1)))
        })
        .unwrap()
    };
    let mut left = rows();
    for _ in 0..100 {
        if left == (0, 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        left = rows();
    }
    assert_eq!(left, (0, 0), "rows left behind (permits, waiters)");
    drop(throttle);
}
