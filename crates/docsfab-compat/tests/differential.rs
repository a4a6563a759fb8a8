//! Differential test of the response boundary against real stream consumers (BND-6, BND-9 and
//! the rest of BND-1..9 as the corpus exercises them).
//!
//! Every body of the boundary corpus (`crates/docsfab-boundary/tests/corpus`) and of our own
//! additions (`tests/cases`) is served verbatim by a raw HTTP/1.1 server on 127.0.0.1, split into
//! the reads its manifest names, and read by each real consumer through `compat/`: the Python
//! `openai` and `anthropic` SDKs, the Node `openai` SDK and pi-ai (both APIs). For every case and
//! client the test checks:
//!
//! (a) every chunk or event the client delivered comes from data the boundary inspected, whatever
//!     the verdict (a client that reads a line the boundary skipped would let unchecked output
//!     through);
//! (b) every body the boundary passes is read by the client as the boundary reads it: the same
//!     chunks and the same ending (an error only where an error event or error chunk is in the
//!     stream), unless the client skipped data the boundary read, which is recorded as a fact
//!     (the boundary reads more, as BND-6 allows) rather than a failure. Differences that are
//!     understood are listed in `KNOWN` with their reason, and must keep occurring.
//!
//! The same client output is also compared against weakened readings (BOM lines ignored, an
//! unterminated last line dropped): real clients must expose each, which shows the comparison
//! would notice a boundary that reads less than a consumer.
//!
//! The boundary does not expose the lines it inspected, so they are rebuilt with
//! `docsfab_boundary::SseDecoder`, which shares the boundary's line splitter and BOM rule.
//!
//! The clients are installed by `compat/install.sh` (run here, idempotent, under a lock); when
//! that fails the test fails. `DOCSFAB_COMPAT_WRITE_DOCS=1` rewrites the results table in
//! `docs/compat-results.md` from this run.

use docsfab_boundary::{
    BOM, BoundaryConfig, LineSplitter, Pass, Secret, SseDecoder, SseEvent, Verdict,
};
use docsfab_compat::{compat_dir, install_clients, repo_root};
use docsfab_record::Api;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Pause between two reads of a split body, so the client's socket sees them as separate reads.
const READ_GAP: Duration = Duration::from_millis(20);
/// A whole client batch must finish within this; a hung client fails the test instead.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Cases

struct Case {
    name: String,
    /// `source/name`: names are unique within one manifest only.
    key: String,
    source: &'static str,
    api: Api,
    model: String,
    expect: String,
    body: Vec<u8>,
    reads: Vec<usize>,
    close_delimited: bool,
    config: BoundaryConfig,
}

fn api_name(api: Api) -> &'static str {
    match api {
        Api::OpenaiChat => "openai-chat",
        Api::AnthropicMessages => "anthropic-messages",
    }
}

fn load_cases(dir: &Path, source: &'static str) -> Vec<Case> {
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
    )
    .expect("manifest is JSON");
    let str_of = |c: &Value, k: &str| c[k].as_str().map(str::to_owned);
    manifest["cases"]
        .as_array()
        .expect("manifest has cases")
        .iter()
        .map(|c| {
            let name = str_of(c, "name").expect("case name");
            let api = match c["api"].as_str() {
                Some("openai-chat") => Api::OpenaiChat,
                Some("anthropic-messages") => Api::AnthropicMessages,
                other => panic!("{name}: unknown api {other:?}"),
            };
            let secrets: Vec<Secret> = c["secrets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    Secret::new(s["label"].as_str().unwrap(), s["value"].as_str().unwrap()).unwrap()
                })
                .collect();
            let model = str_of(c, "model").expect("model");
            let file = str_of(c, "file").expect("file");
            Case {
                source,
                api,
                expect: str_of(c, "expect").expect("expect"),
                body: std::fs::read(dir.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}")),
                reads: c["reads"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|n| n.as_u64().unwrap() as usize)
                    .collect(),
                close_delimited: c["framing"].as_str() == Some("close"),
                config: BoundaryConfig::new(api, &model, &secrets).unwrap(),
                model,
                key: format!("{source}/{name}"),
                name,
            }
        })
        .collect()
}

/// The body cut at the manifest's offsets, as the server writes it and the boundary reads it.
fn pieces(case: &Case) -> Vec<&[u8]> {
    let mut cuts: Vec<usize> = case
        .reads
        .iter()
        .map(|c| (*c).min(case.body.len()))
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts {
        out.push(&case.body[at..c]);
        at = c;
    }
    out.push(&case.body[at..]);
    out
}

// ---------------------------------------------------------------------------------------------
// What the boundary reads

