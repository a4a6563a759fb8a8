//! The provider zoo (`scenarios/zoo/*.yaml`): each shipped scenario loaded from its file and
//! served over real HTTP on loopback, checking the header shapes it stands for and that admissions
//! respect its bucket. No test measures elapsed time: header values are computed at the instant a
//! request is charged, so they are exact, and counts use a copy of the file with a very slow
//! `timeScale` (nothing refills during the test) or bounds that only grow with a slow machine.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_sim::{CAPACITY_ENTRY, RequestLogEntry, Scenario, SimServer};
use support::*;

/// One request per 500 s of real time at 120 a minute: nothing refills while a test runs.
const FROZEN: &str = "0.001";

fn zoo_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/zoo")
        .join(name)
}

/// The shipped file, as is or with `timeScale` added to its capacity.
fn zoo(name: &str, time_scale: Option<&str>) -> Scenario {
    let path = zoo_path(name);
    let Some(scale) = time_scale else {
        return Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    };
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("timeScale"),
        "{name} sets its own time scale"
    );
    let text = text.replacen(
        "capacity:\n",
        &format!("capacity:\n  timeScale: {scale}\n"),
        1,
    );
    Scenario::from_yaml_str(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

async fn serve(scenario: Scenario) -> SimServer {
    SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None)
        .await
        .expect("server starts")
}

fn num(p: &Parsed, name: &str) -> u64 {
    p.header(name)
        .unwrap_or_else(|| panic!("header {name} missing from {:?}", p.headers))
        .parse()
        .unwrap_or_else(|_| panic!("header {name} is not a whole number"))
}

/// The names of the rate-limit headers a response carries, of either family.
fn rate_headers(p: &Parsed) -> Vec<&str> {
    p.headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("x-ratelimit-") || n.starts_with("anthropic-ratelimit-"))
        .collect()
}

