//! Issue 31: the real `docsfab` binary against a real llama.cpp `llama-server` process and a
//! real model (SmolLM2-135M-Instruct), both built by compat/llama/install.sh into
//! target/llama/ (`DOCSFAB_LLAMA_DIR` moves it). The model is weak, so every test asserts
//! mechanics (what was sent, recorded and retried), never the quality of an answer.
//!
//! How the server runs: from target/llama with `-m model.gguf --alias smollm2` (llama-server
//! names the alias, else the `-m` path, as the stream's model, and the response boundary checks
//! it against host.yaml's model), `--temp 0` (greedy, so answers repeat), `--jinja` (this
//! build's default, given for clarity: the model's own chat template renders the prompt; it
//! leaves `tools` out, so the model never calls a tool), `--no-webui`, on a free loopback port.
//! One server per test, tests one at a time (a lock): the machine has few cores.
//!
//! Cases, on `openai-chat` (baseUrl `http://127.0.0.1:P/v1`) and, where the server's Anthropic
//! endpoint can do it, `anthropic-messages` (baseUrl `http://127.0.0.1:P`, without `/v1`, the
//! form llama.cpp documents):
//! - a contract step succeeds under the structured-output constraint (openai-chat: llama.cpp
//!   turns the schema into a grammar; its `/v1/messages` drops `output_config`);
//! - the server starts after the run: connection refusals are replayed in the turn;
//! - a 512-token context overflows: terminal `context-exhausted` after exactly one request;
//! - a fan-out of 8 instances against 2 server slots;
//! - `kill -9` mid-stream and a restart on the same port: the step retries and succeeds;
//! - `doctor --probe --json` capabilities.
//!
//! Without the server the tests say so and pass, unless DOCSFAB_REQUIRE_LLAMA is set (CI sets
//! it), where they fail.

mod support;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::run::Setup;

/// The model name host.yaml gives; the server is started with it as `--alias`.
const MODEL: &str = "smollm2";
/// How long a server may take to load the model (it is about 1 s on an idle machine).
const SERVER_START: Duration = Duration::from_secs(120);
/// How long one `docsfab` command may take (a weak, busy CPU samples a grammar slowly).
const RUN_LIMIT: Duration = Duration::from_secs(1200);

/// In-turn replays that outlast a server start of several seconds: 250 ms doubling to 3 s,
/// 8 requests (the most), about 13 s of waits in all. Step retries wait at most 500 ms.
const CATALOG: &str = "catalog:\n  providerAttempt.baseDelayMs: 250\n  providerAttempt.maxDelayMs: 3000\n  providerAttempt.maxTotalDelayMs: 20000\n  retry.transportMaxDelayMs: 500\n";

/// One test at a time: each starts its own server, and two would share two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn llama_dir() -> PathBuf {
    std::env::var_os("DOCSFAB_LLAMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/llama"))
}

/// The server's directory when it is built; `None` (after saying why) when the test should
/// pass without it. Panics when DOCSFAB_REQUIRE_LLAMA is set and it is missing.
fn installed() -> Option<PathBuf> {
    let dir = llama_dir();
    let missing: Vec<&str> = ["bin/llama-server", "model.gguf"]
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        return Some(dir);
    }
    let why = format!(
        "{} missing under {}; build it with `bash compat/llama/install.sh`",
        missing.join(" and "),
        dir.display()
    );
    if std::env::var_os("DOCSFAB_REQUIRE_LLAMA").is_some() {
        panic!("DOCSFAB_REQUIRE_LLAMA is set and llama-server is not built: {why}");
    }
    eprintln!("skipped: llama-server is not built ({why})");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A bounded plain GET on loopback; `None` when nothing answered.
fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// A `llama-server` child process on 127.0.0.1; killed on drop.
struct Llama {
    child: Child,
    dir: PathBuf,
    port: u16,
    args: Vec<String>,
    log: PathBuf,
}

impl Llama {
    /// Starts the server with context `ctx` and `slots` slots and waits until it is ready.
    fn start(dir: &Path, port: u16, ctx: u32, slots: u32) -> Llama {
        let mut l = Llama::spawn(dir, port, ctx, slots);
        l.wait_ready();
        l
    }