struct BoundaryView {
    verdict: Verdict,
    /// Events as the boundary's line rules read them; the boundary inspects each of their data
    /// lines (until it refuses).
    events: Vec<SseEvent>,
}

fn boundary_view(case: &Case) -> BoundaryView {
    let whole = case.config.check(&case.body);
    let mut b = case.config.start();
    let mut decoder = SseDecoder::new();
    let mut events = Vec::new();
    for piece in pieces(case) {
        b.feed(piece);
        decoder.feed(piece, |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    let split = b.finish();
    assert_eq!(
        whole, split,
        "{}: verdict depends on the reads (BND-9)",
        case.name
    );
    let ok = match (case.expect.as_str(), &whole) {
        ("pass-stream", Verdict::Pass(Pass::Stream)) => true,
        ("pass-error-events-only", Verdict::Pass(Pass::ErrorEventsOnly)) => true,
        (want, Verdict::Refuse(r)) => want.strip_prefix("refuse:") == Some(r.reason.code()),
        _ => false,
    };
    assert!(
        ok,
        "{}: expected {}, boundary says {whole:?}",
        case.name, case.expect
    );
    BoundaryView {
        verdict: whole,
        events,
    }
}

fn verdict_label(v: &Verdict) -> String {
    match v {
        Verdict::Pass(Pass::Stream) => "pass".into(),
        Verdict::Pass(Pass::ErrorEventsOnly) => "pass (error events only)".into(),
        Verdict::Refuse(r) => format!("refuse: {}", r.reason.code()),
    }
}

/// Why a consumer stops on an event whose data (its lines joined) is not one JSON value.
const UNPARSABLE_EVENT: &str = "event whose joined data does not parse";

/// What a consumer that reads every line as the boundary does would deliver: each event's data
/// parsed as one JSON value, until the stream ends, an OpenAI stream's `[DONE]`, or an error
/// (an error event, an error chunk, or event data that does not parse, which every SDK raises
/// on). Anthropic `ping` events are keepalives that the SDKs skip by design.
struct Walk {
    items: Vec<Value>,
    error: Option<&'static str>,
}

fn walk(api: Api, events: &[SseEvent]) -> Walk {
    let mut items = Vec::new();
    for ev in events {
        let name = ev.event.as_deref();
        match api {
            Api::OpenaiChat if ev.data.starts_with("[DONE]") => break,
            Api::AnthropicMessages if name == Some("ping") => continue,
            Api::AnthropicMessages if name == Some("error") => {
                return Walk {
                    items,
                    error: Some("error event"),
                };
            }
            _ => {}
        }
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            return Walk {
                items,
                error: Some(UNPARSABLE_EVENT),
            };
        };
        let is_error = match api {
            Api::OpenaiChat => v.get("error").is_some_and(|e| !e.is_null()),
            Api::AnthropicMessages => v["type"] == "error",
        };
        if is_error {
            return Walk {
                items,
                error: Some("error chunk"),
            };
        }
        items.push(v);
    }
    Walk { items, error: None }
}

/// Every JSON value the boundary's reading holds: each data line alone and each event's data
/// joined (a consumer joins multi-line data; the boundary inspected every line of it).
fn inspected_values(events: &[SseEvent]) -> Vec<Value> {
    let mut out = Vec::new();
    for ev in events {
        for line in &ev.data_lines {
            if let Ok(v) = serde_json::from_str(line) {
                out.push(v);
            }
        }
        if ev.data_lines.len() > 1
            && let Ok(v) = serde_json::from_str(&ev.data)
        {
            out.push(v);
        }
    }
    out
}

/// `got` is `want` as a consumer may present it: every member it has is in `want` with the same
/// value (SDK objects may leave members out, never add or change them).
fn contained(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => g
            .iter()
            .all(|(k, v)| w.get(k).is_some_and(|wv| contained(v, wv))),
        (Value::Array(g), Value::Array(w)) => {
            g.len() == w.len() && g.iter().zip(w).all(|(a, b)| contained(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => got == want,
    }
}

fn string_leaves<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| string_leaves(x, out)),
        Value::Object(o) => o.values().for_each(|x| string_leaves(x, out)),
        _ => {}
    }
}

