//! What an answer reports as its usage (the scenario's numbers, or the simulator's estimates with
//! the prompt cache's read and write) and what a request costs the token budget.

use docsfab_record::Api;
use serde_json::{Value, json};

use super::request::{BodyFacts, RequestInfo};
use crate::cache::BilledUsage;
use crate::capacity::TokenCharge;
use crate::scenario::{Action, Answer, Reply, Response, Step};

/// The usage an answer reports, in the simulator's terms: `total_input` is the whole prompt,
/// cache parts included, on both APIs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reported {
    pub(super) total_input: u64,
    pub(super) output: u64,
    pub(super) creation: u64,
    pub(super) read: u64,
    /// OpenAI: send `prompt_tokens_details.cached_tokens`.
    pub(super) openai_details: bool,
}

impl Reported {
    pub(super) fn billed(self) -> BilledUsage {
        BilledUsage {
            input_tokens: self.total_input,
            output_tokens: self.output,
            cache_creation_input_tokens: self.creation,
            cache_read_input_tokens: self.read,
        }
    }

    /// Anthropic's `input_tokens`: the prompt tokens that were neither read from nor written to
    /// the cache.
    pub(super) fn uncached_input(self) -> u64 {
        self.total_input
            .saturating_sub(self.creation)
            .saturating_sub(self.read)
    }

    /// OpenAI's `usage` object.
    pub(super) fn openai_json(self) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.total_input,
            "completion_tokens": self.output,
            "total_tokens": self.total_input + self.output
        });
        if self.openai_details {
            usage["prompt_tokens_details"] = json!({"cached_tokens": self.read});
        }
        usage
    }
}

/// The prompt as the provider counts it: the total estimate, and the cache's read and write
/// fitted into it (Anthropic keeps at least 1 uncached `input_tokens`; writes give way first).
#[derive(Debug, Clone, Copy)]
pub(super) struct PromptUsage {
    pub(super) total: u64,
    pub(super) creation: u64,
    pub(super) read: u64,
}

pub(super) fn prompt_usage(req: &RequestInfo) -> PromptUsage {
    let total = input_estimate(&req.body);
    match req.api {
        Api::OpenaiChat => PromptUsage {
            total,
            creation: 0,
            read: req.cache.read.min(total),
        },
        Api::AnthropicMessages => {
            let room = total.saturating_sub(1);
            let read = req.cache.read.min(room);
            let creation = req.cache.creation.min(room - read);
            PromptUsage {
                total,
                creation,
                read,
            }
        }
    }
}

/// The usage an answer reports: the scenario's `usage` when it gives one (its numbers as
/// written), else the estimates with the prompt cache's read and write.
pub(super) fn reported_usage(answer: &Answer, req: &RequestInfo) -> Reported {
    if let Some(u) = answer.usage {
        return match req.api {
            Api::OpenaiChat => Reported {
                total_input: u.input_tokens,
                output: u.output_tokens,
                creation: 0,
                read: u.cached_tokens.unwrap_or(0),
                openai_details: u.cached_tokens.is_some(),
            },
            Api::AnthropicMessages => {
                let creation = u.cache_creation_input_tokens.unwrap_or(0);
                let read = u.cache_read_input_tokens.unwrap_or(0);
                Reported {
                    total_input: u.input_tokens.saturating_add(creation).saturating_add(read),
                    output: u.output_tokens,
                    creation,
                    read,
                    openai_details: false,
                }
            }
        };
    }
    let (_, output) = usage_for(answer, &req.body);
    let prompt = prompt_usage(req);
    Reported {
        total_input: prompt.total,
        output,
        creation: prompt.creation,
        read: prompt.read,
        openai_details: req.body.cache.keyed,
    }
}

fn usage_for(answer: &Answer, body: &BodyFacts) -> (u64, u64) {
    if let Some(u) = answer.usage {
        return (u.input_tokens, u.output_tokens);
    }
    // A rough chars/4 estimate: deterministic and plausible is all a test needs.
    let input = input_estimate(body);
    let produced: usize = answer.content.as_deref().map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum::<usize>();
    (input, (produced as u64 / 4).max(1))
}

/// The prompt's size in tokens as the simulator estimates it (body bytes / 4): what the log's
/// `prompt_tokens` says and what `tokens: prompt` charges.
pub(crate) fn input_estimate(body: &BodyFacts) -> u64 {
    (body.len as u64 / 4).max(1)
}

/// What a request costs the token budget. `total`: the usage its answer reports (input plus
/// output, the same numbers as the body's `usage`), or the input estimate for anything that is
/// not an answer. `prompt`: the input estimate, whatever answers it.
pub(crate) fn token_cost(step: &Step, body: &BodyFacts, charge: TokenCharge) -> u64 {
    if charge == TokenCharge::Prompt {
        return input_estimate(body);
    }
    match &step.action {
        Action::Respond(Response {
            reply: Reply::Answer(answer),
            ..
        }) => {
            let (input, output) = usage_for(answer, body);
            input.saturating_add(output)
        }
        _ => input_estimate(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_charge_the_body_estimate_whatever_answers() {
        let scenario = crate::scenario::Scenario::from_yaml_str(
            "capacity: {requestsPerMinute: 60, tokensPerMinute: 6000}\nresponses:\n  - answer: {text: hi, usage: {input_tokens: 10, output_tokens: 20}}\n",
            "t",
        )
        .unwrap();
        let step = scenario.pick_in(None, 0).step;
        let body = BodyFacts {
            len: 400,
            ..BodyFacts::default()
        };
        assert_eq!(token_cost(&step, &body, TokenCharge::Total), 30);
        assert_eq!(token_cost(&step, &body, TokenCharge::Prompt), 100);
        assert_eq!(input_estimate(&body), 100);
    }
}
