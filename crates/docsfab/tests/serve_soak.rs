//! Operations at scale, with real processes: `docsfab serve` workers, `docsfab sim serve` with
//! faults, and (for the PostgreSQL cases) a real PostgreSQL server that is restarted.
//!
//! - A `resume: auto` run whose worker was killed (`kill -9`) and that another process's store
//!   marked `interrupted` (here `docsfab runs list`; in a live service, the store a job opens
//!   when it starts) is resumed exactly once by the next worker, even when the database
//!   restarts between the reap and that worker's start. Before the fix the resume was queued
//!   only by the serve runner's own reap, so such a run was never resumed.
//! - The soak (CI-sized): four workers on one PostgreSQL database, jobs submitted by ten
//!   concurrent clients against a simulator that answers some requests with 429, 5xx and
//!   streams cut mid-body, one worker killed with `kill -9` and restarted, then PostgreSQL
//!   restarted (fast shutdown) while jobs are in flight. Every job ends succeeded (its own run,
//!   or the one resume of its interrupted run), each run is claimed once, no attempt is lost,
//!   and the figures are printed (never asserted: the machine is shared).
//!
//! Restarting the server needs to know where it is: `DOCSFAB_TEST_PGCTL` (the `pg_ctl`
//! binary) and `DOCSFAB_TEST_PGDATA` (its data directory), which `.ci/run` exports. Without
//! them the test database has an outage instead (connections refused and cut for a moment),
//! as `serve_scaleout.rs` does, and a line on stderr says so.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use docsfab_pg::Pg;
use docsfab_pg::testing::{TestDb, fresh_database};
use serde_json::{Value, json};
use support::run::{FAST_CATALOG, Setup, Sim, spawn_serve};

/// Beat every 200 ms: a dead worker is found after about 1.2 s instead of 12 s.
const HEARTBEAT_MS: &str = "200";

/// A restart of the server cuts every test's connections: the PostgreSQL cases of this file
/// run one at a time (cargo runs test binaries one after another).
static SERVER: Mutex<()> = Mutex::new(());

fn server_lock() -> std::sync::MutexGuard<'static, ()> {
    SERVER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Two read-only steps; the second names the first's answer, so a resume carries the first
/// over when it had finished.
const TWO_STEPS: &str = "name: two\nlimits:\n  timeoutMs: 600000\n  maxTurns: 6\nsteps:\n  - id: survey\n    access: read-only\n    instructions: Survey the code.\n    contract:\n      schema: {type: object, required: [modules]}\n  - id: outline\n    access: read-only\n    instructions: \"Outline {{steps.survey.output}}.\"\n    contract:\n      schema: {type: object, required: [modules]}\n";

// ---- Processes --------------------------------------------------------------------------------

