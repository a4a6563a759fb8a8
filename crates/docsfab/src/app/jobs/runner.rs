//! The job runner: claims queued runs from the store (oldest first, at most `--jobs` at once)
//! and runs each as a [`job`](super::job) on a blocking thread. Every 250 ms or sooner it asks
//! the store whether someone asked to cancel one of its runs; once per heartbeat (2 s by default,
//! `DOCSFAB_HEARTBEAT_MS`) it reaps the running
//! runs of dead processes (the store queues, with each mark, the resume of a run submitted with
//! `resume: auto`). It claims at once when a job ends or a run is submitted here, or a resume
//! was queued, else polls every 200 ms.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::service::{Service, log};

const IDLE_POLL: Duration = Duration::from_millis(200);
const CANCEL_POLL: Duration = Duration::from_millis(250);

/// Runs until `stop` is cancelled and every job it started has ended. `cancel_all` cancels the
/// running jobs (the drain's deadline, or a second signal).
pub async fn run(
    service: Arc<Service>,
    slots: usize,
    stop: CancellationToken,
    cancel_all: CancellationToken,
) {
    let mut jobs: JoinSet<String> = JoinSet::new();
    let mut tokens: HashMap<String, CancellationToken> = HashMap::new();
    let mut last_reap = Instant::now();
    let mut last_cancel_poll = Instant::now();
    loop {
        while !stop.is_cancelled() && jobs.len() < slots {
            match service.with_store(|s| s.claim_next()).await {
                Ok(Ok(Some(claimed))) => {
                    let token = CancellationToken::new();
                    if cancel_all.is_cancelled() {
                        token.cancel();
                    }
                    tokens.insert(claimed.run_id.clone(), token.clone());
                    service.running_here.fetch_add(1, Ordering::SeqCst);
                    log(&format!("claimed run {}", claimed.run_id));
                    let job_service = Arc::clone(&service);
                    jobs.spawn_blocking(move || {
                        let id = claimed.run_id.clone();
                        // A bug in one job must not take its slot or its token with it.
                        let run = std::panic::AssertUnwindSafe(|| {
                            super::job::execute(&job_service, claimed, token)
                        });
                        std::panic::catch_unwind(run).unwrap_or_else(|_| {
                            log(&format!("run {id}: its job stopped unexpectedly"));
                            id
                        })
                    });
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    log(&format!(
                        "cannot claim a queued run ({e}); trying again shortly"
                    ));
                    break;
                }
                Err(e) => {
                    log(&e);
                    break;
                }
            }
        }
        if stop.is_cancelled() && jobs.is_empty() {
            return;
        }
        tokio::select! {
            Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                service.running_here.fetch_sub(1, Ordering::SeqCst);
                if let Ok(id) = done {
                    tokens.remove(&id);
                }
            }
            () = service.wake.notified() => {}
            () = tokio::time::sleep(IDLE_POLL) => {}
            () = cancel_all.cancelled(), if !tokens.values().all(CancellationToken::is_cancelled) => {
                for token in tokens.values() {
                    token.cancel();
                }
            }
        }
        if last_cancel_poll.elapsed() >= CANCEL_POLL {
            last_cancel_poll = Instant::now();
            poll_cancel_requests(&service, &tokens).await;
        }
        // Once per heartbeat: a dead worker's runs are interrupted within its stale limit
        // plus one beat (docs/scale-out.md).
        if last_reap.elapsed() >= docsfab_pg::worker::heartbeat_interval() {
            last_reap = Instant::now();
            reap(&service).await;
        }
    }
}

/// Cancels the token of every running run someone asked to cancel.
async fn poll_cancel_requests(service: &Arc<Service>, tokens: &HashMap<String, CancellationToken>) {
    let ids: Vec<String> = tokens
        .iter()
        .filter(|(_, t)| !t.is_cancelled())
        .map(|(id, _)| id.clone())
        .collect();
    if ids.is_empty() {
        return;
    }
    let asked = service
        .with_store(move |s| {
            ids.into_iter()
                .filter(|id| s.cancel_requested(id).unwrap_or(false))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
    for id in asked {
        if let Some(t) = tokens.get(&id) {
            log(&format!("cancelling run {id} as asked"));
            t.cancel();
        }
    }
}

/// Marks the runs of dead processes interrupted; the store queues, in the same transaction,
/// the resume of each one submitted with `resume: auto`.
async fn reap(service: &Arc<Service>) {
    if let Ok(Ok(reaped)) = service.with_store(|s| s.reap_runs()).await {
        for run in &reaped {
            log(&format!(
                "run {} was left running by a process that no longer exists; it is now marked interrupted",
                run.run_id
            ));
            super::service::log_resume(run);
        }
        if reaped.iter().any(|r| r.resumed_as.is_some()) {
            service.wake.notify_one();
        }
    }
}
