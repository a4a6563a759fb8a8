//! Transactions through real restarts of the server (`pg_ctl -m fast restart`; an outage of
//! the test database when `DOCSFAB_TEST_PGCTL`/`DOCSFAB_TEST_PGDATA` are not set). A binary of
//! its own: a restart cuts every connection of the server, so nothing else may run beside it.
//!
//! Found by the release soak (issue 34): a `COMMIT` the shutdown cut was asked after with
//! `txid_status` on the same dead connection, which failed with an I/O error (connection reset)
//! that did not count as an outage, so the cut was reported instead of waited out and a job
//! ended `failed` before its first step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use docsfab_pg::Pg;
use docsfab_pg::testing::fresh_database;

const WRITERS: i32 = 16;

#[test]
fn issue34_writes_through_server_restarts_all_commit_exactly_once() {
    let Some(db) = fresh_database("restart") else {
        return;
    };
    Pg::connect(&db.url)
        .unwrap()
        .call(|c| {
            c.batch_execute(
                "CREATE TABLE counts (id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
                 INSERT INTO counts SELECT g, 0 FROM generate_series(1, 16) g",
            )
        })
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (1..=WRITERS)
        .map(|id| {
            let (url, stop) = (db.url.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let pg = Pg::connect(&url).unwrap();
                let (mut committed, mut failures) = (0u32, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    // A row lock and an update: the transaction has an id, so a cut COMMIT is
                    // asked after.
                    let done =
                        pg.transaction_through_outages(Duration::from_secs(30), false, move |tx| {
                            tx.query_one("SELECT n FROM counts WHERE id = $1 FOR UPDATE", &[&id])?;
                            tx.execute("UPDATE counts SET n = n + 1 WHERE id = $1", &[&id])
                        });
                    match done {
                        Ok(Ok(_)) => committed += 1,
                        other => failures.push(format!("{other:?}")),
                    }
                }
                (id, committed, failures)
            })
        })
        .collect();
    let restarts = AtomicU32::new(0);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        eprintln!("restart: {}", db.restart_server());
        restarts.fetch_add(1, Ordering::SeqCst);
    }
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::SeqCst);
    // A connection made after the last restart (the one above was cut by it).
    let check = Pg::connect(&db.url).unwrap();
    let mut total = 0u32;
    for w in writers {
        let (id, committed, failures) = w.join().unwrap();
        assert!(failures.is_empty(), "writer {id}: {failures:?}");
        let n: i32 = check
            .call(move |c| c.query_one("SELECT n FROM counts WHERE id = $1", &[&id]))
            .unwrap()
            .get(0);
        // Every transaction reported committed is in the table once, and no other.
        assert_eq!(n as u32, committed, "writer {id}");
        total += committed;
    }
    eprintln!(
        "{total} transactions committed through {} restarts",
        restarts.load(Ordering::SeqCst)
    );
    // Nobody is judged dead while the server is younger than the stale limit (docs/scale-out.md),
    // so the suites after this one, which judge dead workers, wait until it is older.
    loop {
        let up: f64 = check
            .call(|c| {
                c.query_one(
                    "SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8",
                    &[],
                )
            })
            .unwrap()
            .get(0);
        if up > docsfab_pg::worker::stale_after().as_secs_f64() + 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
