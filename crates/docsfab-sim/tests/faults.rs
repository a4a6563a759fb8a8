//! HTTP-level responses and connection faults, observed byte by byte on a real loopback socket.

mod support;

use std::time::Duration;

use support::*;

#[tokio::test]
async fn scripted_statuses_come_in_order_with_their_headers_and_bodies() {
    let server = start(
        r#"
responses:
  - status: 408
  - status: 429
    headers: {retry-after: 2}
  - status: 429
    headers: {retry-after-ms: 150}
  - status: 503
  - status: 400
    body: '{"error":{"message":"upstream said 503 Service Unavailable","type":"invalid_request_error"}}'
  - status: 502
    body: '{"error":{"message":"upstream returned 400","upstream_status":400}}'
"#,
    )
    .await;
    let addr = server.local_addr();
    let body = openai_body("m", true);
    let mut got = Vec::new();
    for _ in 0..6 {
        let reply = send(addr, CHAT, &body).await;
        assert_eq!(reply.end, End::Eof);
        let p = reply.parsed();
        assert!(p.complete, "a status response body is complete");
        assert_eq!(p.header("connection"), Some("close"));
        got.push(p);
    }
    let statuses: Vec<u16> = got.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [408, 429, 429, 503, 400, 502]);
    assert_eq!(got[1].header("retry-after"), Some("2"));
    assert_eq!(got[1].header("retry-after-ms"), None);
    assert_eq!(got[2].header("retry-after-ms"), Some("150"));
    // Default bodies are provider-shaped JSON naming the status.
    assert_eq!(got[0].json()["error"]["type"], "timeout");
    assert_eq!(got[3].json()["error"]["type"], "service_unavailable");
    assert!(got[4].text().contains("503"));
    assert_eq!(got[5].json()["error"]["upstream_status"], 400);
    server.shutdown().await;
}

#[tokio::test]
async fn default_error_bodies_follow_the_anthropic_shape_on_messages() {
    let server = start("responses:\n  - status: 529\n").await;
    let p = send(server.local_addr(), MESSAGES, &anthropic_body("m", true))
        .await
        .parsed();
    assert_eq!(p.status, 529);
    assert_eq!(p.json()["type"], "error");
    assert_eq!(p.json()["error"]["type"], "overloaded_error");
    server.shutdown().await;
}

#[tokio::test]
async fn drop_close_reads_the_request_then_closes_without_a_byte() {
    let server = start("responses:\n  - drop: close\n  - status: 200\n    body: ok\n").await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    assert_eq!(reply.end, End::Eof);
    assert!(
        reply.raw.is_empty(),
        "got {:?}",
        String::from_utf8_lossy(&reply.raw)
    );
    // The request was read in full and logged before the drop.
    assert_eq!(server.requests().len(), 1);
    assert_eq!(server.requests()[0].entry, "responses[0]");
    let next = send(server.local_addr(), CHAT, &openai_body("m", true))
        .await
        .parsed();
    assert_eq!((next.status, next.text().as_str()), (200, "ok"));
    server.shutdown().await;
}