/// The text pieces a walk item carries, in the form pi-ai delivers them as deltas.
fn deltas_of(api: Api, item: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match api {
        Api::OpenaiChat => {
            for choice in item["choices"].as_array().into_iter().flatten() {
                let d = &choice["delta"];
                for k in ["content", "reasoning_content", "reasoning"] {
                    if let Some(s) = d[k].as_str().filter(|s| !s.is_empty()) {
                        out.push(s.to_owned());
                    }
                }
            }
        }
        Api::AnthropicMessages => {
            if item["type"] == "content_block_delta" {
                for k in ["text", "thinking", "partial_json"] {
                    if let Some(s) = item["delta"][k].as_str().filter(|s| !s.is_empty()) {
                        out.push(s.to_owned());
                    }
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The server: one corpus body per request, verbatim, in the case's reads

async fn serve(listener: TcpListener, cases: Arc<HashMap<String, Arc<Case>>>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        let cases = cases.clone();
        tokio::spawn(async move {
            // A client that hangs up early is its own result; nothing to do here.
            let _ = answer(sock, &cases).await;
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn answer(mut sock: TcpStream, cases: &HashMap<String, Arc<Case>>) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    // Read the request body so closing the socket never resets it under the client.
    while buf.len() < head_end + length {
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let case = path.strip_prefix("/case/").and_then(|p| {
        let mut parts = p.splitn(3, '/');
        cases.get(&format!("{}/{}", parts.next()?, parts.next()?))
    });
    let Some(case) = case else {
        let msg = format!("no case for {path}");
        let resp = format!(
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{msg}",
            msg.len()
        );
        sock.write_all(resp.as_bytes()).await?;
        return sock.shutdown().await;
    };
    let framing = if case.close_delimited {
        ""
    } else {
        "transfer-encoding: chunked\r\n"
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n{framing}connection: close\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await?;
    let pieces = pieces(case);
    let last = pieces.len() - 1;
    for (i, piece) in pieces.into_iter().enumerate() {
        if !piece.is_empty() {
            if case.close_delimited {
                sock.write_all(piece).await?;
            } else {
                let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                chunk.extend_from_slice(piece);
                chunk.extend_from_slice(b"\r\n");
                sock.write_all(&chunk).await?;
            }
            sock.flush().await?;
        }
        if i < last {
            tokio::time::sleep(READ_GAP).await;
        }
    }
    if !case.close_delimited {
        sock.write_all(b"0\r\n\r\n").await?;
    }
    sock.shutdown().await
}

// ---------------------------------------------------------------------------------------------
// The clients

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Client {
    PyOpenai,
    NodeOpenai,
    PiOpenai,
    PyAnthropic,
    PiAnthropic,
}

impl Client {
    const ALL: [Client; 5] = [
        Client::PyOpenai,
        Client::NodeOpenai,
        Client::PiOpenai,
        Client::PyAnthropic,
        Client::PiAnthropic,
    ];

    /// The name the client scripts put in their output.
    fn name(self) -> &'static str {
        match self {
            Client::PyOpenai => "py-openai",
            Client::NodeOpenai => "node-openai",
            Client::PiOpenai => "pi-openai-chat",
            Client::PyAnthropic => "py-anthropic",
            Client::PiAnthropic => "pi-anthropic-messages",
        }
    }

    fn api(self) -> Api {
        match self {
            Client::PyOpenai | Client::NodeOpenai | Client::PiOpenai => Api::OpenaiChat,
            Client::PyAnthropic | Client::PiAnthropic => Api::AnthropicMessages,
        }
    }

    fn is_pi(self) -> bool {
        matches!(self, Client::PiOpenai | Client::PiAnthropic)
    }

    fn command(self, root: &Path) -> tokio::process::Command {
        let compat = compat_dir(root);
        let mut cmd = match self {
            Client::PyOpenai | Client::PyAnthropic => {
                let mut c = tokio::process::Command::new(compat.join("venv/bin/python"));
                c.args(["-W", "ignore"])
                    .arg(root.join("compat/py_client.py"));
                c
            }
            Client::NodeOpenai | Client::PiOpenai | Client::PiAnthropic => {
                let mut c = tokio::process::Command::new("node");
                c.arg(root.join("compat/node_client.mjs")).args([
                    "--client",
                    if self.is_pi() { "pi" } else { "node-openai" },
                    "--node-dir",
                ]);
                c.arg(compat.join("node"));
                c
            }
        };
        cmd.arg("--batch");
        // Loopback only: no proxy from the environment may sit between client and server.
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// Runs one client over every case of its API in one process (starting an interpreter per
/// request would cost more than all the requests), returning its output lines.
async fn run_client(client: Client, root: PathBuf, port: u16, cases: Vec<Arc<Case>>) -> Vec<Value> {
    let mut requests = String::new();
    for case in &cases {
        let base_url = match client.api() {
            // The Anthropic SDKs append /v1/messages themselves.
            Api::AnthropicMessages => format!("http://127.0.0.1:{port}/case/{}", case.key),
            Api::OpenaiChat => format!("http://127.0.0.1:{port}/case/{}/v1", case.key),
        };
        let req = json!({"case": case.key, "api": api_name(case.api), "base_url": base_url, "model": case.model});
        writeln!(requests, "{req}").unwrap();
    }
    let mut child = client
        .command(&root)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: cannot start the client: {e}", client.name()));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(requests.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{}: no answer within {CLIENT_TIMEOUT:?}", client.name()))
        .unwrap();
    assert!(
        out.status.success(),
        "{}: the client script failed ({}):\n{}",
        client.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: output line is not JSON ({e}): {l}", client.name()))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Comparison

/// How a client's reading relates to the boundary's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relation {
    /// The same chunks, in order.
    Same,
    /// Only some of them, in order: the client skipped data the boundary read.
    Less(usize),
    /// Chunks the boundary inspected, but not in the walk's order or past where the walk stops.
    Other,
}

struct Outcome {
    client: Client,
    delivered: usize,
    relation: Relation,
    /// Items the client delivered that no inspected data accounts for: property (a) broken.
    unseen: Vec<String>,
    /// `None` when the client ended normally; else the error it raised.
    error: Option<String>,
    expected_error: Option<&'static str>,
}

impl Outcome {
    /// A failure of (a) or (b), or `None`.
    fn failure(&self, pass: bool) -> Option<String> {
        if !self.unseen.is_empty() {
            return Some(format!(
                "delivered data the boundary never inspected (a): {}",
                self.unseen.join(" | ")
            ));
        }
        if !pass {
            return None;
        }
        match (&self.relation, &self.error, self.expected_error) {
            // The boundary read more than the client: allowed (BND-6), recorded as a fact.
            (Relation::Less(_), _, _) => None,
            (Relation::Other, _, _) => {
                Some("delivered chunks out of the order the boundary read them (b)".into())
            }
            // An error event on a passed body is there to be classified (BND-2, CLS-5); an
            // event no consumer can parse is not, so raising on it is a difference.
            (Relation::Same, Some(e), Some(UNPARSABLE_EVENT)) => Some(format!(
                "raised on a passed body, whose event data no consumer can parse (b): {e}"
            )),
            (Relation::Same, None, None) | (Relation::Same, Some(_), Some(_)) => None,
            (Relation::Same, Some(e), None) => Some(format!(
                "raised on a passed body the boundary reads without error (b): {e}"
            )),
            (Relation::Same, None, Some(why)) => Some(format!(
                "ended normally where the stream holds an {why} (b)"
            )),
        }
    }

    fn cell(&self, pass: bool, known: bool) -> String {
        let rel = match self.relation {
            Relation::Same => "same".to_string(),
            Relation::Less(n) => format!("reads less (−{n})"),
            Relation::Other => "other".to_string(),
        };
        let end = match &self.error {
            None => "end".to_string(),
            Some(e) => format!("error: {}", e.split(':').next().unwrap_or(e)),
        };
        let mark = match self.failure(pass) {
            Some(_) if known => " (known difference)",
            Some(_) => " **FAIL**",
            None => "",
        };
        format!("{} · {rel} · {end}{mark}", self.delivered)
    }
}

fn compare(client: Client, view: &BoundaryView, lines: &[Value]) -> Outcome {
    let api = client.api();
    let w = walk(api, &view.events);
    let inspected = inspected_values(&view.events);
    let mut delivered = Vec::new();
    let mut error = None;
    for l in lines {
        match l["kind"].as_str() {
            Some("event") => delivered.push(l["event"].clone()),
            Some("error") => {
                error = Some(format!(
                    "{}: {}",
                    l["error_type"].as_str().unwrap_or("?"),
                    l["message"].as_str().unwrap_or("")
                ))
            }
            _ => {}
        }
    }
    let mut unseen = Vec::new();
    let relation;
    let count;
    if client.is_pi() {
        // pi-ai delivers its own events; what comes from the wire is the text of each delta and
        // the message's id and model.
        let want: Vec<String> = w.items.iter().flat_map(|i| deltas_of(api, i)).collect();
        let mut leaves = Vec::new();
        inspected.iter().for_each(|v| string_leaves(v, &mut leaves));
        let raw: Vec<&str> = view
            .events
            .iter()
            .flat_map(|e| e.data_lines.iter().map(String::as_str))
            .collect();
        let from_wire = |s: &str| {
            leaves.iter().any(|l| l.contains(s)) || {
                let esc = serde_json::to_string(s).unwrap();
                raw.iter().any(|r| r.contains(&esc[1..esc.len() - 1]))
            }
        };
        let mut got = Vec::new();
        for ev in &delivered {
            if let Some(d) = ev["delta"].as_str() {
                got.push(d.to_owned());
            }
            for k in ["responseId", "responseModel"] {
                if let Some(s) = ev["message"][k].as_str()
                    && !from_wire(s)
                {
                    unseen.push(format!("{k} {s:?}"));
                }
            }
        }
        for d in &got {
            if !from_wire(d) {
                unseen.push(format!("delta {d:?}"));
            }
        }
        count = got.len();
        relation = subsequence(&got, &want, |g, w| g == w);
    } else {
        for d in &delivered {
            if !inspected.iter().any(|v| contained(d, v)) {
                unseen.push(d.to_string());
            }
        }
        count = delivered.len();
        relation = subsequence(&delivered, &w.items, contained);
    }
    Outcome {
        client,
        delivered: count,
        relation,
        unseen,
        error,
        expected_error: w.error,
    }
}

fn subsequence<T>(got: &[T], want: &[T], eq: impl Fn(&T, &T) -> bool) -> Relation {
    let mut at = 0;
    for g in got {
        match want[at..].iter().position(|w| eq(g, w)) {
            Some(i) => at += i + 1,
            None => return Relation::Other,
        }
    }
    if got.len() == want.len() {
        Relation::Same
    } else {
        Relation::Less(want.len() - got.len())
    }
}

// ---------------------------------------------------------------------------------------------
// Weakened readings: the harness must catch a reader that sees less than a real consumer

/// A line rule the boundary must not have; each is a way to read less than some consumer.
#[derive(Clone, Copy, Debug)]
enum Weakness {
    /// A line that starts with a BOM is no data line (the BOM is not dropped).
    KeepsBoms,
    /// A last line with no line ending after it is never read.
    DropsUnterminatedLine,
}

fn weakened_view(case: &Case, weakness: Weakness) -> BoundaryView {
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut splitter = LineSplitter::new();
    splitter.feed(&case.body, |l| lines.push(l.to_vec()));
    let unterminated = splitter.finish(|l| lines.push(l.to_vec()));
    match weakness {
        Weakness::KeepsBoms => lines.retain(|l| !l.starts_with(BOM)),
        Weakness::DropsUnterminatedLine if unterminated => {
            lines.pop();
        }
        Weakness::DropsUnterminatedLine => {}
    }
    let mut decoder = SseDecoder::new();
    let mut events = Vec::new();
    for l in &lines {
        decoder.feed(l, |e| events.push(e));
        decoder.feed(b"\n", |e| events.push(e));
    }
    decoder.finish(|e| events.push(e));
    BoundaryView {
        verdict: case.config.check(&case.body),
        events,
    }
}

/// Differences from (b) that are understood and reported, with why. Each must still occur, so
/// the list cannot outlive the difference. Empty: the one difference found
/// (`corpus/multi_line_data_each_object`, an event of two data lines that are each a chunk, which
/// the boundary passed and no consumer could parse) is now refused as `multi-line-data-event`.
const KNOWN: &[(&str, &str)] = &[];

// ---------------------------------------------------------------------------------------------
// The test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_consumers_read_no_more_than_the_boundary_bnd_6_bnd_9() {
    let root = repo_root();
    let started = Instant::now();
    install_clients(&root);
    let installed = started.elapsed();

    let cases = all_cases(&root);
    let views: HashMap<&str, BoundaryView> = cases
        .iter()
        .map(|c| (c.key.as_str(), boundary_view(c)))
        .collect();
    let outputs = every_client_output(&root, &cases).await;
    // Every line every client printed, for reading a difference by hand.
    let raw: String = outputs
        .values()
        .flatten()
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(compat_dir(&root).join("raw.jsonl"), raw).unwrap();

    let Judged {
        rows,
        known_seen,
        mut failures,
    } = judge(&cases, &views, &outputs);
    failures.extend(known_no_longer_differing(&known_seen));
    // The same client output against weakened readings: each must be exposed by at least one
    // real client, or this harness could not see a boundary that reads less (BND-6, BND-9).
    let caught_by = weakened_readings_caught(&cases, &outputs, &mut failures);

    let report = render(&rows, &caught_by, &known_seen, &failures);
    let out = compat_dir(&root).join("results.md");
    std::fs::write(&out, &report).unwrap();
    if std::env::var_os("DOCSFAB_COMPAT_WRITE_DOCS").is_some() {
        write_docs(&root.join("docs/compat-results.md"), &report);
    }
    println!("{report}");
    println!(
        "differential: {} cases, install check {:?}, total {:?}; table in {}",
        cases.len(),
        installed,
        started.elapsed(),
        out.display()
    );
    assert!(
        failures.is_empty(),
        "{} differences break (a) or (b):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every line each client printed, by case and client.
type Outputs = BTreeMap<(String, Client), Vec<Value>>;

/// One row of the results table: the case, the boundary's verdict on it, and each client's
/// outcome.
type Row = (Arc<Case>, String, Vec<Outcome>);

/// The cases of the boundary's corpus and of this crate's own manifest.
fn all_cases(root: &Path) -> Vec<Arc<Case>> {
    let mut cases = load_cases(&root.join("crates/docsfab-boundary/tests/corpus"), "corpus");
    cases.extend(load_cases(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases"),
        "compat",
    ));
    cases.into_iter().map(Arc::new).collect()
}

/// Serves every case on a loopback port and runs each real client over the cases of its API;
/// what the clients printed.
async fn every_client_output(root: &Path, cases: &[Arc<Case>]) -> Outputs {
    let by_name: HashMap<String, Arc<Case>> =
        cases.iter().map(|c| (c.key.clone(), c.clone())).collect();
    assert_eq!(
        by_name.len(),
        cases.len(),
        "case names must be unique within a manifest"
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(serve(listener, Arc::new(by_name)));

    let runs = Client::ALL.map(|client| {
        let mine: Vec<Arc<Case>> = cases
            .iter()
            .filter(|c| c.api == client.api())
            .cloned()
            .collect();
        tokio::spawn(run_client(client, root.to_path_buf(), port, mine))
    });
    let mut outputs = Outputs::new();
    for (client, run) in Client::ALL.into_iter().zip(runs) {
        for line in run.await.expect("client task") {
            let case = line["case"].as_str().unwrap_or("").to_owned();
            assert_eq!(line["client"], client.name(), "client name in output");
            outputs.entry((case, client)).or_default().push(line);
        }
    }
    server.abort();
    outputs
}

/// The clients' output held against the boundary's view of each case.
struct Judged {
    rows: Vec<Row>,
    /// Differences of cases listed in [`KNOWN`].
    known_seen: Vec<String>,
    /// Differences that break (a) or (b), and clients that reported nothing or did not end.
    failures: Vec<String>,
}

fn judge(cases: &[Arc<Case>], views: &HashMap<&str, BoundaryView>, outputs: &Outputs) -> Judged {
    let mut judged = Judged {
        rows: Vec::new(),
        known_seen: Vec::new(),
        failures: Vec::new(),
    };
    for case in cases {
        let view = &views[case.key.as_str()];
        let pass = matches!(view.verdict, Verdict::Pass(_));
        let mut outcomes = Vec::new();
        for client in Client::ALL.into_iter().filter(|c| c.api() == case.api) {
            let Some(lines) = outputs.get(&(case.key.clone(), client)) else {
                judged.failures.push(format!(
                    "{} × {}: the client reported nothing",
                    case.key,
                    client.name()
                ));
                continue;
            };
            let ended = lines
                .last()
                .and_then(|l| l["kind"].as_str())
                .is_some_and(|k| k == "end" || k == "error");
            if !ended {
                judged.failures.push(format!(
                    "{} × {}: output has no end or error line",
                    case.key,
                    client.name()
                ));
            }
            let o = compare(client, view, lines);
            if let Some(f) = o.failure(pass) {
                let line = format!("{} × {}: {f}", case.key, client.name());
                match KNOWN.iter().find(|k| k.0 == case.key) {
                    Some(_) => judged.known_seen.push(line),
                    None => judged.failures.push(line),
                }
            }
            outcomes.push(o);
        }
        judged
            .rows
            .push((case.clone(), verdict_label(&view.verdict), outcomes));
    }
    judged
}

/// A failure for each case in [`KNOWN`] that no longer differs.
fn known_no_longer_differing(known_seen: &[String]) -> Vec<String> {
    KNOWN
        .iter()
        .filter(|(case, _)| {
            !known_seen
                .iter()
                .any(|l| l.starts_with(&format!("{case} ×")))
        })
        .map(|(case, _)| {
            format!("{case}: listed in KNOWN but no longer differs; take it off the list")
        })
        .collect()
}

/// For each weakened reading, the cases and clients whose output exposes it; a weakness no
/// client exposes is a failure (BND-6, BND-9).
fn weakened_readings_caught(
    cases: &[Arc<Case>],
    outputs: &Outputs,
    failures: &mut Vec<String>,
) -> Vec<(Weakness, Vec<String>)> {
    let mut caught_by = Vec::new();
    for weakness in [Weakness::KeepsBoms, Weakness::DropsUnterminatedLine] {
        let mut caught = Vec::new();
        for case in cases {
            let view = weakened_view(case, weakness);
            for client in Client::ALL.into_iter().filter(|c| c.api() == case.api) {
                if let Some(lines) = outputs.get(&(case.key.clone(), client))
                    && !compare(client, &view, lines).unseen.is_empty()
                {
                    caught.push(format!("{} × {}", case.key, client.name()));
                }
            }
        }
        if caught.is_empty() {
            failures.push(format!(
                "no real client exposes a reader that {weakness:?}: the corpus lacks a case for it"
            ));
        }
        caught_by.push((weakness, caught));
    }
    caught_by
}

fn render(
    rows: &[Row],
    caught_by: &[(Weakness, Vec<String>)],
    known_seen: &[String],
    failures: &[String],
) -> String {
    let mut s = String::new();
    s.push_str("\n### Weakened readings the real clients expose\n\n");
    for (weakness, caught) in caught_by {
        writeln!(s, "- {weakness:?}: {}", caught.join(", ")).unwrap();
    }
    for api in [Api::OpenaiChat, Api::AnthropicMessages] {
        let clients: Vec<Client> = Client::ALL.into_iter().filter(|c| c.api() == api).collect();
        writeln!(s, "\n### {}\n", api_name(api)).unwrap();
        write!(s, "| case | from | boundary |").unwrap();
        clients
            .iter()
            .for_each(|c| write!(s, " {} |", c.name()).unwrap());
        write!(s, "\n| --- | --- | --- |").unwrap();
        clients.iter().for_each(|_| s.push_str(" --- |"));
        s.push('\n');
        for (case, verdict, outcomes) in rows.iter().filter(|r| r.0.api == api) {
            let pass = verdict.starts_with("pass");
            let known = KNOWN.iter().any(|k| k.0 == case.key);
            write!(s, "| {} | {} | {verdict} |", case.name, case.source).unwrap();
            for c in &clients {
                match outcomes.iter().find(|o| o.client == *c) {
                    Some(o) => write!(s, " {} |", o.cell(pass, known)).unwrap(),
                    None => s.push_str(" (no result) |"),
                }
            }
            s.push('\n');
        }
    }
    if !known_seen.is_empty() {
        s.push_str(
            "\n### Known differences (listed in KNOWN, reported to the boundary's owner)\n\n",
        );
        for (case, why) in KNOWN {
            writeln!(s, "- {case}: {why}").unwrap();
        }
        known_seen
            .iter()
            .for_each(|f| writeln!(s, "  - {f}").unwrap());
    }
    if !failures.is_empty() {
        s.push_str("\n### Failures\n\n");
        failures.iter().for_each(|f| writeln!(s, "- {f}").unwrap());
    }
    s
}

const START: &str =
    "<!-- results:start (written by DOCSFAB_COMPAT_WRITE_DOCS=1 cargo test -p docsfab-compat) -->";
const END: &str = "<!-- results:end -->";

fn write_docs(path: &Path, report: &str) {
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let (head, tail) = match (doc.find(START), doc.find(END)) {
        (Some(a), Some(b)) if a < b => (doc[..a].to_owned(), doc[b + END.len()..].to_owned()),
        _ => (doc, "\n".to_owned()),
    };
    std::fs::write(path, format!("{head}{START}\n{report}\n{END}{tail}")).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The comparison itself must be able to fail: these feed it made-up client output.

#[cfg(test)]
mod comparison {
    use super::*;

    const MODEL: &str = "gpt-4o-mini";

    fn chunk(model: &str, text: &str) -> Value {
        json!({"id": "c1", "model": model, "choices": [{"index": 0, "delta": {"content": text}}]})
    }

    fn view_of(body: &str) -> BoundaryView {
        let config = BoundaryConfig::new(Api::OpenaiChat, MODEL, &[]).unwrap();
        let mut events = Vec::new();
        let mut d = SseDecoder::new();
        d.feed(body.as_bytes(), |e| events.push(e));
        d.finish(|e| events.push(e));
        BoundaryView {
            verdict: config.check(body.as_bytes()),
            events,
        }
    }

    fn body(chunks: &[Value], tail: &str) -> String {
        let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        s.push_str(tail);
        s
    }

    fn out(events: &[Value], error: Option<&str>) -> Vec<Value> {
        let mut v: Vec<Value> = events
            .iter()
            .map(|e| json!({"kind": "event", "event": e}))
            .collect();
        v.push(match error {
            Some(e) => json!({"kind": "error", "error_type": "APIError", "message": e}),
            None => json!({"kind": "end"}),
        });
        v
    }

    #[test]
    fn a_chunk_the_boundary_never_saw_fails_bnd_6() {
        let a = chunk(MODEL, "Hello");
        let view = view_of(&body(std::slice::from_ref(&a), "data: [DONE]\n\n"));
        assert!(matches!(view.verdict, Verdict::Pass(_)));
        // As if the client had read a line the boundary's line rules do not produce.
        let o = compare(
            Client::NodeOpenai,
            &view,
            &out(&[a, chunk("gpt-4o", "x")], None),
        );
        assert_eq!(o.unseen.len(), 1);
        assert!(o.failure(true).is_some() && o.failure(false).is_some());
    }

    #[test]
    fn reading_less_than_the_boundary_is_a_fact_not_a_failure_bnd_6() {
        let (a, b) = (chunk(MODEL, "Hel"), chunk(MODEL, "lo"));
        let view = view_of(&body(&[a.clone(), b], "data: [DONE]\n\n"));
        let o = compare(Client::PyOpenai, &view, &out(&[a], None));
        assert_eq!(o.relation, Relation::Less(1));
        assert_eq!(o.failure(true), None);
    }

    #[test]
    fn a_passed_body_must_read_without_error_and_in_order() {
        let (a, b) = (chunk(MODEL, "Hel"), chunk(MODEL, "lo"));
        let view = view_of(&body(&[a.clone(), b.clone()], "data: [DONE]\n\n"));
        let same = compare(Client::PyOpenai, &view, &out(&[a.clone(), b.clone()], None));
        assert_eq!((same.relation, same.failure(true)), (Relation::Same, None));
        let raised = compare(
            Client::PyOpenai,
            &view,
            &out(&[a.clone(), b.clone()], Some("boom")),
        );
        assert!(raised.failure(true).is_some());
        let swapped = compare(Client::PyOpenai, &view, &out(&[b, a], None));
        assert_eq!(swapped.relation, Relation::Other);
        assert!(swapped.failure(true).is_some());
    }

    #[test]
    fn an_error_chunk_must_surface_as_an_error() {
        let a = chunk(MODEL, "Hel");
        let view = view_of(&body(
            std::slice::from_ref(&a),
            "data: {\"error\":{\"type\":\"server_error\",\"code\":500}}\n\n",
        ));
        assert!(matches!(view.verdict, Verdict::Pass(_)));
        let quiet = compare(
            Client::NodeOpenai,
            &view,
            &out(std::slice::from_ref(&a), None),
        );
        assert!(quiet.failure(true).is_some());
        let raised = compare(Client::NodeOpenai, &view, &out(&[a], Some("server_error")));
        assert_eq!(raised.failure(true), None);
    }

    #[test]
    fn raising_on_unparsable_joined_data_of_a_passed_body_is_a_difference_bnd_7() {
        let a = chunk(MODEL, "Hel");
        let mut view = view_of(&format!("data: {a}\ndata: {a}\n\ndata: [DONE]\n\n"));
        // The boundary refuses such an event now, so a consumer raising on it is no difference.
        assert_eq!(
            view.verdict.refusal().map(|r| r.reason.code()),
            Some("multi-line-data-event")
        );
        let o = compare(Client::PyOpenai, &view, &out(&[], Some("JSONDecodeError")));
        assert_eq!(o.failure(false), None);
        // The rule still catches a boundary that would pass one again.
        view.verdict = Verdict::Pass(Pass::Stream);
        let o = compare(Client::PyOpenai, &view, &out(&[], Some("JSONDecodeError")));
        assert_eq!(o.expected_error, Some(UNPARSABLE_EVENT));
        assert!(o.failure(true).is_some());
    }

    #[test]
    fn a_pi_delta_must_come_from_an_inspected_line() {
        let view = view_of(&body(&[chunk(MODEL, "Hello")], "data: [DONE]\n\n"));
        let pi = |d: &str| out(&[json!({"type": "text_delta", "delta": d})], None);
        assert_eq!(
            compare(Client::PiOpenai, &view, &pi("Hello")).failure(true),
            None
        );
        assert!(
            compare(Client::PiOpenai, &view, &pi("Goodbye"))
                .failure(true)
                .is_some()
        );
    }

    #[test]
    fn multi_line_data_counts_as_inspected_when_joined_bnd_7() {
        // Consumers join the lines and parse; the boundary refuses each line alone.
        let view = view_of("data: {\"model\":\"gpt-4o-mini\",\ndata: \"choices\":[]}\n\n");
        assert!(!matches!(view.verdict, Verdict::Pass(_)));
        let joined = json!({"model": MODEL, "choices": []});
        let o = compare(Client::PyOpenai, &view, &out(&[joined], None));
        assert!(o.unseen.is_empty());
    }
}
