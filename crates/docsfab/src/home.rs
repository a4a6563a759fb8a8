//! The host directory and what every command reads from it: `host.yaml`, the `DOCSFAB_`
//! environment, and the resolved limits. The pure parsing and resolution live in
//! `docsfab_policy`; this module only does the I/O around them.

use std::collections::BTreeMap;
use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};

use docsfab_policy::catalog::{EffectiveLimits, resolve};
use docsfab_policy::host::{HostConfig, ProviderConfig};
use docsfab_policy::rules::{OPERATOR_FILE_NAME, RulesTable};
use docsfab_runtime::composition::Composition;

use crate::error::CliError;

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

/// Reads a text file that may be absent. Any other read failure is bad configuration.
pub fn read_optional(path: &Path, what: &str) -> Result<Option<String>, CliError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == IoKind::NotFound => Ok(None),
        Err(e) => Err(CliError::bad_input(format!(
            "cannot read the {what} {} ({e}); check that it is a readable UTF-8 file.",
            path.display()
        ))),
    }
}

/// Reads and parses the composition file at `path`; `given_to` names where the path was given
/// (`` `docsfab run` ``, `--composition`), for the message when the file does not exist.
pub fn load_composition(path: &Path, given_to: &str) -> Result<Composition, CliError> {
    let text = read_optional(path, "composition")?.ok_or_else(|| {
        CliError::bad_input(format!(
            "the composition {} does not exist; check the path given to {given_to}.",
            path.display()
        ))
    })?;
    Ok(Composition::parse(&text, &path.display().to_string())?)
}

/// The host configuration, and whether a `host.yaml` exists.
pub fn load_host(home: &Home) -> Result<(HostConfig, bool), CliError> {
    let path = home.host_file();
    let shown = path.display().to_string();
    match read_optional(&path, "host configuration")? {
        Some(text) => Ok((HostConfig::parse(&text, &shown)?, true)),
        None => Ok((HostConfig::empty(shown), false)),
    }
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
        let (host, host_file_exists) = load_host(&home)?;
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
            host_file_exists,
            env,
            limits,
            rules,
            rules_path,
        })
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
            let known: Vec<&str> = self.host.providers.keys().map(String::as_str).collect();
            let hint = if self.host_file_exists {
                "add the provider to host.yaml or name a defined one"
            } else {
                "run `docsfab setup` to create host.yaml with the \"default\" provider"
            };
            return Err(CliError::bad_input(format!(
                "the composition {} uses provider {:?}, which {} does not define (it defines: {}); {hint}.",
                composition_path.display(),
                composition.provider,
                self.host.path,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        Ok(Selected {
            provider_name: name,
            provider,
            model: composition.model.as_deref().unwrap_or(&provider.model),
        })
    }
}
