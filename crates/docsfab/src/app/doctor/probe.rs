//! `docsfab doctor --probe`: one minimal real request to a provider ("ping", at most one output
//! token), sent once through the same transport a run uses and never replayed, so an operator
//! learns before a long run whether the host is reachable, the key is accepted and the model
//! exists, and how long a round trip takes.
//!
//! Exit codes: 0 when the provider answered, or answered 429 (reachable and the configuration
//! is right, only throttled now); 2 when the configuration is wrong (no such host, key refused,
//! no such model); 1 when the provider could not be reached or failed otherwise.

use std::time::{Duration, Instant};

use docsfab_boundary::redact::Redactor;
use docsfab_provider::{
    ApiKey, HttpConfig, HttpTransport, Message, Payload, Transport as _, TransportFailure,
    TurnRequest, endpoint_url,
};
use docsfab_record::{Api, Gateway, ProviderErrorClass};

use super::capabilities::{self, Capabilities, Probes};
use crate::app::error::CliError;
use crate::app::preflight::Resolution;

/// The probe waits this long for the answer; a provider slower than that on a one-token ping is
/// reported as unreachable (request-timeout).
const PROBE_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the probe is sent to.
pub struct Target<'a> {
    pub provider: &'a str,
    pub api: Api,
    pub base_url: &'a str,
    pub model: &'a str,
    pub key_var: &'a str,
    pub key: ApiKey,
    /// host.yaml's `includeUsage`: the probe asks as a run would.
    pub include_usage: bool,
}

/// The verdict on one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A complete answer arrived.
    Answered,
    /// HTTP 429: reachable, the request was understood, the provider is throttling now.
    Throttled,
    /// HTTP 401 or 403: the key was refused.
    KeyRefused,
    /// HTTP 404, or an error naming an unknown model.
    NoSuchModel,
    /// No response: DNS, connect, TLS, reset or timeout.
    Unreachable,
    /// Any other failure status or a failed stream.
    Failed,
    /// HTTP 404 at the configured base URL, an answer at the other spelling (with or without
    /// `/v1`): the path is wrong, not the model.
    WrongBaseUrl,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Answered => "answered",
            Verdict::Throttled => "throttled",
            Verdict::KeyRefused => "key-refused",
            Verdict::NoSuchModel => "no-such-model",
            Verdict::Unreachable => "unreachable",
            Verdict::Failed => "failed",
            Verdict::WrongBaseUrl => "wrong-base-url",
        }
    }
}

/// The probe's findings.
pub struct ProbeReport {
    pub provider: String,
    pub api: Api,
    /// `host:port` of the base URL: never its credentials, path or query.
    pub host: String,
    pub model: String,
    pub key_var: String,
    pub dns: Resolution,
    pub verdict: Verdict,
    pub http_status: Option<u16>,
    /// The fault label and class of a failure (`connect-refused`, `network`, ...).
    pub fault: Option<(String, ProviderErrorClass)>,
    pub retry_after_ms: Option<u64>,
    /// What the transport said, redacted.
    pub detail: String,
    pub rtt_ms: u64,
    /// The gateway the answer came through (its `x-litellm-*` headers), if any (issue 24).
    pub gateway: Option<Gateway>,
    /// What the probe learnt of the provider's usage reports, and what to set (issue 23).
    pub usage_note: Option<String>,
    /// What the capability probes found (all unknown unless the ping answered; issue 31).
    pub capabilities: Capabilities,
    /// The base URL that answered where the configured one gave 404 (issue 31).
    pub suggested_base_url: Option<String>,
    /// Requests sent, every one once.
    pub requests: u32,
}

impl ProbeReport {
    /// A report of an answered ping, before anything else is known.
    fn new(target: &Target<'_>, dns: Resolution, rtt_ms: u64) -> ProbeReport {
        ProbeReport {
            provider: target.provider.to_owned(),
            api: target.api,
            host: host_port(target.base_url),
            model: target.model.to_owned(),
            key_var: target.key_var.to_owned(),
            dns,
            verdict: Verdict::Answered,
            http_status: None,
            fault: None,
            retry_after_ms: None,
            detail: String::new(),
            rtt_ms,
            gateway: None,
            usage_note: None,
            capabilities: Capabilities::unknown(),
            suggested_base_url: None,
            requests: 1,
        }
    }
}

