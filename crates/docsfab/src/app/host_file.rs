//! `DOCSFAB_HOME/host.yaml` as `docsfab setup` writes it.
//!
//! The generated file has no numeric `readOnlyMaxRetries`, so `retry.maxRetries` follows the
//! catalog (CFG-4). An existing numeric `readOnlyMaxRetries` is an explicit operator override and
//! is written back exactly as it was; setup does not guess where it came from. Other providers
//! and `catalog:` lowerings are kept; the `default` provider gets the flags given. YAML comments
//! of an existing file are not kept. No key is ever written: `--api-key-env` takes the NAME of
//! the variable, and a value that looks like a key is refused without being echoed.
//!
//! The file is written to a temporary file in the same directory and renamed over `host.yaml`,
//! so a reader never sees a half-written file.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use docsfab_policy::host::{
    DEFAULT_MAX_CONCURRENT_REQUESTS, HostConfig, ProviderConfig, ProviderSpend, ProviderThrottle,
    StructuredOutput, ThrottleMode, UrlProblem, check_base_url, check_key_env_name,
    check_max_concurrent_requests, check_model, check_throttle_mode,
};
use docsfab_record::Api;

use crate::app::error::CliError;
use crate::app::home::{Home, load_host};

/// The provider `setup` writes.
pub const PROVIDER: &str = "default";

/// The settings of the `default` provider that `setup`'s flags give; `None` is a flag not
/// given.
#[derive(Debug, Default)]
pub struct ProviderFlags {
    /// The provider's wire protocol.
    pub api: Option<Api>,
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// The NAME of the environment variable that holds the key (never the key itself).
    pub api_key_env: Option<String>,
    pub max_concurrent_requests: Option<String>,
    /// `shared` or `off`.
    pub throttle: Option<String>,
}

/// What [`write`] wrote.
pub struct Written {
    pub path: PathBuf,
    /// Whether there was a host.yaml before (it was updated).
    pub existed: bool,
    /// The `default` provider as written.
    pub provider: ProviderConfig,
    /// The operator's `readOnlyMaxRetries`, written back as it was.
    pub read_only_max_retries: Option<String>,
}

/// What a fresh provider entry of `api` starts from.
fn defaults_for(api: Api) -> ProviderConfig {
    match api {
        Api::OpenaiChat => ProviderConfig {
            api,
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: "OPENAI_API_KEY".into(),
            model: "gpt-4o-mini".into(),
            throttle: ProviderThrottle::default(),
            spend: ProviderSpend::default(),
            structured_output_given: None,
        },
        Api::AnthropicMessages => ProviderConfig {
            api,
            base_url: "https://api.anthropic.com/v1".into(),
            api_key_env: "ANTHROPIC_API_KEY".into(),
            model: "claude-sonnet-4-5".into(),
            throttle: ProviderThrottle::default(),
            spend: ProviderSpend::default(),
            structured_output_given: None,
        },
    }
}

/// The `default` provider after applying the flags to what exists. When the api changes, the
/// fields not given that still hold the old api's defaults move to the new api's defaults;
/// anything the operator customised stays.
fn merge(existing: Option<&ProviderConfig>, args: &ProviderFlags) -> ProviderConfig {
    let api = args
        .api
        .or(existing.map(|p| p.api))
        .unwrap_or(Api::OpenaiChat);
    let fresh = defaults_for(api);
    let Some(old) = existing else {
        return ProviderConfig {
            api,
            base_url: args.base_url.clone().unwrap_or(fresh.base_url),
            api_key_env: args.api_key_env.clone().unwrap_or(fresh.api_key_env),
            model: args.model.clone().unwrap_or(fresh.model),
            throttle: throttle_from_flags(fresh.throttle, args),
            spend: fresh.spend,
            structured_output_given: None,
        };
    };
    let old_defaults = defaults_for(old.api);
    let keep = |given: &Option<String>, old_v: &str, old_default: &str, new_default: String| {
        given.clone().unwrap_or_else(|| {
            if old.api != api && old_v == old_default {
                new_default
            } else {
                old_v.to_string()
            }
        })
    };
    ProviderConfig {
        api,
        base_url: keep(
            &args.base_url,
            &old.base_url,
            &old_defaults.base_url,
            fresh.base_url,
        ),
        api_key_env: keep(
            &args.api_key_env,
            &old.api_key_env,
            &old_defaults.api_key_env,
            fresh.api_key_env,
        ),
        model: keep(&args.model, &old.model, &old_defaults.model, fresh.model),
        throttle: throttle_from_flags(old.throttle, args),
        spend: spend_for(api, old),
        structured_output_given: structured_output_for(api, old),
    }
}

