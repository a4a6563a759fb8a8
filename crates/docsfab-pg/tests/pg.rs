//! docsfab-pg against a real PostgreSQL server (`DOCSFAB_TEST_POSTGRES`; skipped without one
//! unless `DOCSFAB_REQUIRE_POSTGRES=1`).

use docsfab_pg::testing::fresh_database;
use docsfab_pg::{Pg, migrate, worker};

const STEPS: &[&str] = &[
    "CREATE TABLE t (id INTEGER PRIMARY KEY)",
    "ALTER TABLE t ADD COLUMN note TEXT",
];

#[test]
fn issue15_migrations_apply_once_even_from_many_processes_at_once() {
    let Some(db) = fresh_database("migrations") else {
        return;
    };
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || {
                let pg = Pg::connect(&url).unwrap();
                migrate(&pg, "probe", STEPS).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let pg = Pg::connect(&db.url).unwrap();
    let versions: Vec<i32> = pg
        .call(|c| {
            c.query(
                "SELECT version FROM docsfab_migrations WHERE component = 'probe' ORDER BY version",
                &[],
            )
        })
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, vec![1, 2]);
    pg.call(|c| c.execute("INSERT INTO t (id, note) VALUES (1, 'x')", &[]))
        .unwrap();
}

#[test]
fn issue15_a_newer_schema_is_refused_with_a_sentence() {
    let Some(db) = fresh_database("newer") else {
        return;
    };
    let pg = Pg::connect(&db.url).unwrap();
    migrate(&pg, "probe", STEPS).unwrap();
    let e = migrate(&pg, "probe", &STEPS[..1]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("newer than this docsfab knows"), "{text}");
    assert!(
        !text.contains("postgres:postgres@"),
        "password shown: {text}"
    );
}

#[test]
fn issue15_a_worker_is_alive_while_it_beats_and_dead_once_stopped() {
    let Some(db) = fresh_database("workers") else {
        return;
    };
    let id = worker::this_process(&db.url).unwrap();
    assert_eq!(
        worker::this_process(&db.url).unwrap(),
        id,
        "registered once"
    );
    let pg = Pg::connect(&db.url).unwrap();
    let alive = worker::alive_condition("w");
    let count_alive = move |pg: &Pg| -> i64 {
        let sql = format!("SELECT COUNT(*) FROM docsfab_workers w WHERE {alive}");
        pg.call(move |c| c.query_one(&sql, &[])).unwrap().get(0)
    };
    assert_eq!(count_alive(&pg), 1);
    worker::stop(&db.url).unwrap();
    assert_eq!(count_alive(&pg), 0);
}

#[test]
fn issue15_a_connection_the_server_killed_is_made_again() {
    let Some(db) = fresh_database("reconnect") else {
        return;
    };
    let pg = Pg::connect(&db.url).unwrap();
    let pid: i32 = pg
        .call(|c| c.query_one("SELECT pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let admin = Pg::connect(&db.url).unwrap();
    admin
        .call(move |c| c.execute("SELECT pg_terminate_backend($1)", &[&pid]))
        .unwrap();
    // The call that meets the closed socket fails; the next one reconnects.
    let _ = pg.call(|c| c.query_one("SELECT 1", &[]));
    let again: i32 = pg.call(|c| c.query_one("SELECT 1", &[])).unwrap().get(0);
    assert_eq!(again, 1);
}

/// Issue 15: an outage must not look like death. When this process's heartbeat fails (here:
/// the database refuses new connections and its connection is cut), it holds back from judging
/// other workers dead (`may_judge`), since their beats failed in the same outage.
#[test]
fn issue15_a_worker_whose_beat_failed_holds_back_from_judging_others() {
    let Some(db) = fresh_database("outage") else {
        return;
    };
    worker::this_process(&db.url).unwrap();
    assert!(worker::may_judge(&db.url), "nothing failed yet");
    db.start_outage();
    let until = std::time::Instant::now() + worker::heartbeat_interval() * 3;
    while worker::may_judge(&db.url) {
        assert!(
            std::time::Instant::now() < until,
            "the failed beat did not hold this process back"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    db.end_outage();
    // Back up, it still waits a stale limit for the others to beat again.
    std::thread::sleep(worker::heartbeat_interval());
    assert!(!worker::may_judge(&db.url));
}
