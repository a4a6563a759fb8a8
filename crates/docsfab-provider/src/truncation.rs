//! Silent prompt truncation: a server that cuts a prompt to its context window and still
//! answers 200 (Ollama does) leaves only one trace, a prompt-token count far below what the
//! request's bytes can hold. [`prompt_truncated`] is the pure test of that; the replay driver
//! applies it to each answered turn. A warning changes no retry decision.
//!
//! Calibration (docs/cost.md, "Silent prompt truncation"): on SmolLM2's tokenizer (a 49k BPE,
//! through llama-server's `/tokenize`) English prose, Rust, YAML and JSON request bodies run at
//! 3.5 to 4.2 bytes a token. A warning needs more than [`MAX_BYTES_PER_TOKEN`] (16, four times
//! the highest measured) and a request of at least [`MIN_SENT_BYTES`], so a real tokenizer on
//! ordinary text never trips it; only input made mostly of long runs of one character (about
//! 60 bytes a token) could, and such a request is worth a look anyway.

use docsfab_record::{TurnWarning, Usage};

/// Bytes a reported prompt token may stand for before the count looks cut.
pub const MAX_BYTES_PER_TOKEN: u64 = 16;

/// Requests smaller than this are never judged: the chat template's own tokens and a short
/// prompt's noise would dominate.
pub const MIN_SENT_BYTES: u64 = 8 * 1024;

/// The warning for an answered request of `sent_bytes` whose reported usage counts too few
/// prompt tokens; `None` when the count is plausible, unknown or estimated by docsfab.
pub fn prompt_truncated(sent_bytes: u64, usage: &Usage) -> Option<TurnWarning> {
    let input_tokens = usage.input_tokens?;
    if usage.estimated || sent_bytes < MIN_SENT_BYTES {
        return None;
    }
    (input_tokens.saturating_mul(MAX_BYTES_PER_TOKEN) < sent_bytes).then_some(
        TurnWarning::PromptTruncated {
            sent_bytes,
            input_tokens,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: Option<u64>) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: Some(10),
            ..Usage::ZERO
        }
    }

    #[test]
    fn issue31_truncation_flags_ollamas_cut_prompt() {
        // The observed case: a 43 KB request recorded with 512 prompt tokens.
        assert_eq!(
            prompt_truncated(43_000, &usage(Some(512))),
            Some(TurnWarning::PromptTruncated {
                sent_bytes: 43_000,
                input_tokens: 512
            })
        );
    }

    #[test]
    fn issue31_truncation_spares_real_tokenizers_and_small_requests() {
        // 4.2 bytes a token, the highest measured on ordinary request bodies.
        assert_eq!(prompt_truncated(43_000, &usage(Some(10_238))), None);
        // Exactly at the bound is not below it.
        assert_eq!(prompt_truncated(16_000, &usage(Some(1_000))), None);
        assert!(prompt_truncated(16_001, &usage(Some(1_000))).is_some());
        // Below the minimum size nothing is judged, however small the count.
        assert_eq!(prompt_truncated(MIN_SENT_BYTES - 1, &usage(Some(1))), None);
        assert!(prompt_truncated(MIN_SENT_BYTES, &usage(Some(1))).is_some());
    }

    #[test]
    fn issue31_truncation_needs_a_reported_count() {
        assert_eq!(prompt_truncated(43_000, &usage(None)), None);
        let estimated = Usage {
            estimated: true,
            ..usage(Some(1))
        };
        assert_eq!(prompt_truncated(43_000, &estimated), None);
    }
}
