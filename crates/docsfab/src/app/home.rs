//! The host directory and what every command reads from it: `host.yaml`, the `DOCSFAB_`
//! environment, and the resolved limits. The pure parsing and resolution live in
//! `docsfab_policy`; this module only does the I/O around them.

use std::collections::BTreeMap;
use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};

use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::host::{HostConfig, MAX_CONFIG_BYTES, ProviderConfig, shown_list, shown_value};
use docsfab_policy::rules::{OPERATOR_FILE_NAME, RulesTable};
use docsfab_runtime::composition::Composition;

use crate::app::error::{CliError, plain_reason};

/// The file name of the host configuration inside `DOCSFAB_HOME`.
pub const HOST_FILE_NAME: &str = "host.yaml";

/// Where `DOCSFAB_HOME` is and how it was chosen.
#[derive(Debug, Clone)]
pub struct Home {
    pub dir: PathBuf,
    /// `true` when `DOCSFAB_HOME` was set, `false` for the `$HOME/.docsfab` default.
    pub from_env: bool,
}

impl Home {
    /// `DOCSFAB_HOME`, or `$HOME/.docsfab`.
    pub fn locate() -> Result<Home, CliError> {
        if let Some(dir) = std::env::var_os("DOCSFAB_HOME").filter(|d| !d.is_empty()) {
            return Ok(Home {
                dir: PathBuf::from(dir),
                from_env: true,
            });
        }
        match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(home) => Ok(Home {
                dir: PathBuf::from(home).join(".docsfab"),
                from_env: false,
            }),
            None => Err(CliError::bad_input(
                "neither DOCSFAB_HOME nor HOME is set, so docsfab cannot find its host directory; set DOCSFAB_HOME to a directory docsfab may use.",
            )),
        }
    }

    pub fn host_file(&self) -> PathBuf {
        self.dir.join(HOST_FILE_NAME)
    }

    pub fn rules_file(&self) -> PathBuf {
        self.dir.join(OPERATOR_FILE_NAME)
    }
}

/// Reads a configuration text file that may be absent. Any other read failure is bad
/// configuration, and so is anything that is not a regular file of at most
/// [`MAX_CONFIG_BYTES`]: a FIFO would block the command forever and `/dev/zero` would fill
/// memory, so neither is read at all.
pub fn read_optional(path: &Path, what: &str) -> Result<Option<String>, CliError> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};

    let shown = path.display();
    let refuse = |problem: String| {
        CliError::bad_input(format!(
            "the {what} {shown} {problem}; point docsfab at a regular UTF-8 file of at most 1 MiB."
        ))
    };
    // Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer;
    // the type check on the opened file then refuses it before any read.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
        Err(e) => return Err(refuse(format!("cannot be read ({})", io_reason(&e)))),
    };
    let meta = file
        .metadata()
        .map_err(|e| refuse(format!("cannot be read ({})", io_reason(&e))))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let is = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        return Err(refuse(format!("is {is}, not a regular file")));
    }
    let too_big = || refuse(format!("is larger than {MAX_CONFIG_BYTES} bytes"));
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    // Read at most one byte past the cap, in case the file grew after the size check.
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| refuse(format!("cannot be read ({})", io_reason(&e))))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| refuse("is not UTF-8 text".to_string()))
}

/// An I/O error in words, without the `(os error N)` tail.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        IoKind::PermissionDenied => "permission denied".to_string(),
        IoKind::IsADirectory => "it is a directory".to_string(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(at) => text[..at].to_string(),
                None => text,
            }
        }
    }
}

/// The text of the composition file at `path`; `given_to` names where the path was given
/// (`` `docsfab run` ``, `--composition`), for the message when the file does not exist.
pub fn read_composition(path: &Path, given_to: &str) -> Result<String, CliError> {
    read_optional(path, "composition")?.ok_or_else(|| {
        CliError::bad_input(format!(
            "the composition {} does not exist; check the path given to {given_to}.",
            path.display()
        ))
    })
}

/// The checks `docsfab run` makes on its inputs before anything is written, shared with
/// `docsfab doctor --composition` so that the two accept and refuse exactly the same files:
/// host.yaml, the environment and the rules table; the composition; the provider it names; and
/// the provider's base URL as the HTTP transport reads it. `require_provider` is false only for
/// doctor without a host.yaml, which warns instead (run then stops at the provider).
pub fn validate_run_inputs(
    composition_path: &Path,
    given_to: &str,
    require_provider: bool,
) -> Result<(HostContext, Composition), CliError> {
    let ctx = HostContext::load()?;
    let text = read_composition(composition_path, given_to)?;
    check_run_text(ctx, &text, composition_path, require_provider)
}

/// [`validate_run_inputs`] for a run, which also keeps the composition's text.
pub fn validate_run_file(
    path: &Path,
    given_to: &str,
) -> Result<(HostContext, Composition, String), CliError> {
    let ctx = HostContext::load()?;
    let text = read_composition(path, given_to)?;
    let (ctx, composition) = check_run_text(ctx, &text, path, true)?;
    Ok((ctx, composition, text))
}

/// [`validate_run_inputs`] on a composition's text; `named` is the name messages give it (its
/// path, or the stored composition of a run).
pub fn validate_run_text(
    text: &str,
    named: &Path,
    require_provider: bool,
) -> Result<(HostContext, Composition), CliError> {
    check_run_text(HostContext::load()?, text, named, require_provider)
}

fn check_run_text(
    ctx: HostContext,
    text: &str,
    named: &Path,
    require_provider: bool,
) -> Result<(HostContext, Composition), CliError> {
    let composition = Composition::parse(text, &named.display().to_string())?;
    if require_provider || ctx.host_file_exists {
        let selected = ctx.select_provider(&composition, named)?;
        check_transport(&selected)?;
    }
    crate::app::telemetry::check_env()?;
    Ok((ctx, composition))
}

