//! The job runner: claims queued runs from the store (oldest first, at most `--jobs` at once)
//! and runs each like `docsfab run` does, on a blocking thread with a runtime of its own and a
//! store of its own. Every 250 ms or sooner it asks the store whether someone asked to cancel
//! one of its runs; every 2 s it reaps the running runs of dead processes. It claims at once
//! when a job ends or a run is submitted here, else polls every 200 ms.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use docsfab_runtime::composition::Access;
use docsfab_runtime::executor::{RunConfig, run_claimed};
use docsfab_runtime::progress::Progress;
use docsfab_runtime::record::RunStatus;
use docsfab_runtime::store::{Claimed, RunStore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Shared;

const IDLE_POLL: Duration = Duration::from_millis(200);
const CANCEL_POLL: Duration = Duration::from_millis(250);
/// How often a run waiting for its workspace lock tries again.
const LOCK_RETRY: Duration = Duration::from_millis(200);

fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "serve: {line}");
}

/// Runs until `stop` is cancelled and every job it started has ended. `cancel_all` cancels the
/// running jobs (the drain's deadline, or a second signal).
pub async fn run(
    shared: Arc<Shared>,
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
            match shared.with_store(|s| s.claim_next()).await {
                Ok(Ok(Some(claimed))) => {
                    let token = CancellationToken::new();
                    if cancel_all.is_cancelled() {
                        token.cancel();
                    }
                    tokens.insert(claimed.run_id.clone(), token.clone());
                    shared.running_here.fetch_add(1, Ordering::SeqCst);
                    log(&format!("claimed run {}", claimed.run_id));
                    let job_shared = Arc::clone(&shared);
                    jobs.spawn_blocking(move || {
                        let id = claimed.run_id.clone();
                        // A bug in one job must not take its slot or its token with it.
                        let run =
                            std::panic::AssertUnwindSafe(|| execute(&job_shared, claimed, token));
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
                shared.running_here.fetch_sub(1, Ordering::SeqCst);
                if let Ok(id) = done {
                    tokens.remove(&id);
                }
            }
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(IDLE_POLL) => {}
            () = cancel_all.cancelled(), if !tokens.values().all(CancellationToken::is_cancelled) => {
                for token in tokens.values() {
                    token.cancel();
                }
            }
        }
        if last_cancel_poll.elapsed() >= CANCEL_POLL {
            last_cancel_poll = Instant::now();
            poll_cancel_requests(&shared, &tokens).await;
        }
        // Once per heartbeat: a dead worker's runs are interrupted within its stale limit
        // plus one beat (docs/scale-out.md).
        if last_reap.elapsed() >= docsfab_pg::worker::heartbeat_interval() {
            last_reap = Instant::now();
            reap(&shared).await;
        }
    }
}

/// Cancels the token of every running run someone asked to cancel.
async fn poll_cancel_requests(shared: &Arc<Shared>, tokens: &HashMap<String, CancellationToken>) {
    let ids: Vec<String> = tokens
        .iter()
        .filter(|(_, t)| !t.is_cancelled())
        .map(|(id, _)| id.clone())
        .collect();
    if ids.is_empty() {
        return;
    }
    let asked = shared
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

async fn reap(shared: &Arc<Shared>) {
    if let Ok(Ok(ids)) = shared.with_store(|s| s.reap()).await {
        for id in ids {
            log(&format!(
                "run {id} was left running by a process that no longer exists; it is now marked interrupted"
            ));
            let key = id.clone();
            match shared
                .with_store(move |s| super::resume::auto(s, &key))
                .await
            {
                Ok(Ok(Some(resumed))) => {
                    log(&format!(
                        "run {id} had resume: auto; queued its resume as run {resumed}"
                    ));
                    shared.wake.notify_one();
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => log(&format!("run {id}: cannot queue its resume ({e})")),
                Err(e) => log(&format!("run {id}: cannot queue its resume ({e})")),
            }
        }
    }
}

/// One claimed run, start to end, on this blocking thread. Returns its id.
fn execute(shared: &Shared, claimed: Claimed, cancel: CancellationToken) -> String {
    let id = claimed.run_id.clone();
    let mut store = match shared.store_at.open() {
        Ok(s) => s,
        Err(e) => {
            // Without a store of its own the run cannot be recorded; end it through the API's
            // store so it does not stay `running` under this live process.
            let reason = format!("its worker could not open the run store ({e})");
            log(&format!("run {id} failed: {reason}"));
            let mut api = shared
                .api_store
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let _ = api.finish_run_because(&id, RunStatus::Failed, &reason);
            return id;
        }
    };
    match prepare_and_run(shared, &claimed, cancel.clone(), &mut store) {
        Ok(()) => {}
        Err((status, reason)) => {
            log(&format!("run {id} {}: {reason}", status.as_str()));
            record_end(&mut store, &id, status, &reason, &cancel);
        }
    }
    if let Ok(Some(record)) = store.load_run(&id) {
        log(&format!("run {id} {}", record.status.as_str()));
        shared.metrics.add_record(&record);
    }
    id
}

/// How long a worker keeps trying to record the end of a run while its store does not answer.
const END_RETRY_FOR: Duration = Duration::from_secs(300);

/// Ends a run that is still `running` with `status` and `reason`. A run that failed because its
/// store stopped answering (a database outage) cannot be ended at once either, and a run left
/// `running` under a live worker is never reaped: so this tries again (each store call already
/// waits out a short outage, then a heartbeat's pause), for about [`END_RETRY_FOR`], or until
/// the server is told to stop (then its runs are reaped as the runs of a stopped worker).
fn record_end(
    store: &mut RunStore,
    id: &str,
    status: RunStatus,
    reason: &str,
    cancel: &CancellationToken,
) {
    let until = Instant::now() + END_RETRY_FOR;
    let mut said = false;
    loop {
        match store.load_run(id) {
            Ok(Some(r)) if r.status != RunStatus::Running => return,
            Ok(None) => return,
            Ok(Some(_)) if store.finish_run_because(id, status, reason).is_ok() => return,
            _ => {}
        }
        if !said {
            log(&format!(
                "run {id}: the run store does not answer; trying again to record its end"
            ));
            said = true;
        }
        if Instant::now() >= until || cancel.is_cancelled() {
            log(&format!(
                "run {id}: its end could not be recorded; it stays running until this server stops and another worker reaps it"
            ));
            return;
        }
        std::thread::sleep(docsfab_pg::worker::heartbeat_interval());
    }
}

/// Builds the run as `docsfab run` would, waits for its workspace lock, and runs it into the
/// claimed row. `Err` is the status the run ends with before it could start, and why.
fn prepare_and_run(
    shared: &Shared,
    claimed: &Claimed,
    cancel: CancellationToken,
    store: &mut RunStore,
) -> Result<(), (RunStatus, String)> {
    let id = &claimed.run_id;
    let (mut config, throttle) = super::submit::prepare(
        &shared.home,
        shared.store_at.url(),
        shared.workspace_root.as_deref(),
        id,
        &claimed.spec,
        cancel.clone(),
    )
    .map_err(|reason| (RunStatus::Failed, reason))?;
    config.carry = super::resume::carry(store, &claimed.spec, &config.workspace)
        .map_err(|reason| (RunStatus::Failed, reason))?;
    let started = Instant::now();
    let _lock = wait_for_lock(id, &config, &cancel)?;
    if let Some(deadline) = config.job_deadline {
        config.job_deadline = Some(deadline.saturating_sub(started.elapsed()));
    }
    if cancel.is_cancelled() {
        return Err((
            RunStatus::Cancelled,
            "cancelled before it started".to_owned(),
        ));
    }
    config.throttle = throttle.open();
    // The settings were checked at startup; a run that cannot set them up runs untraced.
    let telemetry = crate::app::telemetry::Telemetry::from_env(&config)
        .ok()
        .flatten();
    config.progress = Some(progress_sink(id, telemetry.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            (
                RunStatus::Failed,
                format!("cannot start its async runtime ({e})"),
            )
        })?;
    let result = runtime.block_on(run_claimed(config, id.clone(), store));
    drop(runtime);
    // After the record is committed: the export cannot change the run.
    if let (Some(t), Ok(Some(record))) = (&telemetry, store.load_run(id))
        && let Err(why) = t.export_and_wait(&record)
    {
        log(&format!(
            "run {id}: warning: {why}; the run and its record are not affected"
        ));
    }
    result
        .map(|_| ())
        .map_err(|e| (RunStatus::Failed, e.to_string()))
}

/// The run's progress, as `docsfab run` prints it, one line each on the server's stderr with
/// the run's id in front (runs interleave), and into its OpenTelemetry timeline when exported.
fn progress_sink(
    id: &str,
    telemetry: Option<Arc<crate::app::telemetry::Telemetry>>,
) -> docsfab_runtime::progress::ProgressSink {
    let id = id.to_owned();
    Arc::new(move |p| {
        // `claimed run ID` already said it started.
        if let Some(line) = p
            .describe_line()
            .filter(|_| !matches!(p, Progress::RunStarted { .. }))
        {
            log(&format!("run {id}: {}", line.trim()));
        }
        if let Some(t) = &telemetry {
            t.observe(p);
        }
    })
}

/// For a composition with a write step: the workspace lock, as `docsfab run` takes it; when
/// another job (or a `docsfab run`) holds it, tried again every 200 ms until the run's deadline
/// or its cancellation.
fn wait_for_lock(
    run_id: &str,
    config: &RunConfig,
    cancel: &CancellationToken,
) -> Result<Option<std::fs::File>, (RunStatus, String)> {
    if !config
        .composition
        .steps
        .iter()
        .any(|s| s.access == Access::Write)
    {
        return Ok(None);
    }
    let dir = &config.workspace;
    let file = std::fs::File::open(dir).map_err(|e| {
        (
            RunStatus::Failed,
            format!("cannot open the workspace {} ({e})", dir.display()),
        )
    })?;
    let deadline = Instant::now() + config.job_deadline.unwrap_or(Duration::MAX / 4);
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if !told => {
                told = true;
                log(&format!(
                    "run {run_id} waits for its workspace {}, which another write run holds",
                    dir.display()
                ));
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err((
                    RunStatus::Failed,
                    format!(
                        "cannot lock the workspace {} for a write step ({e}); use a workspace on a local filesystem that supports file locks",
                        dir.display()
                    ),
                ));
            }
        }
        if cancel.is_cancelled() {
            return Err((
                RunStatus::Cancelled,
                "cancelled while waiting for its workspace, which another write run holds"
                    .to_owned(),
            ));
        }
        if Instant::now() >= deadline {
            return Err((
                RunStatus::Cancelled,
                format!(
                    "its job deadline passed while another write run held the workspace {}",
                    dir.display()
                ),
            ));
        }
        std::thread::sleep(LOCK_RETRY);
    }
}
