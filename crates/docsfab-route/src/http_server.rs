//! The hardened accept/serve loop for docsfab's HTTP servers (`route serve` today).
//!
//! `axum::serve` accepts without bound, never times out a request head, and its graceful
//! shutdown waits for every connection, so one client that sends half a request pins a socket
//! forever and stops SIGTERM from ending the process. This loop serves an axum [`Router`] with:
//!
//! - a header read timeout (hyper's own): a connection whose next request head has not fully
//!   arrived in time is closed, idle keep-alive connections included;
//! - a cap on concurrent connections (a tokio semaphore): past it, a connection gets a fixed 503
//!   and is closed, or, when even those answers are all busy, is closed at once;
//! - graceful shutdown with a deadline: no new connections, idle ones close, requests in flight
//!   may finish, and whatever is still open at the deadline is dropped.
//!
//! The body read timeout and size cap are per request, so they live in [`read_body`], which a
//! handler calls and whose refusal it answers in its own API's shape.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody as _};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How the loop protects itself. Every bound is finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// From the moment a connection waits for a request head to the head's last byte.
    pub header_timeout: Duration,
    /// From the end of the head to the body's last byte (whole body, not per read, so a client
    /// that trickles a byte at a time is cut too).
    pub body_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// After the shutdown signal, how long connections may take to finish.
    pub shutdown_grace: Duration,
}

/// Connections past the cap that may be answered with the busy 503 at once; past this too, a
/// connection is closed without an answer. Each costs a socket and a task for under a second,
/// so this can be well above a flood of a few hundred half-sent requests.
const BUSY_ANSWERS: usize = 256;
/// Writing the busy answer, then reading what the client sent so the close is a FIN (a reset
/// could destroy the answer before the client reads it).
const BUSY_WRITE: Duration = Duration::from_secs(2);
const BUSY_DRAIN: Duration = Duration::from_millis(500);
const BUSY_DRAIN_BYTES: usize = 1024 * 1024;
/// After a failed accept (too many open files, mostly): let connections end before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// An oversized body is read and discarded up to this many bytes past the cap, so a client that
/// writes its whole body before reading sees the 413 rather than a broken pipe.
pub const DISCARD_BYTES: u64 = 128 * 1024 * 1024;

/// How serving ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Whether every connection ended within the grace; `false` means some were dropped at the
    /// deadline without finishing.
    pub drained: bool,
}

/// Serves `app` on `listener` until `shutdown` resolves, then runs `on_shutdown` (to cancel work
/// in flight) and waits at most `limits.shutdown_grace` for connections to end.
///
/// `busy_body` is the JSON body of the 503 a connection past the cap gets; it is sent before
/// the request is read, so it cannot depend on the path.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    busy_body: Bytes,
    shutdown: impl Future<Output = ()>,
    on_shutdown: impl FnOnce(),
) -> Stopped {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let busy = Arc::new(Semaphore::new(BUSY_ANSWERS));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow with the server's lifetime.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        if let Ok(permit) = Arc::clone(&permits).try_acquire_owned() {
            let conn = builder
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
            let conn = graceful.watch(conn);
            tasks.spawn(async move {
                // A connection error (timeout, reset, bad head) ends only that connection.
                let _ = conn.await;
                drop(permit);
            });
        } else if let Ok(permit) = Arc::clone(&busy).try_acquire_owned() {
            let body = busy_body.clone();
            tasks.spawn(async move {
                answer_busy(stream, &body).await;
                drop(permit);
            });
        }
        // else: `stream` drops here, a plain close.
    }
    drop(listener);
    on_shutdown();
    let drained = tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_ok();
    // Busy answers and connections past the deadline end here, not with the runtime.
    tasks.shutdown().await;
    Stopped { drained }
}