/// The old entry's `structuredOutput`; `json-object` has no Anthropic form, so it does not
/// survive a move to anthropic-messages (the API's default applies there).
fn structured_output_for(api: Api, old: &ProviderConfig) -> Option<StructuredOutput> {
    old.structured_output_given
        .filter(|s| !(api == Api::AnthropicMessages && *s == StructuredOutput::JsonObject))
}

/// The old entry's usage, price and budget settings; `includeUsage` is an OpenAI setting, so it
/// does not survive a move to another api.
fn spend_for(api: Api, old: &ProviderConfig) -> ProviderSpend {
    let mut spend = old.spend;
    if api != Api::OpenaiChat {
        spend.include_usage = true;
        spend.given_include_usage = false;
    }
    spend
}

/// `base` with the throttle flags given applied (they were checked by [`check_args`]); a flag
/// counts as written, so it is kept in the file even when it equals the default.
fn throttle_from_flags(base: ProviderThrottle, args: &ProviderFlags) -> ProviderThrottle {
    let mut t = base;
    if let Some(n) = args
        .max_concurrent_requests
        .as_deref()
        .and_then(|n| check_max_concurrent_requests(n, true).ok())
    {
        t.max_concurrent_requests = n;
        t.given.max_concurrent_requests = true;
    }
    if let Some(mode) = args
        .throttle
        .as_deref()
        .and_then(|m| check_throttle_mode(m).ok())
    {
        t.mode = mode;
        t.given.mode = true;
    }
    t
}

/// Refuses flag values that would put a secret (or an unusable value) into host.yaml. Never
/// repeats a value that looks like a key.
fn check_args(args: &ProviderFlags) -> Result<(), CliError> {
    if let Some(name) = &args.api_key_env
        && let Err(problem) = check_key_env_name(name)
    {
        return Err(CliError::bad_input(format!(
            "--api-key-env was refused because {problem}; pass the variable's name, for example --api-key-env OPENAI_API_KEY, and export the key in that variable."
        )));
    }
    // The same checks host.yaml gets, so setup writes nothing that doctor or run would refuse.
    if let Some(url) = &args.base_url {
        match check_base_url(url) {
            Ok(()) => {}
            Err(UrlProblem::CarriesSecret) => {
                return Err(CliError::bad_input(
                    "--base-url was refused because it appears to contain a key or credentials; give the plain base URL and pass the key through the variable named by --api-key-env.",
                ));
            }
            Err(problem) => {
                return Err(CliError::bad_input(format!("--base-url: {problem}.")));
            }
        }
    }
    if let Some(model) = &args.model
        && let Err(problem) = check_model(model)
    {
        return Err(CliError::bad_input(format!(
            "--model was refused: {problem}; pass the model name, and the key only through the variable named by --api-key-env."
        )));
    }
    if let Some(n) = &args.max_concurrent_requests
        && let Err(problem) = check_max_concurrent_requests(n, true)
    {
        return Err(CliError::bad_input(format!(
            "--max-concurrent-requests: {problem}."
        )));
    }
    if let Some(mode) = &args.throttle
        && let Err(problem) = check_throttle_mode(mode)
    {
        return Err(CliError::bad_input(format!("--throttle: {problem}.")));
    }
    Ok(())
}

