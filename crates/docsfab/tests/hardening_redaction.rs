//! Issue 9, findings 1 and 2: a canary key planted in every provider error path of both APIs
//! must not come out anywhere, and provider text must reach the terminal as one safe line.
//!
//! Real processes throughout: `docsfab sim serve` plays the hostile provider, `docsfab run`
//! talks to it with the canary as its API key, and the test reads what a person or a tool could
//! read afterwards: the run's stdout and stderr, `runs show` (text and `--json`), `runs list`
//! (text and `--json`), and the raw bytes of `runs.db` and `runs.db-wal`. One more case goes
//! through `docsfab route serve`.
//!
//! Two canaries: a short one (removed whole) and a 160-character one, of which no 16-character
//! piece may survive (a provider that cuts the key at 64 characters used to leak the first 64).
//! Neither has a known key shape, so only the host-key redaction can find them.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};

use support::run::{FAST_CATALOG, KEY_VAR, ONE_STEP, Sim, docsfab_at, looks_like_run_id};

/// Shorter than a key piece: redacted whole.
const SHORT_CANARY: &str = "CnryK3y-7h2Qx9";

/// The cap of one redacted line (docsfab_boundary::redact::DEFAULT_MAX_CHARS).
const LINE_CAP: usize = docsfab_boundary::redact::DEFAULT_MAX_CHARS;

/// 160 random-looking letters and digits with no known key prefix.
fn long_canary() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..160)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// What must never appear: the key whole, and every 16-character piece of a longer key.
fn pieces(key: &str) -> Vec<&str> {
    if key.len() < 16 {
        vec![key]
    } else {
        (0..=key.len() - 16).map(|i| &key[i..i + 16]).collect()
    }
}

/// Where `hay` holds the key or a piece of it, as one line naming `what` and the offset.
fn key_in(what: &str, hay: &[u8], key: &str) -> Option<String> {
    pieces(key).into_iter().find_map(|piece| {
        let at = hay
            .windows(piece.len())
            .position(|w| w == piece.as_bytes())?;
        let from = at.saturating_sub(60);
        let to = (at + 60).min(hay.len());
        Some(format!(
            "{what}: a piece of the canary at byte {at}: {:?}",
            String::from_utf8_lossy(&hay[from..to])
        ))
    })
}

/// Where `text` holds a terminal escape or another control byte (a line feed is one of
/// docsfab's own line breaks).
fn control_in(what: &str, text: &[u8]) -> Option<String> {
    let at = text
        .iter()
        .position(|b| *b == 0x7f || (*b < 0x20 && *b != b'\n'))?;
    Some(format!(
        "{what}: control byte {:#04x} at byte {at}",
        text[at]
    ))
}

