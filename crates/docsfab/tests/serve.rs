//! `docsfab serve` as a real process against `docsfab sim serve`: submitting, listing,
//! cancelling, re-running, the event stream, metrics, the token, the body cap, FIFO claiming
//! with --jobs 1, the SIGTERM drain, and restarts (queued runs stay queued; a killed server's
//! run is `interrupted`). Waits are bounded polls, never timing assertions.

mod support;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};
use support::run::{FAST_CATALOG, KEY_VAR, Lines, ONE_STEP, Setup, Sim, listening_on, signal};

/// The answer ONE_STEP's contract takes.
const ANSWER: &str = "responses:\n  - answer: {json: {modules: [lib, count]}}\n";
/// A provider that does not answer for ten minutes: runs stay `running` until cancelled.
const STALLED: &str =
    "responses:\n  - answer: {json: {modules: [lib, count]}}\n    delay_ms: 600000\n";

/// A write composition: its one step writes docs/ pages.
const WRITER: &str = "name: writer\nlimits:\n  timeoutMs: 120000\n  maxTurns: 6\nsteps:\n  - id: pages\n    access: write\n    instructions: Write the pages under docs/.\n    tools: [read_file, write_file]\n    writeRoots: [docs/]\n";
const WRITES_THEN_DONE: &str = "responses:\n  - answer:\n      tool_calls:\n        - {name: write_file, arguments: {path: docs/overview.md, content: \"# Overview\\n\\nTwo modules.\\n\"}}\n  - answer: {text: done}\n";

const WAIT: Duration = Duration::from_secs(60);

fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A running `docsfab serve` on 127.0.0.1:0 over a [`Setup`]'s home; killed on drop.
struct Server {
    child: Child,
    base: String,
    stderr: Lines,
    http: Client,
    token: Option<String>,
}

impl Server {
    /// With the setup's directory as workspace root and `extra` flags.
    fn start(s: &Setup, extra: &[&str]) -> Server {
        Server::start_env(s, extra, &[])
    }