/// Sends the ping once and judges what came back; after an answer, the capability probes
/// (two more requests); after a 404, the other spelling of the base URL (one more).
pub fn probe(target: Target<'_>, dns: Resolution) -> Result<ProbeReport, CliError> {
    let redactor = Redactor::new(&[target.key.expose()]);
    let transport = transport_for(&target, target.base_url)?;
    let rt = crate::app::execute::runtime()?;
    let started = Instant::now();
    // `send` is one request: the transport never retries, and no replay driver is involved.
    let sent = rt.block_on(transport.send(ping(&target, target.include_usage)?.bytes().clone()));
    let rtt_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut report = ProbeReport::new(&target, dns, rtt_ms);
    match sent {
        Ok(answer) => {
            report.http_status = Some(answer.http_status);
            report.detail = format!("HTTP {}", answer.http_status);
            report.gateway = answer.gateway.map(|g| *g);
            if !answer.usage.is_known() {
                report.usage_note = Some(format!(
                    "the answer reported no usage, so runs will record their tokens and cost as unknown (null){}",
                    if target.include_usage {
                        " although stream_options.include_usage asked for it"
                    } else {
                        "; includeUsage is false, so try it true"
                    }
                ));
            }
            let probes = Probes {
                transport: &transport,
                api: target.api,
                model: target.model,
                include_usage: target.include_usage,
                redactor: &redactor,
            };
            report.capabilities = capabilities::probe(&probes, answer.usage.is_known())?;
            report.requests += 2;
        }
        Err(f)
            if target.api == Api::OpenaiChat
                && target.include_usage
                && f.failure.http_status == Some(400) =>
        {
            // A server that refuses `stream_options` answers 400 to every request a run sends;
            // the spec keeps that terminal, so the probe finds it before a run does.
            let second = rt.block_on(transport.send(ping(&target, false)?.bytes().clone()));
            report.requests += 1;
            if second.is_ok() {
                report.usage_note = Some(format!(
                    "the server refuses stream_options (HTTP 400 with it, an answer without it); set providers.{}.includeUsage: false in host.yaml",
                    target.provider
                ));
            }
            fill_failure(&mut report, &f, &redactor);
        }
        Err(f) => {
            fill_failure(&mut report, &f, &redactor);
            if f.failure.http_status == Some(404) {
                try_other_base_url(&mut report, &target, &f, &rt)?;
            }
        }
    }
    Ok(report)
}

/// The probe's transport to `base_url`, waiting at most [`PROBE_READ_TIMEOUT`].
fn transport_for(target: &Target<'_>, base_url: &str) -> Result<HttpTransport, CliError> {
    HttpTransport::new(HttpConfig {
        read_timeout: PROBE_READ_TIMEOUT,
        ..HttpConfig::new(target.api, base_url, Some(target.key.clone()))
    })
    .map_err(|e| {
        CliError::bad_input(format!(
            "{e}; check providers.{}.baseUrl in host.yaml.",
            target.provider
        ))
    })
}

/// The ping's payload.
fn ping(target: &Target<'_>, include_usage: bool) -> Result<Payload, CliError> {
    Payload::build(target.api, &probe_request(target.model, include_usage))
        .map_err(|e| CliError::failed(format!("cannot build the probe request ({e}).")))
}

/// After a 404 that does not name the model: the ping once more at the other spelling of the
/// base URL (with `/v1` added, or without its `/v1`). When that one is answered by anything but
/// 404, the path was wrong, not the model, and the report says which base URL to use.
fn try_other_base_url(
    report: &mut ProbeReport,
    target: &Target<'_>,
    f: &TransportFailure,
    rt: &tokio::runtime::Runtime,
) -> Result<(), CliError> {
    if f.body.error_code.as_deref() == Some("model_not_found") {
        return Ok(());
    }
    let Some(other) = other_base_url(target.base_url) else {
        return Ok(());
    };
    let same = |a: &str, b: &str| {
        endpoint_url(target.api, a).ok().map(|u| u.to_string())
            == endpoint_url(target.api, b).ok().map(|u| u.to_string())
    };
    if same(target.base_url, &other) {
        return Ok(());
    }
    let transport = transport_for(target, &other)?;
    let second = rt.block_on(transport.send(ping(target, target.include_usage)?.bytes().clone()));
    report.requests += 1;
    let status = match &second {
        Ok(a) => Some(a.http_status),
        Err(e) => e.failure.http_status,
    };
    if status.is_some_and(|s| s != 404) {
        report.verdict = Verdict::WrongBaseUrl;
        report.suggested_base_url = Some(other);
    }
    Ok(())
}

/// The other spelling of a base URL: without its trailing `/v1`, or with `/v1` added. Never
/// with credentials (the suggestion is printed).
fn other_base_url(base_url: &str) -> Option<String> {
    let mut url = reqwest::Url::parse(base_url.trim()).ok()?;
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let path = url.path().trim_end_matches('/').to_owned();
    match path.strip_suffix("/v1") {
        Some(rest) => url.set_path(rest),
        None => url.set_path(&format!("{path}/v1")),
    }
    let shown = url.to_string();
    Some(match shown.strip_suffix('/') {
        Some(s) if url.query().is_none() => s.to_owned(),
        _ => shown,
    })
}

fn fill_failure(report: &mut ProbeReport, f: &TransportFailure, redactor: &Redactor) {
    report.gateway = f.body.gateway.clone();
    report.verdict = judge(f);
    report.http_status = f.failure.http_status;
    report.retry_after_ms = f.failure.retry_after_ms;
    report.fault = Some((f.failure.fault.as_str().to_owned(), f.failure.class));
    report.detail = redactor.line(&f.detail);
}