#[tokio::test]
async fn drop_reset_arrives_as_a_connection_reset() {
    let server = start("responses:\n  - drop: reset\n").await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    assert_eq!(reply.end, End::Reset);
    assert!(reply.raw.is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn a_clean_close_after_n_body_bytes_leaves_an_incomplete_chunked_body() {
    let server = start(
        "responses:\n  - answer: {text: 'one two three four five six'}\n    cut: {after_bytes: 150, with: close}\n  - answer: {text: 'one two three four five six'}\n",
    )
    .await;
    let addr = server.local_addr();
    let cut = send(addr, CHAT, &openai_body("m", true)).await;
    let whole = send(addr, CHAT, &openai_body("m", true)).await;
    assert_eq!(cut.end, End::Eof);
    let (cut, whole) = (cut.parsed(), whole.parsed());
    assert!(cut.chunked && whole.chunked);
    assert!(
        !cut.complete,
        "the cut body must lack its terminating chunk"
    );
    assert!(whole.complete);
    assert_eq!(cut.body.len(), 150, "exactly N payload bytes arrive");
    // The bytes that did arrive are the start of the same stream, apart from the timestamp.
    let strip = |b: &[u8]| String::from_utf8_lossy(b).replace(|c: char| c.is_ascii_digit(), "");
    assert!(strip(&whole.body).starts_with(&strip(&cut.body)));
    server.shutdown().await;
}

#[tokio::test]
async fn a_reset_after_n_body_bytes_arrives_as_a_reset_after_the_bytes() {
    let server = start(
        "responses:\n  - status: 503\n    body: '0123456789abcdefghij'\n    cut: {after_bytes: 7, with: reset}\n",
    )
    .await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    assert_eq!(reply.end, End::Reset);
    let p = reply.parsed();
    assert_eq!(p.status, 503);
    assert_eq!(p.body, b"0123456");
    assert!(!p.complete, "7 of 20 Content-Length bytes");
    server.shutdown().await;
}

#[tokio::test]
async fn a_cut_at_zero_bytes_sends_the_head_only() {
    let server =
        start("responses:\n  - answer: {text: hi}\n    cut: {after_bytes: 0, with: close}\n").await;
    let p = send(server.local_addr(), MESSAGES, &anthropic_body("m", true))
        .await
        .parsed();
    assert_eq!(p.status, 200);
    assert!(p.body.is_empty());
    assert!(!p.complete);
    server.shutdown().await;
}

#[tokio::test]
async fn a_cut_past_the_end_withholds_only_the_terminating_chunk() {
    let server =
        start("responses:\n  - answer: {text: hi}\n    cut: {after_bytes: 100000, with: close}\n")
            .await;
    let p = send(server.local_addr(), CHAT, &openai_body("m", true))
        .await
        .parsed();
    assert!(!p.complete);
    let evs = events(&p.body);
    assert_eq!(evs.last().map(|e| e.data.as_str()), Some("[DONE]"));
    server.shutdown().await;
}

#[tokio::test]
async fn delay_ms_holds_the_head_back() {
    let server = start("responses:\n  - status: 503\n    delay_ms: 200\n  - status: 503\n").await;
    let addr = server.local_addr();
    let slow = send(addr, CHAT, &openai_body("m", true)).await;
    let fast = send(addr, CHAT, &openai_body("m", true)).await;
    assert!(
        slow.first_byte_after.unwrap() >= Duration::from_millis(200),
        "{slow:?}"
    );
    // Only the lower bound is exact; the undelayed reply just has to be the quicker one.
    assert!(
        fast.first_byte_after.unwrap() < slow.first_byte_after.unwrap(),
        "{fast:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_stall_after_n_bytes_pauses_mid_body_then_finishes() {
    let server = start(
        "responses:\n  - status: 200\n    body: '0123456789'\n    stall: {after_bytes: 4, ms: 250}\n",
    )
    .await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", false)).await;
    let p = reply.parsed();
    assert!(p.complete);
    assert_eq!(p.text(), "0123456789");
    // "0123" leaves with the head; "456789" only after the stall, so it starts a read of its own.
    let head_len = reply.raw.len() - 10;
    let rest = reply.reads.iter().find(|(at, _)| *at == head_len + 4);
    let Some((_, rest_after)) = rest else {
        panic!("no read starts at the stall point: {reply:?}");
    };
    assert!(*rest_after >= Duration::from_millis(250), "{reply:?}");
    assert!(
        reply.reads[0].1 < *rest_after,
        "the head came before the stall"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn event_delay_spaces_the_stream_events() {
    let server =
        start("responses:\n  - answer: {text: abc, deltas: 3, event_delay_ms: 40}\n").await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    // role + 3 deltas + finish + [DONE] = 6 events, 5 gaps.
    assert!(
        reply.elapsed >= Duration::from_millis(200),
        "{:?}",
        reply.elapsed
    );
    assert!(reply.parsed().complete);
    server.shutdown().await;
}

#[tokio::test]
async fn chunked_status_bodies_are_complete_chunked_bodies() {
    let server = start("responses:\n  - status: 500\n    body: oops\n    chunked: true\n").await;
    let p = send(server.local_addr(), CHAT, &openai_body("m", true))
        .await
        .parsed();
    assert!(p.chunked && p.complete);
    assert_eq!(p.text(), "oops");
    server.shutdown().await;
}

#[tokio::test]
async fn other_paths_get_404_and_do_not_consume_the_script() {
    let server = start("responses:\n  - status: 418\n").await;
    let addr = server.local_addr();
    assert_eq!(
        send(addr, "/v1/embeddings", "{}").await.parsed().status,
        404
    );
    let get = send_raw(addr, b"GET /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(get.parsed().status, 405);
    assert_eq!(send(addr, MESSAGES, "{}").await.parsed().status, 418);
    let entries: Vec<String> = server.requests().into_iter().map(|e| e.entry).collect();
    assert_eq!(entries, ["no-route", "no-route", "responses[0]"]);
    server.shutdown().await;
}

#[tokio::test]
async fn chunked_request_bodies_are_read_and_digested_like_plain_ones() {
    let server = start("responses:\n  - status: 204\n").await;
    let addr = server.local_addr();
    let body = openai_body("m", false);
    send(addr, CHAT, &body).await;
    let (a, b) = body.split_at(10);
    let chunked = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    assert_eq!(
        send_raw(addr, chunked.as_bytes()).await.parsed().status,
        204
    );
    let log = server.requests();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].sha256, log[1].sha256);
    server.shutdown().await;
}

#[tokio::test]
async fn a_malformed_request_gets_400() {
    let server = start("responses:\n  - status: 200\n").await;
    let reply = send_raw(server.local_addr(), b"NONSENSE\r\n\r\n").await;
    assert_eq!(reply.parsed().status, 400);
    assert!(server.requests().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_listening() {
    let server = start("responses:\n  - status: 200\n").await;
    let addr = server.local_addr();
    server.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn shutdown_ends_a_connection_that_is_stalled() {
    let server = start("responses:\n  - status: 200\n    delay_ms: 60000\n").await;
    let addr = server.local_addr();
    let client = tokio::spawn(async move { send(addr, CHAT, "{}").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(Duration::from_secs(2), server.shutdown())
        .await
        .expect("shutdown is prompt");
    let reply = client.await.unwrap();
    assert!(reply.raw.is_empty());
}

#[tokio::test]
async fn a_clean_close_sends_no_reset_even_with_unread_client_bytes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Bytes past the request's Content-Length are never read as part of it, and closing a socket
    // with unread input makes the kernel answer with RST. After a scripted clean close the
    // connection must still be half-open: the client can keep writing without an error.
    let server = start("responses:\n  - drop: close\n").await;
    let mut stream = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let request = format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}EXTRA");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(stream.read(&mut buf).await.unwrap(), 0, "FIN, no data");
    tokio::time::sleep(Duration::from_millis(50)).await;
    stream.write_all(b"more").await.expect("no RST came back");
    tokio::time::sleep(Duration::from_millis(50)).await;
    stream.write_all(b"more").await.expect("still no RST");
    server.shutdown().await;
}

#[tokio::test]
async fn chunks_send_any_body_byte_for_byte_one_http_chunk_each() {
    let server = start(
        r#"
responses:
  - status: 200
    headers: {content-type: text/event-stream}
    chunks:
      - "data: {\"error\":{\"type\":\"server_error\"},\"id\":\"x\"}\n"
      - ""
      - "\n"
      - "data: [DONE]\n\n"
    chunk_delay_ms: 30
"#,
    )
    .await;
    let reply = send(server.local_addr(), CHAT, &openai_body("m", true)).await;
    let p = reply.parsed();
    assert!(p.chunked && p.complete);
    assert_eq!(p.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        p.text(),
        "data: {\"error\":{\"type\":\"server_error\"},\"id\":\"x\"}\n\ndata: [DONE]\n\n"
    );
    let wire = String::from_utf8_lossy(&reply.raw);
    assert!(
        wire.contains("\r\n1\r\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"),
        "{wire:?}"
    );
    // Three non-empty chunks, two gaps.
    assert!(
        reply.elapsed >= Duration::from_millis(60),
        "{:?}",
        reply.elapsed
    );
    server.shutdown().await;
}
