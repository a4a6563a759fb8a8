//! A small HTTP/1.1 server side: read one request, write one response, byte by byte under the
//! scenario's control. Hand-written because the faults (a cut at an exact body byte, a reset, a
//! stall mid-chunk) need control that a full server framework does not give.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::scenario::{Cut, Stall};

const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// One parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// The request target without its query string.
    pub path: String,
    pub body: Vec<u8>,
}

/// Why a request could not be read. `Closed` is the peer going away, which needs no answer.
#[derive(Debug)]
pub(crate) enum ReadError {
    Closed,
    Malformed(&'static str),
}

/// Reads one request (head, then the body by Content-Length or chunked coding).
pub(crate) async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<Request, ReadError> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ReadError::Malformed("request head too large"));
        }
        if read_more(stream, &mut buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ReadError::Malformed("request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("bad request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed("unsupported HTTP version"));
    }
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut expect_continue = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed("bad header line"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                value
                    .parse()
                    .map_err(|_| ReadError::Malformed("bad content-length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("expect") {
            expect_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    let method = method.to_owned();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let mut rest = buf.split_off(head_end + 4);
    if expect_continue {
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|_| ReadError::Closed)?;
    }
    let body = if chunked {
        read_chunked(stream, rest).await?
    } else {
        let len = content_length.unwrap_or(0);
        if len > MAX_BODY_BYTES {
            return Err(ReadError::Malformed("request body too large"));
        }
        while rest.len() < len {
            if read_more(stream, &mut rest).await? == 0 {
                return Err(ReadError::Closed);
            }
        }
        rest.truncate(len);
        rest
    };
    Ok(Request { method, path, body })
}

async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<usize, ReadError> {
    let mut chunk = [0u8; 8192];
    let n = stream
        .read(&mut chunk)
        .await
        .map_err(|_| ReadError::Closed)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

async fn read_chunked<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut raw: Vec<u8>,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let line_end = loop {
            if let Some(at) = find(&raw[pos..], b"\r\n") {
                break pos + at;
            }
            if raw.len() - pos > MAX_HEAD_BYTES {
                return Err(ReadError::Malformed("chunk size line too long"));
            }
            if read_more(stream, &mut raw).await? == 0 {
                return Err(ReadError::Closed);
            }
        };
        let size_text = std::str::from_utf8(&raw[pos..line_end])
            .map_err(|_| ReadError::Malformed("bad chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| ReadError::Malformed("bad chunk size"))?;
        pos = line_end + 2;
        if size == 0 {
            // Skip trailers up to the final empty line.
            let mut trailers = 0;
            loop {
                if let Some(at) = find(&raw[pos..], b"\r\n") {
                    if at == 0 {
                        return Ok(body);
                    }
                    pos += at + 2;
                    trailers += at + 2;
                    continue;
                }
                if trailers + (raw.len() - pos) > MAX_HEAD_BYTES {
                    return Err(ReadError::Malformed("trailers too large"));
                }
                if read_more(stream, &mut raw).await? == 0 {
                    return Err(ReadError::Closed);
                }
            }
        }
        if size > MAX_BODY_BYTES.saturating_sub(body.len()) {
            return Err(ReadError::Malformed("request body too large"));
        }
        while raw.len() < pos + size + 2 {
            if read_more(stream, &mut raw).await? == 0 {
                return Err(ReadError::Closed);
            }
        }
        body.extend_from_slice(&raw[pos..pos + size]);
        pos += size + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        425 => "Too Early",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// How the body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    ContentLength,
    Chunked,
}

/// A response ready to send: the head, then body pieces (each piece is one chunk when chunked,
/// with `piece_delay` between pieces).
pub(crate) struct Outgoing {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub pieces: Vec<Vec<u8>>,
    pub framing: Framing,
    pub piece_delay: Duration,
}

/// What [`write_response`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Written {
    pub ending: Ending,
    /// Body payload bytes written.
    pub sent: u64,
    /// The body bytes written when the client was seen to go away (its side of the connection
    /// ended) during a stall or between paced pieces, if it did.
    pub hung_up_at: Option<u64>,
}

/// How the connection ended, so the caller knows whether to close it gracefully.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    Complete,
    Cut(crate::scenario::CloseHow),
    /// The peer went away while we wrote.
    PeerGone,
}

/// Writes the head and the body, applying a stall and a cut at exact body byte offsets. Offsets
/// count body payload bytes (before chunk framing), so `cut.after_bytes: 0` sends the head only.
/// A cut at or past the end still withholds the end of the body (the terminating zero chunk, or
/// for Content-Length nothing is missing only if every byte was sent, so the cut lands there).
///
/// `peer`, the connection's read side, is watched during stalls and piece delays: a client that
/// gives up then is noted in [`Written::hung_up_at`] (the writing goes on as before).
pub(crate) async fn write_response<S: AsyncWrite + Unpin, R: AsyncRead + Unpin>(
    stream: &mut S,
    out: &Outgoing,
    stall: Option<Stall>,
    cut: Option<Cut>,
    peer: Option<&mut R>,
) -> Written {
    let mut watch = Watch {
        peer,
        hung_up_at: None,
    };
    let mut sent = 0;
    let ending = write_body(stream, out, stall, cut, &mut watch, &mut sent).await;
    Written {
        ending,
        sent,
        hung_up_at: watch.hung_up_at,
    }
}

/// The client's side of the connection, watched while the simulator waits.
struct Watch<'a, R> {
    peer: Option<&'a mut R>,
    hung_up_at: Option<u64>,
}

