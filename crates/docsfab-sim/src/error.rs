//! Errors as data: every failure the simulator reports to its caller.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong while loading a scenario or running the server.
///
/// Each variant renders as one sentence that names the file or address involved, so the CLI can
/// print it as is.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario file could not be read at all.
    #[error("cannot read scenario file {}: {source} (check the --scenario path)", path.display())]
    ReadScenario {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The scenario text is not valid YAML, has an unknown field, or breaks a rule of the format.
    #[error("{}", describe_scenario_error(file, *line, message))]
    Scenario {
        /// Where the text came from (a path, or a name given by the caller).
        file: String,
        /// 1-based line of the offending node, when known.
        line: Option<u64>,
        message: String,
    },
    /// The simulator only listens on loopback addresses.
    #[error(
        "refusing to listen on {addr}: the simulator serves loopback only (use 127.0.0.1:PORT or [::1]:PORT)"
    )]
    NotLoopback { addr: SocketAddr },
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source} (pick another port, or port 0 for a free one)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The request log file could not be created.
    #[error(
        "cannot create the request log {}: {source} (check that its directory exists and is writable)",
        path.display()
    )]
    LogFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the `listening on` line failed.
    #[error("cannot write to stdout: {0}")]
    Stdout(#[source] std::io::Error),
    /// Installing the Ctrl-C / SIGTERM handler failed.
    #[error("cannot install the shutdown signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

fn describe_scenario_error(file: &str, line: Option<u64>, message: &str) -> String {
    match line {
        Some(line) => format!("scenario {file}, line {line}: {message}"),
        None => format!("scenario {file}: {message}"),
    }
}