    fn start_env(s: &Setup, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = s.docsfab();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
            .arg(s.dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let base = listening_on(&mut child);
        let stderr = Lines::new(child.stderr.take().unwrap());
        Server {
            child,
            base,
            stderr,
            http: client(),
            token: None,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authed(&self, rb: reqwest::blocking::RequestBuilder) -> reqwest::blocking::RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    fn get(&self, path: &str) -> Response {
        self.authed(self.http.get(self.url(path))).send().unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> Response {
        self.authed(self.http.post(self.url(path)).json(body))
            .send()
            .unwrap()
    }

    fn json(&self, path: &str) -> Value {
        let r = self.get(path);
        assert_eq!(r.status(), StatusCode::OK, "GET {path}");
        r.json().unwrap()
    }

    /// Submits `composition` on the workspace `ws` (a path under the root), expecting 202.
    fn submit(&self, composition: &str, workspace: Value) -> String {
        let r = self.post(
            "/api/runs",
            &json!({"composition": composition, "workspace": workspace}),
        );
        let status = r.status();
        let body: Value = r.json().unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["status"], "queued");
        body["runId"].as_str().unwrap().to_owned()
    }

    fn status_of(&self, id: &str) -> String {
        self.json(&format!("/api/runs/{id}"))["status"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Polls until the run has `status`; panics with the record after [`WAIT`].
    fn wait_status(&self, id: &str, status: &str) -> Value {
        let end = Instant::now() + WAIT;
        loop {
            let record = self.json(&format!("/api/runs/{id}"));
            if record["status"] == status {
                return record;
            }
            assert!(
                Instant::now() < end,
                "run {id} never became {status}: {record:#}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls until the run has at least one attempt under way (its request reached the
    /// provider): status running and the serve log says it was claimed.
    fn wait_claimed(&mut self, id: &str) {
        self.stderr.wait_for(&format!("claimed run {id}"), WAIT);
        self.wait_status(id, "running");
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        signal(&self.child, "TERM");
        wait_exit(&mut self.child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < end, "the process did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ws() -> Value {
    json!({"path": "ws"})
}

/// The record's shape: every key path with the JSON type at it (arrays by their first element),
/// so two records of the same composition compare without their times and ids.
fn shape(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                shape(x, &format!("{at}.{k}"), out);
            }
        }
        Value::Array(a) => {
            out.push(format!("{at}[] len {}", a.len()));
            if let Some(first) = a.first() {
                shape(first, &format!("{at}[0]"), out);
            }
        }
        Value::Null => out.push(format!("{at}: null")),
        Value::Bool(_) => out.push(format!("{at}: bool")),
        Value::Number(_) => out.push(format!("{at}: number")),
        Value::String(_) => out.push(format!("{at}: string")),
    }
}

fn shape_of(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    shape(v, "", &mut out);
    out.sort();
    out
}

/// A submitted run succeeds, and its record is `docsfab runs show --json` byte for byte and has
/// the shape of the record `docsfab run` makes of the same composition.
#[test]
fn issue15_submitted_run_succeeds_with_the_record_docsfab_run_makes() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &[]);
    let id = server.submit(ONE_STEP, ws());
    let record = server.wait_status(&id, "succeeded");
    assert_eq!(record["steps"][0]["output"]["modules"][0], "lib");
    // The server's log follows the run as `docsfab run`'s stderr does, each line under its id.
    server
        .stderr
        .wait_for(&format!("serve: run {id}: attempt 1 (initial)"), WAIT);
    server
        .stderr
        .wait_for(&format!("serve: run {id}: step outline succeeded"), WAIT);
    let canonical_ws = std::fs::canonicalize(s.workspace()).unwrap();
    assert_eq!(record["workspace"], canonical_ws.to_str().unwrap());

    let served = server.get(&format!("/api/runs/{id}")).text().unwrap();
    let shown = s
        .docsfab()
        .args(["runs", "show", &id, "--json"])
        .output()
        .unwrap();
    assert_eq!(served, String::from_utf8(shown.stdout).unwrap());

    let comp = s.composition(ONE_STEP);
    let out = s.run_command(&comp).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (_, cli_json) = text.split_once('\n').unwrap();
    let cli: Value = serde_json::from_str(cli_json).unwrap();
    assert_eq!(shape_of(&record), shape_of(&cli));
    docsfab_runtime::record::validate_against_schema(&record).unwrap();
}

/// A composition `docsfab run` would refuse is a 400 with the same sentence, naming "the
/// submitted composition" rather than any file; a missing key variable too; nothing is queued.
#[test]
fn issue15_bad_submissions_are_400_with_the_cli_sentence_and_queue_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let bad = ONE_STEP.replace("maxTurns: 6", "maxTurns: 6\n  maxRetries: 3");
    let r = server.post("/api/runs", &json!({"composition": bad, "workspace": ws()}));
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("the submitted composition"), "{error}");
    assert!(!error.contains("serve/submitted"), "{error}");
    // The CLI's sentence for the same file, its path replaced.
    let comp = s.composition(&bad);
    let out = s.run_command(&comp).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let cli = String::from_utf8(out.stderr).unwrap();
    let cli = cli
        .trim()
        .strip_prefix("error: ")
        .unwrap()
        .replace(
            &format!("the composition {}", comp.display()),
            "the submitted composition",
        )
        .replace(&comp.display().to_string(), "the submitted composition");
    assert_eq!(error, cli);

    let other_provider = ONE_STEP.replace("name: small\n", "name: small\nprovider: elsewhere\n");
    let r = server.post(
        "/api/runs",
        &json!({"composition": other_provider, "workspace": ws()}),
    );
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("\"elsewhere\""), "{error}");

    let r = server.post("/api/runs", &json!({"composition": ONE_STEP}));
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        server.json("/api/runs")["runs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // A server whose key variable is unset refuses the submission with run's sentence.
    drop(server);
    let mut cmd_env = s.docsfab();
    cmd_env.env_remove(KEY_VAR);
    let server = start_with_command(cmd_env, &s, &[]);
    let r = server.post(
        "/api/runs",
        &json!({"composition": ONE_STEP, "workspace": ws()}),
    );
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.contains(KEY_VAR) && error.contains("not set"),
        "{error}"
    );
}

fn start_with_command(mut cmd: Command, s: &Setup, extra: &[&str]) -> Server {
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
        .arg(s.dir.path())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let base = listening_on(&mut child);
    let stderr = Lines::new(child.stderr.take().unwrap());
    Server {
        child,
        base,
        stderr,
        http: client(),
        token: None,
    }
}

/// Path workspaces must resolve under --workspace-root (`..` and symbolic links included);
/// without a root, path workspaces are refused with what to do.
#[test]
fn issue15_path_workspace_outside_the_root_is_400() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    for path in ["..", "/", "ws/../../"] {
        let r = server.post(
            "/api/runs",
            &json!({"composition": ONE_STEP, "workspace": {"path": path}}),
        );
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        let error = r.json::<Value>().unwrap()["error"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(error.contains("not under the workspace root"), "{error}");
    }
    std::os::unix::fs::symlink("/", s.dir.path().join("escape")).unwrap();
    let r = server.post(
        "/api/runs",
        &json!({"composition": ONE_STEP, "workspace": {"path": "escape"}}),
    );
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    drop(server);

    let mut cmd = s.docsfab();
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let base = listening_on(&mut child);
    let r = client()
        .post(format!("{base}/api/runs"))
        .json(&json!({"composition": ONE_STEP, "workspace": ws()}))
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("--workspace-root"), "{error}");
    let _ = child.kill();
    let _ = child.wait();
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A git repository with `src/` on branch `docs-base` (and something else on its default
/// branch, so the ref matters).
fn repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    git(&repo, &["init", "--quiet"]);
    std::fs::write(repo.join("src/lib.rs"), "pub mod count;\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "first"]);
    git(&repo, &["branch", "docs-base"]);
    std::fs::write(repo.join("src/lib.rs"), "// later\n").unwrap();
    git(&repo, &["commit", "--quiet", "-am", "later"]);
    repo
}

/// A git workspace is cloned at its ref for the run, the run writes into the clone, and the
/// diff endpoint shows what it wrote; an unreachable repository fails the run with a reason.
#[test]
fn issue15_git_workspace_is_cloned_at_its_ref_and_its_diff_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), WRITES_THEN_DONE);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let repo = repo(tmp.path());
    let mut server = Server::start(&s, &[]);
    let url = format!("file://{}", repo.display());
    let id = server.submit(WRITER, json!({"git": url, "ref": "docs-base"}));
    let record = server.wait_status(&id, "succeeded");
    let clone = s.home().join("serve/workspaces").join(&id);
    assert_eq!(
        record["workspace"],
        std::fs::canonicalize(&clone).unwrap().to_str().unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("src/lib.rs")).unwrap(),
        "pub mod count;\n"
    );
    let r = server.get(&format!("/api/runs/{id}/diff"));
    assert_eq!(r.status(), StatusCode::OK);
    let diff = r.text().unwrap();
    assert!(diff.contains("+++ b/docs/overview.md"), "{diff}");
    assert!(diff.contains("+Two modules."), "{diff}");
    let r = server.get(&format!("/api/runs/{id}/report"));
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().unwrap().contains(&id));

    let missing = format!("file://{}", tmp.path().join("nothing-here").display());
    let id = server.submit(WRITER, json!({"git": missing, "ref": "main"}));
    let record = server.wait_status(&id, "failed");
    let reason = record["endReason"].as_str().unwrap().to_owned();
    assert!(reason.contains("git clone"), "{record}");
    server
        .stderr
        .wait_for(&format!("run {id} failed: git clone of"), WAIT);
    // The reason is in the store, not in the worker's memory: a restarted server (or any other
    // worker) streams it, and `runs show` prints it.
    drop(server);
    let server = Server::start(&s, &[]);
    let events = read_events(&server, &id);
    let end = events.iter().find(|(name, _)| name == "end").unwrap();
    assert_eq!(end.1["reason"], reason.as_str(), "{events:?}");
    let shown = s.docsfab().args(["runs", "show", &id]).output().unwrap();
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(
        shown.contains(&format!("why it ended: {reason}")),
        "{shown}"
    );
}