    /// Starts the server without waiting for it.
    fn spawn(dir: &Path, port: u16, ctx: u32, slots: u32) -> Llama {
        let args: Vec<String> = [
            "-m",
            "model.gguf",
            "--alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "-c",
            &(ctx * slots).to_string(),
            "-np",
            &slots.to_string(),
            "--temp",
            "0",
            "--jinja",
            "--no-webui",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = std::env::temp_dir().join(format!("docsfab-llama-{port}.log"));
        Llama {
            child: Llama::launch(dir, &args, &log),
            dir: dir.to_owned(),
            port,
            args,
            log,
        }
    }

    fn launch(dir: &Path, args: &[String], log: &Path) -> Child {
        Command::new(dir.join("bin/llama-server"))
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("start llama-server")
    }

    /// Waits until `/health` answers 200 (503 while the model loads).
    fn wait_ready(&mut self) {
        let end = Instant::now() + SERVER_START;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited ({status}):\n{}", self.tail());
            }
            if http_get(self.port, "/health").is_some_and(|r| r.starts_with("HTTP/1.1 200")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "llama-server was not ready within {SERVER_START:?}:\n{}",
            self.tail()
        );
    }

    /// `kill -9`, then the same server again on the same port.
    fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Llama::launch(&self.dir, &self.args, &self.log);
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits for a child with a bound; kills it and panics past the bound.
fn wait_output(mut child: Child, what: &str) -> Output {
    let end = Instant::now() + RUN_LIMIT;
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    panic!(
        "{what} did not end within {RUN_LIMIT:?}:\n{}",
        text(&out.stderr)
    );
}

/// A finished `docsfab run`: its exit code, record and stderr.
struct Ran {
    code: Option<i32>,
    record: Value,
    stderr: String,
}

impl Ran {
    fn step(&self, i: usize) -> &Value {
        &self.record["steps"][i]
    }

    fn attempts(&self, step: usize) -> &Vec<Value> {
        self.step(step)["attempts"]
            .as_array()
            .unwrap_or_else(|| panic!("no attempts: {}", self.record))
    }

    /// Panics with everything known unless the run exited `code`.
    fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "stderr:\n{}\nrecord:\n{:#}",
            self.stderr,
            self.record
        );
        self
    }
}

/// Starts `docsfab run` on `s` with `composition` (not waiting).
fn spawn_run(s: &Setup, composition: &str) -> Child {
    let c = s.composition(composition);
    s.run_command(&c)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a spawned run and reads its record.
fn finish_run(s: &Setup, child: Child) -> Ran {
    let out = wait_output(child, "docsfab run");
    let stdout = text(&out.stdout);
    let id = stdout.lines().next().unwrap_or_default().to_owned();
    assert!(
        support::run::looks_like_run_id(&id),
        "no run id: {stdout}\n{}",
        text(&out.stderr)
    );
    Ran {
        code: out.status.code(),
        record: s.show_json(&id),
        stderr: text(&out.stderr),
    }
}

fn run(s: &Setup, composition: &str) -> Ran {
    finish_run(s, spawn_run(s, composition))
}

/// A home for provider `api` at the server on `port`, and a small workspace. The Anthropic
/// base URL has no `/v1`, as llama.cpp documents it.
fn setup(port: u16, api: &str) -> Setup {
    let base_url = match api {
        "openai-chat" => format!("http://127.0.0.1:{port}/v1"),
        _ => format!("http://127.0.0.1:{port}"),
    };
    let s = Setup::with_api(api, &base_url, CATALOG);
    // The support setup names the simulator's model; this server answers as MODEL.
    let host = s.home().join("host.yaml");
    let yaml = std::fs::read_to_string(&host).unwrap();
    std::fs::write(
        &host,
        yaml.replace("model: sim-model", &format!("model: {MODEL}")),
    )
    .unwrap();
    s
}

/// A write step without tools that asks for one short sentence: it succeeds on any answer
/// the model ends by itself.
const HELLO: &str = "name: hello\nlimits:\n  timeoutMs: 300000\n  maxTurns: 3\n  maxOutputTokens: 64\nsteps:\n  - id: hello\n    access: write\n    instructions: Say hello in one short sentence.\n";

// Issue 31, a: a contract step succeeds because the schema went to the server as a constraint
// (llama.cpp compiles it into a grammar), and the attempt records the constraint it sent.
#[test]
fn issue31_real_contract_step_succeeds_under_the_constraint() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 2048, 1);
    let s = setup(server.port, "openai-chat");
    let ran = run(
        &s,
        "name: summary\nlimits:\n  timeoutMs: 300000\n  maxTurns: 3\n  maxOutputTokens: 64\nsteps:\n  - id: summary\n    access: read-only\n    instructions: Summarize in one sentence what a function that returns 3 does.\n    contract:\n      schema:\n        type: object\n        required: [summary]\n        additionalProperties: false\n        properties:\n          summary: {type: string, maxLength: 60}\n",
    );
    ran.expect_code(0);
    let last = ran.attempts(0).last().unwrap();
    assert_eq!(last["status"], "succeeded", "{last:#}");
    let sent = last["outputConstraint"].as_str().unwrap_or_default();
    assert!(
        sent.starts_with("json-schema"),
        "outputConstraint: {last:#}"
    );
    assert!(
        ran.step(0)["output"]["summary"].is_string(),
        "{:#}",
        ran.record
    );
}

