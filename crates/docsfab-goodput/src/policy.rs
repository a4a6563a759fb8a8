//! The policies a simulation compares: docsfab's own (its resolved limits and rules table) and
//! presets of other clients' documented retry defaults.

use docsfab_policy::catalog::EffectiveLimits;
use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::ReplayLimits;
use docsfab_policy::rules::RulesTable;
use docsfab_policy::step::StepBudgets;
use docsfab_record::ProviderErrorClass;

/// docsfab's two layers, exactly as a run applies them.
#[derive(Debug, Clone)]
pub struct DocsfabPolicy {
    pub replay: ReplayLimits,
    pub budgets: StepBudgets,
    pub rules: RulesTable,
    /// The host attempt timer (a composition's `limits.timeoutMs`).
    pub attempt_timer_ms: u64,
}

impl DocsfabPolicy {
    /// The policy a run on this host would apply, from the limits `doctor` resolves.
    pub fn from_limits(limits: &EffectiveLimits, rules: RulesTable, attempt_timer_ms: u64) -> Self {
        DocsfabPolicy {
            replay: limits.replay_limits(),
            budgets: limits.step_budgets(),
            rules,
            attempt_timer_ms,
        }
    }
}

/// A client that retries only inside the call, with no step layer above it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerPreset {
    pub name: &'static str,
    /// Retries after the first request.
    pub max_retries: u32,
    /// The first wait; each later one doubles.
    pub initial_delay_ms: u64,
    /// The cap on one wait, if any.
    pub max_delay_ms: Option<u64>,
    /// Each wait is shortened by up to this share at random (openai-python: 0.25).
    pub jitter: f64,
    /// A Retry-After up to this long replaces the computed wait.
    pub honours_retry_after_up_to_ms: Option<u64>,
}

impl PeerPreset {
    /// Whether the client retries this failure: 408, 409, 429, 5xx and connection errors; a
    /// stream that breaks after content has no retry in these clients.
    pub fn retries(&self, f: &ProviderFailure) -> bool {
        !f.content_published
            && matches!(
                f.class,
                ProviderErrorClass::RateLimit
                    | ProviderErrorClass::Server
                    | ProviderErrorClass::Timeout
                    | ProviderErrorClass::Network
            )
    }

    /// The wait before retry `n` (1-based), given a uniform draw `u` for the jitter.
    pub fn wait_ms(&self, n: u32, retry_after_ms: Option<u64>, u: f64) -> u64 {
        if let (Some(ra), Some(limit)) = (retry_after_ms, self.honours_retry_after_up_to_ms)
            && ra <= limit
        {
            return ra;
        }
        let exp = docsfab_policy::replay::exponential_ms(self.initial_delay_ms, n);
        let capped = self.max_delay_ms.map_or(exp, |m| exp.min(m));
        (capped as f64 * (1.0 - self.jitter * u)) as u64
    }
}

/// Peers' defaults; sources are cited in docs/budgets.md.
pub const PEERS: [PeerPreset; 4] = [
    PeerPreset {
        name: "openai-python",
        max_retries: 2,
        initial_delay_ms: 500,
        max_delay_ms: Some(8_000),
        jitter: 0.25,
        // openai 3.57.0: MAX_RETRY_AFTER_DELAY = 2 * 60 s (_constants.py:15).
        honours_retry_after_up_to_ms: Some(120_000),
    },
    PeerPreset {
        name: "anthropic-python",
        max_retries: 2,
        initial_delay_ms: 500,
        max_delay_ms: Some(8_000),
        jitter: 0.25,
        // anthropic 2.15.0: any positive Retry-After, capped at 4,294,967 s
        // (_base_client.py:922-926).
        honours_retry_after_up_to_ms: Some(4_294_967_000),
    },
    PeerPreset {
        name: "vercel-ai-sdk",
        max_retries: 2,
        initial_delay_ms: 2_000,
        max_delay_ms: None,
        jitter: 0.0,
        honours_retry_after_up_to_ms: Some(60_000),
    },
    // litellm.completion itself does not retry by default (num_retries is None); the openai
    // client it wraps gets max_retries 2, with that client's backoff and 2-minute Retry-After.
    PeerPreset {
        name: "litellm",
        max_retries: 2,
        initial_delay_ms: 500,
        max_delay_ms: Some(8_000),
        jitter: 0.25,
        honours_retry_after_up_to_ms: Some(120_000),
    },
];

/// A preset by name.
pub fn peer(name: &str) -> Option<PeerPreset> {
    PEERS.iter().copied().find(|p| p.name == name)
}

/// Either kind of policy.
#[derive(Debug, Clone)]
pub enum Policy {
    Docsfab(Box<DocsfabPolicy>),
    Peer(PeerPreset),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn litellm_preset_is_the_wrapped_openai_client_with_its_two_minute_retry_after() {
        let litellm = peer("litellm").unwrap();
        let openai = peer("openai-python").unwrap();
        assert_eq!(litellm.max_retries, 2);
        // Same computed waits: 0.5 s, 1 s, ... capped at 8 s, jitter up to 25 %.
        for n in 1..6 {
            for u in [0.0, 0.5, 1.0] {
                assert_eq!(litellm.wait_ms(n, None, u), openai.wait_ms(n, None, u));
            }
        }
        assert_eq!(litellm.wait_ms(1, None, 0.0), 500);
        assert_eq!(litellm.wait_ms(6, None, 1.0), 6_000);
        // Both honour a Retry-After up to 120 s (openai 3.57.0), and neither a longer one.
        assert_eq!(litellm.wait_ms(1, Some(90_000), 0.0), 90_000);
        assert_eq!(openai.wait_ms(1, Some(90_000), 0.0), 90_000);
        assert_eq!(openai.wait_ms(1, Some(150_000), 0.0), 500);
        // anthropic 2.15.0 takes any positive Retry-After.
        let anthropic = peer("anthropic-python").unwrap();
        assert_eq!(anthropic.wait_ms(1, Some(150_000), 0.0), 150_000);
    }
}