/// `GET /api/runs` filters by status and bounds the listing; bad filters are 400.
#[test]
fn issue15_list_filters_by_status_and_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let a = server.submit(ONE_STEP, ws());
    let b = server.submit(ONE_STEP, ws());
    server.wait_status(&a, "succeeded");
    server.wait_status(&b, "succeeded");
    let c = server.submit(ONE_STEP, ws());
    server.wait_status(&c, "succeeded");
    let r = server.post(&format!("/api/runs/{c}/cancel"), &json!({}));
    assert_eq!(r.json::<Value>().unwrap()["outcome"], "already-ended");

    let all = server.json("/api/runs");
    let runs = all["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[0]["runId"], c.as_str());
    for key in [
        "runId",
        "composition",
        "status",
        "startedAt",
        "endedAt",
        "steps",
        "attempts",
        "durationMs",
    ] {
        assert!(runs[0].get(key).is_some(), "{key} missing: {}", runs[0]);
    }
    assert_eq!(runs[0]["steps"], 1);
    assert_eq!(runs[0]["composition"], "small");
    let limited = server.json("/api/runs?limit=2");
    assert_eq!(limited["runs"].as_array().unwrap().len(), 2);
    let ok = server.json("/api/runs?status=succeeded");
    assert_eq!(ok["runs"].as_array().unwrap().len(), 3);
    let queued = server.json("/api/runs?status=queued");
    assert!(queued["runs"].as_array().unwrap().is_empty());
    assert_eq!(
        server.get("/api/runs?status=done").status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server.get("/api/runs?limit=0").status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        server.get("/api/runs/run-nope").status(),
        StatusCode::NOT_FOUND
    );
}

