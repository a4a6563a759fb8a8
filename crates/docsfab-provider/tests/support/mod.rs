//! A tiny raw-TCP fault server on 127.0.0.1 for end-to-end transport tests.
//!
//! Each accepted connection plays the next [`Act`] of a script (the last act repeats). It reads
//! the whole request first, logs it, then answers with exact bytes: a dropped or reset
//! connection, silence, or a chunked HTTP/1.1 response that ends cleanly, is cut (FIN without the
//! last chunk), is reset (RST via SO_LINGER=0), or stalls. Chunked framing is what lets a test
//! tell a clean close from a cut one.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
pub enum Act {
    /// Read the request, then close without a response head.
    Drop,
    /// Read the request, then reset the connection.
    Reset,
    /// Read the request and say nothing.
    Stall,
    Respond(Resp),
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<Vec<u8>>,
    pub end: End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The last chunk and a FIN: a complete body.
    Clean,
    /// A FIN without the last chunk: the body is cut.
    Cut,
    /// A reset after the chunks.
    Reset,
    /// Silence after the chunks.
    Stall,
}

impl Resp {
    pub fn new(status: u16) -> Self {
        Resp {
            status,
            headers: Vec::new(),
            chunks: Vec::new(),
            end: End::Clean,
        }
    }
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
    pub fn chunk(mut self, bytes: impl AsRef<[u8]>) -> Self {
        self.chunks.push(bytes.as_ref().to_vec());
        self
    }
    pub fn end(mut self, end: End) -> Self {
        self.end = end;
        self
    }
    pub fn act(self) -> Act {
        Act::Respond(self)
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body_sha256: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct FaultServer {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultServer {
    pub async fn start(acts: Vec<Act>) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let task = tokio::spawn(async move {
            let mut n = 0usize;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let act = acts.get(n).or(acts.last()).cloned().unwrap_or(Act::Drop);
                n += 1;
                let log = log.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, act, log).await;
                });
            }
        });
        FaultServer {
            addr,
            received,
            task,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("log").clone()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A base URL on which nothing listens: connecting is refused.
pub async fn refused_base_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}/v1")
}

async fn serve(
    mut stream: TcpStream,
    act: Act,
    log: Arc<Mutex<Vec<Received>>>,
) -> std::io::Result<()> {
    let req = read_request(&mut stream).await?;
    log.lock().expect("log").push(req);
    match act {
        Act::Drop => {
            stream.shutdown().await?;
        }
        Act::Reset => {
            stream.set_zero_linger()?;
        }
        Act::Stall => tokio::time::sleep(Duration::from_secs(30)).await,
        Act::Respond(resp) => {
            let mut head = format!("HTTP/1.1 {} X\r\n", resp.status);
            let content_type = if resp.status == 200 {
                "text/event-stream"
            } else {
                "application/json"
            };
            if !resp
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            {
                head.push_str(&format!("content-type: {content_type}\r\n"));
            }
            head.push_str("transfer-encoding: chunked\r\nconnection: close\r\n");
            for (n, v) in &resp.headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).await?;
            stream.flush().await?;
            for c in &resp.chunks {
                let mut framed = format!("{:x}\r\n", c.len()).into_bytes();
                framed.extend_from_slice(c);
                framed.extend_from_slice(b"\r\n");
                stream.write_all(&framed).await?;
                stream.flush().await?;
                // Separate reads on the client, like a real stream.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            match resp.end {
                End::Clean => {
                    stream.write_all(b"0\r\n\r\n").await?;
                    stream.shutdown().await?;
                }
                End::Cut => stream.shutdown().await?,
                End::Reset => stream.set_zero_linger()?,
                End::Stall => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        }
    }
    Ok(())
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Received> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_owned();
    let path = first.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = stream.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = &buf[head_end..buf.len().min(head_end + len)];
    Ok(Received {
        method,
        path,
        headers,
        body_sha256: hex::encode(Sha256::digest(body)),
    })
}