/// Builds (and drops) the transport the run would use, without a key, so a base URL it cannot
/// use is refused here rather than after the run store is opened.
fn check_transport(selected: &Selected<'_>) -> Result<(), CliError> {
    use docsfab_provider::transport::{HttpConfig, HttpTransport, TransportBuildError};
    let config = HttpConfig::new(selected.provider.api, &selected.provider.base_url, None);
    match HttpTransport::new(config) {
        Ok(_) => Ok(()),
        Err(TransportBuildError::BadUrl(reason)) => Err(CliError::bad_input(format!(
            "the baseUrl of provider {} is not usable ({}); fix it in host.yaml.",
            shown_value(selected.provider_name),
            plain_reason(&reason, "not an http or https URL")
        ))),
        Err(e) => Err(CliError::failed(format!(
            "cannot prepare the HTTP client ({}).",
            plain_reason(&e.to_string(), "unknown reason")
        ))),
    }
}

/// The host configuration, and whether a `host.yaml` exists.
pub fn load_host(home: &Home) -> Result<(HostConfig, bool), CliError> {
    let (host, file) = load_host_file(home)?;
    Ok((host, file != HostFile::Absent))
}

/// What is at `DOCSFAB_HOME/host.yaml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostFile {
    Absent,
    /// Present but with nothing in it (zero bytes, blank lines, comments): a file `setup` never
    /// writes, so most likely truncated or emptied by hand, and worth saying so.
    Empty,
    Written,
}

/// The host configuration, and what kind of file it came from.
pub fn load_host_file(home: &Home) -> Result<(HostConfig, HostFile), CliError> {
    let path = home.host_file();
    let shown = path.display().to_string();
    match read_optional(&path, "host configuration")? {
        Some(text) => {
            let kind = if is_blank_yaml(&text) {
                HostFile::Empty
            } else {
                HostFile::Written
            };
            Ok((HostConfig::parse(&text, &shown)?, kind))
        }
        None => Ok((HostConfig::empty(shown), HostFile::Absent)),
    }
}

/// True when YAML text holds no content: only whitespace, comments and document markers.
fn is_blank_yaml(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
    })
}

/// The `DOCSFAB_` environment variables. A value that is not UTF-8 is kept lossily, so it is
/// refused as "not a whole number" by name rather than silently ignored.
pub fn docsfab_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with("DOCSFAB_")
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect()
}

/// Everything a command needs from the host, validated.
#[derive(Debug, Clone)]
pub struct HostContext {
    pub home: Home,
    pub host: HostConfig,
    pub host_file_exists: bool,
    /// `host.yaml` exists but says nothing (see [`HostFile::Empty`]).
    pub host_file_empty: bool,
    pub env: BTreeMap<String, String>,
    pub limits: EffectiveLimits,
    pub rules: RulesTable,
    /// `None` for the embedded table, or the operator copy's path.
    pub rules_path: Option<PathBuf>,
}

impl HostContext {
    /// Reads and validates `host.yaml`, the environment and the rules table.
    pub fn load() -> Result<HostContext, CliError> {
        let home = Home::locate()?;
        let (host, host_file) = load_host_file(&home)?;
        let env = docsfab_env();
        let limits = resolve(&host, &env)?;
        let rules_file = home.rules_file();
        let (rules, rules_path) = match read_optional(&rules_file, "rules table")? {
            Some(text) => (
                RulesTable::parse(&text, &rules_file.display().to_string())?,
                Some(rules_file),
            ),
            None => (RulesTable::embedded()?, None),
        };
        Ok(HostContext {
            home,
            host,
            host_file_exists: host_file != HostFile::Absent,
            host_file_empty: host_file == HostFile::Empty,
            env,
            limits,
            rules,
            rules_path,
        })
    }
}

impl HostContext {
    /// A warning for each set `DOCSFAB_` variable docsfab does not read (names only, never
    /// values); the key variables host.yaml names count as read.
    pub fn unknown_env_warnings(&self) -> Vec<String> {
        let key_vars: Vec<&str> = self
            .host
            .providers
            .values()
            .map(|p| p.api_key_env.as_str())
            .collect();
        crate::app::env_names::unknown_warnings(self.env.keys().map(String::as_str), &key_vars)
    }
}

/// The provider and model a composition runs on.
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    pub provider_name: &'a str,
    pub provider: &'a ProviderConfig,
    /// The composition's `model`, or the provider's default model.
    pub model: &'a str,
}

impl HostContext {
    /// The provider `composition` names, which host.yaml must define.
    pub fn select_provider<'a>(
        &'a self,
        composition: &'a Composition,
        composition_path: &Path,
    ) -> Result<Selected<'a>, CliError> {
        let Some((name, provider)) = self.host.providers.get_key_value(&composition.provider)
        else {
            if self.host_file_empty {
                return Err(CliError::bad_input(format!(
                    "{} is empty, so no provider is configured; run `docsfab setup` to write it, then run again.",
                    self.host.path
                )));
            }
            let known: Vec<&str> = self.host.providers.keys().map(String::as_str).collect();
            let hint = if self.host_file_exists {
                "add the provider to host.yaml or name a defined one"
            } else {
                "run `docsfab setup` to create host.yaml with the \"default\" provider"
            };
            return Err(CliError::bad_input(format!(
                "the composition {} uses provider {}, which {} does not define (it defines: {}); {hint}.",
                composition_path.display(),
                shown_value(&composition.provider),
                self.host.path,
                shown_list(known)
            )));
        };
        Ok(Selected {
            provider_name: name,
            provider,
            model: composition.model.as_deref().unwrap_or(&provider.model),
        })
    }
}