/// With --jobs 1 the second run stays queued while the first runs (FIFO); cancelling the
/// queued one ends it at once, cancelling the running one cancels it through its worker; a
/// rerun queues a new run with the same spec, and a run `docsfab run` made has none (404).
#[test]
fn issue15_jobs_1_is_fifo_and_cancel_works_queued_and_running_and_rerun_requeues() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STALLED);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &["--jobs", "1"]);
    let first = server.submit(ONE_STEP, ws());
    let second = server.submit(ONE_STEP, ws());
    server.wait_claimed(&first);
    // The first holds the only slot (its provider stalls), so the second waits its turn.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(server.status_of(&second), "queued");
    let queued = server.json("/api/runs?status=queued");
    assert_eq!(queued["runs"][0]["runId"], second.as_str());

    let r = server.post(&format!("/api/runs/{second}/cancel"), &json!({}));
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let body: Value = r.json().unwrap();
    assert_eq!(body["outcome"], "cancelled");
    assert_eq!(body["status"], "cancelled");
    let record = server.json(&format!("/api/runs/{second}"));
    assert_eq!(record["status"], "cancelled");
    assert!(record["steps"].as_array().unwrap().is_empty());
    assert_eq!(
        record["endReason"],
        "cancelled while queued, before a worker claimed it"
    );

    let r = server.post(&format!("/api/runs/{first}/cancel"), &json!({}));
    let body: Value = r.json().unwrap();
    assert_eq!(body["outcome"], "requested");
    let record = server.wait_status(&first, "cancelled");
    assert_eq!(record["steps"][0]["status"], "cancelled");
    // Its step says why (cancelled by the caller), so the run has no reason of its own.
    assert_eq!(record["endReason"], Value::Null);
    // The attempt that was in flight is recorded, cancelled (REP-9's rule for a cancelled turn).
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{record}");
    assert_eq!(attempts[0]["status"], "cancelled", "{record}");
    // The list (the web page's source) counts it too.
    let listed = server.json("/api/runs?status=cancelled");
    let row = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == first.as_str())
        .unwrap();
    assert_eq!(
        (row["steps"].clone(), row["attempts"].clone()),
        (json!(1), json!(1)),
        "{row}"
    );

    let r = server.post(&format!("/api/runs/{second}/rerun"), &json!({}));
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let again = r.json::<Value>().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(again, second);
    server.wait_claimed(&again);
    let r = server.post(&format!("/api/runs/{again}/cancel"), &json!({}));
    assert_eq!(r.json::<Value>().unwrap()["outcome"], "requested");
    server.wait_status(&again, "cancelled");
    assert_eq!(
        server
            .post("/api/runs/run-nope/cancel", &json!({}))
            .status(),
        StatusCode::NOT_FOUND
    );
    drop(server);

    // A run `docsfab run` made has no spec to run again.
    let fast_dir = tmp.path().join("fast");
    std::fs::create_dir_all(&fast_dir).unwrap();
    let fast = Sim::start(&fast_dir, ANSWER);
    let s2 = Setup::new(&fast.base_url, FAST_CATALOG);
    let comp = s2.composition(ONE_STEP);
    let out = s2.run_command(&comp).output().unwrap();
    assert!(out.status.success());
    let cli_id = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();
    let server = Server::start(&s2, &[]);
    // `docsfab run` keeps its composition too (issue 22), so its run can be queued again.
    let r = server.post(&format!("/api/runs/{cli_id}/rerun"), &json!({}));
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

/// The server-sent events of `GET /api/runs/{id}/events`, read to the end: (event, data).
fn read_events(server: &Server, id: &str) -> Vec<(String, Value)> {
    let mut r = server.get(&format!("/api/runs/{id}/events"));
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut name = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            }
            if let Some(d) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str::<Value>(d).unwrap());
            }
        }
        if let (Some(n), Some(d)) = (name, data) {
            events.push((n, d));
        }
    }
    events
}

/// The event stream follows a run from queued to its end: status, step and attempt events,
/// then `end` with the final status, and the stream closes.
#[test]
fn issue15_event_stream_follows_the_run_and_ends_with_end() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 503\n  - answer: {json: {modules: [lib, count]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let id = server.submit(ONE_STEP, ws());
    let events = read_events(&server, &id);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.last(), Some(&"end"), "{events:?}");
    assert_eq!(events.last().unwrap().1["status"], "succeeded");
    assert!(names.contains(&"status"), "{names:?}");
    assert!(names.contains(&"step"), "{names:?}");
    assert!(names.contains(&"attempt"), "{names:?}");
    let attempt = events.iter().find(|(n, _)| n == "attempt").unwrap();
    assert_eq!(attempt.1["stepId"], "outline");
    // An ended run's stream is its status and end at once.
    let again = read_events(&server, &id);
    assert_eq!(again.last().unwrap().0, "end");
    assert_eq!(
        server.get("/api/runs/run-nope/events").status(),
        StatusCode::NOT_FOUND
    );
}

/// Checks the text is Prometheus exposition: HELP/TYPE before samples of the family, each
/// sample `name{labels} value` with a number, and returns the samples.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    let mut typed: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter"].contains(&kind), "{line}");
            typed.push(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            for pair in labels[1..labels.len() - 1].split(',') {
                let (k, v) = pair.split_once('=').unwrap();
                assert!(
                    !k.is_empty() && v.starts_with('"') && v.ends_with('"'),
                    "{line}"
                );
            }
        }
        assert!(
            typed.iter().any(|t| t == name),
            "sample before its TYPE: {line}"
        );
        samples.push((series.to_owned(), value));
    }
    samples
}

/// `/metrics` parses as Prometheus text and has every family: run counts by status (queued
/// included), runs here, throttle holds, replays and step retries by class from the records
/// of runs this process finished; `/healthz` is ok.
#[test]
fn issue15_metrics_have_every_family_and_count_replays_by_class() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - status: 503\n  - answer: {json: {modules: [lib, count]}}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let health = server.get("/healthz");
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.json::<Value>().unwrap()["status"], "ok");
    let id = server.submit(ONE_STEP, ws());
    server.wait_status(&id, "succeeded");
    // The counters are added once the job has read its record back.
    let end = Instant::now() + WAIT;
    let samples = loop {
        let text = server.get("/metrics").text().unwrap();
        let samples = parse_exposition(&text);
        if samples
            .iter()
            .any(|(s, _)| s.starts_with("docsfab_replays_total{"))
        {
            break samples;
        }
        assert!(Instant::now() < end, "{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let value = |series: &str| {
        samples
            .iter()
            .find(|(s, _)| s == series)
            .unwrap_or_else(|| panic!("{series} missing: {samples:?}"))
            .1
    };
    assert_eq!(value("docsfab_runs{status=\"succeeded\"}"), 1.0);
    assert_eq!(value("docsfab_runs{status=\"queued\"}"), 0.0);
    assert_eq!(value("docsfab_runs{status=\"running\"}"), 0.0);
    assert_eq!(value("docsfab_jobs_running_here"), 0.0);
    assert_eq!(value("docsfab_replays_total{class=\"server\"}"), 1.0);
    value("docsfab_throttle_held_turns_total");
    value("docsfab_throttle_held_seconds_total");
    let text = server.get("/metrics").text().unwrap();
    assert!(
        text.contains("# TYPE docsfab_step_retries_total counter"),
        "{text}"
    );
}

