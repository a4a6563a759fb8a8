//! The DNS pre-flight: before the first provider call, `run` and `doctor` resolve the provider's
//! host once. A host that definitively does not exist is bad configuration, refused at once
//! (exit 2, nothing recorded) instead of costing the whole transport budget of replays and step
//! retries. Anything less certain (a resolver that is down, slow, or temporarily failing) is
//! only a warning: the run goes on and its transport budget decides, as the retry spec says.

use std::net::ToSocketAddrs as _;
use std::sync::mpsc;
use std::time::Duration;

use crate::app::error::CliError;

/// How long the resolver may take before the pre-flight gives up and lets the run go on.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// What resolving a provider's host found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Nothing to resolve: an IP literal, or `localhost` (never looked up in DNS).
    Skipped { host: String, why: &'static str },
    /// The host resolved to this many addresses.
    Resolved { host: String, addresses: usize },
    /// The resolver said the name does not exist (NXDOMAIN / EAI_NONAME / EAI_NODATA).
    NoSuchHost { host: String, said: String },
    /// No definitive answer: a temporary resolver failure, or no answer within the bound.
    Unsure { host: String, said: String },
}

impl Resolution {
    pub fn host(&self) -> &str {
        match self {
            Resolution::Skipped { host, .. }
            | Resolution::Resolved { host, .. }
            | Resolution::NoSuchHost { host, .. }
            | Resolution::Unsure { host, .. } => host,
        }
    }

    /// The JSON spelling of the outcome, for `doctor --json`.
    pub fn status(&self) -> &'static str {
        match self {
            Resolution::Skipped { .. } => "skipped",
            Resolution::Resolved { .. } => "resolved",
            Resolution::NoSuchHost { .. } => "no-such-host",
            Resolution::Unsure { .. } => "unsure",
        }
    }

    /// What the doctor line says after the host.
    pub fn describe(&self) -> String {
        match self {
            Resolution::Skipped { why, .. } => format!("not resolved ({why})"),
            Resolution::Resolved { addresses, .. } => format!(
                "resolves to {addresses} address{}",
                if *addresses == 1 { "" } else { "es" }
            ),
            Resolution::NoSuchHost { said, .. } => format!("does not exist ({said})"),
            Resolution::Unsure { said, .. } => {
                format!("could not be resolved now ({said}); a run would go on and retry")
            }
        }
    }
}

/// Resolves the host of `base_url` within `timeout`. An unparsable URL is `Skipped`: host.yaml
/// validation already refused it, and building the transport would name it.
pub fn resolve(base_url: &str, timeout: Duration) -> Resolution {
    let Ok(url) = reqwest::Url::parse(base_url.trim()) else {
        return Resolution::Skipped {
            host: String::new(),
            why: "the base URL has no host",
        };
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return Resolution::Skipped {
            host: String::new(),
            why: "the base URL has no host",
        };
    };
    // An IPv6 literal comes bracketed.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Resolution::Skipped {
            host,
            why: "an IP address",
        };
    }
    let lower = host.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return Resolution::Skipped {
            host,
            why: "localhost",
        };
    }
    // getaddrinfo has no timeout of its own: it runs on a thread that is abandoned (it ends by
    // itself) when the bound passes.
    let (tx, rx) = mpsc::channel();
    let name = host.clone();
    std::thread::spawn(move || {
        let _ = tx.send((name.as_str(), port).to_socket_addrs().map(Iterator::count));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(0)) => Resolution::NoSuchHost {
            host,
            said: "no addresses".into(),
        },
        Ok(Ok(addresses)) => Resolution::Resolved { host, addresses },
        Ok(Err(e)) => judge(host, &e.to_string()),
        Err(_) => Resolution::Unsure {
            host,
            said: format!("no answer within {} s", timeout.as_secs()),
        },
    }
}