/// Checks the flags, then writes host.yaml with the `default` provider they give, keeping
/// everything else the existing file (if any) holds. Nothing is written when anything is
/// refused.
pub fn write(args: &ProviderFlags) -> Result<Written, CliError> {
    check_args(args)?;
    let home = Home::locate()?;
    let (existing, existed) = load_host(&home).map_err(|e| {
        let text = e.message.trim_end_matches('.').to_string();
        CliError::bad_input(format!(
            "{text} (setup keeps the settings of an existing host.yaml, so it must parse; fix it or move it aside and run setup again)."
        ))
    })?;
    let provider = merge(existing.providers.get(PROVIDER), args);
    let mut host = existing.clone();
    host.providers
        .insert(PROVIDER.to_string(), provider.clone());

    let text = render(&host);
    // The file we write must be one docsfab accepts; anything else is a bug to report, not a
    // file to leave behind.
    let path = home.host_file();
    HostConfig::parse(&text, &path.display().to_string()).map_err(|e| {
        CliError::failed(format!(
            "setup produced a host.yaml it cannot read back ({e}); nothing was written, please report this."
        ))
    })?;
    std::fs::create_dir_all(&home.dir).map_err(|e| {
        CliError::bad_input(format!(
            "cannot create the host directory {} ({e}); set DOCSFAB_HOME to a writable directory.",
            home.dir.display()
        ))
    })?;
    write_atomically(&path, &text)?;
    Ok(Written {
        path,
        existed,
        provider,
        read_only_max_retries: host.read_only_max_retries.map(|raw| raw.text),
    })
}