/// Polls `/metrics` until `series` has `want`; the parsed samples then.
fn metrics_when(server: &Server, series: &str, want: f64) -> Vec<(String, f64)> {
    let end = Instant::now() + WAIT;
    loop {
        let text = server.get("/metrics").text().unwrap();
        let samples = parse_exposition(&text);
        if samples.iter().any(|(s, v)| s == series && *v == want) {
            return samples;
        }
        assert!(Instant::now() < end, "{series} never {want}: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sample(samples: &[(String, f64)], series: &str) -> Option<f64> {
    samples.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
}

/// A read step whose first answer fails its contract (one attempt, one turn) and whose second
/// answers; each answer reports its usage.
const PRICED_SCENARIO: &str = "responses:\n  - answer: {text: not json, usage: {input_tokens: 1000, output_tokens: 10, cached_tokens: 400}}\n  - answer: {json: {modules: [lib]}, usage: {input_tokens: 1200, output_tokens: 20, cached_tokens: 600}}\n";
const PRICED_STEP: &str = "name: priced\nlimits:\n  timeoutMs: 60000\n  maxTurns: 1\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Return an object with a modules array.\n    contract:\n      schema: {type: object, required: [modules]}\n";

/// Issue 34: tokens and cost by provider and model, failed attempts included, are the sums of
/// what the simulator reported; a provider whose server never reports usage has its attempts
/// counted apart and no token or cost series (never 0).
#[test]
fn issue34_metrics_count_tokens_and_cost_by_provider_and_model_and_unknown_usage_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let priced_dir = tmp.path().join("priced");
    let silent_dir = tmp.path().join("silent");
    std::fs::create_dir_all(&priced_dir).unwrap();
    std::fs::create_dir_all(&silent_dir).unwrap();
    let priced = Sim::start(&priced_dir, PRICED_SCENARIO);
    let silent = Sim::start(
        &silent_dir,
        "usage: never\nresponses:\n  - answer: {json: {modules: [lib]}}\n",
    );
    let extra = format!(
        "    pricing:\n      inputPerMillion: 3\n      outputPerMillion: 15\n      cacheReadPerMillion: 0.3\n  local:\n    api: openai-chat\n    baseUrl: {}\n    apiKeyEnv: {KEY_VAR}\n    model: local-model\n{FAST_CATALOG}",
        silent.base_url
    );
    let s = Setup::new(&priced.base_url, &extra);
    let server = Server::start(&s, &[]);
    let id = server.submit(PRICED_STEP, ws());
    let record = server.wait_status(&id, "succeeded");
    let attempts = record["steps"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{record:#}");
    assert_eq!(attempts[0]["status"], "failed", "{record:#}");
    let local = server.submit(&format!("provider: local\n{ONE_STEP}"), ws());
    server.wait_status(&local, "succeeded");

    let samples = metrics_when(&server, "docsfab_finished_runs_total", 2.0);
    let at = |series: &str| sample(&samples, series);
    let default = "provider=\"default\",model=\"sim-model\"";
    assert_eq!(
        at(&format!(
            "docsfab_tokens_total{{{default},direction=\"input\"}}"
        )),
        Some(2200.0)
    );
    assert_eq!(
        at(&format!(
            "docsfab_tokens_total{{{default},direction=\"output\"}}"
        )),
        Some(30.0)
    );
    assert_eq!(
        at(&format!(
            "docsfab_cache_tokens_total{{{default},operation=\"read\"}}"
        )),
        Some(1000.0)
    );
    // (600 x 3 + 400 x 0.3 + 10 x 15) + (600 x 3 + 600 x 0.3 + 20 x 15) per million.
    let cost = at(&format!("docsfab_cost_usd_total{{{default}}}")).unwrap();
    assert!((cost - 0.00435).abs() < 1e-9, "{cost}");
    let recorded = record["costUsd"].as_f64().unwrap();
    assert!((recorded - cost).abs() < 1e-9, "{recorded} in the record");
    assert_eq!(
        at(&format!(
            "docsfab_unknown_usage_attempts_total{{{default}}}"
        )),
        Some(0.0)
    );
    let local = "provider=\"local\",model=\"local-model\"";
    assert_eq!(
        at(&format!("docsfab_unknown_usage_attempts_total{{{local}}}")),
        Some(1.0)
    );
    assert_eq!(
        at(&format!("docsfab_unpriced_attempts_total{{{local}}}")),
        Some(1.0)
    );
    for absent in [
        format!("docsfab_tokens_total{{{local},direction=\"input\"}}"),
        format!("docsfab_cost_usd_total{{{local}}}"),
    ] {
        assert_eq!(at(&absent), None, "{absent}: {samples:?}");
    }
    assert_eq!(at("docsfab_reused_steps_total"), Some(0.0));
    assert_eq!(at("docsfab_finished_steps_total"), Some(2.0));
}

/// With --token-env every request needs the token, as a bearer header or the cookie; a
/// missing or wrong one is 401 with one JSON sentence (the page shell for GET /), and the
/// token is never printed.
#[test]
fn issue15_token_is_required_as_header_or_cookie() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let token = "serve-token-7f3a9c";
    let mut server = Server::start_env(
        &s,
        &["--token-env", "DOCSFAB_TEST_SERVE_TOKEN"],
        &[("DOCSFAB_TEST_SERVE_TOKEN", token)],
    );
    let http = client();
    let r = http.get(server.url("/api/runs")).send().unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("token") && !error.contains(token), "{error}");
    let r = http
        .get(server.url("/api/runs"))
        .bearer_auth("wrong")
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http.get(server.url("/")).send().unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(!r.text().unwrap().contains(token));

    let r = http
        .get(server.url("/api/runs"))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .get(server.url("/api/runs"))
        .header("cookie", format!("theme=dark; docsfab_token={token}"))
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http.get(server.url("/")).bearer_auth(token).send().unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    server.token = Some(token.to_owned());
    let id = server.submit(ONE_STEP, ws());
    server.wait_status(&id, "succeeded");
    assert_eq!(server.terminate().code(), Some(0));
    let log = server.stderr.rest();
    assert!(!log.contains(token), "{log}");
    // The token variable is read, so it draws no unknown-variable warning.
    assert!(!log.contains("warning"), "{log}");
}

/// Startup refusals: a non-loopback address without a token, a named token variable that is
/// unset, a missing workspace root: one sentence, exit 2, nothing listening.
#[test]
fn issue15_startup_refuses_bad_input_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Setup::new("http://127.0.0.1:9/v1", "");
    let out = s
        .docsfab()
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("--token-env") && err.contains("not a loopback"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let out = s
        .docsfab()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-env",
            "DOCSFAB_TEST_UNSET_TOKEN",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("DOCSFAB_TEST_UNSET_TOKEN") && err.contains("not set"),
        "{err}"
    );

    let out = s
        .docsfab()
        .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
        .arg(tmp.path().join("absent"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--workspace-root"), "{err}");

    std::fs::write(s.home().join("host.yaml"), "providers: [\n").unwrap();
    let out = s
        .docsfab()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

/// A request body over 1 MiB is refused with 413 and one JSON sentence.
#[test]
fn issue15_body_over_1_mib_is_413() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let big = "#".repeat(1024 * 1024 + 1);
    let r = server.post("/api/runs", &json!({"composition": big, "workspace": ws()}));
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("larger than 1048576 bytes"), "{error}");
    assert!(
        server.json("/api/runs")["runs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// SIGTERM drains: /healthz turns 503, nothing new is claimed, the running run gets the drain
/// timeout and is then cancelled (recorded `cancelled`), the process exits 0; the queued run
/// is still queued afterwards, and a restarted server runs it.
#[test]
fn issue15_sigterm_drain_cancels_the_long_run_and_restart_keeps_queued_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STALLED);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &["--jobs", "1", "--drain-timeout", "1s"]);
    let long = server.submit(ONE_STEP, ws());
    let waiting = server.submit(ONE_STEP, ws());
    server.wait_claimed(&long);
    signal(&server.child, "TERM");
    server.stderr.wait_for("draining", WAIT);
    let health = server.get("/healthz");
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health.json::<Value>().unwrap()["status"], "draining");
    let status = wait_exit(&mut server.child);
    assert_eq!(status.code(), Some(0));
    drop(server);

    let list = s.list_json();
    let of = |id: &str| {
        list.iter().find(|r| r["runId"] == id).unwrap()["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(of(&long), "cancelled");
    assert_eq!(of(&waiting), "queued");

    let fast_dir = tmp.path().join("fast");
    std::fs::create_dir_all(&fast_dir).unwrap();
    let fast = Sim::start(&fast_dir, ANSWER);
    std::fs::write(
        s.home().join("host.yaml"),
        format!(
            "providers:\n  default:\n    api: openai-chat\n    baseUrl: {}\n    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n{FAST_CATALOG}",
            fast.base_url
        ),
    )
    .unwrap();
    let server = Server::start(&s, &[]);
    server.wait_status(&waiting, "succeeded");
}

/// A server killed with SIGKILL mid-run leaves its run `running`; the restarted server (its
/// store open or its reap) marks it `interrupted`, never re-running it.
#[test]
fn issue15_kill_9_leaves_the_run_interrupted_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STALLED);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &[]);
    let id = server.submit(ONE_STEP, ws());
    server.wait_claimed(&id);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);
    let server = Server::start(&s, &[]);
    let record = server.wait_status(&id, "interrupted");
    assert!(record["endedAt"].is_string());
    let reason = record["endReason"].as_str().unwrap();
    assert!(
        reason.starts_with("the process that ran it (pid ") && reason.contains("ended while"),
        "{record}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.status_of(&id), "interrupted");
}

