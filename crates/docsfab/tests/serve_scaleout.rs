//! Issue 15, end to end: `docsfab serve` workers sharing one PostgreSQL database (real
//! processes, real PostgreSQL from `DOCSFAB_TEST_POSTGRES`, the real simulator with faults).
//!
//! - 20 runs submitted to two workers: each is claimed once and succeeds, the simulator served
//!   exactly the requests the records account for, and the records have the shape SQLite's do;
//! - `kill -9` of a worker mid-run: its run becomes `interrupted` within the documented bound
//!   (five heartbeats, shortened here with `DOCSFAB_HEARTBEAT_MS`) and every other run completes;
//! - the shared throttle holds across both workers: after a 429 with Retry-After, no request
//!   from either worker reaches the provider until the hold ends.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use docsfab_pg::testing::fresh_database;
use serde_json::{Value, json};
use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim, spawn_serve};

/// Beat every 200 ms: a dead worker is found after 1 s instead of 10 s.
const HEARTBEAT_MS: &str = "200";

/// A `docsfab serve` child; killed on drop.
struct Worker {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Worker {
    /// A worker on the setup's home.
    fn start(setup: &Setup, store: &str, jobs: u32) -> Worker {
        Worker::start_in(setup, &setup.home(), store, jobs)
    }

    /// A worker with a `DOCSFAB_HOME` of its own (named `name` beside the setup's home), as on
    /// a machine of its own: only the database is shared.
    fn start_apart(setup: &Setup, name: &str, store: &str, jobs: u32) -> Worker {
        let home = setup.dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        std::fs::copy(setup.home().join("host.yaml"), home.join("host.yaml")).unwrap();
        Worker::start_in(setup, &home, store, jobs)
    }

    fn start_in(setup: &Setup, home: &Path, store: &str, jobs: u32) -> Worker {
        // Its log, for a failing test to show (`Worker::log`).
        let log = home.join("serve.log");
        let (child, addr) = spawn_serve(home, store, jobs, setup.dir.path(), HEARTBEAT_MS, &log);
        Worker { child, addr, log }
    }

    /// What the worker wrote on stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn submit(&self, composition: &str, workspace: &Path) -> String {
        let (status, body) = http(
            &self.addr,
            "POST",
            "/api/runs",
            Some(&json!({"composition": composition, "workspace": {"path": workspace}})),
        );
        assert_eq!(status, 202, "{body}");
        body["runId"].as_str().unwrap().to_owned()
    }

