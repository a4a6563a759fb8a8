//! No panics on any input, verdicts that never depend on the reads, and linear time on bodies
//! built to be slow.

use docsfab_boundary::{BoundaryConfig, Pass, Secret, SseDecoder, Verdict};
use docsfab_record::Api;
use proptest::prelude::*;
use std::time::{Duration, Instant};

fn configs() -> Vec<BoundaryConfig> {
    let secret = Secret::new("HOST_KEY", "hostsecret-0123456789").unwrap();
    vec![
        BoundaryConfig::new(Api::OpenaiChat, "m", std::slice::from_ref(&secret)).unwrap(),
        BoundaryConfig::new(Api::AnthropicMessages, "m", &[secret]).unwrap(),
    ]
}

fn in_reads(config: &BoundaryConfig, body: &[u8], cuts: &[usize]) -> Verdict {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let mut b = config.start();
    let mut at = 0;
    for c in cuts {
        b.feed(&body[at..c]);
        at = c;
    }
    b.feed(&body[at..]);
    b.finish()
}

/// Pieces that, joined, make bodies that reach every rule: both APIs' events, error events,
/// [DONE], BOMs, every line ending, broken JSON, escapes, keys whole and split.
fn fragment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "data: ",
        "data:",
        "event: error",
        "event: message_start",
        ": c",
        "id: 1",
        "\n",
        "\r",
        "\r\n",
        "\u{FEFF}",
        "[DONE]",
        "{\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}",
        "{\"model\":\"other\"}",
        "{\"error\":{\"code\":503}}",
        "{\"type\":\"error\",\"error\":{}}",
        "{\"type\":\"message_start\",\"message\":{\"model\":\"m\"}}",
        "{\"type\":\"content_block_delta\",\"delta\":{\"text\":\"sk-Q3xZ8kLm2Np5\"}}",
        "{\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Rt7Vw9Yb1Cd4Ef6Gh8Jk0\"}}",
        "{\"model\":\"m\",\"c\":\"a\\u0062\\n\"}",
        "{\"mod",
        "el\":\"m\"}",
        "hostsecret-01",
        "23456789",
        "{}",
        "42",
        "x",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes in arbitrary reads: no panic, and the same verdict as one read (BND-9).
    #[test]
    fn arbitrary_bytes_never_panic_and_ignore_reads_bnd_9(
        body in prop::collection::vec(any::<u8>(), 0..600),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        for config in configs() {
            prop_assert_eq!(in_reads(&config, &body, &cuts), config.check(&body));
        }
    }

    /// Bodies assembled from meaningful pieces, cut at random: the verdict is the one-read
    /// verdict (BND-9), and the SSE decoder dispatches the same events.
    #[test]
    fn structured_bodies_ignore_reads_bnd_9(
        parts in prop::collection::vec(fragment(), 0..40),
        cuts in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let body = parts.concat().into_bytes();
        for config in configs() {
            prop_assert_eq!(in_reads(&config, &body, &cuts), config.check(&body));
        }
        let decode = |cuts: &[usize]| {
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut d = SseDecoder::new();
            let mut out = Vec::new();
            let mut at = 0;
            for c in cuts {
                d.feed(&body[at..c], |e| out.push(e));
                at = c;
            }
            d.feed(&body[at..], |e| out.push(e));
            d.finish(|e| out.push(e));
            out
        };
        prop_assert_eq!(decode(&cuts), decode(&[]));
    }
}

/// Generous enough for a debug build on a busy machine; a quadratic path would take minutes.
const LINEAR: Duration = Duration::from_secs(20);

fn timed(what: &str, f: impl FnOnce() -> Verdict) -> Verdict {
    let start = Instant::now();
    let v = f();
    assert!(
        start.elapsed() < LINEAR,
        "{what} took {:?}",
        start.elapsed()
    );
    v
}

#[test]
fn a_one_megabyte_line_in_one_byte_reads_is_linear_bnd_9() {
    let config = &configs()[0];
    let mut body = b"data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"".to_vec();
    body.extend(std::iter::repeat_n(b'a', 1 << 20));
    body.extend_from_slice(b"\"}}]}");
    let v = timed("one-byte reads", || {
        let mut b = config.start();
        for byte in &body {
            b.feed(std::slice::from_ref(byte));
        }
        b.finish()
    });
    assert_eq!(v, Verdict::Pass(Pass::Stream));
}