/// Two write runs on one workspace: the second waits for the first's workspace lock (as a
/// second `docsfab run` would be refused, a queued job waits instead), then runs; both succeed
/// and the second's first attempt starts after the first run ended.
#[test]
fn issue15_write_runs_on_one_workspace_wait_for_its_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:\n  - answer:\n      tool_calls:\n        - {name: write_file, arguments: {path: docs/a.md, content: \"A\\n\"}}\n    delay_ms: 1500\n  - answer: {text: done}\n  - answer:\n      tool_calls:\n        - {name: write_file, arguments: {path: docs/b.md, content: \"B\\n\"}}\n  - answer: {text: done}\n",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &["--jobs", "2"]);
    let first = server.submit(WRITER, ws());
    server.wait_claimed(&first);
    let second = server.submit(WRITER, ws());
    server
        .stderr
        .wait_for(&format!("run {second} waits for its workspace"), WAIT);
    let a = server.wait_status(&first, "succeeded");
    let b = server.wait_status(&second, "succeeded");
    let first_end = a["endedAt"].as_str().unwrap();
    let second_start = b["steps"][0]["attempts"][0]["startedAt"].as_str().unwrap();
    assert!(second_start >= first_end, "{second_start} < {first_end}");
    assert_eq!(
        std::fs::read_to_string(s.workspace().join("docs/a.md")).unwrap(),
        "A\n"
    );
    assert_eq!(
        std::fs::read_to_string(s.workspace().join("docs/b.md")).unwrap(),
        "B\n"
    );
}

