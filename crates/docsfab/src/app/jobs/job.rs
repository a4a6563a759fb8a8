//! One claimed run, start to end, on a blocking thread of the runner's: built as `docsfab run`
//! would build it (the submission's checks again, then the DNS pre-flight and, for a git
//! workspace, the clone), its workspace lock waited for within its deadline, run into the
//! claimed row on a current-thread runtime with a store of its own, its progress lines on the
//! server's stderr with the run's id in front, and the OpenTelemetry export after its record is
//! committed. A run that cannot start is ended with its `endReason`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use docsfab_record::RunStatus;
use docsfab_runtime::executor::{RunConfig, run_claimed};
use docsfab_runtime::progress::Progress;
use docsfab_runtime::store::{Claimed, RunStore};
use tokio_util::sync::CancellationToken;

use super::service::{Service, log};
use crate::app::workspace_lock::{self, Refusal};

/// One claimed run, start to end, on this blocking thread. Returns its id.
pub fn execute(service: &Service, claimed: Claimed, cancel: CancellationToken) -> String {
    let id = claimed.run_id.clone();
    let mut store = match service.store_at.open() {
        Ok(s) => s,
        Err(e) => {
            // Without a store of its own the run cannot be recorded; end it through the API's
            // store so it does not stay `running` under this live process.
            let reason = format!("its worker could not open the run store ({e})");
            log(&format!("run {id} failed: {reason}"));
            let _ = service
                .with_store_now(|api| api.finish_run_because(&id, RunStatus::Failed, &reason));
            return id;
        }
    };
    // Opening a store reaps: a dead worker's runs are often marked here, by the first job to
    // start once its heartbeat is stale, and their resumes queued with them.
    store
        .reaped_on_open()
        .iter()
        .for_each(super::service::log_resume);
    if store
        .reaped_on_open()
        .iter()
        .any(|r| r.resumed_as.is_some())
    {
        service.wake.notify_one();
    }
    match prepare_and_run(service, &claimed, cancel.clone(), &mut store) {
        Ok(()) => {}
        Err((status, reason)) => {
            log(&format!("run {id} {}: {reason}", status.as_str()));
            record_end(&mut store, &id, status, &reason, &cancel);
        }
    }
    if let Ok(Some(record)) = store.load_run(&id) {
        log(&format!("run {id} {}", record.status.as_str()));
        service.metrics.add_record(&record);
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
    service: &Service,
    claimed: &Claimed,
    cancel: CancellationToken,
    store: &mut RunStore,
) -> Result<(), (RunStatus, String)> {
    let id = &claimed.run_id;
    let (mut config, throttle) = super::submit::prepare(
        &service.home,
        service.store_at.url(),
        service.workspace_root.as_deref(),
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
/// another job (or a `docsfab run`) holds it, waited for until the run's deadline or its
/// cancellation.
fn wait_for_lock(
    run_id: &str,
    config: &RunConfig,
    cancel: &CancellationToken,
) -> Result<Option<std::fs::File>, (RunStatus, String)> {
    let deadline = Instant::now() + config.job_deadline.unwrap_or(Duration::MAX / 4);
    let dir = &config.workspace;
    workspace_lock::wait(config, deadline, cancel, || {
        log(&format!(
            "run {run_id} waits for its workspace {}, which another write run holds",
            dir.display()
        ));
    })
    .map_err(|refusal| {
        let status = match refusal {
            Refusal::Cancelled | Refusal::DeadlinePassed => RunStatus::Cancelled,
            Refusal::Open(_) | Refusal::Held | Refusal::Unsupported(_) => RunStatus::Failed,
        };
        (status, refusal.describe(dir))
    })
}