// Issue 31: a read-only step without a contract is told to answer plain text and is judged
// so: a model that does as it is told succeeds, on both APIs, and no attempt is refused as
// prose (before, every attempt was `contract-prose`). No constraint is sent.
#[test]
fn issue31_real_text_step_without_a_contract_takes_the_plain_answer() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 2048, 1);
    for api in ["openai-chat", "anthropic-messages"] {
        let s = setup(server.port, api);
        let ran = run(
            &s,
            "name: text\nlimits:\n  timeoutMs: 300000\n  maxTurns: 3\n  maxOutputTokens: 128\nsteps:\n  - id: describe\n    access: read-only\n    instructions: Say in one short sentence what a function that returns 3 does.\n",
        );
        ran.expect_code(0);
        for a in ran.attempts(0) {
            assert_ne!(a["retryRule"], "contract-prose", "{api}: {a:#}");
            assert!(a.get("outputConstraint").is_none(), "{api}: {a:#}");
        }
        let last = ran.attempts(0).last().unwrap();
        assert!(
            last["answerExcerpt"]
                .as_str()
                .is_some_and(|t| !t.trim().is_empty()),
            "{api}: {last:#}"
        );
    }
}

// Issue 31, b: the run starts before the server listens; the refused connections (and the
// 503s while the model loads) are replayed inside the turn, and the step succeeds.
#[test]
fn issue31_real_server_starting_late_is_replayed_in_the_turn() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for api in ["openai-chat", "anthropic-messages"] {
        let port = free_port();
        let s = setup(port, api);
        let child = spawn_run(&s, HELLO);
        std::thread::sleep(Duration::from_millis(1500));
        let _server = Llama::spawn(&dir, port, 1024, 1);
        let ran = finish_run(&s, child);
        ran.expect_code(0);
        let turn = &ran.attempts(0)[0]["turns"][0];
        let refused = turn["replays"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["fault"] == "connect-refused")
            .count();
        assert!(
            refused >= 1,
            "{api}: no refused connection replayed: {turn:#}"
        );
        assert_eq!(ran.step(0)["status"], "succeeded", "{api}");
    }
}

/// About 5 KB of prose: well over 512 tokens.
fn long_instructions() -> String {
    "Describe each part of the crate carefully and list every public function with its purpose. "
        .repeat(55)
}

// Issue 31, c: a request larger than a 512-token context is refused by the server; the attempt
// is terminal after exactly one request, recorded as context-exhausted.
#[test]
fn issue31_real_context_overflow_is_terminal_after_one_request() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 512, 1);
    for api in ["openai-chat", "anthropic-messages"] {
        let s = setup(server.port, api);
        let ran = run(
            &s,
            &format!(
                "name: big\nlimits:\n  timeoutMs: 300000\n  maxTurns: 3\n  maxOutputTokens: 64\nsteps:\n  - id: big\n    access: write\n    instructions: {}\n",
                long_instructions()
            ),
        );
        ran.expect_code(1);
        let attempts = ran.attempts(0);
        assert_eq!(attempts.len(), 1, "{api}: {:#}", ran.record);
        let turns = attempts[0]["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 1, "{api}");
        assert_eq!(turns[0]["providerRetries"], 0, "{api}: {:#}", turns[0]);
        assert_eq!(
            ran.step(0)["failure"]["category"],
            "context-exhausted",
            "{api}: {:#}",
            ran.step(0)
        );
        assert_eq!(attempts[0]["retryDecision"], "terminal", "{api}");
    }
}

