//! Fresh PostgreSQL databases for tests.
//!
//! `DOCSFAB_TEST_POSTGRES` names a server and a role allowed to create databases (CI starts
//! one: see `.ci/run`). Each [`fresh_database`] is a new, empty database, dropped with the
//! value, so tests never see each other's rows and may run in parallel. Without the variable
//! the PostgreSQL half of a suite is skipped with a line on stderr, unless
//! `DOCSFAB_REQUIRE_POSTGRES=1` (CI), where a missing server is a failure.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Pg, PgUrl};

/// A database that exists until this value is dropped.
pub struct TestDb {
    pub url: PgUrl,
    admin: PgUrl,
    name: String,
}

/// A new empty database named after `label`, or `None` when no test server is configured.
pub fn fresh_database(label: &str) -> Option<TestDb> {
    let admin = match std::env::var("DOCSFAB_TEST_POSTGRES") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => {
            if std::env::var("DOCSFAB_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
                panic!(
                    "DOCSFAB_REQUIRE_POSTGRES=1 but DOCSFAB_TEST_POSTGRES is not set; point it at a PostgreSQL server (see .ci/run)"
                );
            }
            eprintln!("skipped the PostgreSQL part of {label}: DOCSFAB_TEST_POSTGRES is not set");
            return None;
        }
    };
    let admin = PgUrl::parse(&admin).expect("DOCSFAB_TEST_POSTGRES is a PostgreSQL URL");
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let clean: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect();
    let name = format!(
        "dft_{clean}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let pg = Pg::connect(&admin).expect("connect to DOCSFAB_TEST_POSTGRES");
    // Two statements, two calls: a multi-statement string is one implicit transaction, and
    // neither may run inside one.
    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    let create = format!("CREATE DATABASE {name}");
    pg.call(move |c| c.batch_execute(&drop))
        .expect("drop a leftover test database");
    pg.call(move |c| c.batch_execute(&create))
        .expect("create a test database");
    Some(TestDb {
        url: admin.with_database(&name),
        admin,
        name,
    })
}

impl TestDb {
    /// An outage, as far as this database's clients can tell: new connections are refused and
    /// every open one is cut. [`TestDb::end_outage`] lets them connect again.
    pub fn start_outage(&self) {
        let name = self.name.clone();
        Pg::connect(&self.admin)
            .expect("connect to DOCSFAB_TEST_POSTGRES")
            .call(move |c| {
                c.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))?;
                c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&name],
                )
            })
            .expect("refuse and cut the test database's connections");
    }

    /// Restarts the test server with a fast shutdown (`pg_ctl -m fast restart`, as the data
    /// directory's owner) when `DOCSFAB_TEST_PGCTL` and `DOCSFAB_TEST_PGDATA` say where it is
    /// (`.ci/run` exports both); otherwise this database refuses and cuts every connection for
    /// a second instead, and a line on stderr says so. Returns what it did. A restart cuts every
    /// test's connections: a test that restarts runs in a test binary of its own.
    pub fn restart_server(&self) -> &'static str {
        let pgctl = std::env::var("DOCSFAB_TEST_PGCTL").unwrap_or_default();
        let pgdata = std::env::var("DOCSFAB_TEST_PGDATA").unwrap_or_default();
        if pgctl.trim().is_empty() || pgdata.trim().is_empty() {
            eprintln!(
                "DOCSFAB_TEST_PGCTL/DOCSFAB_TEST_PGDATA are not set: an outage of the test database stands in for the server restart"
            );
            self.start_outage();
            std::thread::sleep(std::time::Duration::from_secs(1));
            self.end_outage();
            return "database outage";
        }
        // pg_ctl refuses to run as root: run it as the data directory's owner then. Its log goes
        // to a file, so the server it starts does not hold the test's pipes open.
        let script = r#"restart="\"$C\" -D \"$D\" -l \"$D/restart.log\" -m fast -w restart"
if [ "$(id -u)" = 0 ]; then exec su "$(stat -c %U "$D")" -s /bin/sh -c "$restart"; fi
exec sh -c "$restart""#;
        let status = std::process::Command::new("sh")
            .args(["-c", script])
            .env("C", pgctl.trim())
            .env("D", pgdata.trim())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run pg_ctl");
        assert!(status.success(), "pg_ctl restart failed: {status}");
        "pg_ctl -m fast restart"
    }

    pub fn end_outage(&self) {
        let sql = format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", self.name);
        Pg::connect(&self.admin)
            .expect("connect to DOCSFAB_TEST_POSTGRES")
            .call(move |c| c.batch_execute(&sql))
            .expect("allow the test database's connections again");
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Best effort: a leftover database is harmless, and the next run with the same pid
        // and counter drops it before creating.
        if let Ok(pg) = Pg::connect(&self.admin) {
            let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            let _ = pg.call(move |c| c.batch_execute(&drop));
        }
    }
}
