//! Shared by the `docsfab run`, `runs`, signal, `sim serve` and demo tests: the simulator as a real `docsfab sim serve` process, a
//! temporary DOCSFAB_HOME with a host.yaml pointing at it, a small workspace, and a reader that
//! waits for a line on a child's stderr.
#![allow(dead_code)] // each test file uses a different part

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The variable the test host.yaml names for the key, and the key's value (which must never be
/// printed).
pub const KEY_VAR: &str = "DOCSFAB_TEST_PROVIDER_KEY";
pub const SECRET: &str = "sk-run-test-SECRET-0042";

/// Replay waits lowered to milliseconds.
pub const FAST_CATALOG: &str = "catalog:\n  providerAttempt.baseDelayMs: 10\n  providerAttempt.maxDelayMs: 50\n  providerAttempt.maxTotalDelayMs: 200\n";

/// A small read-only composition: survey the workspace, answer {"modules": [...]}.
pub const ONE_STEP: &str = "name: small\nlimits:\n  timeoutMs: 60000\n  maxTurns: 6\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Survey src/ and return an object with a modules array.\n    tools: [list_files, read_file]\n    contract:\n      schema: {type: object, required: [modules]}\n";

pub fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin!("docsfab").to_path_buf()
}

/// `docsfab` with no inherited `DOCSFAB_` variable and the given home.
pub fn docsfab_at(home: &Path) -> Command {
    let mut cmd = Command::new(bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DOCSFAB_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("DOCSFAB_HOME", home);
    cmd
}

/// `docsfab` with a clean environment for limits: no inherited `DOCSFAB_` variable, the given
/// home, the provider key set and the step retry base delay lowered.
pub fn docsfab(home: &Path) -> Command {
    let mut cmd = docsfab_at(home);
    cmd.env(KEY_VAR, SECRET)
        .env("DOCSFAB_RETRY_BASE_DELAY_MS", "20");
    cmd
}

/// A `docsfab serve` worker process on `home` (which holds host.yaml) and `store`: `--jobs
/// jobs`, workspaces under `workspace_root`, beating every `heartbeat_ms`, its stderr in `log`.
/// Returns the child and the address it listens on (from its first stdout line).
pub fn spawn_serve(
    home: &Path,
    store: &str,
    jobs: u32,
    workspace_root: &Path,
    heartbeat_ms: &str,
    log: &Path,
) -> (Child, String) {
    let mut child = docsfab(home)
        .env("DOCSFAB_HEARTBEAT_MS", heartbeat_ms)
        .args(["--store", store, "serve", "--listen", "127.0.0.1:0"])
        .arg("--jobs")
        .arg(jobs.to_string())
        .arg("--workspace-root")
        .arg(workspace_root)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| {
            panic!(
                "unexpected first line from serve: {first:?}\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
        .to_owned();
    (child, addr)
}

/// `docsfab sim serve` on 127.0.0.1:0 as a child process; killed on drop.
pub struct Sim {
    child: Child,
    pub base_url: String,
}

impl Sim {
    pub fn start(dir: &Path, scenario: &str) -> Sim {
        Sim::start_with(dir, scenario, &[])
    }

    /// As [`Sim::start`], writing the request log to `log`.
    pub fn start_logging(dir: &Path, scenario: &str, log: &Path) -> Sim {
        Sim::start_with(dir, scenario, &["--log".as_ref(), log.as_os_str()])
    }

    fn start_with(dir: &Path, scenario: &str, extra: &[&std::ffi::OsStr]) -> Sim {
        let path = dir.join("scenario.yaml");
        std::fs::write(&path, scenario).unwrap();
        let mut child = Command::new(bin())
            .args(["sim", "serve", "--listen", "127.0.0.1:0", "--scenario"])
            .arg(&path)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base_url = listening_on(&mut child);
        Sim { child, base_url }
    }
}

impl Sim {
    /// `host:port` of the listening socket.
    pub fn addr(&self) -> &str {
        self.base_url
            .strip_prefix("http://")
            .and_then(|rest| rest.strip_suffix("/v1"))
            .unwrap_or_else(|| panic!("unexpected base URL {:?}", self.base_url))
    }

    /// Sends SIGTERM and waits for the process to end.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.child, "TERM");
        self.child.wait().unwrap()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory with `home/host.yaml` (provider "default" at `base_url`, key from
/// [`KEY_VAR`], plus `extra` host.yaml text) and a workspace `ws/` with two source files.
pub struct Setup {
    pub dir: tempfile::TempDir,
}

impl Setup {
    pub fn new(base_url: &str, extra: &str) -> Setup {
        Setup::with_api("openai-chat", base_url, extra)
    }

    /// As [`Setup::new`] for a provider speaking `api` (`openai-chat`, `anthropic-messages`).
    pub fn with_api(api: &str, base_url: &str, extra: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let s = Setup { dir };
        std::fs::create_dir_all(s.home()).unwrap();
        std::fs::write(
            s.home().join("host.yaml"),
            format!(
                "providers:\n  default:\n    api: {api}\n    baseUrl: {base_url}\n    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n{extra}"
            ),
        )
        .unwrap();
        std::fs::create_dir_all(s.workspace().join("src")).unwrap();
        std::fs::write(
            s.workspace().join("src/lib.rs"),
            "//! A tiny crate.\npub mod count;\n",
        )
        .unwrap();
        std::fs::write(
            s.workspace().join("src/count.rs"),
            "pub fn count() -> usize { 3 }\n",
        )
        .unwrap();
        s
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    pub fn store(&self) -> PathBuf {
        self.home().join("runs.db")
    }

    /// Writes a composition file and returns its path.
    pub fn composition(&self, text: &str) -> PathBuf {
        let path = self.dir.path().join("composition.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `docsfab` on this setup's home; on the store [`Setup::use_store`] chose, if any.
    pub fn docsfab(&self) -> Command {
        let mut cmd = docsfab(&self.home());
        if let Ok(url) = std::fs::read_to_string(self.dir.path().join("store-url")) {
            cmd.env("DOCSFAB_STORE", url.trim());
        }
        cmd
    }

    /// Points host.yaml's provider at `base_url` (a new simulator).
    #[allow(dead_code)]
    pub fn repoint(&self, base_url: &str) {
        let host = self.home().join("host.yaml");
        let text = std::fs::read_to_string(&host).unwrap();
        let start = text.find("baseUrl: ").unwrap() + "baseUrl: ".len();
        let end = start + text[start..].find('\n').unwrap();
        std::fs::write(
            &host,
            format!("{}{base_url}{}", &text[..start], &text[end..]),
        )
        .unwrap();
    }

    /// Every later command of this setup uses the run store `url` (`DOCSFAB_STORE`).
    #[allow(dead_code)]
    pub fn use_store(&self, url: &str) {
        std::fs::write(self.dir.path().join("store-url"), url).unwrap();
    }

    /// `docsfab run COMPOSITION --workspace` on this setup's workspace.
    pub fn run_command(&self, composition: &Path) -> Command {
        let mut cmd = self.docsfab();
        cmd.arg("run")
            .arg(composition)
            .arg("--workspace")
            .arg(self.workspace());
        cmd
    }

    /// `docsfab runs show ID --json`, checked to succeed, parsed.
    pub fn show_json(&self, id: &str) -> Value {
        let out = self
            .docsfab()
            .args(["runs", "show", id, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "runs show failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `docsfab runs list --json`, parsed.
    pub fn list_json(&self) -> Vec<Value> {
        self.list_json_judging(None)
    }

    /// [`Setup::list_json`], judging other processes' heartbeats at `heartbeat_ms` (as workers
    /// started with that `DOCSFAB_HEARTBEAT_MS` do) when given.
    pub fn list_json_judging(&self, heartbeat_ms: Option<&str>) -> Vec<Value> {
        let mut cmd = self.docsfab();
        if let Some(ms) = heartbeat_ms {
            cmd.env("DOCSFAB_HEARTBEAT_MS", ms);
        }
        let out = cmd.args(["runs", "list", "--json"]).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }
}

/// The lines a child writes to stderr, read on a thread, with everything seen kept.
pub struct Lines {
    rx: Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(stderr: ChildStderr) -> Lines {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; panics with what was seen after `timeout`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!(
                    "no stderr line containing {needle:?} within {timeout:?}; seen:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Everything left until the child closes stderr.
    pub fn rest(&mut self) -> String {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(10)) {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// Reads the first line of a child's stdout (the run id).
pub fn first_line(stdout: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

/// The URL a server child (`sim serve`, `serve`, `route serve` on port 0) announced on its first
/// stdout line, `listening on URL`. Takes the child's stdout.
pub fn listening_on(child: &mut Child) -> String {
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut first)
        .unwrap();
    first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from the server: {first:?}"))
        .to_owned()
}

/// Sends a signal by name (`INT`, `TERM`) with kill(1).
pub fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} failed");
}

/// A run id as `docsfab run` prints it.
pub fn looks_like_run_id(line: &str) -> bool {
    line.starts_with("run-") && !line.contains(char::is_whitespace) && line.len() > 10
}
