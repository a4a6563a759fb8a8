//! How many admissions a second one process gets from the shared throttle, against an unpaced
//! provider: TASKS tasks each acquire a permit, finish it at once, and go again, for SECONDS.
//! Prints admissions a second and the store calls they cost. Run two at once on one
//! PostgreSQL database to see two hosts share it (docs/performance.md, "The throttle's cost").
//!
//!   cargo run --release -p docsfab-throttle --example decisions -- sqlite:/tmp/t.db 50 5
//!   cargo run --release -p docsfab-throttle --example decisions -- postgres://u@h/db 50 5

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use docsfab_throttle::{Backend, DEFAULT_POLL, Mode, Outcome, RateHeaders, Settings, Throttle};
use tokio_util::sync::CancellationToken;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: decisions sqlite:PATH|postgres://URL TASKS SECONDS";
    let (Some(place), Some(tasks), Some(seconds)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let backend = match place.strip_prefix("sqlite:") {
        Some(path) => Backend::Sqlite(path.into()),
        None => match docsfab_pg::PgUrl::parse(place) {
            Ok(url) => Backend::Postgres(url),
            Err(e) => {
                eprintln!("{place} is not a sqlite:PATH or a PostgreSQL URL: {e}; {usage}");
                std::process::exit(2);
            }
        },
    };
    let (Ok(tasks), Ok(seconds)) = (tasks.parse::<u32>(), seconds.parse::<u64>()) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let settings = Settings::new(Mode::Shared, 64).expect("64 is in range");
    let throttle = Throttle::open_at(&backend, [("bench".to_owned(), settings)], DEFAULT_POLL)
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let admitted = Arc::new(AtomicU64::new(0));
    let calls_before = throttle.store_calls();
    let started = Instant::now();
    rt.block_on(async {
        let end = started + Duration::from_secs(seconds);
        let mut handles = vec![];
        for _ in 0..tasks {
            let (t, admitted) = (throttle.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                let cancel = CancellationToken::new();
                while Instant::now() < end {
                    let p = t.acquire("bench", &cancel, None).await.expect("permit");
                    admitted.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    let ok = Outcome::Success {
                        input_tokens: Some(10),
                        output_tokens: Some(5),
                    };
                    p.finish(ok, &RateHeaders::none()).expect("finish");
                }
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let n = admitted.load(Ordering::Relaxed);
    let calls = throttle.store_calls() - calls_before;
    println!(
        "{place}: {tasks} tasks, {n} admissions in {secs:.1} s: {:.0} admissions/s, {:.0} store calls/s",
        n as f64 / secs,
        calls as f64 / secs
    );
}
