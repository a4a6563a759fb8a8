//! The docsfab command line: `commands` holds one module per command (or group) over the
//! shared layer in `app`; each returns `Result<(), CliError>` and
//! `main` turns the error into one sentence on stderr and an exit code (0 ok, 1 failed, 2 bad
//! input or configuration, 130 cancelled).

mod app;
mod commands;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::app::error::CliError;
use crate::app::{error, progress, telemetry};
use crate::commands::{check_docs, demo, doctor, new, route, run, runs, serve, setup, sim};

/// Run multi-step documentation workflows against LLM providers, with auditable retries.
#[derive(Debug, Parser)]
#[command(name = "docsfab", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
    /// When to color the output: auto (on a terminal whose TERM is not dumb, unless NO_COLOR is
    /// set), always, or never.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = progress::ColorChoice::Auto)]
    color: progress::ColorChoice,
    /// The run store: sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DATABASE (default:
    /// sqlite:$DOCSFAB_HOME/runs.db). Used by run, runs, serve, demo, doctor and sim goodput
    /// --fault-model store; route serve shares the throttle of a PostgreSQL store.
    #[arg(
        long,
        global = true,
        env = "DOCSFAB_STORE",
        value_name = "URL",
        hide_env_values = true
    )]
    store: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Write DOCSFAB_HOME/host.yaml (keeps an existing readOnlyMaxRetries as it is).
    Setup(setup::SetupArgs),
    /// Check the host configuration, environment and a composition; print effective limits.
    Doctor(doctor::DoctorArgs),
    /// Write a ready composition from a template (wiki, quickstart) to start from; without a
    /// template, list them. Never overwrites a file.
    New(new::NewArgs),
    /// Run a composition; the first line of stdout is the run id (exit 0 succeeded, 1 failed,
    /// 2 bad input or configuration, 130 cancelled).
    Run(run::RunArgs),
    /// List recorded runs, or show one run's steps, attempts, turns and retry decisions.
    Runs(runs::RunsArgs),
    /// Run the bundled example against the built-in fault-injecting simulator, showing every
    /// retry as it happens, then print the run.
    Demo,
    /// The fault-injecting provider simulator, for tests, demos and benchmarks.
    Sim(sim::SimArgs),
    /// The composition route: OpenAI- and Anthropic-compatible endpoints on loopback that forward
    /// to the composition's provider with in-turn replay and the response boundary.
    Route(route::RouteArgs),
    /// The job service: an HTTP API and web page that queue runs in the run store and run them,
    /// at most --jobs at once. Prints `listening on http://ADDR` first; SIGTERM drains.
    Serve(serve::ServeArgs),
    /// Check existing Markdown against the tree it describes: every cited path, code name,
    /// relative link and line range must exist (exit 0 all grounded, 1 some unknown, 2 bad input).
    CheckDocs(check_docs::CheckDocsArgs),
    /// Print a shell completion script to stdout (e.g. `docsfab completions bash > ~/.local/share/bash-completion/completions/docsfab`).
    Completions {
        /// The shell to write the script for.
        shell: clap_complete::Shell,
    },
    /// Print the docsfab(1) man page (roff) to stdout (e.g. `docsfab man | man -l -`).
    Man,
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Commands::Setup(args) => setup::run(&args),
        Commands::Doctor(args) => doctor::run(&args, cli.store.as_deref()),
        Commands::New(args) => new::run(&args),
        Commands::Run(args) => run::run(&args, cli.color, cli.store.as_deref()),
        Commands::Runs(args) => runs::run(&args, cli.store.as_deref(), cli.color),
        Commands::Demo => demo::run(cli.color, cli.store.as_deref()),
        Commands::Sim(args) => sim::run(&args, cli.store.as_deref()),
        Commands::Route(args) => route::run(&args, cli.store.as_deref()),
        Commands::Serve(args) => serve::run(&args, cli.store.as_deref()),
        Commands::CheckDocs(args) => check_docs::run(&args),
        Commands::Completions { shell } => completions(shell),
        Commands::Man => man_page(),
    }
}

/// Both scripts are generated from the same clap definition the parser uses, so they cannot
/// drift from the real flags.
fn completions(shell: clap_complete::Shell) -> Result<(), CliError> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "docsfab", &mut buf);
    write_stdout(&buf)
}

fn man_page() -> Result<(), CliError> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut buf)
        .map_err(|e| CliError::failed(format!("cannot render the man page ({e}).")))?;
    write_stdout(&buf)
}

/// Both generators emit UTF-8 text; anything else would be a bug in them.
fn write_stdout(bytes: &[u8]) -> Result<(), CliError> {
    error::emit(&String::from_utf8_lossy(bytes))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = run(cli);
    // A run's OpenTelemetry export, if one is under way (bounded; a failure is a warning).
    telemetry::wait_for_export();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Every refusal passes the one redaction path on its way out, whatever built it:
            // one line, control characters escaped, credential shapes withheld.
            let line = docsfab_boundary::redact::Redactor::default().line(&e.to_string());
            // Not eprintln!: a closed stderr must not turn a clean refusal into a panic.
            let _ = writeln!(std::io::stderr(), "error: {line}");
            e.exit_code()
        }
    }
}