/// The resolver's own words for "this name does not exist" (glibc's EAI_NONAME and EAI_NODATA,
/// musl's, and macOS's). Anything else, EAI_AGAIN's "Temporary failure in name resolution"
/// included, is not definitive. Rust never calls setlocale, so glibc answers in English.
const NO_SUCH_HOST: [&str; 5] = [
    "Name or service not known",
    "No address associated with hostname",
    "Name does not resolve",
    "Name has no usable address",
    "nodename nor servname provided, or not known",
];

fn judge(host: String, message: &str) -> Resolution {
    // std prefixes the resolver's text with "failed to lookup address information: ".
    let said = message
        .strip_prefix("failed to lookup address information: ")
        .unwrap_or(message)
        .to_owned();
    if NO_SUCH_HOST.iter().any(|m| said.contains(m)) {
        Resolution::NoSuchHost { host, said }
    } else {
        Resolution::Unsure { host, said }
    }
}

/// The one sentence that refuses a provider whose host does not exist.
pub fn refusal(provider: &str, host_file: &str, r: &Resolution) -> CliError {
    let said = match r {
        Resolution::NoSuchHost { said, .. } => said.as_str(),
        _ => "no such host",
    };
    CliError::bad_input(format!(
        "provider {provider:?} points at host {} (providers.{provider}.baseUrl in {host_file}), which does not exist (the resolver says: {said}); correct the host name in baseUrl, or check this machine's DNS settings.",
        r.host()
    ))
}

/// The one warning line for a resolution that was not definitive.
pub fn warning(provider: &str, r: &Resolution) -> Option<String> {
    match r {
        Resolution::Unsure { host, said } => Some(format!(
            "the host {host} of provider {provider:?} could not be resolved now ({said}); going on, the run's transport retries decide whether it stays unreachable."
        )),
        _ => None,
    }
}

/// For `run`: resolves the selected provider's host; refuses a host that does not exist and
/// warns on stderr when the answer was not definitive.
pub fn check_provider(provider: &str, base_url: &str, host_file: &str) -> Result<(), CliError> {
    let r = resolve(base_url, RESOLVE_TIMEOUT);
    if matches!(r, Resolution::NoSuchHost { .. }) {
        return Err(refusal(provider, host_file, &r));
    }
    if let Some(w) = warning(provider, &r) {
        use std::io::Write as _;
        // Not eprintln!: a closed stderr must not stop the run.
        let _ = writeln!(std::io::stderr(), "warning: {w}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_ip_literals_and_localhost_are_not_resolved() {
        for (url, host) in [
            ("http://127.0.0.1:9/v1", "127.0.0.1"),
            ("http://[::1]:9/v1", "::1"),
            ("http://localhost:9/v1", "localhost"),
            ("http://api.LocalHost:9/v1", "api.localhost"),
        ] {
            let r = resolve(url, Duration::from_millis(1));
            assert!(matches!(r, Resolution::Skipped { .. }), "{url}: {r:?}");
            assert_eq!(r.host(), host);
        }
    }

    #[test]
    fn issue11_only_a_no_such_host_answer_is_definitive() {
        let judged = |m: &str| judge("h.example".into(), m).status();
        for m in [
            "failed to lookup address information: Name or service not known",
            "failed to lookup address information: No address associated with hostname",
            "failed to lookup address information: Name does not resolve",
        ] {
            assert_eq!(judged(m), "no-such-host", "{m}");
        }
        for m in [
            "failed to lookup address information: Temporary failure in name resolution",
            "failed to lookup address information: System error",
        ] {
            assert_eq!(judged(m), "unsure", "{m}");
        }
    }

    #[test]
    fn issue11_the_refusal_names_provider_host_key_and_remedy() {
        let r = judge(
            "docsfab-test.invalid".into(),
            "failed to lookup address information: Name or service not known",
        );
        let e = refusal("default", "/h/host.yaml", &r);
        assert_eq!(e.kind, crate::app::error::ErrorKind::BadInput);
        assert_eq!(
            e.message,
            "provider \"default\" points at host docsfab-test.invalid (providers.default.baseUrl in /h/host.yaml), which does not exist (the resolver says: Name or service not known); correct the host name in baseUrl, or check this machine's DNS settings."
        );
    }
}
