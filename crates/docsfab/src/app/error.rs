//! The one error type every command returns, and the exit code it maps to.

use std::fmt;
use std::process::ExitCode;

/// How a command ended when it did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The work ran and failed (exit 1).
    Failed,
    /// Bad input or configuration, found before any work started (exit 2).
    BadInput,
    /// The caller cancelled (exit 130, as a shell reports SIGINT).
    Cancelled,
}

impl ErrorKind {
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Failed => 1,
            ErrorKind::BadInput => 2,
            ErrorKind::Cancelled => 130,
        }
    }
}

/// A command's failure: its kind and one sentence for stderr saying what is wrong, where, and
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CliError {
    pub fn bad_input(message: impl Into<String>) -> CliError {
        CliError {
            kind: ErrorKind::BadInput,
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> CliError {
        CliError {
            kind: ErrorKind::Failed,
            message: message.into(),
        }
    }

    pub fn cancelled(message: impl Into<String>) -> CliError {
        CliError {
            kind: ErrorKind::Cancelled,
            message: message.into(),
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.kind.exit_code())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// Writes command output to stdout. A closed pipe (`docsfab doctor | head -1`) is not an error
/// and never a panic, unlike `println!`.
pub fn emit(text: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::failed(format!(
            "cannot write to standard output ({e})."
        ))),
    }
}

/// A library's error text cut to something an operator can read on one line: the first line,
/// without an `(os error N)` tail; `fallback` instead when it carries SQL or is long, since a
/// statement from the store's schema says nothing useful about a file that is not ours.
pub fn plain_reason(text: &str, fallback: &str) -> String {
    let first = text.lines().next().unwrap_or("").trim();
    let first = first.split(" (os error").next().unwrap_or(first);
    let upper = text.to_ascii_uppercase();
    let sql = [
        "CREATE ", "SELECT ", "INSERT ", "UPDATE ", "PRAGMA ", " TABLE", " COLUMN", "SQL",
    ]
    .iter()
    .any(|w| upper.contains(w));
    if sql || first.is_empty() || first.len() > 120 || text.contains('\n') {
        fallback.to_string()
    } else {
        first.to_string()
    }
}

/// Configuration errors from the libraries are all bad input.
impl From<docsfab_policy::host::HostError> for CliError {
    fn from(e: docsfab_policy::host::HostError) -> Self {
        CliError::bad_input(e.to_string())
    }
}

impl From<docsfab_policy::catalog::ConfigError> for CliError {
    fn from(e: docsfab_policy::catalog::ConfigError) -> Self {
        CliError::bad_input(e.to_string())
    }
}

impl From<docsfab_runtime::composition::CompositionError> for CliError {
    fn from(e: docsfab_runtime::composition::CompositionError) -> Self {
        CliError::bad_input(e.to_string())
    }
}

impl From<docsfab_policy::rules::RulesError> for CliError {
    fn from(e: docsfab_policy::rules::RulesError) -> Self {
        let text = e.to_string();
        let text = text.trim_end_matches('.');
        CliError::bad_input(format!(
            "{text}; fix the rules table or remove the operator copy to use the embedded one."
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_reason_drops_sql_and_extra_lines() {
        let fb = "not a docsfab run store";
        assert_eq!(
            plain_reason("no such column: x in\nCREATE INDEX i ON runs (x);", fb),
            fb
        );
        assert_eq!(
            plain_reason("file is not a database", fb),
            "file is not a database"
        );
        assert_eq!(
            plain_reason("Permission denied (os error 13)", fb),
            "Permission denied"
        );
    }

    #[test]
    fn kinds_map_to_documented_exit_codes() {
        assert_eq!(CliError::failed("x").kind.exit_code(), 1);
        assert_eq!(CliError::bad_input("x").kind.exit_code(), 2);
        assert_eq!(CliError::cancelled("x").kind.exit_code(), 130);
    }
}
