//! Shared by the route tests: a host directory pointing at an in-process simulator, the
//! `docsfab route serve` process in front of it, and a raw HTTP/1.1 client that times the first
//! byte of each response.

#![allow(dead_code)] // each test file uses a different part

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use docsfab_sim::{Scenario, SimServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The variable host.yaml names for the key. Not `DOCSFAB_*`: those are docsfab's own settings.
pub const KEY_VAR: &str = "ROUTE_TEST_API_KEY";
/// The host's key value. No known key shape, so only the host-secret scan can find it.
pub const KEY: &str = "routekey-5f2b9c1d7e3a8h4q";
/// The composition's selected model.
pub const MODEL: &str = "sel-model";

pub struct Setup {
    pub dir: tempfile::TempDir,
    pub sim: SimServer,
    pub route: Child,
    /// `127.0.0.1:PORT` of the route.
    pub addr: String,
}

impl Setup {
    /// A route for a provider of `api` (`openai-chat` or `anthropic-messages`) in front of a
    /// simulator playing `scenario`, with replay waits lowered (5 ms base, 20 ms cap).
    pub async fn start(api: &str, scenario: &str) -> Setup {
        Setup::start_with(api, scenario, &[]).await
    }

    /// [`Setup::start`] with more `route serve` arguments (the serving limits).
    pub async fn start_with(api: &str, scenario: &str, args: &[&str]) -> Setup {
        let sim = SimServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Scenario::from_yaml_str(scenario, "test").unwrap(),
            None,
        )
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("host.yaml"),
            format!(
                "providers:\n  default:\n    api: {api}\n    baseUrl: {}\n    apiKeyEnv: {KEY_VAR}\n    model: {MODEL}\ncatalog:\n  providerAttempt.baseDelayMs: 5\n  providerAttempt.maxDelayMs: 20\n  providerAttempt.maxTotalDelayMs: 1000\n",
                sim.base_url()
            ),
        )
        .unwrap();
        let composition = write_composition(dir.path());
        let mut route = docsfab()
            .args(["route", "serve", "--listen", "127.0.0.1:0", "--composition"])
            .arg(&composition)
            .args(args)
            .env("DOCSFAB_HOME", dir.path())
            .env(KEY_VAR, KEY)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("route.stderr")).unwrap())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(route.stdout.take().unwrap())
            .read_line(&mut first)
            .await
            .unwrap();
        let addr = first
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.strip_suffix("/v1"))
            .unwrap_or_else(|| panic!("unexpected first line: {first:?} ({})", stderr_of(&dir)))
            .to_owned();
        Setup {
            dir,
            sim,
            route,
            addr,
        }
    }

    pub async fn post(&self, path: &str, body: &str) -> HttpReply {
        post(&self.addr, path, body).await
    }

    /// What the route wrote on stderr so far.
    pub fn stderr(&self) -> String {
        stderr_of(&self.dir)
    }
}

fn stderr_of(dir: &tempfile::TempDir) -> String {
    std::fs::read_to_string(dir.path().join("route.stderr")).unwrap_or_default()
}

pub fn docsfab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_docsfab"));
    c.kill_on_drop(true);
    c
}

pub fn write_composition(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("composition.yaml");
    std::fs::write(
        &path,
        "name: route-test\nprovider: default\nlimits:\n  timeoutMs: 60000\n  maxTurns: 4\n  maxOutputTokens: 256\n  sourceReadBytes: 65536\nsteps:\n  - id: outline\n    access: read-only\n    instructions: Survey the code.\n    tools: [list_files]\n    contract:\n      schema:\n        type: object\n",
    )
    .unwrap();
    path
}

/// A streaming request body for `api` naming a model other than the selected one.
pub fn request(api: &str) -> String {
    match api {
        "openai-chat" => r#"{"model":"client-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#.to_owned(),
        _ => r#"{"model":"client-model","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#.to_owned(),
    }
}

pub fn path_of(api: &str) -> &'static str {
    match api {
        "openai-chat" => "/v1/chat/completions",
        _ => "/v1/messages",
    }
}

#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
    /// From the end of the request to the first response byte.
    pub first_byte: Duration,
    /// From the end of the request to the end of the response.
    pub total: Duration,
}

impl HttpReply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

/// One POST with `connection: close`, read to the end. Handles content-length and chunked
/// bodies (the simulator streams chunked; the route answers with a content-length).
pub async fn post(addr: &str, path: &str, body: &str) -> HttpReply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let sent = Instant::now();
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let mut first_byte = None;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("the response did not end within 30 s")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        first_byte.get_or_insert_with(|| sent.elapsed());
        raw.extend_from_slice(&buf[..n]);
    }
    let total = sent.elapsed();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let rest = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    HttpReply {
        status,
        head,
        body,
        first_byte: first_byte.unwrap_or(total),
        total,
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&rest[..end])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap_or(0);
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            out.extend_from_slice(&rest[..size.min(rest.len())]);
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    out
}
