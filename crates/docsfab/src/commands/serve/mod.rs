//! `docsfab serve`: the job service's HTTP face. An HTTP API (and the web page of [`page`])
//! over the job service of `crate::app::jobs`: a submitted run is `queued` in the run store,
//! and this process's job runner claims queued runs, at most `--jobs` at once, first come first
//! served, and runs each like `docsfab run` would. Any number of serve processes may share one
//! store; each claims runs for itself.
//!
//! Startup validates everything before listening (host.yaml, limits, rules table, the token
//! variable, the listen address, the workspace root, the store): bad input is one sentence and
//! exit 2. The first stdout line is `listening on http://ADDR`. SIGTERM or SIGINT drains: no new
//! claims, `/healthz` answers 503, running runs get `--drain-timeout` to finish and are then
//! cancelled (recorded `cancelled`); a second signal cancels them at once. The process exits 0.

pub mod api;
mod auth;
mod events;
pub mod page;
mod reply;
mod state;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use docsfab_route::ServerLimits;
use tokio_util::sync::CancellationToken;

use self::state::Shared;
use crate::app::error::CliError;
use crate::app::home::HostContext;
use crate::app::jobs::drain::Signals;
use crate::app::jobs::service::Service;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0 picks a free port). Anything but loopback needs
    /// --token-env.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// How many runs this process runs at once (1 to 64).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// The environment variable holding the bearer token every request must carry
    /// (`Authorization: Bearer TOKEN` or the `docsfab_token` cookie).
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// The directory under which submitted path workspaces must lie; without it only git
    /// workspaces are accepted.
    #[arg(long, value_name = "DIR")]
    pub workspace_root: Option<PathBuf>,
    /// How long running runs may go on after SIGTERM before they are cancelled (e.g. 30s,
    /// 500ms, 2m).
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

/// `30s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; write e.g. 30s, 500ms or 2m"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?} is not a duration; write e.g. 30s, 500ms or 2m"))?;
    Ok(Duration::from_millis(ms))
}

/// The HTTP server's limits: the route's hardening defaults. Event streams are long-lived, so
/// they end themselves when the server stops (`Shared::stopping`).
fn server_limits() -> ServerLimits {
    ServerLimits {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(60),
        max_connections: 256,
        shutdown_grace: Duration::from_secs(5),
    }
}

pub fn run(args: &ServeArgs, store: Option<&str>) -> Result<(), CliError> {
    let ctx = HostContext::load()?;
    // The token variable counts as read, like the providers' key variables.
    let mut read: Vec<&str> = ctx
        .host
        .providers
        .values()
        .map(|p| p.api_key_env.as_str())
        .collect();
    read.extend(args.token_env.as_deref());
    for warning in
        crate::app::env_names::unknown_warnings(ctx.env.keys().map(String::as_str), &read)
    {
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
    crate::app::telemetry::check_env()?;
    let token = auth::read_token(args.token_env.as_deref())?;
    if token.is_none() && !args.listen.ip().is_loopback() {
        return Err(CliError::bad_input(format!(
            "docsfab serve would listen on {}, which is not a loopback address, without a token; add --token-env VAR naming a variable that holds a bearer token, or listen on 127.0.0.1.",
            args.listen
        )));
    }
    let service = Service::open(&ctx.home.dir, store, args.workspace_root.as_deref())?;
    let limits = server_limits();
    let shared = Arc::new(Shared {
        service: Arc::new(service),
        stopping: CancellationToken::new(),
        body_timeout: limits.body_timeout,
    });
    let runtime = crate::app::execute::runtime()?;
    runtime.block_on(serve(args, shared, token.map(Arc::new), limits))
}

async fn serve(
    args: &ServeArgs,
    shared: Arc<Shared>,
    token: Option<Arc<auth::Token>>,
    limits: ServerLimits,
) -> Result<(), CliError> {
    // Installed before the `listening on` line, so a supervisor that signals as soon as it
    // reads it still gets a drain.
    let signals = Signals::install()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            CliError::bad_input(format!(
                "cannot listen on {} ({}); pick another address or port 0 for a free one.",
                args.listen,
                crate::app::error::plain_reason(&e.to_string(), "unknown reason")
            ))
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::failed(format!("cannot read the listening address ({e}).")))?;
    crate::app::error::emit(&format!("listening on http://{addr}\n"))?;
    let _ = writeln!(
        std::io::stderr(),
        "serve: up to {} runs at once; store {}",
        args.jobs,
        shared.service.store_at.url()
    );

    let stop_claiming = CancellationToken::new();
    let cancel_all = CancellationToken::new();
    let runner = tokio::spawn(crate::app::jobs::runner::run(
        Arc::clone(&shared.service),
        usize::from(args.jobs),
        stop_claiming.clone(),
        cancel_all.clone(),
    ));
    tokio::spawn(signals.drain_on_signal(
        Arc::clone(&shared.service),
        args.drain_timeout,
        stop_claiming,
        cancel_all,
    ));
    let app = api::router(Arc::clone(&shared), token);
    let stopping = shared.stopping.clone();
    let runner_done = async move {
        let _ = runner.await;
    };
    let stopped = docsfab_route::http_server::serve(
        listener,
        app,
        limits,
        busy_body(),
        runner_done,
        move || stopping.cancel(),
    )
    .await;
    let _ = writeln!(
        std::io::stderr(),
        "serve: stopped{}",
        if stopped.drained {
            ""
        } else {
            " (connections still open after the shutdown grace were closed)"
        }
    );
    // Every run this worker held has ended.
    shared.service.sign_off().await;
    Ok(())
}

/// The 503 past the connection cap (sent before the request is read).
fn busy_body() -> axum::body::Bytes {
    axum::body::Bytes::from_static(
        b"{\"error\": \"docsfab serve is serving as many connections as it allows; retry shortly.\"}",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_drain_timeout_reads_units_and_refuses_words() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("").is_err());
    }
}