/// A `docsfab serve` child; killed on drop.
struct Worker {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Worker {
    /// A worker on `home` (which holds host.yaml) and `store`, its stderr in `log`.
    fn start(setup: &Setup, home: &Path, store: &str, jobs: u32, log: PathBuf) -> Worker {
        let (child, addr) = spawn_serve(home, store, jobs, setup.dir.path(), HEARTBEAT_MS, &log);
        Worker { child, addr, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no drain, no goodbye.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn submit(&self, body: &Value) -> String {
        let (status, answer) = http(&self.addr, "POST", "/api/runs", Some(body)).unwrap();
        assert_eq!(status, 202, "{answer}");
        answer["runId"].as_str().unwrap().to_owned()
    }

    fn record(&self, id: &str) -> Value {
        let (status, body) = http(&self.addr, "GET", &format!("/api/runs/{id}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        body
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `DOCSFAB_HOME` of its own named `name` beside the setup's, with the setup's host.yaml, as
/// a worker on a machine of its own has.
fn home_apart(setup: &Setup, name: &str) -> PathBuf {
    let home = setup.dir.path().join(name);
    std::fs::create_dir_all(&home).unwrap();
    std::fs::copy(setup.home().join("host.yaml"), home.join("host.yaml")).unwrap();
    home
}

/// One request with `connection: close`: (status, JSON body or the text as a JSON string).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, rest)) = text.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("no HTTP head in {text:?}")));
    };
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    let value = serde_json::from_str(&payload).unwrap_or(Value::String(payload));
    Ok((status, value))
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail.get(n + 2..).unwrap_or("");
    }
    out
}

/// `docsfab runs list --json` on the setup's store, judging heartbeats as the workers do.
fn list_runs(setup: &Setup) -> Vec<Value> {
    setup.list_json_judging(Some(HEARTBEAT_MS))
}

/// Waits for `done` to give a value, up to `timeout`; `what` names it in the failure.
fn wait_for<T>(timeout: Duration, what: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + timeout;
    loop {
        if let Some(v) = done() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---- PostgreSQL restarts ------------------------------------------------------------------------

/// One query's rows, asked again while the server restarts.
fn query(pg: &Pg, sql: &'static str, pattern: Option<String>) -> Vec<docsfab_pg::postgres::Row> {
    let mut last = None;
    for _ in 0..100 {
        let p = pattern.clone();
        match pg.call(move |c| match &p {
            Some(p) => c.query(sql, &[p]),
            None => c.query(sql, &[]),
        }) {
            Ok(rows) => return rows,
            Err(e) => last = Some(e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the test's query kept failing: {last:?}");
}

// ---- A run reaped by another process, then a restart ---------------------------------------------

/// The first answer comes at once; the second (the `outline` step) never comes before the
/// worker is killed.
const STALLS: &str = "responses:\n  - answer: {json: {modules: [lib]}}\n  - answer: {json: {modules: [x]}}\n    delay_ms: 600000\n";
const QUICK: &str = "responses:\n  - answer: {json: {modules: [outlined]}}\n";

/// Worker A runs a `resume: auto` job and is killed after its first step; another process
/// (`docsfab runs list`) opens the store and marks the run `interrupted`; `between` runs (a
/// database restart); worker B starts. The run must be resumed exactly once, by B, carrying
/// the finished step over.
fn reaped_by_another_process_then_resumed_once(store: &str, between: impl FnOnce()) {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STALLS);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    setup.use_store(store);
    let ws = setup.workspace();
    let mut a = Worker::start(&setup, &setup.home(), store, 1, tmp.path().join("a.log"));
    let id =
        a.submit(&json!({"composition": TWO_STEPS, "workspace": {"path": ws}, "resume": "auto"}));
    wait_for(Duration::from_secs(60), "the first step to finish", || {
        (a.record(&id)["steps"][0]["status"] == "succeeded").then_some(())
    });
    a.kill();
    drop(sim);
    // Which process reaps is not left to chance: the store a command opens marks the dead
    // worker's run interrupted (once its heartbeat is stale), as the store each serve job
    // opens when it starts does.
    wait_for(
        Duration::from_secs(60),
        "runs list to mark the run interrupted",
        || {
            let runs = list_runs(&setup);
            let run = runs.iter().find(|r| r["runId"] == id.as_str())?;
            (run["status"] == "interrupted").then_some(())
        },
    );
    between();

    let dir = tmp.path().join("second");
    std::fs::create_dir(&dir).unwrap();
    let log = dir.join("requests.jsonl");
    let sim = Sim::start_logging(&dir, QUICK, &log);
    setup.repoint(&sim.base_url);
    let b = Worker::start(&setup, &setup.home(), store, 2, tmp.path().join("b.log"));
    let resumes = |b: &Worker| -> Vec<Value> {
        let (_, listing) = http(&b.addr, "GET", "/api/runs?limit=100", None).unwrap();
        listing["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["runId"] != id.as_str())
            .cloned()
            .collect()
    };
    let resumed = wait_for(
        Duration::from_secs(60),
        "the run's resume to succeed",
        || {
            let found = resumes(&b);
            let first = found.first()?;
            (first["status"] == "succeeded").then(|| first["runId"].as_str().unwrap().to_owned())
        },
    );
    let record = b.record(&resumed);
    assert_eq!(record["resumedFrom"]["runId"], id.as_str(), "{record}");
    assert_eq!(record["steps"][0]["reusedFrom"]["runId"], id.as_str());
    assert!(record["steps"][1]["reusedFrom"].is_null());
    let sent = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        sent.lines().count(),
        1,
        "only the unfinished step asked: {sent}"
    );
    // B went on reaping for ten beats: nothing was resumed a second time.
    std::thread::sleep(Duration::from_millis(10 * 200));
    let found = resumes(&b);
    assert_eq!(found.len(), 1, "resumed exactly once: {found:#?}");
    assert_eq!(b.record(&id)["status"], "interrupted");
    let log_b = std::fs::read_to_string(&b.log).unwrap_or_default();
    assert_eq!(
        log_b.matches(&format!("claimed run {resumed}")).count(),
        1,
        "{log_b}"
    );
}

#[test]
fn soak_a_resume_auto_run_reaped_by_another_process_is_resumed_once_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", tmp.path().join("runs.db").display());
    reaped_by_another_process_then_resumed_once(&store, || {});
}

#[test]
fn soak_a_resume_auto_run_reaped_then_the_database_restarts_is_resumed_once_postgres() {
    let Some(db) = fresh_database("soak_reap_restart") else {
        return;
    };
    let _one_at_a_time = server_lock();
    let store = db.url.as_str().to_owned();
    reaped_by_another_process_then_resumed_once(&store, || {
        eprintln!(
            "between the reap and the next worker: {}",
            db.restart_server()
        );
    });
}

// ---- The soak ---------------------------------------------------------------------------------

/// Mostly answers after a short wait, with a 429 (and its Retry-After), a 503, a 502 and a
/// stream cut mid-body (an abortive close) among every 52 requests, over and over.
const FAULTY: &str = r#"responses:
  - answer: {json: {modules: [core]}}
    delay_ms: 120
    repeat: 12
  - status: 429
    headers: {retry-after-ms: "50"}
  - answer: {json: {modules: [core]}}
    delay_ms: 120
    repeat: 12
  - status: 503
  - answer: {json: {modules: [core]}}
    delay_ms: 120
    repeat: 12
  - answer: {json: {modules: [core, cli, docs, tests, bench]}}
    cut: {after_bytes: 60, with: reset}
  - answer: {json: {modules: [core]}}
    delay_ms: 120
    repeat: 12
  - status: 502
fallback: cycle
"#;

/// The soak's shape.
struct Shape {
    workers: usize,
    jobs_per_worker: u32,
    clients: usize,
    jobs: usize,
    /// Runs each client keeps submitted and not ended.
    window: usize,
}

/// What the clients measured.
#[derive(Default)]
struct Measured {
    ids: Vec<String>,
    submit_ms: Vec<f64>,
    poll_ms: Vec<f64>,
    submit_errors: usize,
}

/// The workers, by slot; a killed one is replaced in its slot.
type Addrs = Arc<Mutex<Vec<String>>>;

/// One client: keeps up to `window` of its `count` jobs submitted and not ended, submitting to
/// the workers in turn (the next one when one does not answer) and polling each run's record.
fn client(
    n: usize,
    count: usize,
    window: usize,
    addrs: &Addrs,
    ws: &Path,
    submitted: &AtomicUsize,
) -> Measured {
    let body = json!({"composition": TWO_STEPS, "workspace": {"path": ws}, "resume": "auto"});
    let mut m = Measured::default();
    let mut open: Vec<String> = Vec::new();
    let mut turn = n;
    while m.ids.len() < count || !open.is_empty() {
        while open.len() < window && m.ids.len() < count {
            let addr = pick(addrs, turn);
            turn += 1;
            let t = Instant::now();
            match http(&addr, "POST", "/api/runs", Some(&body)) {
                Ok((202, answer)) => {
                    m.submit_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    let id = answer["runId"].as_str().unwrap().to_owned();
                    m.ids.push(id.clone());
                    open.push(id);
                    submitted.fetch_add(1, Ordering::SeqCst);
                }
                _ => {
                    m.submit_errors += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let mut still = Vec::new();
        for id in open.drain(..) {
            let addr = pick(addrs, turn);
            turn += 1;
            let t = Instant::now();
            match http(&addr, "GET", &format!("/api/runs/{id}"), None) {
                Ok((200, record)) => {
                    m.poll_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    if matches!(record["status"].as_str(), Some("queued" | "running")) {
                        still.push(id);
                    }
                }
                _ => still.push(id),
            }
        }
        open = still;
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

/// The worker in slot `turn` modulo their number.
fn pick(addrs: &Addrs, turn: usize) -> String {
    let addrs = addrs.lock().unwrap_or_else(PoisonError::into_inner);
    addrs[turn % addrs.len()].clone()
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank]
}

fn epoch_ms(at: SystemTime) -> i64 {
    i64::try_from(at.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The runs table as the soak checks it: (run id, status, owner, resumed run, started, ended).
type Row = (
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<i64>,
);

fn runs_table(pg: &Pg) -> Vec<Row> {
    query(
        pg,
        "SELECT run_id, status, owner_worker,
                (job_spec::jsonb -> 'resumeFrom' ->> 'runId'), started_ms, ended_ms
         FROM runs ORDER BY queued_seq",
        None,
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
    .collect()
}

/// What the chaos did and when.
struct Chaos {
    killed_at: SystemTime,
    victim_pid: u32,
    restart: &'static str,
}

/// Kills worker 0 once it has a run in flight and a quarter of the jobs were submitted,
/// starts it again, and restarts PostgreSQL as soon as the first run is marked interrupted.
fn chaos(
    setup: &Setup,
    db: &TestDb,
    workers: &mut [Worker],
    addrs: &Addrs,
    submitted: &AtomicUsize,
    shape: &Shape,
    logs: &Path,
) -> Chaos {
    let pg = Pg::connect(&db.url).unwrap();
    let victim_pid = workers[0].pid();
    wait_for(Duration::from_secs(120), "worker 0 to run jobs", || {
        let mine = query(
            &pg,
            "SELECT COUNT(*) FROM runs WHERE status = 'running' AND owner_worker LIKE $1",
            Some(format!("%/{victim_pid}/%")),
        )[0]
        .get::<_, i64>(0);
        (mine > 0 && submitted.load(Ordering::SeqCst) >= shape.jobs / 4).then_some(())
    });
    workers[0].kill();
    let killed_at = SystemTime::now();
    let home = home_apart(setup, "w0");
    workers[0] = Worker::start(
        setup,
        &home,
        db.url.as_str(),
        shape.jobs_per_worker,
        logs.join("w0-restarted.log"),
    );
    addrs.lock().unwrap()[0] = workers[0].addr.clone();
    wait_for(
        Duration::from_secs(120),
        "a run of the killed worker to be interrupted",
        || {
            let n = query(
                &pg,
                "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'",
                None,
            )[0]
            .get::<_, i64>(0);
            (n > 0).then_some(())
        },
    );
    let restart = db.restart_server();
    Chaos {
        killed_at,
        victim_pid,
        restart,
    }
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the record writes it
/// (`2026-12-01T20:19:12.123Z`).
fn record_ms(text: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| -> i64 { text[r].parse().unwrap() };
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let ms = if text.len() > 20 { n(20..23) } else { 0 };
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + ms
}

/// Provider requests a record accounts for: one per turn plus its replays.
fn requests_in(record: &Value) -> u64 {
    let mut n = 0;
    for step in record["steps"].as_array().unwrap() {
        for attempt in step["attempts"].as_array().unwrap() {
            for turn in attempt["turns"].as_array().unwrap() {
                n += 1 + turn["replays"].as_array().map_or(0, |r| r.len() as u64);
            }
        }
    }
    n
}

/// A finished run's record: both steps there once, each step's attempts numbered 1, 2, ...
/// with no two overlapping in time, a succeeded run's steps succeeded by their last attempt
/// (or carried over, with none).
fn check_record(r: &Value) {
    let steps = r["steps"].as_array().unwrap();
    if r["status"] == "succeeded" {
        assert_eq!(steps.len(), 2, "claimed twice? {r:#}");
    }
    for step in steps {
        let attempts = step["attempts"].as_array().unwrap();
        let mut free_from = i64::MIN;
        for (i, a) in attempts.iter().enumerate() {
            assert_eq!(a["attempt"], i + 1, "an attempt is missing: {r:#}");
            let start = record_ms(a["startedAt"].as_str().unwrap());
            // Times are kept to the millisecond: a next attempt may seem to start 1 ms early.
            assert!(start + 1 >= free_from, "two attempts overlap: {r:#}");
            free_from = start + a["durationMs"].as_i64().unwrap();
        }
        if r["status"] == "succeeded" {
            assert_eq!(step["status"], "succeeded", "{r:#}");
            match attempts.last() {
                Some(last) => assert_eq!(last["status"], "succeeded", "{r:#}"),
                None => assert!(!step["reusedFrom"].is_null(), "{r:#}"),
            }
        }
    }
}

/// Every run ended succeeded, or was the killed worker's and interrupted with exactly one
/// resume, which succeeded; every job a client submitted is there. Returns the interrupted
/// runs and their resumes.
fn check_outcomes(
    rows: &[Row],
    ids: &[String],
    victim_pid: u32,
    record: &dyn Fn(&str) -> Value,
) -> Vec<(String, String)> {
    let by_id: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.0.as_str(), r)).collect();
    for id in ids {
        assert!(
            by_id.contains_key(id.as_str()),
            "submitted run {id} is not in the store"
        );
    }
    let mut resumes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in rows {
        if let Some(from) = &r.3 {
            resumes.entry(from.as_str()).or_default().push(&r.0);
        }
    }
    let victim = format!("/{victim_pid}/");
    let mut pairs = Vec::new();
    for (id, status, owner, resume_of, _, _) in rows {
        match status.as_str() {
            "succeeded" => {}
            "interrupted" => {
                let owner = owner.as_deref().unwrap_or_default();
                assert!(
                    owner.contains(&victim),
                    "run {id} of a live worker ({owner}) was interrupted"
                );
                assert!(resume_of.is_none(), "the resume {id} was interrupted");
                let found = resumes.get(id.as_str()).cloned().unwrap_or_default();
                assert_eq!(
                    found.len(),
                    1,
                    "run {id} was resumed {} times: {found:?}",
                    found.len()
                );
                assert_eq!(
                    by_id[found[0]].1, "succeeded",
                    "the resume of {id}: {:?}",
                    by_id[found[0]]
                );
                pairs.push((id.clone(), found[0].to_owned()));
            }
            other => {
                let r = record(id);
                let steps: Vec<&Value> = r["steps"]
                    .as_array()
                    .map(|s| s.iter().map(|s| &s["endReason"]).collect())
                    .unwrap_or_default();
                panic!(
                    "run {id} ended {other}: {} (steps: {steps:?})",
                    r["endReason"]
                )
            }
        }
    }
    for (from, found) in &resumes {
        assert_eq!(
            by_id[from].1, "interrupted",
            "run {from} was resumed but is {:?}",
            by_id[from]
        );
        assert_eq!(found.len(), 1);
    }
    assert!(
        !pairs.is_empty(),
        "the kill interrupted no run: the soak proved nothing"
    );
    pairs
}

/// Each run that left the queue was claimed exactly once, over every worker's log (the
/// killed one's included).
fn check_claims(rows: &[Row], logs: &Path) {
    let mut text = String::new();
    for entry in std::fs::read_dir(logs).unwrap() {
        text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default());
    }
    for (id, ..) in rows {
        let claims = text.matches(&format!("claimed run {id}\n")).count();
        assert_eq!(claims, 1, "run {id} was claimed {claims} times");
    }
}

/// Peak resident memory of a live process (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Starts the workers, the clients and the chaos; returns when every run ended.
fn soak(shape: &Shape) {
    let Some(db) = fresh_database("soak") else {
        return;
    };
    let _one_at_a_time = server_lock();
    let tmp = tempfile::tempdir().unwrap();
    let sim_log = tmp.path().join("sim.jsonl");
    let sim = Sim::start_logging(tmp.path(), FAULTY, &sim_log);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let store = db.url.as_str();
    let mut workers: Vec<Worker> = (0..shape.workers)
        .map(|i| {
            let home = home_apart(&setup, &format!("w{i}"));
            Worker::start(
                &setup,
                &home,
                store,
                shape.jobs_per_worker,
                logs.join(format!("w{i}.log")),
            )
        })
        .collect();
    let addrs: Addrs = Arc::new(Mutex::new(workers.iter().map(|w| w.addr.clone()).collect()));
    let submitted = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..shape.clients)
        .map(|n| {
            let count = shape.jobs / shape.clients + usize::from(n < shape.jobs % shape.clients);
            let (addrs, submitted, ws, window) = (
                Arc::clone(&addrs),
                Arc::clone(&submitted),
                setup.workspace(),
                shape.window,
            );
            std::thread::spawn(move || client(n, count, window, &addrs, &ws, &submitted))
        })
        .collect();
    let chaos = chaos(&setup, &db, &mut workers, &addrs, &submitted, shape, &logs);
    let mut m = Measured::default();
    for c in clients {
        let one = c.join().unwrap();
        m.ids.extend(one.ids);
        m.submit_ms.extend(one.submit_ms);
        m.poll_ms.extend(one.poll_ms);
        m.submit_errors += one.submit_errors;
    }
    let pg = Pg::connect(&db.url).unwrap();
    wait_for(
        Duration::from_secs(180),
        "every run (resumes too) to end",
        || {
            let live = query(
                &pg,
                "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')",
                None,
            )[0]
            .get::<_, i64>(0);
            (live == 0).then_some(())
        },
    );
    let wall = started.elapsed().as_secs_f64();
    let rows = runs_table(&pg);
    let pairs = check_outcomes(&rows, &m.ids, chaos.victim_pid, &|id| workers[1].record(id));
    check_claims(&rows, &logs);
    let records: Vec<Value> = rows.iter().map(|r| workers[1].record(&r.0)).collect();
    records.iter().for_each(check_record);
    let accounted: u64 = records.iter().map(requests_in).sum();
    let logged = std::fs::read_to_string(&sim_log).unwrap().lines().count() as u64;
    // The attempts the kill cut short are in no record; every other request is.
    assert!(
        accounted <= logged && logged - accounted <= 10 * pairs.len() as u64,
        "the simulator served {logged} requests, the records account for {accounted}"
    );
    let rss: Vec<String> = workers
        .iter()
        .map(|w| format!("{:.0}", peak_rss_mib(w.pid())))
        .collect();
    report(shape, &m, wall, &rows, &pairs, &chaos);
    eprintln!(
        "peak RSS per live worker (MiB): {}; requests {logged}, accounted {accounted}",
        rss.join(", ")
    );
}

/// The figures, on stderr (never asserted: the machine is shared).
fn report(
    shape: &Shape,
    m: &Measured,
    wall: f64,
    rows: &[Row],
    pairs: &[(String, String)],
    chaos: &Chaos,
) {
    let by_id: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.0.as_str(), r)).collect();
    let killed = epoch_ms(chaos.killed_at);
    let interrupted: Vec<i64> = pairs
        .iter()
        .map(|(id, _)| by_id[id.as_str()].5.unwrap() - killed)
        .collect();
    let claimed: Vec<i64> = pairs
        .iter()
        .map(|(_, r)| by_id[r.as_str()].4 - killed)
        .collect();
    let ended: Vec<i64> = pairs
        .iter()
        .map(|(_, r)| by_id[r.as_str()].5.unwrap() - killed)
        .collect();
    let (mut submit, mut poll) = (m.submit_ms.clone(), m.poll_ms.clone());
    let workers: BTreeSet<&str> = rows.iter().filter_map(|r| r.2.as_deref()).collect();
    eprintln!(
        "soak: {} jobs by {} clients on {} workers (--jobs {}), {} in {wall:.1} s = {:.1} jobs/s; {} resumed; {} submissions retried; {}",
        m.ids.len(),
        shape.clients,
        shape.workers,
        shape.jobs_per_worker,
        rows.len(),
        m.ids.len() as f64 / wall,
        pairs.len(),
        m.submit_errors,
        chaos.restart
    );
    eprintln!(
        "submit p50 {:.1} ms p99 {:.1} ms; poll p50 {:.1} ms p99 {:.1} ms; owners seen {}",
        percentile(&mut submit, 50.0),
        percentile(&mut submit, 99.0),
        percentile(&mut poll, 50.0),
        percentile(&mut poll, 99.0),
        workers.len()
    );
    eprintln!(
        "death to interrupted (ms): {interrupted:?}; to resume claimed: {claimed:?}; to resume ended: {ended:?}"
    );
}

/// Four workers, 160 jobs by ten clients, a `kill -9` and a PostgreSQL restart: every job
/// ends succeeded, each run is claimed once, every interrupted run is resumed exactly once.
#[test]
fn soak_four_postgres_workers_ride_out_a_kill_and_a_database_restart() {
    soak(&Shape {
        workers: 4,
        jobs_per_worker: 4,
        clients: 10,
        jobs: 160,
        window: 3,
    });
}