    fn record(&self, id: &str) -> Value {
        let (status, body) = http(&self.addr, "GET", &format!("/api/runs/{id}"), None);
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Waits until every run in `ids` has ended; returns their records.
    fn wait_ended(&self, ids: &[String], timeout: Duration) -> Vec<Value> {
        let until = Instant::now() + timeout;
        loop {
            let records: Vec<Value> = ids.iter().map(|id| self.record(id)).collect();
            let live = records
                .iter()
                .filter(|r| matches!(r["status"].as_str(), Some("queued" | "running")))
                .count();
            if live == 0 {
                return records;
            }
            assert!(
                Instant::now() < until,
                "{live} of {} runs still queued or running",
                ids.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request with `connection: close`; (status, JSON body or the text as a JSON string).
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let payload = if chunked {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    let value = serde_json::from_str(&payload).unwrap_or(Value::String(payload));
    (status, value)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

/// Every key path of a JSON value (array elements merged), to compare records by shape.
fn shape(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{path}.{k}");
                out.insert(p.clone());
                shape(x, &p, out);
            }
        }
        Value::Array(items) => {
            for x in items {
                shape(x, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
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

fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Bursts of 503/408 between answers, fixed by the seed: every run meets some, none more than
/// the replay budget absorbs.
const STORMY: &str = r#"responses:
  - name: storm
    random:
      seed: 15
      episodes: 60
      burst:
        length: [0, 2]
        statuses: [503, 408]
      then:
        answer: {json: {modules: [core, cli]}}
fallback: cycle
"#;

#[test]
fn issue15_twenty_runs_on_two_postgres_workers_are_each_claimed_once_and_finish() {
    let Some(db) = fresh_database("scaleout_twenty") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("sim.log");
    let sim = Sim::start_logging(tmp.path(), STORMY, &log);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let store = db.url.as_str().to_owned();
    let a = Worker::start_apart(&setup, "host-a", &store, 2);
    let b = Worker::start_apart(&setup, "host-b", &store, 2);
    let ids: Vec<String> = (0..20)
        .map(|i| {
            let w = if i % 2 == 0 { &a } else { &b };
            w.submit(ONE_STEP, &setup.workspace())
        })
        .collect();
    let records = b.wait_ended(&ids, Duration::from_secs(120));
    for r in &records {
        assert_eq!(r["status"], "succeeded", "{r:#}");
        assert_eq!(
            r["steps"].as_array().unwrap().len(),
            1,
            "claimed twice? {r:#}"
        );
    }
    // Every request the provider saw belongs to exactly one attempt of one record: no run
    // was worked on by two workers, none by a worker that lost its claim.
    let accounted: u64 = records.iter().map(requests_in).sum();
    assert_eq!(log_lines(&log).len() as u64, accounted);
    let replays: u64 = records.iter().map(|r| requests_in(r) - 1).sum();
    assert!(replays > 0, "the scenario's faults never reached a run");

    // Both workers claimed runs (which one is up to the queue, but with 20 runs and 2 slots
    // each, one worker cannot have taken them all while the other idled).
    let pg = docsfab_pg::Pg::connect(&db.url).unwrap();
    let owners: i64 = pg
        .call(|c| {
            c.query_one(
                "SELECT COUNT(DISTINCT owner_worker) FROM runs WHERE status = 'succeeded'",
                &[],
            )
        })
        .unwrap()
        .get(0);
    assert_eq!(owners, 2, "both workers claim");

    // The same composition on the embedded store: the records have the same shape.
    let sqlite = format!("sqlite:{}", setup.store().display());
    let c = Worker::start(&setup, &sqlite, 1);
    let id = c.submit(ONE_STEP, &setup.workspace());
    let local = c.wait_ended(&[id], Duration::from_secs(60)).remove(0);
    let (mut want, mut got) = (BTreeSet::new(), BTreeSet::new());
    shape(&local, "", &mut want);
    for r in &records {
        shape(r, "", &mut got);
    }
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    // Replays appear only where the fault script put them; compare the rest.
    let extra: Vec<_> = extra
        .into_iter()
        .filter(|p| !p.contains(".replays"))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
}

/// A step that waits for a lane answer delayed far past the test, so its run stays `running`
/// until its worker dies.
const SLOW_AND_QUICK: &str = r#"responses:
  - answer: {json: {modules: [core]}}
lanes:
  - contains: "SLOW-RUN"
    responses:
      - delay_ms: 600000
        answer: {json: {modules: [never]}}
"#;

#[test]
fn issue15_a_killed_worker_s_run_is_interrupted_and_the_others_complete() {
    let Some(db) = fresh_database("scaleout_kill") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), SLOW_AND_QUICK);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let store = db.url.as_str().to_owned();
    // Only A is up when the slow run is submitted, with one slot: the slow run is A's only run.
    let mut a = Worker::start_apart(&setup, "host-a", &store, 1);
    let slow = a.submit(
        &ONE_STEP.replace("Survey src/", "SLOW-RUN survey src/"),
        &setup.workspace(),
    );
    let until = Instant::now() + Duration::from_secs(30);
    while a.record(&slow)["steps"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < until, "the slow run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = Worker::start_apart(&setup, "host-b", &store, 2);
    let quick: Vec<String> = (0..6)
        .map(|_| b.submit(ONE_STEP, &setup.workspace()))
        .collect();
    a.child.kill().unwrap(); // SIGKILL: no drain, no goodbye
    a.child.wait().unwrap();
    let killed_at = Instant::now();
    let ended = b.wait_ended(std::slice::from_ref(&slow), Duration::from_secs(60));
    assert_eq!(ended[0]["status"], "interrupted", "{:#}", ended[0]);
    // The record names the dead worker, so an operator knows which host to look at.
    let reason = ended[0]["endReason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("its worker ") && reason.contains("stopped sending heartbeats"),
        "{:#}",
        ended[0]
    );
    // The documented bound is five beats plus one (1.2 s here); no assertion on the clock
    // (the machine is shared), the figure is printed for the record.
    eprintln!("interrupted {:?} after the kill", killed_at.elapsed());
    for r in b.wait_ended(&quick, Duration::from_secs(120)) {
        assert_eq!(r["status"], "succeeded", "{r:#}");
    }
}

/// Short first waits, but room under the per-wait ceiling for a 3 s Retry-After.
const HOLD_FITS_CATALOG: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 5000\n  providerAttempt.maxTotalDelayMs: 20000\n";

/// The first request gets a 429 with a 3 s Retry-After; everything after it answers.
const ONE_429: &str = r#"responses:
  - status: 429
    headers: {retry-after: "3"}
  - answer: {json: {modules: [core]}}
fallback: repeat-last
"#;

#[test]
fn issue15_the_shared_throttle_holds_across_two_postgres_workers() {
    let Some(db) = fresh_database("scaleout_throttle") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("sim.log");
    let sim = Sim::start_logging(tmp.path(), ONE_429, &log);
    // Waits of up to 5 s are within the policy's ceilings, so the 3 s hold is one the throttle
    // may keep (issue 20: it never holds a request past the policy's per-wait ceiling).
    let setup = Setup::new(&sim.base_url, HOLD_FITS_CATALOG);
    let store = db.url.as_str().to_owned();
    let a = Worker::start_apart(&setup, "host-a", &store, 2);
    let b = Worker::start_apart(&setup, "host-b", &store, 2);
    // The first run meets the 429; the others are submitted to the other worker right after.
    let mut ids = vec![a.submit(ONE_STEP, &setup.workspace())];
    let until = Instant::now() + Duration::from_secs(30);
    while log_lines(&log).is_empty() {
        assert!(Instant::now() < until, "no request reached the simulator");
        std::thread::sleep(Duration::from_millis(20));
    }
    ids.extend((0..3).map(|_| b.submit(ONE_STEP, &setup.workspace())));
    for r in b.wait_ended(&ids, Duration::from_secs(120)) {
        assert_eq!(r["status"], "succeeded", "{r:#}");
    }
    let lines = log_lines(&log);
    let t429 = lines[0]["time_unix_ms"].as_u64().unwrap();
    let early: Vec<u64> = lines[1..]
        .iter()
        .map(|l| l["time_unix_ms"].as_u64().unwrap() - t429)
        .filter(|&dt| dt < 3000)
        .collect();
    assert!(
        early.is_empty(),
        "requests reached the provider during the 3 s hold, {early:?} ms after the 429"
    );
}

/// The provider answers the first request after 2.5 s: long enough for the database to go away
/// and come back while the answer is on its way.
const ANSWER_LATE: &str = r#"responses:
  - answer: {json: {modules: [core]}}
    delay_ms: 2500
fallback: repeat-last
"#;

/// A database outage mid-run loses nothing: PostgreSQL refuses connections and cuts the
/// worker's for 3 s while the run waits for its answer; the attempt that finishes meanwhile is
/// recorded once the database is back, the run succeeds, and the worker (whose own heartbeat
/// failed) does not take its own stale run for a dead worker's.
#[test]
fn issue15_a_database_outage_mid_run_loses_no_attempt() {
    let Some(db) = fresh_database("scaleout_outage") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER_LATE);
    let setup = Setup::new(&sim.base_url, FAST_CATALOG);
    let store = db.url.as_str().to_owned();
    let worker = Worker::start_apart(&setup, "host-a", &store, 1);
    let id = worker.submit(ONE_STEP, &setup.workspace());
    let until = Instant::now() + Duration::from_secs(30);
    while worker.record(&id)["steps"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < until, "the run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    db.start_outage();
    std::thread::sleep(Duration::from_secs(3));
    db.end_outage();

    let until = Instant::now() + Duration::from_secs(60);
    while worker.record(&id)["status"] == "running" {
        assert!(
            Instant::now() < until,
            "still running; log:\n{}",
            worker.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ended = worker.wait_ended(std::slice::from_ref(&id), Duration::from_secs(60));
    let record = &ended[0];
    assert_eq!(record["status"], "succeeded", "{record:#}");
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{record:#}");
    assert_eq!(attempts[0]["status"], "succeeded");
    assert_eq!(record["steps"][0]["output"]["modules"][0], "core");
    assert_eq!(record["endReason"], Value::Null);
    // DOCSFAB_HEARTBEAT_MS and DOCSFAB_STORE are variables docsfab reads: no warning for them.
    assert!(
        !worker.log().contains("not a variable docsfab reads"),
        "{}",
        worker.log()
    );
}