// Issue 31, d: 8 fan-out instances at once against a server with 2 slots: the server queues
// them, and every instance succeeds. The array comes from a contract step under the grammar.
// Each instance is a contract step too, so the grammar ends every answer after a few tokens
// whatever the model would ramble (a 135M model loops at temperature 0 on some prompts), and
// the attempt timer is long, so that the last queued instance has time on a busy machine.
#[test]
fn issue31_real_fan_out_of_8_against_2_slots() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 1024, 2);
    let s = setup(server.port, "openai-chat");
    let ran = run(
        &s,
        "name: fan\nlimits:\n  timeoutMs: 900000\n  maxTurns: 3\n  maxOutputTokens: 96\nsteps:\n  - id: names\n    access: read-only\n    instructions: List eight fruits.\n    contract:\n      schema:\n        type: object\n        required: [items]\n        additionalProperties: false\n        properties:\n          items: {type: array, minItems: 8, maxItems: 8, items: {type: string, maxLength: 12}}\n  - id: hello\n    access: read-only\n    forEach: steps.names.output.items\n    concurrency: 8\n    instructions: Name the colour of {{item}}.\n    contract:\n      schema:\n        type: object\n        required: [colour]\n        additionalProperties: false\n        properties:\n          colour: {type: string, maxLength: 12}\n",
    );
    ran.expect_code(0);
    let instances: Vec<&Value> = ran.record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|st| st["forEach"]["step"] == "hello")
        .collect();
    assert_eq!(instances.len(), 8, "{:#}", ran.record);
    for i in instances {
        assert_eq!(i["status"], "succeeded", "{i:#}");
    }
}

/// Whether the server's slot has decoded at least one token of an answer (`GET /slots`).
fn decoding(port: u16) -> bool {
    let Some(reply) = http_get(port, "/slots") else {
        return false;
    };
    let Some(body) = reply.split("\r\n\r\n").nth(1) else {
        return false;
    };
    let Ok(Value::Array(slots)) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    slots.iter().any(|s| {
        s["is_processing"] == true
            && s["next_token"][0]["n_decoded"]
                .as_u64()
                .is_some_and(|n| n >= 1)
    })
}