#[test]
fn bodies_built_to_be_slow_stay_linear() {
    let config = &configs()[0];
    // A quarter megabyte: seconds in a debug build if linear, hours if quadratic.
    let size = 1 << 18;
    let key_prefixes = format!("data: \"{}\"", "sk-".repeat(size / 3));
    let glued = format!("data: \"{}\"", "sk-a".repeat(size / 4));
    let pem = format!(
        "data: \"{}\"",
        "-----BEGIN PRIVATE KEY-----".repeat(size / 27)
    );
    let escapes = format!(
        "data: {{\"model\":\"m\",\"content\":\"{}\"}}",
        "\\u0061".repeat(size / 6)
    );
    let crs = "\r".repeat(size);
    let lfs = "\n".repeat(size);
    let boms = "\u{FEFF}".repeat(size / 3);
    let tiny_events = "data: {\"model\":\"m\",\"content\":\"s\"}\n\n".repeat(size / 36);
    let nested = format!(
        "data: {{\"model\":\"m\",\"a\":{}1{}}}",
        "[".repeat(100),
        "]".repeat(100)
    )
    .repeat(1);
    for (what, body) in [
        ("key prefixes", key_prefixes),
        ("glued prefixes", glued),
        ("pem headers", pem),
        ("escapes", escapes),
        ("bare CRs", crs),
        ("LFs", lfs),
        ("BOMs", boms),
        ("tiny events", tiny_events),
        ("nesting", nested),
    ] {
        timed(what, || config.check(body.as_bytes()));
        // The same body in reads of 7 bytes.
        timed(what, || {
            let mut b = config.start();
            for piece in body.as_bytes().chunks(7) {
                b.feed(piece);
            }
            b.finish()
        });
    }
}

/// Content pieces that join into keys, PEM blocks and host secrets, or into near misses.
fn content_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "s",
        "k",
        "-",
        "sk-",
        "proj-",
        "ta",
        "ant-",
        "Q3xZ8kLm",
        "2Np5Rt7V",
        "w9Yb1Cd4",
        "Ef6Gh8Jk",
        "0123",
        " ",
        "\\n",
        "AKIA",
        "IOSFODNN",
        "7EXAMPLE",
        "nvapi-",
        "ghp_",
        "-----BEGIN ",
        "RSA ",
        "PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA",
        "hostsecret-01",
        "23456789",
        "x",
        ".",
    ])
}

fn body_of_deltas(deltas: &[String]) -> Vec<u8> {
    let mut body = String::new();
    for d in deltas {
        body.push_str(&format!(
            "data: {{\"model\":\"m\",\"choices\":[{{\"delta\":{{\"content\":\"{d}\"}}}}]}}\n\n"
        ));
    }
    body.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The joined-content window finds every credential that the content, joined into one
    /// delta, holds, however it is cut into deltas.
    #[test]
    fn credentials_split_across_deltas_are_found(
        pieces in prop::collection::vec(content_piece(), 1..40),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let joined = pieces.concat();
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(joined.len() + 1)).collect();
        at.push(joined.len());
        at.sort_unstable();
        at.dedup();
        let mut deltas = Vec::new();
        let mut from = 0;
        for c in at {
            // Never cut inside a `\n` escape: a delta is a JSON string of its own.
            let c = if c > 0 && joined.as_bytes()[c - 1] == b'\\' { c + 1 } else { c };
            if c > from && c <= joined.len() {
                deltas.push(joined[from..c].to_owned());
                from = c;
            }
        }
        if from < joined.len() {
            deltas.push(joined[from..].to_owned());
        }
        for config in configs() {
            if matches!(config.api(), Api::AnthropicMessages) {
                continue;
            }
            let whole = config.check(&body_of_deltas(std::slice::from_ref(&joined)));
            let split = config.check(&body_of_deltas(&deltas));
            if whole.refusal().is_some_and(|r| r.reason.is_credential()) {
                prop_assert!(
                    split.refusal().is_some_and(|r| r.reason.is_credential()),
                    "{:?} found whole, not in {:?}", joined, deltas
                );
            }
        }
    }
}

#[test]
fn a_key_cut_into_three_byte_deltas_is_found() {
    let config = &configs()[0];
    let key = "sk-proj-Q3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123";
    for joined in [
        format!("Use {key} now"),
        "-----BEGIN RSA PRIVATE KEY-----\\nMIIEowIBAAKCAQEAQ3xZ8kLm2Np5Rt7Vw9Yb1Cd4Ef6Gh8Jk0123"
            .to_owned(),
        "echo hostsecret-0123456789 done".to_owned(),
    ] {
        let bytes = joined.as_bytes();
        let mut deltas = Vec::new();
        let mut from = 0;
        while from < bytes.len() {
            let mut to = (from + 3).min(bytes.len());
            if bytes[to - 1] == b'\\' {
                to += 1;
            }
            deltas.push(joined[from..to].to_owned());
            from = to;
        }
        let v = config.check(&body_of_deltas(&deltas));
        assert!(
            v.refusal().is_some_and(|r| r.reason.is_credential()),
            "{joined}: {v:?}"
        );
    }
}