/// Every problem found, so one failing run lists every path that leaks, not only the first.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, p: Option<String>) {
        self.0.extend(p);
    }

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn assert_none(self) {
        assert!(
            self.0.is_empty(),
            "{} problem(s):\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A provider error object with the key in its type, code and message, in the API's shape.
fn error_body(api: &str, key: &str) -> String {
    match api {
        "openai-chat" => {
            format!(
                r#"{{"error":{{"message":"bad key {key}","type":"{key}","code":"{key}","param":"{key}"}}}}"#
            )
        }
        _ => format!(
            r#"{{"type":"error","error":{{"type":"{key}","code":"{key}","message":"bad key {key}"}}}}"#
        ),
    }
}

/// The provider error paths, as (name, scenario). Every one names the key somewhere the
/// provider chooses.
fn scenarios(api: &str, key: &str) -> Vec<(&'static str, String)> {
    let body = error_body(api, key);
    let part = if key.len() >= 16 { &key[20..60] } else { key };
    // 20,000 characters of terminal escapes, line breaks and a forged log line, then the key.
    let hostile = format!(
        "\u{1b}[2J\u{1b}[31mFORGED\r\nstep outline succeeded\n{}{key}",
        "A".repeat(20_000)
    );
    let hostile = serde_json::to_string(&hostile).unwrap();
    let esc_path = serde_json::to_string("\u{1b}[2J../x\r\nstep outline succeeded").unwrap();
    let esc_name = serde_json::to_string("\u{1b}]0;title\u{7}read\u{202e}").unwrap();
    vec![
        (
            "http-400-json-body",
            format!("responses:\n  - status: 400\n    body: '{body}'\n"),
        ),
        (
            "http-503-json-body",
            format!("responses:\n  - status: 503\n    body: '{body}'\nfallback: repeat-last\n"),
        ),
        (
            "http-429-headers",
            format!(
                "responses:\n  - status: 429\n    body: '{body}'\n    headers: {{retry-after: {key}, retry-after-ms: {key}, x-request-id: {key}, www-authenticate: 'Bearer {key}'}}\nfallback: repeat-last\n"
            ),
        ),
        (
            "http-401-plain-text",
            format!(
                "responses:\n  - status: 401\n    body: 'invalid api key {key}'\n    headers: {{content-type: text/plain}}\n"
            ),
        ),
        (
            "json-200-error-body",
            format!(
                "responses:\n  - status: 200\n    body: '{body}'\n    headers: {{content-type: application/json}}\n"
            ),
        ),
        (
            "error-event-before-content",
            format!(
                "responses:\n  - stream_error: {{type: {key}, code: {key}, message: 'bad key {key}'}}\n"
            ),
        ),
        (
            "error-event-after-content",
            format!(
                "responses:\n  - answer:\n      text: 'partial answer'\n      error_event: {{type: {key}, code: {key}, message: 'bad key {key}'}}\n"
            ),
        ),
        (
            "error-event-400",
            format!(
                "responses:\n  - stream_error: {{type: {key}, code: 400, message: 'bad key {key}'}}\n"
            ),
        ),
        (
            "model-name",
            format!("responses:\n  - answer: {{json: {{modules: [lib]}}, model: {key}}}\n"),
        ),
        (
            "tool-arguments",
            // The key (or a 40-character piece of the long one) in tool call ids, names and
            // paths: the response boundary refuses the turn before any tool runs.
            format!(
                "responses:\n  - answer:\n      tool_calls:\n        - {{id: {part}, name: read_file, arguments: {{path: {part}}}}}\n        - {{name: read_file, arguments: {{path: '../{part}/x'}}}}\n        - {{name: {part}, arguments: {{path: src}}}}\n        - {{name: list_files, arguments: {{path: '/{part}'}}}}\n  - answer: {{json: {{modules: [lib]}}}}\n"
            ),
        ),
        (
            // Terminal escapes and line breaks in a tool name and paths, echoed into the refusal
            // details the record keeps; the run goes on and answers.
            "tool-arguments-escapes",
            format!(
                "responses:\n  - answer:\n      tool_calls:\n        - {{name: read_file, arguments: {{path: {esc_path}}}}}\n        - {{name: {esc_name}, arguments: {{path: src}}}}\n  - answer: {{json: {{modules: [lib]}}}}\n"
            ),
        ),
        (
            // A piece of the key in the answer itself: the boundary refuses it, so it is never
            // used as the step's output or stored.
            "answer-content",
            format!("responses:\n  - answer: {{json: {{modules: [lib, '{part}']}}}}\n"),
        ),
        (
            "escape-injection",
            format!("responses:\n  - stream_error: {{type: {hostile}, code: 400}}\n"),
        ),
    ]
}

/// A home shared by every case of one API and key, so `runs list` and the database hold them all.
struct Home {
    dir: tempfile::TempDir,
    api: &'static str,
    key: String,
}

impl Home {
    fn new(api: &'static str, key: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(dir.path().join("ws/src")).unwrap();
        std::fs::write(dir.path().join("ws/src/lib.rs"), "pub mod count;\n").unwrap();
        std::fs::write(dir.path().join("ws/src/count.rs"), "pub fn n() {}\n").unwrap();
        std::fs::write(dir.path().join("composition.yaml"), ONE_STEP).unwrap();
        Home {
            dir,
            api,
            key: key.to_owned(),
        }
    }

    fn home(&self) -> std::path::PathBuf {
        self.dir.path().join("home")
    }

    fn docsfab(&self) -> Command {
        let mut cmd = docsfab_at(&self.home());
        cmd.env(KEY_VAR, &self.key)
            .env("DOCSFAB_RETRY_BASE_DELAY_MS", "20");
        cmd
    }

    /// Points host.yaml at `sim` (waits lowered, one transport retry) and runs the composition.
    fn run_against(&self, sim: &Sim) -> Output {
        std::fs::write(
            self.home().join("host.yaml"),
            format!(
                "providers:\n  default:\n    api: {}\n    baseUrl: {}\n    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n{FAST_CATALOG}  retry.maxTransportRetries: 1\n",
                self.api, sim.base_url
            ),
        )
        .unwrap();
        self.docsfab()
            .arg("run")
            .arg(self.dir.path().join("composition.yaml"))
            .arg("--workspace")
            .arg(self.dir.path().join("ws"))
            .output()
            .unwrap()
    }

    fn cli(&self, args: &[&str]) -> Vec<u8> {
        let out = self.docsfab().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "docsfab {args:?}: {}",
            text(&out.stderr)
        );
        out.stdout
    }
}

/// Every case of one API with one key, then everything a person could read afterwards.
fn canary(api: &'static str, key: &str) {
    let h = Home::new(api, key);
    let mut p = Problems::default();
    let mut ids = Vec::new();
    for (name, scenario) in scenarios(api, key) {
        let case_dir = h.dir.path().join(name);
        std::fs::create_dir_all(&case_dir).unwrap();
        let sim = Sim::start(&case_dir, &scenario);
        let out = h.run_against(&sim);
        let (stdout, stderr) = (&out.stdout, &out.stderr);
        let what = format!("{api} {name}");
        // Every case is a failure docsfab reports, except the tool round trip with escapes,
        // which answers.
        let expected = if name == "tool-arguments-escapes" {
            0
        } else {
            1
        };
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{what}: {}\n{}",
            text(stdout),
            text(stderr)
        );
        p.add(key_in(&format!("{what}: stdout"), stdout, key));
        p.add(key_in(&format!("{what}: stderr"), stderr, key));
        p.add(control_in(&format!("{what}: stdout"), stdout));
        p.add(control_in(&format!("{what}: stderr"), stderr));
        let id = text(stdout).lines().next().unwrap_or_default().to_owned();
        assert!(looks_like_run_id(&id), "{what}: first line {id:?}");

        let shown = h.cli(&["runs", "show", &id]);
        p.add(key_in(&format!("{what}: runs show"), &shown, key));
        p.add(control_in(&format!("{what}: runs show"), &shown));
        let json = h.cli(&["runs", "show", &id, "--json"]);
        p.add(key_in(&format!("{what}: runs show --json"), &json, key));
        let record: serde_json::Value = serde_json::from_slice(&json).unwrap();
        check_recorded_text(&mut p, &what, &record);
        check_stderr_of_the_case(&mut p, &what, name, stderr);
        ids.push(id);
    }
    let listed = h.cli(&["runs", "list"]);
    p.add(key_in("runs list", &listed, key));
    let listed = h.cli(&["runs", "list", "--json"]);
    p.add(key_in("runs list --json", &listed, key));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&listed)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        ids.len()
    );
    for file in ["runs.db", "runs.db-wal"] {
        if let Ok(bytes) = std::fs::read(h.home().join(file)) {
            p.add(key_in(&format!("{api}: {file}"), &bytes, key));
        }
    }
    p.assert_none();
}