/// The DNS pre-flight is not done at submit (202) but at claim time: a provider host that does
/// not exist fails the run before it starts, and the event stream's `end` says why.
#[test]
fn issue15_no_such_provider_host_fails_the_claimed_run_with_the_preflight_reason() {
    use std::net::ToSocketAddrs as _;
    let definitive = match ("docsfab-test.invalid", 9).to_socket_addrs() {
        Ok(_) => false,
        Err(e) => {
            let said = e.to_string();
            said.contains("Name or service not known")
                || said.contains("No address associated with hostname")
                || said.contains("Name does not resolve")
        }
    };
    if !definitive {
        println!("skipped: this machine's resolver gives no definitive answer for .invalid names");
        return;
    }
    let s = Setup::new("http://docsfab-test.invalid:9/v1", FAST_CATALOG);
    let mut server = Server::start(&s, &[]);
    let id = server.submit(ONE_STEP, ws());
    let record = server.wait_status(&id, "failed");
    assert!(record["steps"].as_array().unwrap().is_empty(), "{record:#}");
    server.stderr.wait_for(
        &format!("run {id} failed: provider \"default\" points at host docsfab-test.invalid"),
        WAIT,
    );
    let events = read_events(&server, &id);
    let (name, end) = events.last().unwrap();
    assert_eq!(name, "end");
    assert!(
        end["reason"].as_str().unwrap().contains("does not exist"),
        "{end}"
    );
    assert_eq!(record["endReason"], end["reason"], "{record:#}");
}