/// `n` requests sent at once; the replies in no particular order.
async fn at_once(server: &SimServer, path: &'static str, body: &str, n: usize) -> Vec<Parsed> {
    let addr = server.local_addr();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let body = body.to_owned();
            tokio::spawn(async move { send(addr, path, &body).await.parsed() })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn statuses(replies: &[Parsed]) -> (usize, usize) {
    let ok = replies.iter().filter(|p| p.status == 200).count();
    let refused = replies.iter().filter(|p| p.status == 429).count();
    assert_eq!(ok + refused, replies.len(), "only 200s and 429s");
    (ok, refused)
}

/// Sends until refused (a slow machine may let a refill in between), then returns the refusal.
async fn until_refused(server: &SimServer, path: &str, body: &str) -> Parsed {
    for _ in 0..50 {
        let p = send(server.local_addr(), path, body).await.parsed();
        if p.status == 429 {
            return p;
        }
        assert_eq!(p.status, 200);
    }
    panic!("50 requests in a row were admitted by a bucket of one");
}

/// A frozen bucket of `burst` takes `burst` of `n` requests sent at once and refuses the rest,
/// each refusal in the log and none consuming the script.
async fn frozen_counts(name: &str, path: &'static str, burst: usize) -> Vec<Parsed> {
    let server = serve(zoo(name, Some(FROZEN))).await;
    let body = match path {
        CHAT => openai_body("gpt-test", false),
        _ => anthropic_body("claude-test", false),
    };
    let n = burst + 5;
    let replies = at_once(&server, path, &body, n).await;
    assert_eq!(statuses(&replies), (burst, 5), "{name}");
    let log = server.requests();
    let refused = log.iter().filter(|e| e.entry == CAPACITY_ENTRY).count();
    assert_eq!((log.len(), refused), (n, 5), "{name}");
    server.shutdown().await;
    replies
}

fn answer_text(p: &Parsed) -> String {
    let v = p.json();
    v["choices"][0]["message"]["content"]
        .as_str()
        .or_else(|| v["content"][0]["text"].as_str())
        .unwrap_or_else(|| panic!("no answer text in {v}"))
        .to_owned()
}

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z` as milliseconds since the Unix epoch.
fn rfc3339_ms(v: &str) -> u64 {
    let n = |r: std::ops::Range<usize>| -> i64 { v[r].parse().unwrap() };
    assert!(v.ends_with('Z') && &v[10..11] == "T", "{v}");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant), the inverse of the simulator's conversion.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    let ms = if v.len() > 20 { n(20..23) } else { 0 };
    (secs * 1000 + ms) as u64
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test]
async fn zoo_burst1_openai_reports_per_minute_limits_and_whole_second_retry_after() {
    let server = serve(zoo("burst1-openai.yaml", None)).await;
    let body = openai_body("gpt-test", false);
    let ok = send(server.local_addr(), CHAT, &body).await.parsed();
    assert_eq!(ok.status, 200);
    assert_eq!(answer_text(&ok), "Done.");
    // OpenAI's quantized limit: 120 a minute, enforced one request at a time.
    assert_eq!(num(&ok, "x-ratelimit-limit-requests"), 120);
    assert_eq!(num(&ok, "x-ratelimit-remaining-requests"), 0);
    assert_eq!(ok.header("x-ratelimit-reset-requests"), Some("500ms"));
    assert_eq!(ok.header("x-ratelimit-limit-tokens"), None);

    let refused = until_refused(&server, CHAT, &body).await;
    assert_eq!(num(&refused, "x-ratelimit-limit-requests"), 120);
    assert_eq!(num(&refused, "x-ratelimit-remaining-requests"), 0);
    // At most half a second to wait, rounded up to a whole second; no milliseconds.
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("retry-after-ms"), None);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("(RPM): Limit 120, Used 1, Requested 1."),
        "{message}"
    );
    // `headers: openai`: the OpenAI family on the Anthropic API too.
    let other = send(server.local_addr(), MESSAGES, &anthropic_body("c", false))
        .await
        .parsed();
    assert!(
        rate_headers(&other)
            .iter()
            .all(|n| n.starts_with("x-ratelimit-")),
        "{:?}",
        other.headers
    );
    assert_eq!(num(&other, "x-ratelimit-limit-requests"), 120);
    server.shutdown().await;

    let replies = frozen_counts("burst1-openai.yaml", CHAT, 1).await;
    for p in replies.iter().filter(|p| p.status == 429) {
        // 500 real seconds to the next request at this time scale, rounded up.
        assert_eq!(p.header("retry-after"), Some("500"));
        assert_eq!(p.header("retry-after-ms"), None);
    }
}

#[tokio::test]
async fn zoo_burst_n_openai_lets_ten_through_at_once_under_a_per_minute_limit() {
    let server = serve(zoo("burstN-openai.yaml", None)).await;
    let ok = send(server.local_addr(), CHAT, &openai_body("gpt-test", false))
        .await
        .parsed();
    assert_eq!(ok.status, 200);
    assert_eq!(num(&ok, "x-ratelimit-limit-requests"), 120);
    assert_eq!(num(&ok, "x-ratelimit-remaining-requests"), 9);
    // One request short of a full bucket, refilling two a second.
    assert_eq!(ok.header("x-ratelimit-reset-requests"), Some("500ms"));
    server.shutdown().await;

    let replies = frozen_counts("burstN-openai.yaml", CHAT, 10).await;
    let mut remaining: Vec<u64> = replies
        .iter()
        .filter(|p| p.status == 200)
        .map(|p| num(p, "x-ratelimit-remaining-requests"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..10).collect::<Vec<u64>>());
    for p in &replies {
        assert_eq!(num(p, "x-ratelimit-limit-requests"), 120);
        if p.status == 429 {
            assert_eq!(p.header("retry-after"), Some("500"));
            assert_eq!(p.header("retry-after-ms"), None);
        }
    }
}

#[tokio::test]
async fn zoo_burst1_anthropic_reports_rfc3339_resets_and_seconds() {
    let server = serve(zoo("burst1-anthropic.yaml", None)).await;
    let body = anthropic_body("claude-test", false);
    let before = unix_ms(SystemTime::now());
    let ok = send(server.local_addr(), MESSAGES, &body).await.parsed();
    let after = unix_ms(SystemTime::now());
    assert_eq!(ok.status, 200);
    assert_eq!(answer_text(&ok), "Done.");
    assert_eq!(num(&ok, "anthropic-ratelimit-requests-limit"), 120);
    assert_eq!(num(&ok, "anthropic-ratelimit-requests-remaining"), 0);
    // Full again half a second after the request was charged, somewhere in [before, after].
    let reset = rfc3339_ms(ok.header("anthropic-ratelimit-requests-reset").unwrap());
    assert!(
        before + 500 <= reset && reset <= after + 501,
        "{before} {reset} {after}"
    );
    assert!(
        rate_headers(&ok)
            .iter()
            .all(|n| n.starts_with("anthropic-ratelimit-requests-")),
        "{:?}",
        ok.headers
    );

    let refused = until_refused(&server, MESSAGES, &body).await;
    assert_eq!(refused.json()["error"]["type"], "rate_limit_error");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("retry-after-ms"), None);
    assert_eq!(num(&refused, "anthropic-ratelimit-requests-limit"), 120);
    // `headers: anthropic`: the Anthropic family on the OpenAI API too.
    let other = send(server.local_addr(), CHAT, &openai_body("m", false))
        .await
        .parsed();
    assert_eq!(num(&other, "anthropic-ratelimit-requests-limit"), 120);
    assert_eq!(other.header("x-ratelimit-limit-requests"), None);
    server.shutdown().await;

    frozen_counts("burst1-anthropic.yaml", MESSAGES, 1).await;
}

#[tokio::test]
async fn zoo_no_headers_sends_only_retry_after_on_a_429() {
    let server = serve(zoo("no-headers.yaml", None)).await;
    for (path, body) in [
        (CHAT, openai_body("m", false)),
        (MESSAGES, anthropic_body("c", false)),
    ] {
        let refused = until_refused(&server, path, &body).await;
        assert!(rate_headers(&refused).is_empty(), "{:?}", refused.headers);
        assert_eq!(refused.header("retry-after"), Some("1"));
        assert_eq!(refused.header("retry-after-ms"), None);
    }
    server.shutdown().await;
    let replies = frozen_counts("no-headers.yaml", CHAT, 1).await;
    for p in &replies {
        assert!(rate_headers(p).is_empty(), "{:?}", p.headers);
    }
}

#[tokio::test]
async fn zoo_retry_after_ms_sends_only_milliseconds() {
    let server = serve(zoo("retry-after-ms.yaml", None)).await;
    for (path, body) in [
        (CHAT, openai_body("m", false)),
        (MESSAGES, anthropic_body("c", false)),
    ] {
        let refused = until_refused(&server, path, &body).await;
        let ms = num(&refused, "retry-after-ms");
        assert!((1..=500).contains(&ms), "{ms}");
        assert_eq!(refused.header("retry-after"), None);
        assert_eq!(num(&refused, "x-ratelimit-limit-requests"), 120);
    }
    server.shutdown().await;
    let replies = frozen_counts("retry-after-ms.yaml", CHAT, 1).await;
    for p in replies.iter().filter(|p| p.status == 429) {
        let ms = num(p, "retry-after-ms");
        assert!((499_000..=500_000).contains(&ms), "{ms}");
        assert_eq!(p.header("retry-after"), None);
    }
}

#[tokio::test]
async fn zoo_retry_after_none_leaves_only_the_reset_header() {
    let server = serve(zoo("retry-after-none.yaml", None)).await;
    let refused = until_refused(&server, CHAT, &openai_body("m", false)).await;
    assert_eq!(refused.header("retry-after"), None);
    assert_eq!(refused.header("retry-after-ms"), None);
    assert_eq!(num(&refused, "x-ratelimit-remaining-requests"), 0);
    let reset = refused.header("x-ratelimit-reset-requests").unwrap();
    assert!(reset.ends_with("ms") || reset == "0s", "{reset}");
    server.shutdown().await;
    let replies = frozen_counts("retry-after-none.yaml", CHAT, 1).await;
    for p in replies.iter().filter(|p| p.status == 429) {
        assert_eq!(p.header("retry-after"), None);
        assert_eq!(p.header("retry-after-ms"), None);
    }
}

/// A request whose body is `bytes` long (so its prompt estimate is `bytes / 4` tokens).
fn sized_body(api: &str, bytes: usize) -> String {
    let base = if api == CHAT {
        openai_body("m", false)
    } else {
        anthropic_body("c", false)
    };
    let padded = base.replacen("hello", &"x".repeat(bytes - base.len() + "hello".len()), 1);
    assert_eq!(padded.len(), bytes);
    padded
}

#[tokio::test]
async fn zoo_prompt_tokens_charges_the_prompt_and_reports_input_tokens_on_anthropic() {
    let server = serve(zoo("prompt-tokens.yaml", None)).await;
    let body = sized_body(CHAT, 8_000);
    let ok = send(server.local_addr(), CHAT, &body).await.parsed();
    assert_eq!(ok.status, 200);
    assert_eq!(num(&ok, "x-ratelimit-limit-requests"), 600);
    assert_eq!(num(&ok, "x-ratelimit-remaining-requests"), 599);
    assert_eq!(num(&ok, "x-ratelimit-limit-tokens"), 60_000);
    // Ten seconds' worth (10,000) minus this prompt's 2,000; the answer's output is free.
    assert_eq!(num(&ok, "x-ratelimit-remaining-tokens"), 8_000);
    assert_eq!(ok.header("x-ratelimit-reset-tokens"), Some("2s"));
    let log = server.requests();
    assert_eq!(log[0].prompt_tokens, 2_000);
    server.shutdown().await;

    // The budget binds before the requests do: five prompts of 2,000 fill it.
    let server = serve(zoo("prompt-tokens.yaml", Some(FROZEN))).await;
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let p = send(server.local_addr(), CHAT, &body).await.parsed();
        assert_eq!(p.status, 200);
        remaining.push(num(&p, "x-ratelimit-remaining-tokens"));
    }
    assert_eq!(remaining, [8_000, 6_000, 4_000, 2_000, 0]);
    let refused = send(server.local_addr(), CHAT, &body).await.parsed();
    assert_eq!(refused.status, 429);
    let error = &refused.json()["error"];
    assert_eq!(error["type"], "tokens");
    // "Used" is what the bucket lacks, so the token or so refilled meanwhile shows.
    let message = error["message"].as_str().unwrap();
    let used: u64 = message
        .split_once("(TPM): Limit 60000, Used ")
        .and_then(|(_, rest)| rest.split_once(", Requested 2000."))
        .and_then(|(used, _)| used.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!((9_000..=10_000).contains(&used), "{message}");
    // A small prompt still fits the 500-odd requests left: it is the tokens that ran out.
    assert!(num(&refused, "x-ratelimit-remaining-requests") >= 590);
    let log = server.requests();
    assert!(log.iter().all(|e| e.prompt_tokens == 2_000), "{log:?}");
    server.shutdown().await;

    // On the Anthropic API the prompt budget is the input-tokens family (ITPM).
    let server = serve(zoo("prompt-tokens.yaml", Some(FROZEN))).await;
    let ok = send(server.local_addr(), MESSAGES, &sized_body(MESSAGES, 4_000))
        .await
        .parsed();
    assert_eq!(ok.status, 200);
    assert_eq!(num(&ok, "anthropic-ratelimit-input-tokens-limit"), 60_000);
    assert_eq!(
        num(&ok, "anthropic-ratelimit-input-tokens-remaining"),
        9_000
    );
    assert!(
        ok.header("anthropic-ratelimit-input-tokens-reset")
            .is_some()
    );
    assert_eq!(ok.header("anthropic-ratelimit-tokens-limit"), None);
    assert_eq!(num(&ok, "anthropic-ratelimit-requests-limit"), 600);
    server.shutdown().await;
}

#[tokio::test]
async fn zoo_outside_client_takes_capacity_the_headers_still_promise() {
    // 60x: the outside client arrives every 1/36 s of real time, the bucket refills 120 a second.
    let started = std::time::Instant::now();
    let server = serve(zoo("outside-client.yaml", Some("60"))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Nobody else used the bucket, so every arrival so far found room (a slow machine only adds
    // arrivals).
    let idle = server
        .outside_client()
        .expect("the scenario has an outside client");
    assert!(idle.admitted >= 10, "{idle:?}");
    assert_eq!(idle.refused, 0, "{idle:?}");
    assert!(server.requests().is_empty(), "not request-log entries");

    let body = openai_body("m", false);
    let mut admitted = 0;
    for _ in 0..3 {
        let replies = at_once(&server, CHAT, &body, 10).await;
        for p in &replies {
            // The header promises the whole 120 a minute, the outside client's share included.
            assert_eq!(num(p, "x-ratelimit-limit-requests"), 120);
            if p.status == 429 {
                assert!(num(p, "retry-after") >= 1);
                assert_eq!(p.header("retry-after-ms"), None);
            }
        }
        admitted += statuses(&replies).0 as u64;
    }
    let outside = server.outside_client().unwrap();
    let span = started.elapsed().as_secs_f64();
    // Together never more than one bucket plus the refill (120 a real second) over a span that
    // is at least the server's own.
    let most = 1.0 + 120.0 * span;
    assert!(
        (admitted + outside.admitted) as f64 <= most,
        "{admitted} + {outside:?} in {span} s"
    );
    assert!(outside.admitted >= idle.admitted);
    assert_eq!(server.requests().len(), 30);
    server.shutdown().await;

    let plain = serve(zoo("burst1-openai.yaml", None)).await;
    assert_eq!(plain.outside_client(), None);
    plain.shutdown().await;
}

#[test]
fn zoo_every_file_loads_and_says_what_it_models() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/zoo");
    let mut names = Vec::new();
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# "),
            "{} has no header comment",
            path.display()
        );
        let scenario = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(scenario.scripted_len() > 0, "{}", path.display());
        assert!(text.contains("\ncapacity:\n"), "{}", path.display());
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(
        names,
        [
            "burst1-anthropic.yaml",
            "burst1-openai.yaml",
            "burstN-openai.yaml",
            "no-headers.yaml",
            "outside-client.yaml",
            "prompt-tokens.yaml",
            "retry-after-ms.yaml",
            "retry-after-none.yaml"
        ]
    );
}

#[test]
fn zoo_bad_provider_options_are_refused_with_one_sentence_naming_the_field() {
    let cases = [
        (
            "outsideShare: 1.5",
            "capacity.outsideShare must be between 0 and 0.9, not 1.5",
        ),
        (
            "limitHeader: minute",
            "capacity.limitHeader must be perMinute or bucket, not minute",
        ),
        (
            "headers: azure",
            "capacity.headers must be api, openai, anthropic or none, not azure",
        ),
        (
            "retryAfter: date",
            "capacity.retryAfter must be both, seconds, milliseconds or none, not date",
        ),
        (
            "tokensPerMinute: 1000, tokens: output",
            "capacity.tokens must be total or prompt, not output",
        ),
        (
            "tokensPerMinute: 1000, tokenBurstSeconds: 0",
            "capacity.tokenBurstSeconds must be between 1 and 60, not 0",
        ),
        (
            "tokenBurstSeconds: 10",
            "capacity.tokenBurstSeconds needs capacity.tokensPerMinute, the token budget it shapes",
        ),
        (
            "tokens: prompt",
            "capacity.tokens needs capacity.tokensPerMinute, the token budget it shapes",
        ),
    ];
    for (extra, want) in cases {
        let yaml = format!(
            "capacity: {{requestsPerMinute: 120, {extra}}}\nresponses: [{{status: 200}}]\n"
        );
        let e = Scenario::from_yaml_str(&yaml, "t")
            .expect_err(&yaml)
            .to_string();
        assert_eq!(e, format!("scenario t, line 1: {want}"));
    }
    // Misspelt keys are unknown fields, as everywhere.
    let e = Scenario::from_yaml_str(
        "capacity: {requestsPerMinute: 120, outsideshare: 0.3}\nresponses: [{status: 200}]\n",
        "t",
    )
    .expect_err("unknown key")
    .to_string();
    assert!(e.contains("outsideshare") && !e.contains('\n'), "{e}");
}

#[test]
fn zoo_log_lines_written_before_prompt_tokens_still_read() {
    let old = r#"{"index":0,"time_unix_ms":1,"method":"POST","path":"/v1/messages","sha256":"ab","model":null,"stream":false,"entry":"responses[0]"}"#;
    let entry: RequestLogEntry = serde_json::from_str(old).unwrap();
    assert_eq!(entry.prompt_tokens, 0);
    assert_eq!(entry.billed, docsfab_sim::BilledUsage::default());
    let line = serde_json::to_string(&entry).unwrap();
    assert!(
        line.ends_with(
            r#""entry":"responses[0]","prompt_tokens":0,"billed":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#
        ),
        "{line}"
    );
}