/// The record's lines (an attempt's message and lease evidence) are each one capped line, and
/// its tool calls' id, tool and detail keep no control character.
fn check_recorded_text(p: &mut Problems, what: &str, record: &serde_json::Value) {
    for attempt in record["steps"][0]["attempts"].as_array().unwrap() {
        for line in [&attempt["message"], &attempt["lease"]["evidence"]] {
            let Some(t) = line.as_str() else { continue };
            let n = t.chars().count();
            p.check(n <= LINE_CAP, || {
                format!("{what}: a recorded line of {n} characters")
            });
            p.check(!t.contains(['\u{1b}', '\r', '\n']), || {
                format!("{what}: a recorded line with a control character")
            });
        }
    }
    for call in record["steps"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["turns"].as_array().unwrap())
        .flat_map(|t| {
            t["toolBatch"]["calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
    {
        for field in ["id", "tool", "detail"] {
            let Some(t) = call[field].as_str() else {
                continue;
            };
            p.check(!t.chars().any(char::is_control), || {
                format!("{what}: tool call {field} {t:?} keeps a control character")
            });
        }
    }
}

/// What a case's own stderr must show: the escape injection escaped and no line it forged; the
/// 400's error type redacted.
fn check_stderr_of_the_case(p: &mut Problems, what: &str, name: &str, stderr: &[u8]) {
    if name == "escape-injection" {
        let lines = text(stderr);
        p.check(
            !lines
                .lines()
                .any(|l| l.starts_with("step outline succeeded")),
            || format!("{what}: a forged line reached stderr"),
        );
        p.check(lines.contains("\\u{1b}[2J"), || {
            format!("{what}: the escape is not shown escaped")
        });
    }
    if name == "http-400-json-body" {
        p.check(
            text(stderr).contains("HTTP 400, error type <redacted>"),
            || format!("{what}: stderr does not say the type was redacted"),
        );
    }
}

#[test]
fn hardening_key_leak_openai_short_canary_appears_nowhere() {
    canary("openai-chat", SHORT_CANARY);
}

#[test]
fn hardening_key_leak_openai_long_canary_leaves_no_16_character_piece() {
    canary("openai-chat", &long_canary());
}

#[test]
fn hardening_key_leak_anthropic_short_canary_appears_nowhere() {
    canary("anthropic-messages", SHORT_CANARY);
}

#[test]
fn hardening_key_leak_anthropic_long_canary_leaves_no_16_character_piece() {
    canary("anthropic-messages", &long_canary());
}

/// The composition route: a provider error type holding the long canary comes back to the
/// client, and into the route's log, redacted (the route and the runtime share one redactor).
#[test]
fn hardening_key_leak_route_serve_redacts_the_long_canary() {
    let key = long_canary();
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        &format!(
            "responses:\n  - status: 400\n    body: '{}'\n",
            error_body("openai-chat", &key)
        ),
    );
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("host.yaml"),
        format!(
            "providers:\n  default:\n    api: openai-chat\n    baseUrl: {}\n    apiKeyEnv: {KEY_VAR}\n    model: sim-model\n{FAST_CATALOG}",
            sim.base_url
        ),
    )
    .unwrap();
    let composition = tmp.path().join("composition.yaml");
    std::fs::write(&composition, ONE_STEP).unwrap();
    let stderr_path = tmp.path().join("route.stderr");
    let mut route = docsfab_at(&home)
        .env(KEY_VAR, &key)
        .args(["route", "serve", "--listen", "127.0.0.1:0", "--composition"])
        .arg(&composition)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(route.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .and_then(|a| a.strip_suffix("/v1"))
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();

    let body =
        r#"{"model":"client-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let _ = route.kill();
    let _ = route.wait();

    let reply_text = text(&reply);
    assert!(reply_text.starts_with("HTTP/1.1 400"), "{reply_text}");
    let log = std::fs::read(&stderr_path).unwrap();
    assert!(
        text(&log).contains("400"),
        "the route logged the request: {}",
        text(&log)
    );
    let mut p = Problems::default();
    p.add(key_in("route reply", &reply, &key));
    let body = reply_text.split("\r\n\r\n").nth(1).unwrap_or_default();
    p.add(control_in("route reply body", body.as_bytes()));
    p.add(key_in("route log", &log, &key));
    p.assert_none();
}

/// The canaries themselves are what the test says they are.
#[test]
fn the_canaries_are_short_and_160_characters() {
    assert!(SHORT_CANARY.len() < 16);
    assert_eq!(long_canary().len(), 160);
    assert!(long_canary().bytes().all(|b| b.is_ascii_alphanumeric()));
}
