//! What a gateway between docsfab and the provider does to the retry rules (issue 24), in one
//! list: `doctor --probe` prints all of it when its probe came through a gateway, and `runs
//! show` and the HTML report print, once per run, the rules that a gateway an attempt came
//! through may have bent (the ones docsfab cannot undo). Measured against LiteLLM 1.108.7 by
//! `tests/gateway_litellm.rs`; `docs/retries.md`, "Behind a gateway", says the same for people.

use docsfab_record::{Api, Gateway, GatewayName, RunRecord};
use serde::Serialize;

/// One retry rule a gateway weakens, and what can be done about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Weakened {
    /// The requirement ids of the rule (`docs/requirements.md`).
    pub rule: &'static str,
    /// What the gateway does to it.
    pub what: &'static str,
    /// Whether docsfab undoes it by itself; when not, the rule may be bent in a run.
    pub compensated: bool,
    /// What docsfab does about it, or why it cannot.
    pub docsfab: &'static str,
    /// What the operator can do.
    pub remedy: &'static str,
}

/// Keeps every rule: the provider itself, or docsfab's own route in the gateway's place.
const ROUTE: &str = "point providers.NAME.baseUrl at the provider itself, or put `docsfab route serve` where the gateway is (it keeps every rule)";

const LITELLM_OPENAI: &[Weakened] = &[
    Weakened {
        rule: "REP-8",
        what: "the provider's Retry-After arrives renamed as llm_provider-retry-after(-ms), with no retry-after of LiteLLM's own",
        compensated: true,
        docsfab: "reads the relayed one as the provider's, under the same clamps, for the replay, the step retry and the throttle",
        remedy: "nothing to do",
    },
    Weakened {
        rule: "CLS-5, CLS-6",
        what: "an error event after the answer began is replaced by LiteLLM's own, {\"type\":null,\"code\":\"500\"}, whatever the provider declared",
        compensated: true,
        docsfab: "reads the code \"500\" as a declared 500 (server) and retries the step from the transport budget, as without the gateway; a declared 504 becomes a 500 (server, retried alike)",
        remedy: "nothing to do",
    },
    Weakened {
        rule: "REP-6",
        what: "a quota or rate limit reported inside a 200 stream reaches docsfab as HTTP 500 (when it is the stream's first event) or as a \"500\" error event (after text)",
        compensated: false,
        docsfab: "cannot tell it from a server fault (the status decides, REP-4): it replays the request and retries the step from the transport budget instead of stopping",
        remedy: "no LiteLLM setting keeps it; lower DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES and providerAttempt.maxAttemptsPerTurn to bound what a quota costs, or",
    },
    Weakened {
        rule: "CLS-2",
        what: "a stream the provider closed early (no finish reason, no [DONE]) arrives completed, with finish_reason stop, a usage chunk LiteLLM computed and [DONE]",
        compensated: false,
        docsfab: "cannot tell the cut answer from a whole one: a step's contract judges it (a contract retry where a transport retry was due), a write step's closing text is taken as it is",
        remedy: "no LiteLLM setting keeps it; give every read step a contract, or",
    },
];

const LITELLM_ANTHROPIC: &[Weakened] = &[Weakened {
    rule: "REP-8",
    what: "a 429 from an Anthropic provider arrives with neither the provider's Retry-After nor a relayed llm_provider-retry-after",
    compensated: false,
    docsfab: "has nothing to read: the replay waits its own backoff, within the throttle window",
    remedy: "no LiteLLM setting keeps it;",
}];

/// The rules `gateway` weakens on `api`, in the order the spec states them.
pub fn weakened(gateway: GatewayName, api: Api) -> &'static [Weakened] {
    match (gateway, api) {
        (GatewayName::Litellm, Api::OpenaiChat) => LITELLM_OPENAI,
        (GatewayName::Litellm, Api::AnthropicMessages) => LITELLM_ANTHROPIC,
    }
}

impl Weakened {
    /// The remedy as one sentence ending in the way that keeps every rule.
    pub fn remedy_text(&self) -> String {
        if self.compensated {
            self.remedy.to_owned()
        } else {
            format!("{} {ROUTE}", self.remedy)
        }
    }

    /// `REP-6: what; docsfab what; remedy`, one line for a terminal.
    pub fn line(&self) -> String {
        format!(
            "{}: {}; docsfab {}; {}",
            self.rule,
            self.what,
            self.docsfab,
            self.remedy_text()
        )
    }
}

/// What a run says about the gateway its attempts came through, once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunGateway {
    /// `LiteLLM 1.108.7`.
    pub gateway: String,
    /// Attempts that came through it, of all attempts of the run.
    pub attempts: usize,
    pub of: usize,
    /// The rules it may have bent in this run: the ones docsfab cannot undo.
    pub may_have_bent: Vec<BentRule>,
}

/// One rule a run's gateway may have bent, for `runs show` and the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BentRule {
    pub rule: &'static str,
    pub what: String,
}

impl RunGateway {
    /// `None` when no attempt of the run came through a gateway docsfab recognises.
    pub fn of_run(r: &RunRecord) -> Option<RunGateway> {
        let attempts: Vec<_> = r.steps.iter().flat_map(|s| &s.attempts).collect();
        let through: Vec<&Gateway> = attempts.iter().filter_map(|a| a.gateway.as_ref()).collect();
        // The version when any response stated it (LiteLLM states none on its errors).
        let gateway = through
            .iter()
            .find(|g| g.version.is_some())
            .or(through.first())?;
        let api = r.provider.as_ref().map_or(Api::OpenaiChat, |p| p.api);
        let may_have_bent = weakened(gateway.name, api)
            .iter()
            .filter(|w| !w.compensated)
            .map(|w| BentRule {
                rule: w.rule,
                what: format!("{}; docsfab {}", w.what, w.docsfab),
            })
            .collect();
        Some(RunGateway {
            gateway: gateway.describe(),
            attempts: through.len(),
            of: attempts.len(),
            may_have_bent,
        })
    }

    /// The lines `runs show` prints, indented as the run's context.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "  gateway: {} ({} of {} attempts came through it); the rules it may have bent in this run:",
            self.gateway, self.attempts, self.of
        )];
        out.extend(
            self.may_have_bent
                .iter()
                .map(|b| format!("    {}: {}", b.rule, b.what)),
        );
        if self.may_have_bent.is_empty() {
            out[0] = format!(
                "  gateway: {} ({} of {} attempts came through it); docsfab undid what it changes",
                self.gateway, self.attempts, self.of
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue24_every_weakened_rule_names_a_requirement_and_a_remedy() {
        for api in [Api::OpenaiChat, Api::AnthropicMessages] {
            let list = weakened(GatewayName::Litellm, api);
            assert!(!list.is_empty());
            for w in list {
                assert!(
                    w.rule.starts_with("REP-") || w.rule.starts_with("CLS-"),
                    "{w:?}"
                );
                let line = w.line();
                assert!(!line.contains('\n'), "{line}");
                if !w.compensated {
                    assert!(line.contains("docsfab route serve"), "{line}");
                }
            }
        }
        // The two the spec forbids undoing by reading text are the ones left bent.
        let bent: Vec<&str> = weakened(GatewayName::Litellm, Api::OpenaiChat)
            .iter()
            .filter(|w| !w.compensated)
            .map(|w| w.rule)
            .collect();
        assert_eq!(bent, ["REP-6", "CLS-2"]);
    }
}
