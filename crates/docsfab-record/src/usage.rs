//! Tokens spent, what they cost, and the one adder that keeps unknown unknown.

use serde::{Deserialize, Serialize};

/// Tokens an attempt, a turn or a request spent (OPS-4).
///
/// `input_tokens` counts every prompt token, cache reads and writes included, on both APIs
/// (OpenAI's `prompt_tokens` already does; Anthropic's three counts are added up), so the two
/// are comparable and a price applies to `input - cache_read - cache_write`.
///
/// `None` is unknown: the provider reported nothing and nothing could be estimated. It is
/// never read as 0, and a sum with an unknown part is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Prompt tokens written to the provider's prompt cache (part of `input_tokens`). Always
    /// written, so a record's shape does not depend on the provider's cache state.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache (part of `input_tokens`).
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Some count was estimated by docsfab (a stream cut before its usage), not reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Usage {
    /// Nothing was spent: the start of every sum, and a request that never left.
    pub const ZERO: Usage = Usage {
        input_tokens: Some(0),
        output_tokens: Some(0),
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        estimated: false,
    };

    /// Nothing is known.
    pub const UNKNOWN: Usage = Usage {
        input_tokens: None,
        output_tokens: None,
        cache_write_tokens: 0,
        cache_read_tokens: 0,
        estimated: false,
    };

    /// Both counts are known (reported or estimated).
    pub fn is_known(&self) -> bool {
        self.input_tokens.is_some() && self.output_tokens.is_some()
    }

    /// Input plus output, when both are known.
    pub fn total(&self) -> Option<u64> {
        Some(self.input_tokens?.saturating_add(self.output_tokens?))
    }

    /// Prompt tokens that neither read nor wrote the cache.
    pub fn uncached_input(&self) -> Option<u64> {
        Some(
            self.input_tokens?
                .saturating_sub(self.cache_read_tokens)
                .saturating_sub(self.cache_write_tokens),
        )
    }
}

impl std::fmt::Display for Usage {
    /// `tokens in 120 / out 40`, with `unknown` for a count nobody reported, the cache parts
    /// when there are any, and `(estimated)` when docsfab estimated some of it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |v: Option<u64>| v.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        if self.input_tokens.is_none() && self.output_tokens.is_none() {
            f.write_str("tokens unknown")?;
        } else {
            write!(
                f,
                "tokens in {} / out {}",
                n(self.input_tokens),
                n(self.output_tokens)
            )?;
        }
        if self.cache_read_tokens > 0 || self.cache_write_tokens > 0 {
            write!(
                f,
                " (cache read {}, write {})",
                self.cache_read_tokens, self.cache_write_tokens
            )?;
        }
        if self.estimated {
            f.write_str(" (estimated)")?;
        }
        Ok(())
    }
}

/// A cost for people: `$0.001234`, or `cost unknown` when there is none.
pub fn shown_cost(cost: Option<f64>) -> String {
    match cost {
        Some(c) => format!("${c:.6}"),
        None => "cost unknown".to_owned(),
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;
    /// Saturating (a corrupt provider count must not overflow the record); unknown wins.
    fn add(self, other: Usage) -> Usage {
        let sum = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_add(b?));
        Usage {
            input_tokens: sum(self.input_tokens, other.input_tokens),
            output_tokens: sum(self.output_tokens, other.output_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_add(other.cache_write_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_add(other.cache_read_tokens),
            estimated: self.estimated || other.estimated,
        }
    }
}

impl std::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::ZERO, |a, b| a + b)
    }
}

/// What one provider's tokens cost, in US dollars per million, as the operator set them in
/// host.yaml. docsfab ships no price list: prices change, and a stale one reads as truth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pricing {
    pub input_per_million: f64,
    pub output_per_million: f64,
    /// Defaults to the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_million: Option<f64>,
    /// Defaults to the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_million: Option<f64>,
}

impl Pricing {
    /// The cost of `usage` in USD, rounded to a millionth of a dollar; `None` when a count is
    /// unknown.
    pub fn cost(&self, usage: &Usage) -> Option<f64> {
        let write = self
            .cache_write_per_million
            .unwrap_or(self.input_per_million);
        let read = self
            .cache_read_per_million
            .unwrap_or(self.input_per_million);
        let micro = usage.uncached_input()? as f64 * self.input_per_million
            + usage.output_tokens? as f64 * self.output_per_million
            + usage.cache_write_tokens as f64 * write
            + usage.cache_read_tokens as f64 * read;
        Some(round_usd(micro / 1e6))
    }

    /// The most `prompt` input tokens and `output` output tokens could cost: every prompt
    /// token at the dearest of the input and cache-write prices.
    pub fn worst_case(&self, prompt: u64, output: u64) -> f64 {
        let input = self
            .input_per_million
            .max(self.cache_write_per_million.unwrap_or(0.0));
        (prompt as f64 * input + output as f64 * self.output_per_million) / 1e6
    }
}

/// USD rounded to a millionth, so sums in the record do not carry float noise.
pub fn round_usd(usd: f64) -> f64 {
    (usd * 1e6).round() / 1e6
}

/// Adds costs the way usage adds: unknown wins.
pub fn sum_cost(costs: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let mut total = 0.0;
    for c in costs {
        total += c?;
    }
    Some(round_usd(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_stays_unknown_in_sums() {
        let known = Usage {
            input_tokens: Some(10),
            output_tokens: Some(2),
            ..Usage::ZERO
        };
        assert_eq!((known + known).total(), Some(24));
        assert_eq!((known + Usage::UNKNOWN).input_tokens, None);
        assert_eq!(
            [known, known].into_iter().sum::<Usage>().input_tokens,
            Some(20)
        );
        let json = serde_json::to_value(Usage::UNKNOWN).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"inputTokens": null, "outputTokens": null, "cacheWriteTokens": 0, "cacheReadTokens": 0})
        );
    }

    #[test]
    fn cost_prices_cache_parts_apart() {
        let p = Pricing {
            input_per_million: 3.0,
            output_per_million: 15.0,
            cache_write_per_million: Some(3.75),
            cache_read_per_million: Some(0.3),
        };
        let u = Usage {
            input_tokens: Some(1_000_000),
            output_tokens: Some(100_000),
            cache_write_tokens: 200_000,
            cache_read_tokens: 500_000,
            estimated: false,
        };
        // 300k uncached × 3 + 100k × 15 + 200k × 3.75 + 500k × 0.3, per million.
        assert_eq!(p.cost(&u), Some(round_usd(0.9 + 1.5 + 0.75 + 0.15)));
        assert_eq!(p.cost(&Usage::UNKNOWN), None);
        assert_eq!(sum_cost([Some(0.1), None]), None);
    }
}
