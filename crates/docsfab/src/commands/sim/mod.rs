//! `docsfab sim serve`: the fault-injecting provider simulator as a foreground process.

pub mod goodput;
pub mod plot;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use docsfab_sim::SimError;

use crate::app::error::CliError;
use crate::app::execute::runtime;

#[derive(Debug, Args)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Serve a scenario on loopback (OpenAI /v1/chat/completions and Anthropic /v1/messages).
    /// Prints `listening on http://ADDR/v1` first, then runs until Ctrl-C or SIGTERM.
    Serve(ServeArgs),
    /// Monte Carlo of the retry policy (and peers' defaults) against a fault model: step
    /// success with a 95% interval, step time, requests and waits per policy (docs/budgets.md).
    Goodput(goodput::GoodputArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Loopback address to listen on; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The scenario file (format: docs/simulator.md).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Also write the request log (JSON Lines) to this file.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}

/// `store`: the global `--store` flag (`sim goodput --fault-model store` reads that store).
pub fn run(args: &SimArgs, store: Option<&str>) -> Result<(), CliError> {
    match &args.command {
        SimCommand::Serve(serve) => runtime()?
            .block_on(docsfab_sim::serve_command(
                serve.listen,
                &serve.scenario,
                serve.log.as_deref(),
            ))
            .map_err(to_cli_error),
        SimCommand::Goodput(g) => goodput::run(g, store),
    }
}

fn to_cli_error(e: SimError) -> CliError {
    match e {
        SimError::Stdout(_) | SimError::Signal(_) => CliError::failed(e.to_string()),
        // Everything else is about what the operator passed: the scenario, the address, the log path.
        _ => CliError::bad_input(e.to_string()),
    }
}