/// The one-token ping.
fn probe_request(model: &str, include_usage: bool) -> TurnRequest {
    TurnRequest {
        model: model.to_owned(),
        max_output_tokens: 1,
        system: None,
        messages: vec![Message::User {
            text: "ping".into(),
        }],
        tools: vec![],
        include_usage,
        prompt_cache_key: None,
        response_format: None,
        tool_choice: None,
    }
}

/// The verdict of a failed probe: the status first, then the error words a provider uses for a
/// model it does not serve, then whether any response head arrived.
fn judge(f: &TransportFailure) -> Verdict {
    let words = [&f.body.error_type, &f.body.error_code];
    let names_model = words.iter().any(|w| {
        matches!(
            w.as_deref(),
            Some("model_not_found" | "not_found_error" | "model_not_available")
        )
    });
    match f.failure.http_status {
        Some(401 | 403) => Verdict::KeyRefused,
        Some(429) => Verdict::Throttled,
        Some(404) => Verdict::NoSuchModel,
        Some(400) if names_model => Verdict::NoSuchModel,
        Some(_) => Verdict::Failed,
        None if matches!(
            f.failure.class,
            ProviderErrorClass::Network | ProviderErrorClass::Timeout
        ) && !f.failure.content_published
            && f.body.error_type.is_none() =>
        {
            Verdict::Unreachable
        }
        None => Verdict::Failed,
    }
}

/// `host:port` of a base URL, without user info, path or query.
fn host_port(base_url: &str) -> String {
    reqwest::Url::parse(base_url.trim())
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .unwrap_or_else(|| "(unparsable base URL)".into())
}

impl ProbeReport {
    /// `Ok` when the probe passed (answered or throttled); otherwise the one sentence and exit
    /// code that say what to do.
    pub fn conclusion(&self) -> Result<(), CliError> {
        let p = &self.provider;
        match self.verdict {
            Verdict::Answered | Verdict::Throttled => Ok(()),
            Verdict::KeyRefused => Err(CliError::bad_input(format!(
                "provider {p:?} refused the API key in {} ({}); export the right key in {} and probe again.",
                self.key_var, self.detail, self.key_var
            ))),
            Verdict::NoSuchModel => Err(CliError::bad_input(format!(
                "the model {:?} does not exist at provider {p:?} ({}); set providers.{p}.model in host.yaml (or the composition's model) to a model the provider serves, or check that baseUrl ends with the API's version path.",
                self.model, self.detail
            ))),
            Verdict::Unreachable => Err(CliError::failed(format!(
                "provider {p:?} at {} could not be reached ({}); check that it is up and that the host, port and scheme of providers.{p}.baseUrl are right.",
                self.host, self.detail
            ))),
            Verdict::Failed => Err(CliError::failed(format!(
                "provider {p:?} at {} failed the probe ({}); try again later, or check the provider's status.",
                self.host, self.detail
            ))),
            Verdict::WrongBaseUrl => Err(CliError::bad_input(format!(
                "provider {p:?} answered {} at its baseUrl but answers at {}; set providers.{p}.baseUrl: {} in host.yaml.",
                self.detail,
                self.suggested_base_url.as_deref().unwrap_or("?"),
                self.suggested_base_url.as_deref().unwrap_or("?")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_policy::class::ProviderFailure;
    use docsfab_record::FaultKind;

    fn status(code: u16, error_code: Option<&str>) -> TransportFailure {
        let mut f = TransportFailure::new(ProviderFailure::from_http_status(code, None), "x");
        f.body.error_code = error_code.map(str::to_owned);
        f
    }

    #[test]
    fn issue11_probe_verdicts_follow_the_status_then_the_error_words() {
        assert_eq!(judge(&status(401, None)), Verdict::KeyRefused);
        assert_eq!(judge(&status(403, None)), Verdict::KeyRefused);
        assert_eq!(judge(&status(429, None)), Verdict::Throttled);
        assert_eq!(judge(&status(404, None)), Verdict::NoSuchModel);
        assert_eq!(
            judge(&status(400, Some("model_not_found"))),
            Verdict::NoSuchModel
        );
        assert_eq!(judge(&status(400, None)), Verdict::Failed);
        assert_eq!(judge(&status(503, None)), Verdict::Failed);
        let refused = TransportFailure::new(ProviderFailure::from_fault(FaultKind::Dns), "x");
        assert_eq!(judge(&refused), Verdict::Unreachable);
    }

    #[test]
    fn issue31_the_other_base_url_adds_or_drops_v1_without_credentials() {
        assert_eq!(
            other_base_url("http://127.0.0.1:8080").as_deref(),
            Some("http://127.0.0.1:8080/v1")
        );
        assert_eq!(
            other_base_url("http://127.0.0.1:8080/v1/").as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            other_base_url("https://u:secret@gw.example/openai").as_deref(),
            Some("https://gw.example/openai/v1")
        );
    }

    #[test]
    fn issue11_probe_host_never_shows_credentials_or_query() {
        assert_eq!(
            host_port("https://user:secret@api.example.com/v1?key=abc"),
            "api.example.com:443"
        );
        assert_eq!(host_port("http://127.0.0.1:9/v1"), "127.0.0.1:9");
    }
}
