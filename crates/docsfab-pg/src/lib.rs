//! docsfab's PostgreSQL plumbing, shared by the run store, the job queue and the throttle.
//!
//! - [`PgUrl`]: a `postgres://` URL that never prints its password.
//! - [`Pg`]: one `postgres::Client` on a thread of its own. The `postgres` crate is a blocking
//!   wrapper that runs its own tokio runtime, so calling it on a tokio worker thread would start
//!   a runtime inside a runtime and panic. Every call is a closure sent to the client's thread;
//!   the caller blocks on the answer exactly as it blocks on a SQLite statement.
//! - [`migrate`]: versioned schema steps per component, applied on open, serialized across
//!   processes by an advisory lock.
//! - [`worker`]: the registry of live docsfab processes and their heartbeat, which is how a
//!   process on another machine tells that a run's owner is gone.

use std::fmt;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use postgres;
use postgres::{Client, IsolationLevel, NoTls, Transaction};

#[cfg(feature = "testing")]
pub mod testing;
pub mod worker;

/// A PostgreSQL connection URL. `Display` and `Debug` hide the password; [`PgUrl::as_str`] is
/// the real text, for connecting only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PgUrl {
    raw: String,
    shown: String,
}

impl PgUrl {
    /// Accepts `postgres://` and `postgresql://` URLs that the client can read.
    pub fn parse(text: &str) -> Result<PgUrl, String> {
        let text = text.trim();
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            return Err(format!(
                "{:?} is not a PostgreSQL URL; write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                redact(text)
            ));
        }
        if let Err(e) = text.parse::<postgres::Config>() {
            return Err(format!(
                "the PostgreSQL URL {} cannot be read ({e}); write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                redact(text)
            ));
        }
        Ok(PgUrl {
            raw: text.to_owned(),
            shown: redact(text),
        })
    }

    /// The URL with its password; for connecting, never for printing.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The same server and credentials, another database.
    pub fn with_database(&self, database: &str) -> PgUrl {
        let (before, after) = split_path(&self.raw);
        let query = after.find('?').map_or("", |i| &after[i..]);
        let raw = format!("{before}/{database}{query}");
        PgUrl {
            shown: redact(&raw),
            raw,
        }
    }
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({})", self.shown)
    }
}

/// `(scheme://authority, /path?query)` of a URL.
fn split_path(url: &str) -> (&str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    url.split_at(end)
}

/// The URL with the password of its user information and any `password=` parameter replaced.
fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    let authority = &url[start..authority_end];
    let mut out = url[..start].to_owned();
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let rest = &url[authority_end..];
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(rest),
    }
    out
}

/// What went wrong talking to PostgreSQL. Messages name the server by its redacted URL.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("cannot connect to PostgreSQL at {url}: {}", detail(source))]
    Connect {
        url: String,
        #[source]
        source: postgres::Error,
    },
    #[error("PostgreSQL at {url} answered with an error: {}", detail(source))]
    Query {
        url: String,
        #[source]
        source: postgres::Error,
    },
    #[error(
        "the database at {url} has schema version {found} of {component}, newer than this docsfab knows ({known}); upgrade docsfab"
    )]
    SchemaTooNew {
        url: String,
        component: String,
        found: i32,
        known: usize,
    },
    #[error("the PostgreSQL client thread for {url} has stopped")]
    Gone { url: String },
}

/// The client's own text is terse ("db error"); the reason is in the server's message or in
/// the chain of sources (refused, timed out, TLS).
fn detail(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if text.contains("TLS") {
        text.push_str(
            "; docsfab connects without TLS: use sslmode=disable or prefer on a private network (docs/scale-out.md)",
        );
    }
    text
}

impl PgError {
    /// The server's SQLSTATE, when the server answered with one.
    pub fn code(&self) -> Option<&postgres::error::SqlState> {
        match self {
            PgError::Connect { source, .. } | PgError::Query { source, .. } => source.code(),
            _ => None,
        }
    }
}

