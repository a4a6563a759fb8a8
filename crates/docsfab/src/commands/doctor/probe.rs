//! `doctor --probe`'s findings as the report prints them: the probe's lines and its `probe`
//! member of `--json`, with the capability probes' summary and what to set.

use docsfab_record::Api;
use serde_json::{Value, json};

use crate::app::doctor::capabilities::Capabilities;
use crate::app::doctor::probe::{ProbeReport, Verdict};

/// The probe's lines in the doctor report.
pub fn lines(p: &ProbeReport) -> Vec<String> {
    let what = match p.verdict {
        Verdict::Answered => "answered".to_string(),
        Verdict::Throttled => "reachable, currently throttled".to_string(),
        Verdict::KeyRefused => "the key was refused".to_string(),
        Verdict::NoSuchModel => {
            format!("the model {:?} does not exist at this provider", p.model)
        }
        Verdict::Unreachable => "unreachable".to_string(),
        Verdict::Failed => "the provider failed the request".to_string(),
        Verdict::WrongBaseUrl => format!(
            "nothing serves this API at this baseUrl; baseUrl should be {}",
            p.suggested_base_url.as_deref().unwrap_or("?")
        ),
    };
    // A status already says what came back; a failure without one is named by its label.
    let mut fault = match (&p.fault, p.http_status) {
        (Some((label, class)), None) => format!("; {label}, class {class}"),
        (Some((_, class)), Some(_)) => format!("; class {class}"),
        (None, _) => String::new(),
    };
    if let Some(ms) = p.retry_after_ms {
        fault.push_str(&format!("; retry after {ms} ms"));
    }
    let mut lines = vec![
        format!(
            "Probe: provider {} api={} host={} model={} ({} request{}, never replayed)",
            p.provider,
            p.api,
            p.host,
            p.model,
            p.requests,
            if p.requests == 1 { "" } else { "s" }
        ),
        format!("Probe DNS: {} {}", p.dns.host(), p.dns.describe()),
        format!(
            "Probe result: {what} ({}{fault}) round trip {}",
            p.detail,
            rtt(p.rtt_ms)
        ),
    ];
    if let Some(note) = &p.usage_note {
        lines.push(format!("Probe usage: {note}"));
    }
    if p.verdict == Verdict::Answered {
        lines.extend(capability_lines(&p.capabilities, &p.provider, p.api));
    }
    if let Some(g) = &p.gateway {
        lines.push(format!(
            "Probe gateway: {} answered for the provider; the retry rules it weakens, and what to do:",
            g.describe()
        ));
        lines.extend(
            crate::app::gateway::weakened(g.name, p.api)
                .iter()
                .map(|w| format!("  - {}", w.line())),
        );
    }
    lines
}

/// The probe's `probe` member of `--json`.
pub fn to_json(p: &ProbeReport) -> Value {
    json!({
        "provider": p.provider,
        "api": p.api.as_str(),
        "host": p.host,
        "model": p.model,
        "dns": {"host": p.dns.host(), "status": p.dns.status(), "detail": p.dns.describe()},
        "result": p.verdict.as_str(),
        "httpStatus": p.http_status,
        "fault": p.fault.as_ref().map(|(label, _)| label),
        "providerErrorClass": p.fault.as_ref().map(|(_, class)| class.as_str()),
        "retryAfterMs": p.retry_after_ms,
        "detail": p.detail,
        "rttMs": p.rtt_ms,
        "usageNote": p.usage_note,
        "requests": p.requests,
        "capabilities": capabilities_json(&p.capabilities),
        "suggestedBaseUrl": p.suggested_base_url,
        "gateway": p.gateway.as_ref().map(|g| json!({
            "name": g.name.as_str(),
            "version": g.version,
            "weakens": crate::app::gateway::weakened(g.name, p.api)
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

/// Milliseconds exactly, then in seconds for a person.
fn rtt(ms: u64) -> String {
    format!("{ms} ms ({:.2} s)", ms as f64 / 1000.0)
}

fn word(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

/// The capability probes' lines: one summary, then what each finding that is not a plain yes
/// means for a composition and what to set.
fn capability_lines(c: &Capabilities, provider: &str, api: Api) -> Vec<String> {
    let mut lines = vec![format!(
        "Probe capabilities: tools {}, structuredOutput {}, streamUsage {}",
        word(c.tools.value),
        word(c.structured_output.value),
        word(c.stream_usage)
    )];
    match c.tools.value {
        Some(true) => {}
        Some(false) => lines.push(format!(
            "  tools: {}; this server/model ignores tools, so steps that need the read tools will answer without reading; use a model with a tool-calling chat template (with llama.cpp, llama-server --jinja)",
            c.tools.seen
        )),
        None => lines.push(format!("  tools: {}", c.tools.seen)),
    }
    let fallback = match api {
        Api::OpenaiChat => "off or json-object",
        Api::AnthropicMessages => "off",
    };
    match c.structured_output.value {
        Some(true) => {}
        Some(false) => lines.push(format!(
            "  structuredOutput: {}; contract steps cannot count on the constraint: set providers.{provider}.structuredOutput: {fallback} in host.yaml",
            c.structured_output.seen
        )),
        None => lines.push(format!("  structuredOutput: {}", c.structured_output.seen)),
    }
    lines
}

fn capabilities_json(c: &Capabilities) -> Value {
    json!({
        "tools": c.tools.value,
        "structuredOutput": c.structured_output.value,
        "streamUsage": c.stream_usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::doctor::capabilities::Capability;

    #[test]
    fn issue31_capability_lines_say_what_to_set() {
        let caps = Capabilities {
            tools: Capability {
                value: Some(false),
                seen: "none came".into(),
            },
            structured_output: Capability {
                value: Some(false),
                seen: "prose".into(),
            },
            stream_usage: Some(true),
        };
        let lines = capability_lines(&caps, "local", Api::OpenaiChat).join("\n");
        assert!(
            lines.starts_with("Probe capabilities: tools no, structuredOutput no, streamUsage yes"),
            "{lines}"
        );
        assert!(
            lines.contains("steps that need the read tools will answer without reading"),
            "{lines}"
        );
        assert!(
            lines.contains("set providers.local.structuredOutput: off or json-object in host.yaml"),
            "{lines}"
        );
        let lines = capability_lines(&caps, "a", Api::AnthropicMessages).join("\n");
        assert!(
            lines.contains("structuredOutput: off in host.yaml"),
            "{lines}"
        );
        assert_eq!(
            capabilities_json(&Capabilities::unknown()),
            json!({"tools": null, "structuredOutput": null, "streamUsage": null})
        );
    }
}