/// A YAML scalar: plain when that cannot be misread, otherwise double-quoted (JSON string
/// syntax is valid YAML).
fn scalar(s: &str) -> String {
    let plain_chars = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_./:-+@".contains(c));
    let starts_ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    let reserved = matches!(
        s.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null" | "nan" | "inf"
    );
    if plain_chars && starts_ok && !reserved && !s.ends_with(':') {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

/// The text of host.yaml for `host`.
fn render(host: &HostConfig) -> String {
    let mut out = String::new();
    out.push_str("# docsfab host configuration, written by `docsfab setup`.\n");
    out.push_str("# Keys are never stored here: apiKeyEnv names the environment variable that holds the key.\n");
    out.push_str("# Settings and their limits: docs/configuration.md.\n");
    out.push_str("providers:\n");
    for (name, p) in &host.providers {
        let _ = writeln!(out, "  {}:", scalar(name));
        let _ = writeln!(out, "    api: {}", p.api);
        let _ = writeln!(out, "    baseUrl: {}", scalar(&p.base_url));
        let _ = writeln!(out, "    apiKeyEnv: {}", scalar(&p.api_key_env));
        let _ = writeln!(out, "    model: {}", scalar(&p.model));
        render_throttle(&mut out, &p.throttle);
        render_spend(&mut out, &p.spend);
        render_structured_output(&mut out, p);
    }
    if let Some(raw) = &host.read_only_max_retries {
        // Written back exactly as the operator wrote it.
        let _ = writeln!(out, "readOnlyMaxRetries: {}", raw.text);
    }
    if !host.catalog.is_empty() {
        out.push_str("catalog:\n");
        for (key, raw) in &host.catalog {
            let _ = writeln!(out, "  {}: {}", scalar(key), raw.text);
        }
    }
    out
}

/// The throttle keys of one provider: those the operator wrote, and any non-default value.
fn render_throttle(out: &mut String, t: &ProviderThrottle) {
    let n = t.max_concurrent_requests;
    if t.given.max_concurrent_requests || n != DEFAULT_MAX_CONCURRENT_REQUESTS {
        let _ = writeln!(out, "    maxConcurrentRequests: {n}");
    }
    if t.given.mode || t.mode != ThrottleMode::Shared {
        // Quoted when needed: to other YAML readers a plain `off` is false.
        let _ = writeln!(out, "    throttle: {}", scalar(t.mode.as_str()));
    }
}

/// `structuredOutput` when the operator wrote it (the API's default is not written).
fn render_structured_output(out: &mut String, p: &ProviderConfig) {
    if let Some(s) = p.structured_output_given {
        let _ = writeln!(out, "    structuredOutput: {}", scalar(s.as_str()));
    }
}

/// The usage, price and budget keys of one provider: those the operator wrote, and any value
/// that is not the default.
fn render_spend(out: &mut String, s: &ProviderSpend) {
    if s.given_include_usage || !s.include_usage {
        let _ = writeln!(out, "    includeUsage: {}", s.include_usage);
    }
    if s.given_prompt_caching || !s.prompt_caching {
        let _ = writeln!(out, "    promptCaching: {}", s.prompt_caching);
    }
    if let Some(p) = &s.pricing {
        out.push_str("    pricing:\n");
        let _ = writeln!(out, "      inputPerMillion: {}", p.input_per_million);
        let _ = writeln!(out, "      outputPerMillion: {}", p.output_per_million);
        if let Some(v) = p.cache_write_per_million {
            let _ = writeln!(out, "      cacheWritePerMillion: {v}");
        }
        if let Some(v) = p.cache_read_per_million {
            let _ = writeln!(out, "      cacheReadPerMillion: {v}");
        }
    }
    if let Some(v) = s.max_run_cost_usd {
        let _ = writeln!(out, "    budget:\n      maxRunCostUsd: {v}");
    }
}

fn write_atomically(path: &Path, text: &str) -> Result<(), CliError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".host.yaml.tmp-{}", std::process::id()));
    let fail = |e: std::io::Error| {
        CliError::bad_input(format!(
            "cannot write {} ({e}); check that the host directory is writable.",
            path.display()
        ))
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        api: Option<Api>,
        url: Option<&str>,
        model: Option<&str>,
        env: Option<&str>,
    ) -> ProviderFlags {
        ProviderFlags {
            api,
            base_url: url.map(str::to_string),
            model: model.map(str::to_string),
            api_key_env: env.map(str::to_string),
            max_concurrent_requests: None,
            throttle: None,
        }
    }

    #[test]
    fn scalar_quotes_only_when_needed() {
        assert_eq!(
            scalar("https://api.example.com/v1"),
            "https://api.example.com/v1"
        );
        assert_eq!(scalar("OPENAI_API_KEY"), "OPENAI_API_KEY");
        assert_eq!(scalar("yes"), "\"yes\"");
        assert_eq!(scalar("123"), "\"123\"");
        assert_eq!(scalar("a b # c"), "\"a b # c\"");
        assert_eq!(scalar(""), "\"\"");
    }

    #[test]
    fn api_change_moves_untouched_defaults_only() {
        let old = defaults_for(Api::OpenaiChat);
        let mut custom = old.clone();
        custom.base_url = "https://gw.internal/v1".into();
        let m = merge(
            Some(&custom),
            &args(Some(Api::AnthropicMessages), None, None, None),
        );
        assert_eq!(m.api, Api::AnthropicMessages);
        assert_eq!(m.base_url, "https://gw.internal/v1");
        assert_eq!(m.api_key_env, "ANTHROPIC_API_KEY");
        let m = merge(Some(&old), &args(None, None, Some("m2"), None));
        assert_eq!((m.api, m.model.as_str()), (Api::OpenaiChat, "m2"));
    }

    #[test]
    fn secrets_in_flags_refused_without_echo_cfg_4() {
        let key = "sk-proj-Abc123Def456Ghi789";
        for a in [
            args(None, None, None, Some(key)),
            args(None, Some(&format!("https://u:{key}@h/v1")), None, None),
            args(None, Some("https://h/v1?api_key=zzz"), None, None),
            args(None, None, Some(key), None),
        ] {
            let e = check_args(&a).unwrap_err();
            assert_eq!(e.kind, crate::app::error::ErrorKind::BadInput);
            assert!(!e.message.contains("Abc123"), "{}", e.message);
        }
        assert!(check_args(&args(None, Some("https://h/v1"), Some("m"), Some("MY_KEY"))).is_ok());
    }

    #[test]
    fn rendered_file_round_trips_with_override_kept_cfg_4() {
        let host = HostConfig::parse(
            "readOnlyMaxRetries: 2\ncatalog:\n  retry.maxRetries: 3\n",
            "h.yaml",
        )
        .unwrap();
        let mut host2 = host.clone();
        host2
            .providers
            .insert("default".into(), defaults_for(Api::OpenaiChat));
        let text = render(&host2);
        let back = HostConfig::parse(&text, "h.yaml").unwrap();
        assert_eq!(back.read_only_max_retries.unwrap().text, "2");
        assert_eq!(back.catalog["retry.maxRetries"].text, "3");
        assert_eq!(back.providers["default"], defaults_for(Api::OpenaiChat));
        let fresh = render(&HostConfig {
            providers: host2.providers.clone(),
            ..HostConfig::empty("h.yaml")
        });
        assert!(!fresh.contains("readOnlyMaxRetries"), "{fresh}");
    }

    #[test]
    fn issue12_throttle_keys_written_back_as_given_and_flags_applied() {
        let text = "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://h/v1\n    apiKeyEnv: K\n    model: m\n    maxConcurrentRequests: 8\n  other:\n    api: openai-chat\n    baseUrl: https://h/v1\n    apiKeyEnv: K\n    model: m\n    throttle: off\n";
        let host = HostConfig::parse(text, "h.yaml").unwrap();
        let back = HostConfig::parse(&render(&host), "h.yaml").unwrap();
        assert_eq!(back, host);
        let rendered = render(&host);
        assert!(
            rendered.contains("    maxConcurrentRequests: 8\n"),
            "{rendered}"
        );
        assert!(rendered.contains("    throttle: \"off\"\n"), "{rendered}");
        // Defaults the file did not write are not added.
        let plain = render(&HostConfig::parse(FRESH, "h.yaml").unwrap());
        assert!(
            !plain.contains("throttle") && !plain.contains("maxConcurrent"),
            "{plain}"
        );

        let mut a = args(None, None, None, None);
        a.max_concurrent_requests = Some("3".into());
        a.throttle = Some("off".into());
        assert!(check_args(&a).is_ok());
        let m = merge(host.providers.get("default"), &a);
        assert_eq!(
            (m.throttle.max_concurrent_requests, m.throttle.mode),
            (3, ThrottleMode::Off)
        );
        // Flags not given keep what the file had.
        let m = merge(
            host.providers.get("other"),
            &args(None, None, Some("m2"), None),
        );
        assert_eq!(m.throttle, host.providers["other"].throttle);
    }

    #[test]
    fn issue12_bad_throttle_flags_are_one_sentence() {
        let mut a = args(None, None, None, None);
        a.max_concurrent_requests = Some("65".into());
        assert_eq!(
            check_args(&a).unwrap_err().message,
            "--max-concurrent-requests: 65 is outside the allowed range 1..64; give the requests in flight at once as a whole number from 1 through 64 (default 8)."
        );
        let mut a = args(None, None, None, None);
        a.throttle = Some("adaptive".into());
        assert_eq!(
            check_args(&a).unwrap_err().message,
            "--throttle: \"adaptive\" is not a throttle mode; use shared or off (default shared)."
        );
    }

    const FRESH: &str = "providers:\n  default:\n    api: openai-chat\n    baseUrl: https://h/v1\n    apiKeyEnv: K\n    model: m\n";
}