/// A call for the connection's thread: it gets the connection, or why none could be made.
type Job = Box<dyn FnOnce(Result<&mut Client, PgError>) + Send>;

/// One PostgreSQL connection, owned by a thread of its own. Dropping it ends the thread and
/// the connection.
pub struct Pg {
    url: PgUrl,
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Pg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pg").field("url", &self.url).finish()
    }
}

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn connect(url: &PgUrl) -> Result<Client, PgError> {
    let mut config: postgres::Config = url.raw.parse().map_err(|source| PgError::Connect {
        url: url.to_string(),
        source,
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("docsfab");
    }
    config.connect(NoTls).map_err(|source| PgError::Connect {
        url: url.to_string(),
        source,
    })
}

impl Pg {
    /// Connects, on a new thread, and waits until the connection is up.
    pub fn connect(url: &PgUrl) -> Result<Pg, PgError> {
        let client = {
            // Connecting runs the crate's own runtime too: do it on a plain thread.
            let target = url.clone();
            std::thread::spawn(move || connect(&target))
                .join()
                .map_err(|_| PgError::Gone {
                    url: url.to_string(),
                })??
        };
        let (jobs, inbox) = mpsc::channel::<Job>();
        let thread_url = url.clone();
        let thread = std::thread::Builder::new()
            .name("docsfab-pg".to_owned())
            .spawn(move || {
                let mut client = Some(client);
                for job in inbox {
                    // A connection the server closed (restart, idle kill) is made again
                    // before the next call; the call that met the close got its error. The
                    // connecting happens here, never on the caller's thread, which may be
                    // driving an async runtime (where the blocking client must not run).
                    if client.as_ref().is_none_or(Client::is_closed) {
                        client = None;
                        match connect(&thread_url) {
                            Ok(c) => client = Some(c),
                            Err(e) => {
                                job(Err(e));
                                continue;
                            }
                        }
                    }
                    match client.as_mut() {
                        Some(c) => job(Ok(c)),
                        None => job(Err(PgError::Gone {
                            url: thread_url.to_string(),
                        })),
                    }
                }
            })
            .map_err(|_| PgError::Gone {
                url: url.to_string(),
            })?;
        Ok(Pg {
            url: url.clone(),
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> &PgUrl {
        &self.url
    }

    /// Runs `f` with the client on its thread and returns what it returned. `Err` only when
    /// there is no connection (it failed and could not be made again).
    pub fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Client) -> T + Send + 'static,
    ) -> Result<T, PgError> {
        let (answer, answered) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |conn| {
            let _ = answer.send(conn.map(f));
        });
        let gone = || PgError::Gone {
            url: self.url.to_string(),
        };
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        // `Err` inside: the reconnect before this call failed, with the server's reason.
        answered.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// Runs `f` in one transaction (a read-only snapshot when `snapshot`) and commits it; while
    /// the server cannot be reached (a restart, a failover, a network cut) it is run again, for
    /// up to `patience`, backing off from 100 ms to 2 s. The caller's thread sleeps between
    /// tries. `Err` outside: no connection; inside: `f`'s failure or the server's.
    ///
    /// A transaction is never applied twice and never lost to an outage: one cut before its
    /// `COMMIT` was sent cannot have committed and is run again; one cut while its `COMMIT` was
    /// on its way (the server went down between receiving it and answering) may or may not have
    /// committed, so before it is sent its transaction id is read, and after the cut the server
    /// is asked what became of it (`txid_status`): committed, `f`'s value stands; aborted, it is
    /// run again; still unknown when the patience runs out, the cut is reported. A transaction
    /// that wrote nothing has no id and nothing to lose: its value stands.
    pub fn transaction_through_outages<T, E>(
        &self,
        patience: Duration,
        snapshot: bool,
        f: impl Fn(&mut Transaction<'_>) -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Result<T, E>, PgError>
    where
        T: Send + 'static,
        E: TxFailure + Send + 'static,
    {
        let f = Arc::new(f);
        let until = Instant::now() + patience;
        let mut pause = Duration::from_millis(100);
        loop {
            let g = Arc::clone(&f);
            let again = match self.with(move |c| try_transaction(c, snapshot, &*g)) {
                Err(e) if connect_may_succeed_later(&e) => Err(e),
                Err(e) => return Err(e),
                Ok(Tried::Ended(result)) => return Ok(result),
                Ok(Tried::CutBeforeCommit(cut)) => Ok(cut),
                Ok(Tried::CutInCommit {
                    value, xid: None, ..
                }) => return Ok(Ok(value)),
                Ok(Tried::CutInCommit {
                    value,
                    xid: Some(xid),
                    cut,
                }) => match self.commit_status(xid, until) {
                    CommitStatus::Committed => return Ok(Ok(value)),
                    CommitStatus::Aborted => Ok(cut),
                    CommitStatus::Unknown => return Ok(Err(cut)),
                },
            };
            if Instant::now() + pause > until {
                return again.map(Err);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// What became of transaction `xid`, whose `COMMIT` was cut: asked again while the server
    /// cannot be reached or the transaction is still finishing, until `until`.
    fn commit_status(&self, xid: i64, until: Instant) -> CommitStatus {
        let mut pause = Duration::from_millis(100);
        loop {
            let asked = self.with(move |c| {
                c.query_one("SELECT txid_status($1)", &[&xid])
                    .map(|row| row.get::<_, Option<String>>(0))
            });
            let done = match &asked {
                Ok(Ok(Some(s))) if s == "committed" => return CommitStatus::Committed,
                Ok(Ok(Some(s))) if s == "aborted" => return CommitStatus::Aborted,
                // Too old to know (`NULL`), or a refusal that is not an outage.
                Ok(Ok(None)) => true,
                Ok(Err(e)) => !is_outage(e),
                Err(e) => !connect_may_succeed_later(e),
                // "in progress": the server has not finished the transaction yet.
                Ok(Ok(Some(_))) => false,
            };
            if done || Instant::now() + pause > until {
                return CommitStatus::Unknown;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// [`Pg::with`] for a closure whose only error is the server's.
    pub fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error> + Send + 'static,
    ) -> Result<T, PgError> {
        let url = self.url.to_string();
        self.with(f)?
            .map_err(|source| PgError::Query { url, source })
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; joining makes the close orderly.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The error of a closure run by [`Pg::transaction_through_outages`]: the server's errors
/// convert into it, and it says which of its values is one (only those can be outages).
pub trait TxFailure: From<postgres::Error> {
    fn server_error(&self) -> Option<&postgres::Error>;
}

impl TxFailure for postgres::Error {
    fn server_error(&self) -> Option<&postgres::Error> {
        Some(self)
    }
}

/// How one try of a transaction ended.
enum Tried<T, E> {
    /// Committed (`Ok`), or refused with nothing committed: `f`'s failure or the server's.
    Ended(Result<T, E>),
    /// Cut by an outage before its `COMMIT` was sent: nothing committed.
    CutBeforeCommit(E),
    /// Cut by an outage after its `COMMIT` was sent: it may have committed. `xid` is the
    /// transaction's id when it wrote (or locked) anything; without one there is nothing to lose.
    CutInCommit { value: T, xid: Option<i64>, cut: E },
}

/// What the server says became of a transaction whose `COMMIT` was cut.
enum CommitStatus {
    Committed,
    Aborted,
    Unknown,
}

/// One try: `f` in a transaction, its id read before `COMMIT` is sent when it is not a
/// snapshot, and how it ended.
fn try_transaction<T, E: TxFailure>(
    client: &mut Client,
    snapshot: bool,
    f: &dyn Fn(&mut Transaction<'_>) -> Result<T, E>,
) -> Tried<T, E> {
    let before_commit = |e: E| {
        if e.server_error().is_some_and(is_outage) {
            Tried::CutBeforeCommit(e)
        } else {
            Tried::Ended(Err(e))
        }
    };
    let started = if snapshot {
        client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
    } else {
        client.transaction()
    };
    let mut tx = match started {
        Ok(tx) => tx,
        Err(e) => return before_commit(E::from(e)),
    };
    let value = match f(&mut tx) {
        Ok(value) => value,
        Err(e) => return before_commit(e),
    };
    let xid = if snapshot {
        None
    } else {
        match transaction_id(&mut tx) {
            Ok(xid) => xid,
            Err(e) => return before_commit(E::from(e)),
        }
    };
    match tx.commit() {
        Ok(()) => Tried::Ended(Ok(value)),
        Err(e) if is_outage(&e) => Tried::CutInCommit {
            value,
            xid,
            cut: E::from(e),
        },
        Err(e) => Tried::Ended(Err(E::from(e))),
    }
}

/// The transaction's id, if it has one: only a transaction that wrote or locked a row does.
/// One simple query (one round trip), asked just before `COMMIT`.
fn transaction_id(tx: &mut Transaction<'_>) -> Result<Option<i64>, postgres::Error> {
    let answer = tx.simple_query("SELECT txid_current_if_assigned()")?;
    Ok(answer.iter().find_map(|m| match m {
        postgres::SimpleQueryMessage::Row(row) => row.get(0).and_then(|v| v.parse().ok()),
        _ => None,
    }))
}

/// Runs `f` (a connect, a schema check: anything that may be repeated) again while it fails
/// because the server cannot be reached, for up to `patience`, backing off from 100 ms to 2 s.
/// With no patience it runs once. A refusal of the credentials or the database, or any other
/// error of the server, ends it at once.
pub fn retry_outages<T>(
    patience: Duration,
    mut f: impl FnMut() -> Result<T, PgError>,
) -> Result<T, PgError> {
    let until = Instant::now() + patience;
    let mut pause = Duration::from_millis(100);
    loop {
        match f() {
            Err(e) if is_outage_error(&e) && Instant::now() + pause <= until => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            done => return done,
        }
    }
}

/// Whether `e` says the server is down or restarting rather than refusing what was asked.
fn is_outage_error(e: &PgError) -> bool {
    match e {
        PgError::Connect { .. } => connect_may_succeed_later(e),
        PgError::Query { source, .. } => is_outage(source),
        PgError::Gone { .. } => true,
        PgError::SchemaTooNew { .. } => false,
    }
}

/// Whether a connection that could not be made may be made later: not when the server refused
/// the credentials or the database name (configuration, not availability).
fn connect_may_succeed_later(e: &PgError) -> bool {
    match e {
        PgError::Connect { source, .. } => !source.code().is_some_and(|c| {
            c.code().starts_with("28") || *c == postgres::error::SqlState::INVALID_CATALOG_NAME
        }),
        _ => false,
    }
}

/// A failure of the connection or of the server's availability, not of the statement: the
/// socket closed or failed under the client (a reset: what a query on a connection the server
/// just killed can meet before the client has noticed it closed), a connection exception
/// (SQLSTATE class 08), or the server shutting down or starting up (class 57P).
fn is_outage(e: &postgres::Error) -> bool {
    e.is_closed()
        || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        || e.code().is_some_and(|c| {
            let code = c.code();
            code.starts_with("08") || code.starts_with("57P")
        })
}

/// Any number of processes may open the same database at once; this key serializes their
/// schema changes (`pg_advisory_lock`). The number spells "DOCSFAB".
const MIGRATION_LOCK: i64 = 0x0044_4F43_5346_4142;

/// Brings `component`'s tables to the newest version: `steps[i]` takes the schema from version
/// `i` to `i + 1`, each in its own transaction, recorded in `docsfab_migrations`. A database
/// already newer than `steps` is refused (an older docsfab must not write a newer schema).
pub fn migrate(
    pg: &Pg,
    component: &'static str,
    steps: &'static [&'static str],
) -> Result<(), PgError> {
    let url = pg.url().to_string();
    let outcome = pg.call(move |client| {
        client.query_one("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
        let result = apply_steps(client, component, steps);
        let unlock = client.query_one("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
        let found = result?;
        unlock?;
        Ok(found)
    })?;
    match outcome {
        Some(found) => Err(PgError::SchemaTooNew {
            url,
            component: component.to_owned(),
            found,
            known: steps.len(),
        }),
        None => Ok(()),
    }
}

/// Applies the missing steps; `Some(version)` when the database is newer than `steps`.
fn apply_steps(
    client: &mut Client,
    component: &str,
    steps: &[&str],
) -> Result<Option<i32>, postgres::Error> {
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS docsfab_migrations (
             component  TEXT NOT NULL,
             version    INTEGER NOT NULL,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             PRIMARY KEY (component, version)
         )",
    )?;
    let current: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM docsfab_migrations WHERE component = $1",
            &[&component],
        )?
        .get(0);
    let known = i32::try_from(steps.len()).unwrap_or(i32::MAX);
    if current > known {
        return Ok(Some(current));
    }
    for (version, step) in (current + 1..).zip(steps.iter().skip(current as usize)) {
        let mut tx = client.transaction()?;
        tx.batch_execute(step)?;
        tx.execute(
            "INSERT INTO docsfab_migrations (component, version) VALUES ($1, $2)",
            &[&component, &version],
        )?;
        tx.commit()?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue34_an_open_waits_out_an_outage_but_not_a_refusal() {
        let gone = || PgError::Gone {
            url: "postgres://db/x".to_owned(),
        };
        let mut tries = 0;
        let opened = retry_outages(Duration::from_secs(5), || {
            tries += 1;
            if tries < 3 { Err(gone()) } else { Ok(tries) }
        });
        assert_eq!(opened.unwrap(), 3);
        let mut tries = 0;
        let refused: Result<(), _> = retry_outages(Duration::from_secs(5), || {
            tries += 1;
            Err(PgError::SchemaTooNew {
                url: "postgres://db/x".to_owned(),
                component: "runs".to_owned(),
                found: 9,
                known: 1,
            })
        });
        assert!(refused.is_err());
        assert_eq!(tries, 1, "a refusal is not tried again");
        let mut tries = 0;
        let impatient: Result<(), _> = retry_outages(Duration::ZERO, || {
            tries += 1;
            Err(gone())
        });
        assert!(impatient.is_err());
        assert_eq!(tries, 1, "no patience: one try");
    }

    #[test]
    fn issue15_password_never_shown() {
        let url = PgUrl::parse("postgres://docsfab:s3cret@db.internal:5432/jobs?sslmode=disable")
            .unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://docsfab:***@db.internal:5432/jobs?sslmode=disable"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(url.as_str().contains("s3cret"));
        let q = PgUrl::parse("postgresql://h/db?user=u&password=hunter2").unwrap();
        assert_eq!(q.to_string(), "postgresql://h/db?user=u&password=***");
    }

    #[test]
    fn issue15_bad_urls_get_one_sentence_without_the_password() {
        let e = PgUrl::parse("mysql://u:pw@h/db").unwrap_err();
        assert!(e.contains("not a PostgreSQL URL"), "{e}");
        assert!(!e.contains("pw@"), "{e}");
        let e = PgUrl::parse("postgres://u:pw@h:notaport/db").unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
        assert!(!e.contains(":pw"), "{e}");
    }

    #[test]
    fn issue15_another_database_keeps_server_and_query() {
        let url = PgUrl::parse("postgres://u:p@h:5432/postgres?connect_timeout=3").unwrap();
        assert_eq!(
            url.with_database("t1").as_str(),
            "postgres://u:p@h:5432/t1?connect_timeout=3"
        );
        let bare = PgUrl::parse("postgres://u:p@h:5432").unwrap();
        assert_eq!(
            bare.with_database("t2").as_str(),
            "postgres://u:p@h:5432/t2"
        );
    }
}
