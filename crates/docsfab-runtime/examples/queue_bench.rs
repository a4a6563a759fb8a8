//! Claim throughput of the run store's job queue (docs/scale-out.md, "Benchmark").
//!
//! `queue_bench STORE_URL JOBS CLAIMERS`: enqueues JOBS runs, then CLAIMERS threads, each with
//! a store connection of its own (as separate workers have), claim until the queue is empty;
//! every claimed run is finished at once, so a claim is all the work there is. Prints one JSON
//! line: claims per second and the mean claim+finish time. Every run must be claimed exactly
//! once, or it exits 1.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use docsfab_record::RunStatus;
use docsfab_runtime::store::{JobSpec, JobWorkspace, RunStore, StoreOptions, StoreUrl};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: queue_bench STORE_URL JOBS CLAIMERS");
        std::process::exit(2);
    }
    let url = StoreUrl::parse(&args[1]).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let jobs: usize = args[2].parse().expect("JOBS is a number");
    let claimers: usize = args[3].parse().expect("CLAIMERS is a number");
    let open = || RunStore::open_url(&url, StoreOptions::default()).expect("open the store");
    let mut store = open();
    let spec = JobSpec {
        composition_yaml: "name: bench\n".into(),
        composition_name: "bench".into(),
        workspace: JobWorkspace::Path {
            path: "/tmp".into(),
        },
        resume: None,
        resume_from: None,
    };
    for _ in 0..jobs {
        store.enqueue(&spec).expect("enqueue");
    }
    let barrier = Arc::new(Barrier::new(claimers + 1));
    let threads: Vec<_> = (0..claimers)
        .map(|_| {
            let mut mine = open();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let mut ids = Vec::new();
                while let Some(claimed) = mine.claim_next().expect("claim") {
                    mine.finish_run(&claimed.run_id, RunStatus::Succeeded)
                        .expect("finish");
                    ids.push(claimed.run_id);
                }
                ids
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in threads {
        for id in t.join().expect("claimer") {
            total += 1;
            seen.insert(id);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if total != jobs || seen.len() != jobs {
        eprintln!(
            "claimed {total} times, {} distinct, of {jobs} jobs",
            seen.len()
        );
        std::process::exit(1);
    }
    println!(
        "{{\"store\": \"{}\", \"claimers\": {claimers}, \"jobs\": {jobs}, \"claimsPerSecond\": {:.1}, \"meanClaimAndFinishMs\": {:.2}}}",
        if matches!(url, StoreUrl::Postgres(_)) {
            "postgres"
        } else {
            "sqlite"
        },
        jobs as f64 / secs,
        secs * 1000.0 * claimers as f64 / jobs as f64
    );
}
