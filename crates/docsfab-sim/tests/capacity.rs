//! Issue 12, the simulator's capacity model: token buckets for requests and tokens, 429s with an
//! honest Retry-After, and the providers' rate-limit headers on every response. Real HTTP on
//! loopback. No test measures elapsed time: slow refills (a low `timeScale`) keep the counts
//! exact, and where a wait matters the test waits what the simulator advertised and checks the
//! status that follows.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use docsfab_sim::{RequestLogEntry, Scenario, SimServer};
use support::*;

/// A refill so slow (one request per 12.5 real minutes) that nothing refills during a test.
const FROZEN: &str = "timeScale: 0.01";

fn num(p: &Parsed, name: &str) -> u64 {
    p.header(name)
        .unwrap_or_else(|| panic!("header {name} missing from {:?}", p.headers))
        .parse()
        .unwrap_or_else(|_| panic!("header {name} is not a whole number"))
}

fn entries(server: &SimServer) -> Vec<String> {
    server.requests().into_iter().map(|e| e.entry).collect()
}

/// A Go duration as OpenAI prints it: `0s`, `120ms`, `1.5s`, `6m0s`, `1h2m3s`.
fn is_go_duration(v: &str) -> bool {
    let units_ok = v.ends_with("ms") || v.ends_with('s');
    let digits_ok = v.chars().all(|c| c.is_ascii_digit() || "hms.".contains(c));
    units_ok && digits_ok && v.starts_with(|c: char| c.is_ascii_digit())
}

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z`.
fn is_rfc3339_utc(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && v.ends_with('Z')
}

#[tokio::test]
async fn issue12_within_the_burst_all_succeed_with_decreasing_remaining_then_429() {
    // `limitHeader: bucket`: this test pins the bucket's own numbers (limit 3, "Limit 3, Used 3").
    let server = start(&format!(
        "capacity: {{requestsPerMinute: 60, burst: 3, limitHeader: bucket, {FROZEN}}}\nresponses:\n  - answer: {{text: hi}}\n    repeat: 5\n"
    ))
    .await;
    let addr = server.local_addr();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(
            send(addr, CHAT, &openai_body("gpt-test", false))
                .await
                .parsed(),
        );
    }
    let statuses: Vec<u16> = seen.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let remaining: Vec<u64> = seen
        .iter()
        .map(|p| num(p, "x-ratelimit-remaining-requests"))
        .collect();
    assert_eq!(remaining, [2, 1, 0, 0]);
    for p in &seen {
        assert_eq!(num(p, "x-ratelimit-limit-requests"), 3);
        let reset = p.header("x-ratelimit-reset-requests").unwrap();
        assert!(is_go_duration(reset), "{reset}");
        // No token budget was given, so no token headers.
        assert_eq!(p.header("x-ratelimit-limit-tokens"), None);
    }
    // The refusal: OpenAI's own body shape, and both Retry-After forms.
    let refused = &seen[3];
    let error = &refused.json()["error"];
    assert_eq!(error["type"], "requests");
    assert_eq!(error["code"], "rate_limit_exceeded");
    let message = error["message"].as_str().unwrap();
    assert!(message.starts_with("Rate limit reached for gpt-test on requests per min (RPM): Limit 3, Used 3, Requested 1."), "{message}");
    let ms = num(refused, "retry-after-ms");
    let secs = num(refused, "retry-after");
    assert!(ms > 0 && secs == ms.div_ceil(1000), "{ms} ms vs {secs} s");
    // The 429 did not consume the script: entries 1-3 answered, the refusal is logged as such.
    assert_eq!(
        entries(&server),
        [
            "responses[0]#1",
            "responses[0]#2",
            "responses[0]#3",
            "capacity (429)"
        ]
    );
    server.shutdown().await;
}

/// Sends until the simulator refuses, then returns the refusal.
async fn until_refused(server: &SimServer, path: &str, body: &str) -> Parsed {
    for _ in 0..200 {
        let p = send(server.local_addr(), path, body).await.parsed();
        match p.status {
            200 => continue,
            429 => return p,
            other => panic!("unexpected status {other}"),
        }
    }
    panic!("200 requests in a row were admitted by a bucket of one");
}

#[tokio::test]
async fn issue12_honouring_the_advertised_retry_after_ms_succeeds() {
    // 60 rpm at 20x: one request per 50 ms of real time, one at once.
    let server = start(
        "capacity: {requestsPerMinute: 60, burst: 1, timeScale: 20}\nresponses:\n  - answer: {text: hi}\n",
    )
    .await;
    let body = openai_body("m", false);
    for _ in 0..3 {
        let refused = until_refused(&server, CHAT, &body).await;
        let wait = num(&refused, "retry-after-ms");
        assert!((1..=50).contains(&wait), "{wait}");
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let next = send(server.local_addr(), CHAT, &body).await.parsed();
        assert_eq!(next.status, 200, "waited the advertised {wait} ms");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn issue12_anthropic_style_headers_body_and_retry_after() {
    // 60 rpm at 20x with 6000 tokens per minute; every answer costs 10 + 20 tokens.
    let server = start(
        "capacity: {requestsPerMinute: 60, tokensPerMinute: 6000, burst: 1, timeScale: 20}\nresponses:\n  - answer: {text: hi, usage: {input_tokens: 10, output_tokens: 20}}\n",
    )
    .await;
    let body = anthropic_body("claude-test", false);
    let ok = send(server.local_addr(), MESSAGES, &body).await.parsed();
    assert_eq!(ok.status, 200);
    // The limits are per minute, as Anthropic documents them; the buckets are smaller.
    assert_eq!(num(&ok, "anthropic-ratelimit-requests-limit"), 60);
    assert_eq!(num(&ok, "anthropic-ratelimit-requests-remaining"), 0);
    assert_eq!(num(&ok, "anthropic-ratelimit-tokens-limit"), 6000);
    // The token bucket holds as many minutes as the request bucket: 6000 * 1 / 60 = 100.
    assert_eq!(num(&ok, "anthropic-ratelimit-tokens-remaining"), 70);
    for name in [
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-reset",
    ] {
        let v = ok.header(name).unwrap();
        assert!(is_rfc3339_utc(v), "{name}: {v}");
    }
    assert_eq!(ok.header("x-ratelimit-limit-requests"), None);

    let refused = until_refused(&server, MESSAGES, &body).await;
    assert_eq!(refused.json()["type"], "error");
    assert_eq!(refused.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        refused.header("retry-after-ms"),
        None,
        "not an Anthropic header"
    );
    let secs = num(&refused, "retry-after");
    assert_eq!(secs, 1, "a 50 ms wait rounds up to one whole second");
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let next = send(server.local_addr(), MESSAGES, &body).await.parsed();
    assert_eq!(next.status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn issue12_the_token_budget_refuses_on_its_own_with_type_tokens() {
    // Requests are plentiful; tokens are not: the bucket holds 200 and each answer costs 100.
    let server = start(&format!(
        "capacity: {{requestsPerMinute: 600, tokensPerMinute: 200, {FROZEN}}}\nresponses:\n  - answer: {{text: hi, usage: {{input_tokens: 40, output_tokens: 60}}}}\n"
    ))
    .await;
    let body = openai_body("m", true);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(send(server.local_addr(), CHAT, &body).await.parsed());
    }
    let statuses: Vec<u16> = seen.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    let tokens: Vec<u64> = seen
        .iter()
        .map(|p| num(p, "x-ratelimit-remaining-tokens"))
        .collect();
    assert_eq!(tokens, [100, 0, 0]);
    assert_eq!(num(&seen[2], "x-ratelimit-remaining-requests"), 598);
    assert_eq!(num(&seen[2], "x-ratelimit-limit-tokens"), 200);
    let error = &seen[2].json()["error"];
    assert_eq!(error["type"], "tokens");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("tokens per min (TPM): Limit 200, Used 200, Requested 100."),
        "{error}"
    );
    // A streamed 200 carries the headers too.
    assert_eq!(seen[0].header("content-type"), Some("text/event-stream"));
    server.shutdown().await;
}

#[tokio::test]
async fn issue12_scripted_errors_carry_the_headers_and_scenario_headers_still_win() {
    let server = start(&format!(
        "capacity: {{requestsPerMinute: 10, {FROZEN}}}\nresponses:\n  - status: 503\n  - status: 429\n    headers: {{x-ratelimit-remaining-requests: 0, retry-after: 7}}\n  - drop: close\n  - answer: {{text: hi}}\n"
    ))
    .await;
    let addr = server.local_addr();
    let body = openai_body("m", false);
    let scripted_503 = send(addr, CHAT, &body).await.parsed();
    assert_eq!(scripted_503.status, 503);
    assert_eq!(num(&scripted_503, "x-ratelimit-remaining-requests"), 9);
    let scripted_429 = send(addr, CHAT, &body).await.parsed();
    assert_eq!(scripted_429.status, 429);
    assert_eq!(num(&scripted_429, "x-ratelimit-remaining-requests"), 0);
    assert_eq!(num(&scripted_429, "x-ratelimit-limit-requests"), 10);
    assert_eq!(scripted_429.header("retry-after"), Some("7"));
    // A drop sends nothing, but it spent a request all the same.
    let dropped = send(addr, CHAT, &body).await;
    assert!(dropped.raw.is_empty());
    let answer = send(addr, CHAT, &body).await.parsed();
    assert_eq!(answer.status, 200);
    assert_eq!(num(&answer, "x-ratelimit-remaining-requests"), 6);
    server.shutdown().await;
}

#[tokio::test]
async fn issue12_concurrent_requests_spend_the_bucket_exactly_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("requests.jsonl");
    let scenario = Scenario::from_yaml_str(
        &format!(
            "capacity: {{requestsPerMinute: 8, {FROZEN}}}\nresponses:\n  - answer: {{text: hi}}\n    repeat: 32\n"
        ),
        "t",
    )
    .unwrap();
    let server = SimServer::start(
        "127.0.0.1:0".parse().unwrap(),
        scenario,
        Some(log_path.clone()),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let body = openai_body("m", false);
    let replies: Vec<_> = (0..32)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move { send(addr, CHAT, &body).await.parsed() })
        })
        .collect();
    let mut by_status: BTreeMap<u16, Vec<Parsed>> = BTreeMap::new();
    for reply in replies {
        let p = reply.await.unwrap();
        by_status.entry(p.status).or_default().push(p);
    }
    let counts: Vec<(u16, usize)> = by_status.iter().map(|(s, v)| (*s, v.len())).collect();
    assert_eq!(counts, [(200, 8), (429, 24)]);
    // Each admitted request saw a different remaining count: no two were charged as one.
    let mut remaining: Vec<u64> = by_status[&200]
        .iter()
        .map(|p| num(p, "x-ratelimit-remaining-requests"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..8).collect::<Vec<u64>>());
    assert!(by_status[&429].iter().all(|p| num(p, "retry-after") >= 1));
    // The log shows every refusal, in memory and in the file, and the script moved 8 places.
    let log = server.requests();
    let refused = log.iter().filter(|e| e.entry == "capacity (429)").count();
    assert_eq!(refused, 24);
    let mut scripted: Vec<&str> = log
        .iter()
        .filter(|e| e.entry != "capacity (429)")
        .map(|e| e.entry.as_str())
        .collect();
    scripted.sort_unstable();
    let want: Vec<String> = (1..=8).map(|i| format!("responses[0]#{i}")).collect();
    assert_eq!(scripted, want);
    server.shutdown().await;
    let from_file: Vec<RequestLogEntry> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_file, log);
}

#[tokio::test]
async fn issue12_the_time_scale_shrinks_the_advertised_wait() {
    // 6 rpm: one request per 10 s at scale 1, per 10 ms at scale 1000.
    let mut waits = Vec::new();
    for scale in ["1", "1000"] {
        let server = start(&format!(
            "capacity: {{requestsPerMinute: 6, burst: 1, timeScale: {scale}}}\nresponses:\n  - answer: {{text: hi}}\n"
        ))
        .await;
        let refused = until_refused(&server, CHAT, &openai_body("m", false)).await;
        waits.push(num(&refused, "retry-after-ms"));
        server.shutdown().await;
    }
    // At scale 1 the wait is most of 10 s unless the machine stalled for seconds between two
    // back-to-back requests; at scale 1000 it can never exceed 10 ms.
    assert!(waits[0] > 5_000 && waits[0] <= 10_000, "{waits:?}");
    assert!(waits[1] <= 10, "{waits:?}");
}

#[test]
fn issue12_a_bad_capacity_is_refused_with_one_sentence_naming_the_field() {
    let cases = [
        (
            "capacity: {requestsPerMinute: 60, burst: 61}\nresponses: [{status: 200}]\n",
            "scenario t, line 1: capacity.burst must be between 1 and capacity.requestsPerMinute (60), not 61",
        ),
        (
            "responses: [{status: 200}]\ncapacity:\n  requestsPerMinute: 0\n",
            "scenario t, line 3: capacity.requestsPerMinute must be between 1 and 1000000, not 0",
        ),
        (
            "capacity: {requestsPerMinute: 60, timeScale: 0}\nresponses: [{status: 200}]\n",
            "scenario t, line 1: capacity.timeScale must be between 0.001 and 10000, not 0",
        ),
        (
            "capacity: {requestsPerMinute: 60, tokensPerMinute: 0}\nresponses: [{status: 200}]\n",
            "scenario t, line 1: capacity.tokensPerMinute must be between 1 and 1000000000, not 0",
        ),
    ];
    for (yaml, want) in cases {
        let e = Scenario::from_yaml_str(yaml, "t")
            .expect_err(yaml)
            .to_string();
        assert_eq!(e, want);
    }
    for (yaml, mentions) in [
        (
            "capacity: {requestsPerMinute: 60, perSecond: 1}\nresponses: [{status: 200}]\n",
            "perSecond",
        ),
        (
            "capacity: {burst: 2}\nresponses: [{status: 200}]\n",
            "requestsPerMinute",
        ),
        (
            "capacity: {requestsPerMinute: -5}\nresponses: [{status: 200}]\n",
            "line 1",
        ),
    ] {
        let e = Scenario::from_yaml_str(yaml, "t")
            .expect_err(yaml)
            .to_string();
        assert!(e.starts_with("scenario t"), "{e}");
        assert!(e.contains(mentions), "{e}");
        assert!(!e.contains('\n'), "one sentence: {e}");
    }
}

/// The benchmark's shape in miniature, with a real HTTP client: 16 concurrent clients against a
/// small bucket, each honouring `retry-after-ms` until it is answered. Everyone gets through, and
/// the log holds exactly one admitted request per client plus every refusal.
#[tokio::test]
async fn issue12_concurrent_clients_that_honour_retry_after_all_get_through() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .build()
        .unwrap();
    // 60 rpm at 6x: 6 requests per real second, 4 at once, so 16 at once must meet 429s.
    let server = start(
        "capacity: {requestsPerMinute: 60, burst: 4, timeScale: 6}\nresponses:\n  - answer: {text: hi}\n",
    )
    .await;
    let url = format!("{}/chat/completions", server.base_url());
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut refusals = 0u32;
                loop {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(openai_body("m", false))
                        .send()
                        .await
                        .unwrap();
                    assert!(
                        response
                            .headers()
                            .contains_key("x-ratelimit-remaining-requests")
                    );
                    if response.status() == 200 {
                        return refusals;
                    }
                    assert_eq!(response.status(), 429);
                    let wait: u64 = response.headers()["retry-after-ms"]
                        .to_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    refusals += 1;
                    assert!(refusals < 1000, "never admitted");
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
            })
        })
        .collect();
    let mut refusals = 0;
    for task in tasks {
        refusals += task.await.unwrap();
    }
    let log = server.requests();
    let refused_in_log = log.iter().filter(|e| e.entry == "capacity (429)").count();
    assert_eq!(refused_in_log, refusals as usize);
    assert_eq!(log.len() - refused_in_log, 16);
    assert!(
        refusals > 0,
        "16 clients at once against a bucket of 4 must meet a 429"
    );
    server.shutdown().await;
}
