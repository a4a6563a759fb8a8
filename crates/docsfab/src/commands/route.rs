//! `docsfab route serve`: the flags, and resolving the composition's provider from the host
//! configuration. The route itself is the docsfab-route crate.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use docsfab_route::{RouteError, ServerLimits, Upstream};

use crate::app::throttle::ThrottlePlan;
use docsfab_runtime::composition::Composition;

use crate::app::error::CliError;
use crate::app::home::{HostContext, read_optional};

#[derive(Debug, Args)]
pub struct RouteArgs {
    #[command(subcommand)]
    pub command: RouteCommand,
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Serve the composition route on loopback (OpenAI /v1/chat/completions and Anthropic
    /// /v1/messages). Prints `listening on http://ADDR/v1` first, then runs until Ctrl-C or
    /// SIGTERM.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Loopback address to listen on; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The composition whose provider and model the route forwards to.
    #[arg(long, value_name = "FILE")]
    pub composition: PathBuf,
    /// Close a connection whose request head has not fully arrived within this many
    /// milliseconds; also how long an idle keep-alive connection stays open.
    #[arg(long, value_name = "MS", env = "DOCSFAB_ROUTE_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub header_timeout_ms: u64,
    /// Answer 408 to a request whose body has not fully arrived within this many milliseconds
    /// after its head.
    #[arg(long, value_name = "MS", env = "DOCSFAB_ROUTE_BODY_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub body_timeout_ms: u64,
    /// Connections served at once; a connection past this gets a 503 and is closed.
    #[arg(long, value_name = "N", env = "DOCSFAB_ROUTE_MAX_CONNECTIONS", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_connections: u64,
    /// On Ctrl-C or SIGTERM, how many milliseconds connections get to finish before they are
    /// dropped and the process exits.
    #[arg(long, value_name = "MS", env = "DOCSFAB_ROUTE_SHUTDOWN_GRACE_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub shutdown_grace_ms: u64,
}

impl ServeArgs {
    fn server_limits(&self) -> ServerLimits {
        ServerLimits {
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            // The parser bounds it to 1..=4096.
            max_connections: usize::try_from(self.max_connections).unwrap_or(64),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
        }
    }
}

pub fn run(args: &RouteArgs, store: Option<&str>) -> Result<(), CliError> {
    match &args.command {
        RouteCommand::Serve(serve) => serve_command(serve, store),
    }
}

fn serve_command(args: &ServeArgs, store: Option<&str>) -> Result<(), CliError> {
    docsfab_route::check_listen(args.listen).map_err(cli_error)?;
    let ctx = HostContext::load()?;
    let path = &args.composition;
    let text = read_optional(path, "composition")?.ok_or_else(|| {
        CliError::bad_input(format!(
            "the composition {} does not exist; check the path given to --composition.",
            path.display()
        ))
    })?;
    let composition = Composition::parse(&text, &path.display().to_string())?;
    let selected = ctx.select_provider(&composition, path)?;
    let provider = selected.provider;
    let upstream = Upstream {
        provider_name: selected.provider_name.to_owned(),
        host_path: ctx.host.path.clone(),
        api: provider.api,
        base_url: provider.base_url.clone(),
        model: selected.model.to_owned(),
        key_env: provider.api_key_env.clone(),
        key: std::env::var(&provider.api_key_env).unwrap_or_default(),
        limits: ctx.limits.replay_limits(),
        timeout: Duration::from_millis(composition.limits.timeout_ms),
        throttle: ThrottlePlan::for_store_url(
            &ctx.home.dir,
            &crate::app::store::store_url(&ctx.home.dir, store)?,
            &ctx.host,
        )
        .open(),
    };
    docsfab_route::serve(args.listen, upstream, args.server_limits()).map_err(cli_error)
}

fn cli_error(e: RouteError) -> CliError {
    match e {
        RouteError::BadInput(m) => CliError::bad_input(m),
        RouteError::Failed(m) => CliError::failed(m),
    }
}