/// Requests a browser makes for another site are refused: a foreign Origin, a cross-site
/// fetch, a Host that is not loopback on a server without a token (DNS rebinding), and a
/// submission that is not JSON (a "simple" cross-site POST).
#[test]
fn issue15_cross_site_requests_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let server = Server::start(&s, &[]);
    let body = json!({"composition": ONE_STEP, "workspace": ws()}).to_string();
    let http = client();
    let r = http
        .post(server.url("/api/runs"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = http
        .get(server.url("/api/runs"))
        .header("sec-fetch-site", "cross-site")
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A link followed from another site (a top-level GET navigation) opens the page.
    let r = http
        .get(server.url("/"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .post(server.url("/api/runs"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "a cross-site form post");
    let r = http
        .get(server.url("/api/runs"))
        .header("host", "rebound.example:80")
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = http
        .post(server.url("/api/runs"))
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(
        server.json("/api/runs")["runs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // The server's own origin is fine.
    let own = server.base.clone();
    let r = http
        .post(server.url("/api/runs"))
        .header("origin", own)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

/// --jobs 2 runs two runs at once and no more: the third stays queued, the metrics say two run
/// here, and cancelling one lets the third be claimed.
#[test]
fn issue15_jobs_2_runs_two_at_once_and_the_third_waits() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), STALLED);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &["--jobs", "2"]);
    let a = server.submit(ONE_STEP, ws());
    let b = server.submit(ONE_STEP, ws());
    let c = server.submit(ONE_STEP, ws());
    server.wait_claimed(&a);
    server.wait_claimed(&b);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(server.status_of(&c), "queued");
    let metrics = server.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("docsfab_jobs_running_here 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("docsfab_runs{status=\"queued\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("docsfab_runs{status=\"running\"} 2\n"),
        "{metrics}"
    );
    let r = server.post(&format!("/api/runs/{a}/cancel"), &json!({}));
    assert_eq!(r.json::<Value>().unwrap()["outcome"], "requested");
    server.wait_status(&a, "cancelled");
    server.wait_claimed(&c);
    assert_eq!(server.status_of(&b), "running");
}

/// Two serve processes on one store: runs submitted to one are shared out, each claimed by
/// exactly one of them, and all succeed; either server shows any run.
#[test]
fn issue15_two_servers_on_one_store_claim_each_run_once() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(tmp.path(), ANSWER);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut one = Server::start(&s, &["--jobs", "2"]);
    let mut two = Server::start(&s, &["--jobs", "2"]);
    let ids: Vec<String> = (0..8).map(|_| one.submit(ONE_STEP, ws())).collect();
    for id in &ids {
        two.wait_status(id, "succeeded");
    }
    assert_eq!(one.terminate().code(), Some(0));
    assert_eq!(two.terminate().code(), Some(0));
    let logs = [one.stderr.rest(), two.stderr.rest()];
    for id in &ids {
        let claims: usize = logs
            .iter()
            .map(|log| log.matches(&format!("claimed run {id}")).count())
            .sum();
        assert_eq!(claims, 1, "run {id} claimed {claims} times:\n{logs:#?}");
    }
}

/// Two read-only steps; the second names the first's answer.
const TWO_STEPS: &str = "name: two\nlimits:\n  timeoutMs: 600000\n  maxTurns: 6\nsteps:\n  - id: survey\n    access: read-only\n    instructions: Survey the code.\n    contract:\n      schema: {type: object, required: [modules]}\n  - id: outline\n    access: read-only\n    instructions: \"Outline {{steps.survey.output}}.\"\n    contract:\n      schema: {type: object, required: [modules]}\n";

/// Issue 22: a job submitted with `resume: auto` whose worker is killed (`kill -9`) mid-run is
/// resumed, once, by the next worker: the resume carries the finished step over and sends only
/// the unfinished step's request. `POST /api/runs/{id}/resume` queues the same by hand, and
/// refuses a succeeded run with one sentence.
#[test]
fn issue22_serve_resumes_a_dead_workers_run_once_with_resume_auto_and_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let stalls = "responses:\n  - answer: {json: {modules: [lib]}}\n  - answer: {json: {modules: [x]}}\n    delay_ms: 600000\n";
    let sim = Sim::start(tmp.path(), stalls);
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let mut server = Server::start(&s, &[]);
    let r = server.post(
        "/api/runs",
        &json!({"composition": TWO_STEPS, "workspace": ws(), "resume": "auto"}),
    );
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.json::<Value>().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    server.wait_claimed(&id);
    let end = Instant::now() + WAIT;
    while server.json(&format!("/api/runs/{id}"))["steps"][0]["status"] != "succeeded" {
        assert!(Instant::now() < end, "the first step never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);
    drop(sim);

    let dir = tmp.path().join("second");
    std::fs::create_dir(&dir).unwrap();
    let log = dir.join("requests.jsonl");
    let quick = "responses:\n  - answer: {json: {modules: [outlined]}}\n";
    let sim = Sim::start_logging(&dir, quick, &log);
    s.repoint(&sim.base_url);
    let server = Server::start(&s, &[]);
    server.wait_status(&id, "interrupted");
    let resumed = {
        let end = Instant::now() + WAIT;
        loop {
            let runs = server.json("/api/runs");
            let found = runs["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["runId"].as_str().unwrap().to_owned())
                .find(|r| *r != id);
            if let Some(found) = found {
                break found;
            }
            assert!(Instant::now() < end, "no resume was queued: {runs}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let record = server.wait_status(&resumed, "succeeded");
    assert_eq!(record["resumedFrom"]["runId"], id.as_str(), "{record}");
    assert_eq!(record["steps"][0]["reusedFrom"]["runId"], id.as_str());
    assert!(record["steps"][1]["reusedFrom"].is_null());
    let sent = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        sent.lines().count(),
        1,
        "only the unfinished step asked: {sent}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.json("/api/runs")["runs"].as_array().unwrap().len(),
        2,
        "resumed once"
    );

    // A succeeded run has nothing to resume: 400, one sentence.
    let r = server.post(&format!("/api/runs/{resumed}/resume"), &json!({}));
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error = r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("nothing to resume"), "{error}");
    // The interrupted one can be resumed again by hand.
    let r = server.post(&format!("/api/runs/{id}/resume"), &json!({}));
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let again = r.json::<Value>().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let record = server.wait_status(&again, "succeeded");
    assert_eq!(record["resumedFrom"]["runId"], id.as_str());
    assert_eq!(record["steps"][0]["reusedFrom"]["runId"], id.as_str());
    let sent = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        sent.lines().count(),
        2,
        "each resume asked only for the second step: {sent}"
    );
    // Issue 34: this process finished the two resumes, each of which carried one step over.
    let samples = metrics_when(&server, "docsfab_finished_runs_total", 2.0);
    let at = |series: &str| sample(&samples, series);
    assert_eq!(at("docsfab_runs_with_reused_steps_total"), Some(2.0));
    assert_eq!(at("docsfab_reused_steps_total"), Some(2.0));
    assert_eq!(at("docsfab_finished_steps_total"), Some(4.0));
}
