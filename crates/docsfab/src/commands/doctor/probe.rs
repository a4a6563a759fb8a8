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
use docsfab_policy::class::ProviderErrorClass;
use docsfab_provider::{
    ApiKey, Gateway, HttpConfig, HttpTransport, Message, Payload, Transport as _, TransportFailure,
    TurnRequest,
};
use docsfab_record::Api;
use serde_json::{Value, json};

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
}

/// Sends the probe once and judges what came back.
pub fn probe(target: Target<'_>, dns: Resolution) -> Result<ProbeReport, CliError> {
    let payload = Payload::build(
        target.api,
        &probe_request(target.model, target.include_usage),
    )
    .map_err(|e| CliError::failed(format!("cannot build the probe request ({e}).")))?;
    let redactor = Redactor::new(&[target.key.expose()]);
    let transport = HttpTransport::new(HttpConfig {
        read_timeout: PROBE_READ_TIMEOUT,
        ..HttpConfig::new(target.api, target.base_url, Some(target.key.clone()))
    })
    .map_err(|e| {
        CliError::bad_input(format!(
            "{e}; check providers.{}.baseUrl in host.yaml.",
            target.provider
        ))
    })?;
    let started = Instant::now();
    // `send` is one request: the transport never retries, and no replay driver is involved.
    let sent = crate::app::execute::runtime()?.block_on(transport.send(payload.bytes().clone()));
    let rtt_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut report = ProbeReport {
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
    };
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
        }
        Err(f)
            if target.api == Api::OpenaiChat
                && target.include_usage
                && f.failure.http_status == Some(400) =>
        {
            // A server that refuses `stream_options` answers 400 to every request a run sends;
            // the spec keeps that terminal, so the probe finds it before a run does.
            let again = TurnRequest {
                include_usage: false,
                ..probe_request(target.model, true)
            };
            let second = Payload::build(target.api, &again).ok().map(|p| {
                crate::app::execute::runtime()
                    .map(|rt| rt.block_on(transport.send(p.bytes().clone())))
            });
            if let Some(Ok(Ok(_))) = second {
                report.usage_note = Some(format!(
                    "the server refuses stream_options (HTTP 400 with it, an answer without it); set providers.{}.includeUsage: false in host.yaml",
                    target.provider
                ));
            }
            fill_failure(&mut report, &f, &redactor);
        }
        Err(f) => fill_failure(&mut report, &f, &redactor),
    }
    Ok(report)
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

/// Milliseconds exactly, then in seconds for a person.
fn rtt(ms: u64) -> String {
    format!("{ms} ms ({:.2} s)", ms as f64 / 1000.0)
}

impl ProbeReport {
    /// The probe's lines in the doctor report.
    pub fn lines(&self) -> Vec<String> {
        let what = match self.verdict {
            Verdict::Answered => "answered".to_string(),
            Verdict::Throttled => "reachable, currently throttled".to_string(),
            Verdict::KeyRefused => "the key was refused".to_string(),
            Verdict::NoSuchModel => {
                format!("the model {:?} does not exist at this provider", self.model)
            }
            Verdict::Unreachable => "unreachable".to_string(),
            Verdict::Failed => "the provider failed the request".to_string(),
        };
        // A status already says what came back; a failure without one is named by its label.
        let mut fault = match (&self.fault, self.http_status) {
            (Some((label, class)), None) => format!("; {label}, class {class}"),
            (Some((_, class)), Some(_)) => format!("; class {class}"),
            (None, _) => String::new(),
        };
        if let Some(ms) = self.retry_after_ms {
            fault.push_str(&format!("; retry after {ms} ms"));
        }
        let mut lines = vec![
            format!(
                "Probe: provider {} api={} host={} model={} (1 request, never replayed)",
                self.provider, self.api, self.host, self.model
            ),
            format!("Probe DNS: {} {}", self.dns.host(), self.dns.describe()),
            format!(
                "Probe result: {what} ({}{fault}) round trip {}",
                self.detail,
                rtt(self.rtt_ms)
            ),
        ];
        if let Some(note) = &self.usage_note {
            lines.push(format!("Probe usage: {note}"));
        }
        if let Some(g) = &self.gateway {
            lines.push(format!(
                "Probe gateway: {} answered for the provider; the retry rules it weakens, and what to do:",
                g.describe()
            ));
            lines.extend(
                crate::app::gateway::weakened(g.name, self.api)
                    .iter()
                    .map(|w| format!("  - {}", w.line())),
            );
        }
        lines
    }

    pub fn to_json(&self) -> Value {
        json!({
            "provider": self.provider,
            "api": self.api.as_str(),
            "host": self.host,
            "model": self.model,
            "dns": {"host": self.dns.host(), "status": self.dns.status(), "detail": self.dns.describe()},
            "result": self.verdict.as_str(),
            "httpStatus": self.http_status,
            "fault": self.fault.as_ref().map(|(label, _)| label),
            "providerErrorClass": self.fault.as_ref().map(|(_, class)| class.as_str()),
            "retryAfterMs": self.retry_after_ms,
            "detail": self.detail,
            "rttMs": self.rtt_ms,
            "usageNote": self.usage_note,
            "requests": if self.usage_note.as_deref().is_some_and(|n| n.contains("refuses stream_options")) { 2 } else { 1 },
            "gateway": self.gateway.as_ref().map(|g| json!({
                "name": g.name.as_str(),
                "version": g.version,
                "weakens": crate::app::gateway::weakened(g.name, self.api)
                    .iter()
                    .map(|w| json!({
                        "rule": w.rule,
                        "what": w.what,
                        "compensated": w.compensated,
                        "docsfab": w.docsfab,
                        "remedy": w.remedy_text(),
                    }))
                    .collect::<Vec<_>>(),
            })),
        })
    }

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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_policy::class::{FaultKind, ProviderFailure};

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
    fn issue11_probe_host_never_shows_credentials_or_query() {
        assert_eq!(
            host_port("https://user:secret@api.example.com/v1?key=abc"),
            "api.example.com:443"
        );
        assert_eq!(host_port("http://127.0.0.1:9/v1"), "127.0.0.1:9");
    }
}