/// The fixed answer past the connection cap: a 503 with `retry-after: 1`, then a close.
async fn answer_busy(mut stream: TcpStream, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let wrote = tokio::time::timeout(BUSY_WRITE, async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(wrote, Ok(Ok(()))) {
        return;
    }
    let _ = tokio::time::timeout(BUSY_DRAIN, async {
        let mut buf = [0u8; 8192];
        let mut read = 0;
        while read < BUSY_DRAIN_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

/// Why a request body was not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Larger than the cap (declared or sent). What the client sent was read and discarded up
    /// to [`DISCARD_BYTES`] past the cap, or until the body timeout.
    TooLarge { limit: usize },
    /// The body did not arrive in full within the body timeout.
    TooSlow { timeout: Duration },
    /// The server is shutting down.
    Cancelled,
    /// The client broke the body off (closed the connection, bad chunk framing).
    Broken,
}

/// Reads a request body of at most `limit` bytes within `timeout`, or says why not. `cancel`
/// ends the read early (shutdown).
pub async fn read_body(
    mut body: Body,
    limit: usize,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Bytes, BodyRefusal> {
    let deadline = Instant::now() + timeout;
    let declared = body.size_hint().exact();
    let mut too_large = declared.is_some_and(|n| n > limit as u64);
    let mut buf = Vec::new();
    let mut discarded: u64 = 0;
    loop {
        let next = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        let frame = tokio::select! {
            () = cancel.cancelled() => return Err(BodyRefusal::Cancelled),
            f = tokio::time::timeout_at(deadline, next) => f,
        };
        let frame = match frame {
            // Out of time: for a body already over the cap, the 413 is the better answer.
            Err(_) if too_large => return Err(BodyRefusal::TooLarge { limit }),
            Err(_) => return Err(BodyRefusal::TooSlow { timeout }),
            Ok(None) if too_large => return Err(BodyRefusal::TooLarge { limit }),
            Ok(None) => return Ok(Bytes::from(buf)),
            Ok(Some(Err(_))) if too_large => return Err(BodyRefusal::TooLarge { limit }),
            Ok(Some(Err(_))) => return Err(BodyRefusal::Broken),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if !too_large && buf.len() + data.len() > limit {
            too_large = true;
            discarded = buf.len() as u64;
            buf = Vec::new();
        }
        if too_large {
            discarded += data.len() as u64;
            if discarded > limit as u64 + DISCARD_BYTES {
                return Err(BodyRefusal::TooLarge { limit });
            }
        } else {
            buf.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> (usize, Duration) {
        (16, Duration::from_secs(5))
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_read_whole() {
        let (limit, t) = limits();
        let got = read_body(
            Body::from("0123456789abcdef"),
            limit,
            t,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(got, Ok(Bytes::from_static(b"0123456789abcdef")));
    }

    #[tokio::test]
    async fn hardening_oversized_body_is_refused_after_reading_it() {
        let (limit, t) = limits();
        // Declared length over the cap.
        let got = read_body(
            Body::from("x".repeat(17)),
            limit,
            t,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(got, Err(BodyRefusal::TooLarge { limit }));
        // No declared length (a stream of chunks) that grows past the cap.
        let chunks = futures_chunks(&["0123456789", "0123456789", "tail"]);
        let got = read_body(chunks, limit, t, &CancellationToken::new()).await;
        assert_eq!(got, Err(BodyRefusal::TooLarge { limit }));
    }

    #[tokio::test(start_paused = true)]
    async fn hardening_slow_body_is_refused_at_the_deadline() {
        let (limit, t) = limits();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"{\"a\""))).await.unwrap();
        let body = Body::from_stream(tokio_stream(rx));
        let got = read_body(body, limit, t, &CancellationToken::new()).await;
        assert_eq!(got, Err(BodyRefusal::TooSlow { timeout: t }));
        drop(tx);
    }

    #[tokio::test]
    async fn a_cancelled_read_ends_at_once() {
        let (limit, t) = limits();
        let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let got = read_body(Body::from_stream(tokio_stream(rx)), limit, t, &cancel).await;
        assert_eq!(got, Err(BodyRefusal::Cancelled));
    }

    fn futures_chunks(parts: &[&'static str]) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(parts.len());
        for p in parts {
            tx.try_send(Ok(Bytes::from_static(p.as_bytes()))).unwrap();
        }
        Body::from_stream(tokio_stream(rx))
    }

    fn tokio_stream<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
