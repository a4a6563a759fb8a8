//! A deliberately plain HTTP/1.1 client for the simulator's tests: it sends one request, reads
//! every byte until EOF or an error, and reports exactly how the connection ended, so a test can
//! tell a reset from a clean close and an incomplete chunked body from a complete one.

#![allow(dead_code)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use docsfab_sim::{Scenario, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The server closed with FIN.
    Eof,
    /// The server closed with RST.
    Reset,
    Other(ErrorKind),
}

#[derive(Debug)]
pub struct Reply {
    /// Every byte received.
    pub raw: Vec<u8>,
    pub end: End,
    /// When the first byte arrived, and when the connection ended, relative to sending.
    pub first_byte_after: Option<Duration>,
    pub elapsed: Duration,
    /// Byte arrival times (offset into `raw`, time since sending), one per read.
    pub reads: Vec<(usize, Duration)>,
}

#[derive(Debug)]
pub struct Parsed {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunk framing removed).
    pub body: Vec<u8>,
    /// True when the body ended properly: the terminating zero chunk, or every Content-Length byte.
    pub complete: bool,
    pub chunked: bool,
}

impl Reply {
    pub fn parse(&self) -> Option<Parsed> {
        let head_end = self.raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&self.raw[..head_end]).ok()?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let rest = &self.raw[head_end + 4..];
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        let (body, complete) = if chunked {
            decode_chunked(rest)
        } else {
            let len: usize = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(rest.len());
            (rest[..rest.len().min(len)].to_vec(), rest.len() >= len)
        };
        Some(Parsed {
            status,
            headers,
            body,
            complete,
            chunked,
        })
    }

    pub fn parsed(&self) -> Parsed {
        self.parse().expect("a response head")
    }
}

impl Parsed {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

fn decode_chunked(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (body, false);
        };
        let Some(size) = std::str::from_utf8(&rest[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
        else {
            return (body, false);
        };
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (body, rest.starts_with(b"\r\n"));
        }
        if rest.len() < size + 2 {
            body.extend_from_slice(&rest[..rest.len().min(size)]);
            return (body, false);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

pub async fn send(addr: SocketAddr, path: &str, body: &str) -> Reply {
    send_raw(addr, format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ).as_bytes())
    .await
}

pub async fn send_raw(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    stream.write_all(request).await.expect("send request");
    let mut raw = Vec::new();
    let mut reads = Vec::new();
    let mut first_byte_after = None;
    let mut buf = [0u8; 4096];
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Err(_) => panic!("no end of response within 10 s"),
            Ok(Ok(0)) => break End::Eof,
            Ok(Ok(n)) => {
                first_byte_after.get_or_insert(started.elapsed());
                reads.push((raw.len(), started.elapsed()));
                raw.extend_from_slice(&buf[..n]);
            }
            Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => break End::Reset,
            Ok(Err(e)) => break End::Other(e.kind()),
        }
    };
    Reply {
        raw,
        end,
        first_byte_after,
        elapsed: started.elapsed(),
        reads,
    }
}

pub fn openai_body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}]
    })
    .to_string()
}

pub fn anthropic_body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hello"}]
    })
    .to_string()
}

pub async fn start(yaml: &str) -> SimServer {
    let scenario = Scenario::from_yaml_str(yaml, "test scenario").expect("valid scenario");
    SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .expect("server starts")
}

pub const CHAT: &str = "/v1/chat/completions";
pub const MESSAGES: &str = "/v1/messages";

/// An SSE event as a test needs it: the `event:` name and the `data:` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub name: Option<String>,
    pub data: String,
}

/// Splits an SSE body at CRLF, LF or CR, drops every leading BOM, and groups lines into events.
pub fn events(body: &[u8]) -> Vec<Event> {
    let text = String::from_utf8(body.to_vec()).expect("UTF-8 stream");
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = Vec::new();
    let mut name = None;
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.trim_start_matches('\u{FEFF}');
        if line.is_empty() {
            if let Some(d) = data.take() {
                out.push(Event {
                    name: name.take(),
                    data: d,
                });
            }
            name = None;
        } else if let Some(v) = line.strip_prefix("event: ") {
            name = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = Some(v.to_owned());
        }
    }
    out
}

pub fn data_json(events: &[Event]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| serde_json::from_str(&e.data).expect("JSON data line"))
        .collect()
}
