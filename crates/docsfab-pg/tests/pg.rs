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

/// Where a [`CommitCutter`] cuts the connection that carries a `COMMIT`.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Before the server gets it: the transaction does not commit.
    BeforeServer,
    /// After the server got it, before its answer reaches the client: it commits unheard.
    AfterServer,
}

/// A TCP proxy in front of the test server that, once armed, cuts the next connection that
/// sends `COMMIT`, as a server restart or a network cut does at the worst moment.
struct CommitCutter {
    port: u16,
    armed: std::sync::Arc<std::sync::Mutex<Option<Cut>>>,
}

impl CommitCutter {
    /// `None` when the test server is not reached over TCP.
    fn start(url: &docsfab_pg::PgUrl) -> Option<CommitCutter> {
        use docsfab_pg::postgres::config::Host;
        let config: docsfab_pg::postgres::Config = url.as_str().parse().unwrap();
        let Some(Host::Tcp(host)) = config.get_hosts().first().cloned() else {
            return None;
        };
        let upstream = format!(
            "{host}:{}",
            config.get_ports().first().copied().unwrap_or(5432)
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = std::sync::Arc::new(std::sync::Mutex::new(None));
        let shared = std::sync::Arc::clone(&armed);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let server = std::net::TcpStream::connect(&upstream).unwrap();
                pump(client, server, std::sync::Arc::clone(&shared));
            }
        });
        Some(CommitCutter { port, armed })
    }

    fn arm(&self, cut: Cut) {
        *self.armed.lock().unwrap() = Some(cut);
    }

    fn armed(&self) -> bool {
        self.armed.lock().unwrap().is_some()
    }
}

/// Carries one connection both ways, cutting it where the armed [`Cut`] says.
fn pump(
    client: std::net::TcpStream,
    server: std::net::TcpStream,
    armed: std::sync::Arc<std::sync::Mutex<Option<Cut>>>,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let muted = std::sync::Arc::new(AtomicBool::new(false));
    let (mut from_server, mut to_client) =
        (server.try_clone().unwrap(), client.try_clone().unwrap());
    let quiet = std::sync::Arc::clone(&muted);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = from_server.read(&mut buf) {
            if !quiet.load(Ordering::SeqCst) && to_client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        let (mut from_client, mut to_server) = (client, server);
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            let commit = buf[..n].windows(7).any(|w| w == b"COMMIT\0");
            let cut = if commit {
                armed.lock().unwrap().take()
            } else {
                None
            };
            if let Some(Cut::AfterServer) = cut {
                muted.store(true, Ordering::SeqCst);
                let _ = to_server.write_all(&buf[..n]);
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            if cut.is_some() || to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = from_client.shutdown(std::net::Shutdown::Both);
        let _ = to_server.shutdown(std::net::Shutdown::Both);
    });
}

/// A `COMMIT` whose connection is cut is never applied twice and never lost: cut after the
/// server committed, the transaction's value stands and it is not run again (the server says
/// it committed); cut before, it is run again (the server says it aborted). Either way the
/// row is there once.
#[test]
fn a_transaction_whose_commit_is_cut_is_applied_exactly_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let Some(db) = fresh_database("commit_cut") else {
        return;
    };
    let Some(cutter) = CommitCutter::start(&db.url) else {
        eprintln!("skipped: the test server is not reached over TCP");
        return;
    };
    let config: docsfab_pg::postgres::Config = db.url.as_str().parse().unwrap();
    let proxied = docsfab_pg::PgUrl::parse(&format!(
        "postgres://{}@127.0.0.1:{}/{}",
        config.get_user().unwrap_or("postgres"),
        cutter.port,
        config.get_dbname().unwrap()
    ))
    .unwrap();
    let pg = Pg::connect(&proxied).unwrap();
    pg.call(|c| c.batch_execute("CREATE TABLE t (n INTEGER)"))
        .unwrap();
    for (cut, runs) in [(Cut::AfterServer, 1), (Cut::BeforeServer, 2)] {
        let tries = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&tries);
        cutter.arm(cut);
        let result = pg
            .transaction_through_outages(std::time::Duration::from_secs(30), false, move |tx| {
                counted.fetch_add(1, Ordering::SeqCst);
                tx.execute("INSERT INTO t VALUES (1)", &[])
            })
            .unwrap();
        assert_eq!(result.unwrap(), 1, "{cut:?}");
        assert!(!cutter.armed(), "{cut:?}: no COMMIT was cut");
        assert_eq!(tries.load(Ordering::SeqCst), runs, "{cut:?}");
        let rows: i64 = pg
            .call(|c| c.query_one("SELECT COUNT(*) FROM t", &[]))
            .unwrap()
            .get(0);
        assert_eq!(rows, 1, "{cut:?}");
        pg.call(|c| c.batch_execute("DELETE FROM t")).unwrap();
    }
}
