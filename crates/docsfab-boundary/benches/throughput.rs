//! The boundary's throughput on a generated 10 MB chat-completion stream, against a floor of
//! what any consumer must do anyway: split lines with memchr and parse every data line with
//! serde_json. Run: `cargo bench -p docsfab-boundary -- --measurement-time 3`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use docsfab_boundary::{BoundaryConfig, EventReader, Pass, Secret, Verdict};
use docsfab_record::Api;
use std::hint::black_box;

const MODEL: &str = "gpt-4o-mini-2024-07-18";
const TARGET: usize = 10 << 20;
const READ: usize = 16 << 10;

/// A realistic stream: one chunk per short delta, a newline escape now and then, prose that
/// brushes against key prefixes ("task-", "ask-"), a usage chunk and [DONE] at the end.
fn stream() -> Vec<u8> {
    let words = [
        "The",
        " boundary",
        " checks",
        " every",
        " task-oriented",
        " chunk",
        " before",
        " the",
        " consumer",
        " reads",
        " it",
        ".\\n\\n",
        " Ask-me",
        " anything",
        " about",
        " `sk-learn`",
        " or",
        " AKIA",
        " prefixes",
        ":",
        " ",
        "\\\"quoted\\\"",
        " text",
        ",",
        " é",
        " 🙂",
    ];
    let mut body = Vec::with_capacity(TARGET + 4096);
    let mut i = 0usize;
    while body.len() < TARGET {
        let w = words[i % words.len()];
        body.extend_from_slice(
            format!(
                "data: {{\"id\":\"chatcmpl-AbC123xYz\",\"object\":\"chat.completion.chunk\",\"created\":1732900000,\"model\":\"{MODEL}\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            )
            .as_bytes(),
        );
        i += 1;
    }
    body.extend_from_slice(format!("data: {{\"id\":\"chatcmpl-AbC123xYz\",\"object\":\"chat.completion.chunk\",\"created\":1732900000,\"model\":\"{MODEL}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":10,\"completion_tokens\":{i},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n", i + 10).as_bytes());
    body
}

/// The floor: memchr line splitting and a full serde_json parse of every data line.
fn floor(body: &[u8]) -> usize {
    let mut parsed = 0;
    for line in memchr::memchr_iter(b'\n', body).scan(0, |start, end| {
        let line = &body[*start..end];
        *start = end + 1;
        Some(line)
    }) {
        if let Some(data) = line.strip_prefix(b"data: ")
            && data != b"[DONE]"
        {
            let v: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
            parsed += usize::from(v.is_object());
        }
    }
    parsed
}

/// The same floor parsing into `IgnoredAny` (validation only), for comparison.
fn floor_validate_only(body: &[u8]) -> usize {
    let mut parsed = 0;
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', body) {
        let line = &body[start..end];
        start = end + 1;
        if let Some(data) = line.strip_prefix(b"data: ")
            && data != b"[DONE]"
        {
            parsed += usize::from(serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok());
        }
    }
    parsed
}

fn bench(c: &mut Criterion) {
    let body = stream();
    let secrets = [Secret::new("OPENAI_API_KEY", "sk-host-0123456789abcdefABCDEF0123").unwrap()];
    let config = BoundaryConfig::new(Api::OpenaiChat, MODEL, &secrets).unwrap();
    assert_eq!(config.check(&body), Verdict::Pass(Pass::Stream));

    let mut g = c.benchmark_group("chat_stream_10mb");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.sample_size(10);
    g.bench_function("floor_memchr_serde_value", |b| {
        b.iter(|| floor(black_box(&body)))
    });
    g.bench_function("floor_memchr_serde_ignored", |b| {
        b.iter(|| floor_validate_only(black_box(&body)))
    });
    g.bench_function("boundary_one_shot", |b| {
        b.iter(|| config.check(black_box(&body)))
    });
    g.bench_function("boundary_16k_reads", |b| {
        b.iter(|| {
            let mut boundary = config.start();
            for read in black_box(&body).chunks(READ) {
                boundary.feed(read);
            }
            boundary.finish()
        })
    });
    // What the provider transport now runs per body: the verdict and every line's chunk in one
    // pass (compare with boundary_16k_reads plus a `Value` parse per line, as before).
    g.bench_function("event_reader_judged_16k_reads", |b| {
        b.iter(|| {
            let mut reader = EventReader::judged(&config);
            let mut text = 0usize;
            for read in black_box(&body).chunks(READ) {
                reader.feed(read, |e| text += e.chunks.len());
            }
            (reader.finish(|e| text += e.chunks.len()), text)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