impl<R: AsyncRead + Unpin> Watch<'_, R> {
    /// Sleeps `d`; notes when the client's side ends meanwhile (bytes it sends are discarded).
    async fn pause(&mut self, d: Duration, sent: u64) {
        let sleep = tokio::time::sleep(d);
        tokio::pin!(sleep);
        if self.hung_up_at.is_none()
            && let Some(peer) = self.peer.as_mut()
        {
            let mut sink = [0u8; 1024];
            loop {
                tokio::select! {
                    () = &mut sleep => return,
                    read = peer.read(&mut sink) => match read {
                        Ok(0) | Err(_) => {
                            self.hung_up_at = Some(sent);
                            break;
                        }
                        Ok(_) => {}
                    },
                }
            }
        }
        sleep.await;
    }
}

async fn write_body<S: AsyncWrite + Unpin, R: AsyncRead + Unpin>(
    stream: &mut S,
    out: &Outgoing,
    stall: Option<Stall>,
    cut: Option<Cut>,
    watch: &mut Watch<'_, R>,
    sent: &mut u64,
) -> Ending {
    let total: usize = out.pieces.iter().map(Vec::len).sum();
    let mut head = format!("HTTP/1.1 {} {}\r\n", out.status, reason_phrase(out.status));
    for (name, value) in &out.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    match out.framing {
        Framing::ContentLength => head.push_str(&format!("content-length: {total}\r\n")),
        Framing::Chunked => head.push_str("transfer-encoding: chunked\r\n"),
    }
    head.push_str("connection: close\r\n\r\n");
    if write(stream, head.as_bytes()).await.is_err() {
        return Ending::PeerGone;
    }

    let mut stall = stall;
    for (i, piece) in out.pieces.iter().enumerate() {
        if i > 0 && !out.piece_delay.is_zero() {
            watch.pause(out.piece_delay, *sent).await;
        }
        if out.framing == Framing::Chunked && !piece.is_empty() {
            // A cut that falls exactly at this piece's start sends nothing of it.
            if let Some(c) = cut
                && c.after_bytes <= *sent
            {
                return Ending::Cut(c.with);
            }
            if write(stream, format!("{:x}\r\n", piece.len()).as_bytes())
                .await
                .is_err()
            {
                return Ending::PeerGone;
            }
        }
        let mut offset = 0usize;
        while offset < piece.len() {
            // The next byte offset at which something happens inside this piece.
            let mut stop = piece.len();
            if let Some(s) = stall
                && s.after_bytes >= *sent
            {
                stop = stop.min(offset + (s.after_bytes - *sent) as usize);
            }
            if let Some(c) = cut {
                stop = stop.min(offset + c.after_bytes.saturating_sub(*sent) as usize);
            }
            if stop > offset {
                if write(stream, &piece[offset..stop]).await.is_err() {
                    return Ending::PeerGone;
                }
                *sent += (stop - offset) as u64;
                offset = stop;
            }
            if let Some(s) = stall
                && s.after_bytes == *sent
            {
                watch.pause(Duration::from_millis(s.ms), *sent).await;
                stall = None;
            }
            if let Some(c) = cut
                && c.after_bytes <= *sent
                && offset < piece.len()
            {
                return Ending::Cut(c.with);
            }
        }
        if out.framing == Framing::Chunked
            && !piece.is_empty()
            && write(stream, b"\r\n").await.is_err()
        {
            return Ending::PeerGone;
        }
    }
    if let Some(s) = stall
        && s.after_bytes >= *sent
    {
        // A stall placed at or past the end waits before the body ends.
        watch.pause(Duration::from_millis(s.ms), *sent).await;
    }
    if let Some(c) = cut {
        return Ending::Cut(c.with);
    }
    if out.framing == Framing::Chunked && write(stream, b"0\r\n\r\n").await.is_err() {
        return Ending::PeerGone;
    }
    Ending::Complete
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::CloseHow;

    fn outgoing(framing: Framing) -> Outgoing {
        Outgoing {
            status: 200,
            headers: Vec::new(),
            pieces: vec![b"abc".to_vec(), b"def".to_vec()],
            framing,
            piece_delay: Duration::ZERO,
        }
    }

    /// Writes the response into memory and returns (what follows the head, how it ended).
    async fn body_after(
        framing: Framing,
        stall: Option<Stall>,
        cut: Option<Cut>,
    ) -> (String, Ending) {
        let mut wire = Vec::new();
        let written = write_response(
            &mut wire,
            &outgoing(framing),
            stall,
            cut,
            None::<&mut tokio::io::Empty>,
        )
        .await;
        let ending = written.ending;
        let text = String::from_utf8(wire).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        (body.to_owned(), ending)
    }

    fn cut(after_bytes: u64) -> Option<Cut> {
        Some(Cut {
            after_bytes,
            with: CloseHow::Close,
        })
    }

    #[tokio::test]
    async fn chunked_cuts_land_on_exact_payload_bytes() {
        let cases = [
            (None, "3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", Ending::Complete),
            (cut(0), "", Ending::Cut(CloseHow::Close)),
            (cut(2), "3\r\nab", Ending::Cut(CloseHow::Close)),
            // At a chunk boundary: the next chunk's size line is not sent.
            (cut(3), "3\r\nabc\r\n", Ending::Cut(CloseHow::Close)),
            (cut(4), "3\r\nabc\r\n3\r\nd", Ending::Cut(CloseHow::Close)),
            // At or past the end: only the terminating chunk is missing.
            (
                cut(6),
                "3\r\nabc\r\n3\r\ndef\r\n",
                Ending::Cut(CloseHow::Close),
            ),
            (
                cut(99),
                "3\r\nabc\r\n3\r\ndef\r\n",
                Ending::Cut(CloseHow::Close),
            ),
        ];
        for (c, want, ending) in cases {
            assert_eq!(
                body_after(Framing::Chunked, None, c).await,
                (want.to_owned(), ending),
                "{c:?}"
            );
        }
    }

    #[tokio::test]
    async fn content_length_cuts_leave_fewer_bytes_than_announced() {
        assert_eq!(
            body_after(Framing::ContentLength, None, cut(4)).await,
            ("abcd".to_owned(), Ending::Cut(CloseHow::Close))
        );
        assert_eq!(
            body_after(Framing::ContentLength, None, None).await,
            ("abcdef".to_owned(), Ending::Complete)
        );
    }

    #[tokio::test]
    async fn a_stall_does_not_change_the_bytes() {
        let stall = Some(Stall {
            after_bytes: 4,
            ms: 60,
        });
        let started = tokio::time::Instant::now();
        let (body, ending) = body_after(Framing::Chunked, stall, None).await;
        assert_eq!(body, "3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");
        assert_eq!(ending, Ending::Complete);
        assert!(started.elapsed() >= Duration::from_millis(60));
    }

    #[tokio::test]
    async fn requests_are_read_by_length_or_chunks() {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"POST /v1/messages?x=1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let req = read_request(&mut server).await.unwrap();
        assert_eq!(
            (req.method.as_str(), req.path.as_str(), req.body.as_slice()),
            ("POST", "/v1/messages", b"hello".as_slice())
        );

        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=1\r\nhe\r\n3\r\nllo\r\n0\r\nX-Trailer: 1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_request(&mut server).await.unwrap().body, b"hello");

        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nhel")
            .await
            .unwrap();
        drop(client);
        assert!(matches!(
            read_request(&mut server).await,
            Err(ReadError::Closed)
        ));

        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"POST / HTTP/1.1\r\nContent-Length: nine\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(
            read_request(&mut server).await,
            Err(ReadError::Malformed(_))
        ));

        // A chunk size near usize::MAX is refused, not an arithmetic overflow.
        let (mut client, mut server) = tokio::io::duplex(4096);
        client
            .write_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n")
            .await
            .unwrap();
        assert!(matches!(
            read_request(&mut server).await,
            Err(ReadError::Malformed("request body too large"))
        ));
    }

    /// A chunk-size line or a trailer that never ends is refused, not buffered without bound.
    #[tokio::test]
    async fn an_endless_chunk_size_line_or_trailer_is_refused() {
        for rest in [&b""[..], &b"0\r\n"[..]] {
            let (mut client, mut server) = tokio::io::duplex(1 << 20);
            let mut request = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            request.extend_from_slice(rest);
            request.extend(std::iter::repeat_n(b'1', MAX_HEAD_BYTES + 2));
            client.write_all(&request).await.unwrap();
            let read =
                tokio::time::timeout(Duration::from_secs(5), read_request(&mut server)).await;
            assert!(
                matches!(read, Ok(Err(ReadError::Malformed(_)))),
                "{:?}",
                read.map(|r| r.map(|q| q.body.len()))
            );
            drop(client);
        }
    }
}