// Issue 31, e: the server is killed with SIGKILL while it streams the answer, and restarted
// on the same port: the broken stream fails the attempt (or is replayed, had nothing been
// published), and the step retries and succeeds. The schema's minLength makes the answer long
// enough to be killed in the middle of.
#[test]
fn issue31_real_server_killed_mid_stream_and_restarted() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Llama::start(&dir, free_port(), 1024, 1);
    let s = setup(server.port, "openai-chat");
    let mut child = spawn_run(
        &s,
        "name: story\nlimits:\n  timeoutMs: 300000\n  maxTurns: 3\n  maxOutputTokens: 160\nsteps:\n  - id: story\n    access: read-only\n    instructions: Write a short story about a lighthouse keeper.\n    contract:\n      schema:\n        type: object\n        required: [story]\n        additionalProperties: false\n        properties:\n          story: {type: string, minLength: 150, maxLength: 300}\n",
    );
    let end = Instant::now() + RUN_LIMIT;
    while !decoding(server.port) {
        assert!(Instant::now() < end, "the server never started the answer");
        if child.try_wait().unwrap().is_some() {
            let ran = finish_run(&s, child);
            panic!("the run ended before the kill: {:#}", ran.record);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill_and_restart();
    let ran = finish_run(&s, child);
    ran.expect_code(0);
    let attempts = ran.attempts(0);
    let first = &attempts[0];
    let replayed = first["turns"][0]["replays"]
        .as_array()
        .is_some_and(|r| !r.is_empty());
    eprintln!(
        "killed mid-stream: {} attempts; the first {} ({})",
        attempts.len(),
        first["status"],
        first["code"]
    );
    assert!(
        attempts.len() >= 2 || replayed,
        "the kill left no trace: {:#}",
        ran.record
    );
    if attempts.len() >= 2 {
        assert_eq!(first["status"], "failed", "{first:#}");
        assert_eq!(first["retryDecision"], "scheduled", "{first:#}");
    }
    assert_eq!(ran.step(0)["status"], "succeeded");
}

/// `doctor --probe --json` on `s`, checked to pass; its `probe` object.
fn probe_json(s: &Setup) -> Value {
    let out = wait_output(
        s.docsfab()
            .args(["doctor", "--probe", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        "doctor --probe",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["probe"].clone()
}

// Issue 31, f: what the probe finds on this server and model. Observed: the chat template
// drops `tools` on both APIs, the schema holds on openai-chat (a grammar) and is ignored on
// the Anthropic endpoint, and both report usage.
#[test]
fn issue31_real_probe_reports_the_servers_capabilities() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 1024, 1);
    for (api, structured) in [("openai-chat", true), ("anthropic-messages", false)] {
        let p = probe_json(&setup(server.port, api));
        assert_eq!(p["result"], "answered", "{api}: {p:#}");
        assert_eq!(p["requests"], 3, "{api}");
        let caps = &p["capabilities"];
        assert_eq!(caps["tools"], false, "{api}: {caps}");
        assert_eq!(caps["structuredOutput"], structured, "{api}: {caps}");
        assert_eq!(caps["streamUsage"], true, "{api}: {caps}");
    }
}

// Issue 32: the wiki `docsfab new wiki` writes, on a real model behind a real server. A 135M
// model proves mechanics, not prose: whatever it answers, either the run succeeded and every
// page on disk is grounded (`check-docs` agrees), or it failed and no page reached the tree.
// The limits are cut down so the test stays short, and the map's lists bounded so that a small
// model's answer fits them; the steps are the template's.
#[test]
fn issue32_real_wiki_puts_only_grounded_pages_on_disk() {
    let Some(dir) = installed() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Llama::start(&dir, free_port(), 4096, 1);
    let s = setup(server.port, "openai-chat");
    let ws = s.workspace();
    std::fs::write(ws.join("src/lib.rs"), "pub mod count;\npub mod report;\n").unwrap();
    std::fs::write(
        ws.join("src/report.rs"),
        "pub fn report(n: usize) -> String {\n    format!(\"{n} words\")\n}\n",
    )
    .unwrap();
    let comp = s.home().join("wiki.yaml");
    let out = s
        .docsfab()
        .args(["new", "wiki", "--output", comp.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let wiki = std::fs::read_to_string(&comp).unwrap();
    let small = wiki
        .replace("timeoutMs: 300000", "timeoutMs: 180000")
        .replace("maxTurns: 16", "maxTurns: 3")
        .replace("maxOutputTokens: 8192", "maxOutputTokens: 384")
        // Few and short, so a small model's answer fits the cut-down output limit.
        .replace("maxItems: 40", "maxItems: 2")
        .replace(
            "sources: {type: array, items: {type: string}}",
            "sources: {type: array, maxItems: 2, items: {type: string, maxLength: 24}}",
        );
    assert_ne!(small, wiki, "the template's limits moved; update this test");
    std::fs::write(&comp, small).unwrap();
    let child = s
        .run_command(&comp)
        .env("DOCSFAB_READ_ONLY_MAX_RETRIES", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ran = finish_run(&s, child);
    let steps = ran.record["steps"].as_array().unwrap();
    eprintln!(
        "real wiki: exit {:?}, truthfulness {}, steps {:?}",
        ran.code,
        ran.record["truthfulness"],
        steps
            .iter()
            .map(|st| format!(
                "{} {} {}",
                st["stepId"], st["status"], st["failure"]["code"]
            ))
            .collect::<Vec<_>>()
    );
    let pages = ws.join("docs/wiki");
    match ran.code {
        Some(0) => {
            let check = s
                .docsfab()
                .args(["check-docs", "docs/wiki", "--workspace", "."])
                .current_dir(&ws)
                .output()
                .unwrap();
            assert_eq!(check.status.code(), Some(0), "{}", text(&check.stdout));
            let write = steps.iter().find(|st| st["stepId"] == "write").unwrap();
            assert_eq!(write["attempts"][0]["turns"], serde_json::json!([]));
        }
        Some(1) => {
            assert!(
                !pages.exists(),
                "a failed run left pages on disk: {:#}",
                ran.record
            );
            let failed = steps.iter().find(|st| st["status"] == "failed").unwrap();
            if failed["failure"]["code"] == "contract-ungrounded" {
                let last = failed["attempts"].as_array().unwrap().last().unwrap();
                let unknown = last["grounding"]["unknown"].as_array().unwrap();
                assert!(!unknown.is_empty(), "{failed:#}");
                assert!(
                    failed["failure"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(unknown[0]["text"].as_str().unwrap())),
                    "the failure names the unknowns: {failed:#}"
                );
            }
        }
        other => panic!("exit {other:?}: {}", ran.stderr),
    }
}
