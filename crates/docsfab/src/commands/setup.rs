//! `docsfab setup`: write `DOCSFAB_HOME/host.yaml` with the `default` provider the flags give
//! (`crate::app::host_file` checks the flags, keeps what the file holds and writes it), then
//! say what was written and what to do next.

use std::fmt::Write as _;

use clap::{Args, ValueEnum};
use docsfab_record::Api;

use crate::app::error::{CliError, emit};
use crate::app::host_file::{PROVIDER, ProviderFlags, Written, write};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApiArg {
    OpenaiChat,
    AnthropicMessages,
}

impl From<ApiArg> for Api {
    fn from(a: ApiArg) -> Api {
        match a {
            ApiArg::OpenaiChat => Api::OpenaiChat,
            ApiArg::AnthropicMessages => Api::AnthropicMessages,
        }
    }
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The provider's wire protocol.
    #[arg(long, value_enum, value_name = "API")]
    pub api: Option<ApiArg>,
    /// The provider's base URL, including the version prefix (e.g. https://api.openai.com/v1).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The provider's default model.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// The NAME of the environment variable that holds the key (never the key itself).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Requests to this provider in flight at once, across every docsfab process sharing this
    /// DOCSFAB_HOME (1..64; default 8).
    #[arg(long, value_name = "N")]
    pub max_concurrent_requests: Option<String>,
    /// The shared provider throttle: shared (default) or off.
    #[arg(long, value_name = "MODE")]
    pub throttle: Option<String>,
}

pub fn run(args: &SetupArgs) -> Result<(), CliError> {
    let w = write(&ProviderFlags {
        api: args.api.map(Api::from),
        base_url: args.base_url.clone(),
        model: args.model.clone(),
        api_key_env: args.api_key_env.clone(),
        max_concurrent_requests: args.max_concurrent_requests.clone(),
        throttle: args.throttle.clone(),
    })?;
    emit(&report(&w))
}

/// What was written, and what to do next.
fn report(w: &Written) -> String {
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{} {}",
        if w.existed { "Updated" } else { "Wrote" },
        w.path.display()
    );
    let _ = writeln!(
        report,
        "Provider {PROVIDER}: api={} baseUrl={} model={} apiKeyEnv={}",
        w.provider.api, w.provider.base_url, w.provider.model, w.provider.api_key_env
    );
    let _ = writeln!(
        report,
        "Provider {PROVIDER} throttle={} maxConcurrentRequests={}",
        w.provider.throttle.mode, w.provider.throttle.max_concurrent_requests
    );
    let _ = match &w.read_only_max_retries {
        Some(raw) => writeln!(
            report,
            "Kept readOnlyMaxRetries: {raw} as the operator's explicit override of retry.maxRetries; remove it to follow the catalog."
        ),
        None => writeln!(
            report,
            "readOnlyMaxRetries is not set, so retry.maxRetries follows the catalog."
        ),
    };
    if std::env::var_os(&w.provider.api_key_env).is_none_or(|v| v.is_empty()) {
        let _ = writeln!(
            report,
            "Note: {} is not set in this shell; export the key there before `docsfab run`.",
            w.provider.api_key_env
        );
    }
    let _ = writeln!(report, "Run `docsfab doctor` to check the configuration.");
    report
}
