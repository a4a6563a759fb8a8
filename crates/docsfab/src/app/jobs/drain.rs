//! The drain of `docsfab serve`: the first SIGTERM or SIGINT stops the claims and marks the
//! service draining (`/healthz` 503), running runs get the grace (`--drain-timeout`) to finish
//! and are then cancelled; a second signal cancels them at once.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::service::Service;
use crate::app::error::CliError;

/// SIGINT and SIGTERM, installed.
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> Result<Signals, CliError> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind| {
            signal(kind)
                .map_err(|e| CliError::failed(format!("cannot install the signal handlers ({e}).")))
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }

    /// First signal: drain (no claims, healthz 503, running runs get the grace, then are
    /// cancelled). Second signal: cancel them now.
    pub async fn drain_on_signal(
        mut self,
        service: Arc<Service>,
        grace: Duration,
        stop_claiming: CancellationToken,
        cancel_all: CancellationToken,
    ) {
        let name = self.next().await;
        service.draining.store(true, Ordering::SeqCst);
        stop_claiming.cancel();
        let running = service.running_here.load(Ordering::SeqCst);
        let _ = writeln!(
            std::io::stderr(),
            "serve: {name} received: draining; {running} running run(s) get {} to finish, then are cancelled (send it again to cancel them now).",
            docsfab_runtime::progress::human_duration(
                u64::try_from(grace.as_millis()).unwrap_or(u64::MAX)
            )
        );
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            name = self.next() => {
                let _ = writeln!(std::io::stderr(), "serve: {name} received again: cancelling the running runs now.");
            }
        }
        cancel_all.cancel();
    }
}
