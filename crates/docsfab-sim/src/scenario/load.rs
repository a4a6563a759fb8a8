//! Reading a scenario: a file (a regular file of at most 1 MiB) or a text, parsed under the
//! configuration files' YAML budget and resolved, every refusal one message with the file and
//! the line.

use std::path::Path;

use super::Scenario;
use super::raw::RawScenario;
use super::resolve::Resolver;
use crate::SimError;

impl Scenario {
    /// Parses and checks a scenario. `source` names the text in error messages (usually its path).
    pub fn from_yaml_str(text: &str, source: &str) -> Result<Scenario, SimError> {
        // The same YAML budget as the configuration files (docsfab-policy's `from_yaml`).
        let options = serde_saphyr::options! {
            strict_booleans: true,
            with_snippet: false,
            budget: serde_saphyr::budget! {
                max_depth: 40,
                max_nodes: 50_000,
                max_aliases: 64,
                max_documents: 1,
            },
        };
        let raw: RawScenario = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
            let line = e.location().map(|l| l.line()).filter(|&l| l > 0);
            SimError::Scenario {
                file: source.to_owned(),
                line,
                message: plain_yaml_message(&e),
            }
        })?;
        let fail = |line: Option<u64>, message: String| SimError::Scenario {
            file: source.to_owned(),
            line,
            message,
        };
        Resolver::default()
            .scenario(raw)
            .map_err(|e| fail(e.line, e.message))
    }

    /// Reads and parses a scenario file.
    /// Only a regular file of at most 1 MiB is read: a FIFO would block `sim serve` before it
    /// listens and `/dev/zero` would fill memory.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        use std::io::{Error, ErrorKind, Read as _};
        const MAX_BYTES: u64 = 1024 * 1024;
        let fail = |source: Error| SimError::ReadScenario {
            path: path.to_owned(),
            source,
        };
        // Checked before opening, since opening a FIFO for reading waits for a writer.
        let meta = std::fs::metadata(path).map_err(fail)?;
        if !meta.is_file() {
            return Err(fail(Error::new(
                ErrorKind::InvalidInput,
                "it is not a regular file",
            )));
        }
        let too_big = || {
            fail(Error::new(
                ErrorKind::InvalidInput,
                format!("it is larger than {MAX_BYTES} bytes"),
            ))
        };
        if meta.len() > MAX_BYTES {
            return Err(too_big());
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(fail)?
            .take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(fail)?;
        if text.len() as u64 > MAX_BYTES {
            return Err(too_big());
        }
        Scenario::from_yaml_str(&text, &path.display().to_string())
    }
}

/// serde-saphyr's rendering carries its own location prefix; keep only the message so that ours
/// (file and line) comes first and is not repeated.
fn plain_yaml_message(e: &serde_saphyr::Error) -> String {
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
    // Drop a trailing " at line L, column C" that some messages carry.
    let message = match first.find(" at line ") {
        Some(at) => &first[..at],
        None => first,
    };
    // Keep the sentence single: drop the library's advice on its own options.
    let message = match message.find(", set DuplicateKeyPolicy") {
        Some(at) => &message[..at],
        None => message,
    };
    // Say what was expected in words rather than in Rust type names.
    let plain = match message {
        "invalid u16" => "expected a whole number from 0 to 65535",
        "invalid u32" => "expected a whole number from 0 to 4294967295",
        "invalid u64" | "invalid usize" => "expected a whole number, 0 or more",
        "invalid f64" => "expected a number",
        "expected sequence start" => "expected a list here",
        "expected mapping start" => "expected a mapping (key: value) here",
        m if m.starts_with("budget breached") => {
            "the scenario is larger or deeper than allowed (at most 40 levels, 50000 values, 64 aliases)"
        }
        m if m.starts_with("multiple YAML documents") => {
            "the file holds more than one YAML document (a second --- line)"
        }
        other => other,
    };
    plain.to_owned()
}
