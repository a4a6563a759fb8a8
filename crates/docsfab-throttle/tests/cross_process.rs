//! Two real OS processes sharing one DOCSFAB_HOME share the throttle: the hold, the cap on
//! requests in flight, and the permits of a process killed with `kill -9` come back.
//!
//! The other process is this test binary run again with `DOCSFAB_THROTTLE_CHILD` naming its
//! role (see `child_role`). Times are scaled down; the assertions are about orderings and
//! counts, never about how long something took.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_throttle::{AcquireError, Mode, Outcome, RateHeaders, Reason, Settings, Throttle};
use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

const ROLE: &str = "DOCSFAB_THROTTLE_CHILD";
const HOME: &str = "DOCSFAB_THROTTLE_CHILD_HOME";
const HOLD_MS: u64 = 2_000;
const CAP: u32 = 2;

fn open(home: &Path, max: u32) -> Throttle {
    let settings = Settings::new(Mode::Shared, max).unwrap();
    Throttle::open_with(
        &home.join("throttle.db"),
        [("sim".to_owned(), settings)],
        Duration::from_millis(10),
    )
    .unwrap()
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

/// Starts this test binary as a child playing `role` on `home`.
fn spawn_child(role: &str, home: &Path) -> Kid {
    Kid(Command::new(std::env::current_exe().unwrap())
        .args(["child_role", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(HOME, home)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap())
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
    let rt = runtime();
    let cancel = CancellationToken::new();
    match role.as_str() {
        // Sees a 429 whose replay wait is HOLD_MS, says when, and exits.
        "hold" => rt.block_on(async {
            let t = open(&home, 8);
            let p = t.acquire("sim", &cancel, None).await.unwrap();
            let before_finish = unix_ms();
            p.finish(
                Outcome::RateLimited {
                    wait_ms: Some(HOLD_MS),
                },
                &RateHeaders::none(),
            )
            .unwrap();
            println!("limited-at {before_finish}");
        }),
        // Six requests through a cap of CAP, each counted in and out of the probe database.
        "cap" => rt.block_on(async {
            let t = open(&home, CAP);
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
            let t = open(&home, CAP);
            // One answered request first: until then a provider gets one request at a time.
            let probe = t.acquire("sim", &cancel, None).await.unwrap();
            probe.finish(ok(), &RateHeaders::none()).unwrap();
            let mut held = vec![];
            for _ in 0..CAP {
                held.push(t.acquire("sim", &cancel, None).await.unwrap());
            }
            println!("holding {}", held.len());
            tokio::time::sleep(Duration::from_secs(120)).await;
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
    let home = tempfile::tempdir().unwrap();
    let t = open(home.path(), 8);
    let mut child = spawn_child("hold", home.path());
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
    let mut a = spawn_child("cap", home.path());
    let mut b = spawn_child("cap", home.path());
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
    let t = open(home.path(), CAP);
    let mut hog = spawn_child("hog", home.path());
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
