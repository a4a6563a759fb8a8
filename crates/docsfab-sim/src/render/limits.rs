//! The rate-limit headers of a scenario's capacity, in the family it asks for, and the 429 a
//! request over capacity gets, with its Retry-After.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_record::Api;
use serde_json::json;

use super::request::{BodyFacts, DEFAULT_MODEL};
use crate::capacity::{
    Capacity, Dimension, Gauge, HeaderFamily, Refusal, RetryAfter, TokenCharge, Verdict,
};
use crate::http::{Framing, Outgoing};

/// The rate-limit headers in the family the capacity asks for (by default the API's own). Times
/// are real time (already scaled).
///
/// OpenAI sends the reset as a Go-style duration until the budget is back to its initial state;
/// Anthropic sends the RFC 3339 instant at which it is fully replenished.
pub(crate) fn rate_limit_headers(
    api: Api,
    capacity: &Capacity,
    verdict: &Verdict,
    now: SystemTime,
) -> Vec<(String, String)> {
    let family = match capacity.headers {
        HeaderFamily::Api => api,
        HeaderFamily::Openai => Api::OpenaiChat,
        HeaderFamily::Anthropic => Api::AnthropicMessages,
        HeaderFamily::None => return Vec::new(),
    };
    // Anthropic reports a prompt-only budget as its input-tokens family (ITPM); OpenAI has one
    // token family whatever it counts.
    let tokens = match (family, capacity.tokens) {
        (Api::AnthropicMessages, TokenCharge::Prompt) => "input-tokens",
        _ => "tokens",
    };
    let budgets =
        std::iter::once(("requests", verdict.requests)).chain(verdict.tokens.map(|t| (tokens, t)));
    let mut headers = Vec::new();
    for (what, gauge) in budgets {
        let Gauge {
            limit,
            remaining,
            reset,
            ..
        } = gauge;
        let (names, reset) = match family {
            Api::OpenaiChat => (
                [
                    format!("x-ratelimit-limit-{what}"),
                    format!("x-ratelimit-remaining-{what}"),
                    format!("x-ratelimit-reset-{what}"),
                ],
                go_duration(reset),
            ),
            Api::AnthropicMessages => (
                [
                    format!("anthropic-ratelimit-{what}-limit"),
                    format!("anthropic-ratelimit-{what}-remaining"),
                    format!("anthropic-ratelimit-{what}-reset"),
                ],
                rfc3339(now.checked_add(reset).unwrap_or(now)),
            ),
        };
        let [limit_name, remaining_name, reset_name] = names;
        headers.push((limit_name, limit.to_string()));
        headers.push((remaining_name, remaining.to_string()));
        headers.push((reset_name, reset));
    }
    headers
}

/// The 429 a request over capacity gets: the API's own rate-limit error body, the rate-limit
/// headers, and the Retry-After the capacity's `retryAfter` asks for, telling when this request
/// would fit: `retry-after` in whole seconds rounded up, `retry-after-ms` exact (by default
/// both, the milliseconds on the OpenAI API only, as the providers send them).
pub(crate) fn capacity_refusal(
    api: Api,
    capacity: &Capacity,
    verdict: &Verdict,
    refusal: Refusal,
    body: &BodyFacts,
) -> Outgoing {
    let wait_ms = ceil_millis(refusal.wait);
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    headers.extend(rate_limit_headers(
        api,
        capacity,
        verdict,
        SystemTime::now(),
    ));
    let (seconds, millis) = match capacity.retry_after {
        RetryAfter::Both => (true, api == Api::OpenaiChat),
        RetryAfter::Seconds => (true, false),
        RetryAfter::Milliseconds => (false, true),
        RetryAfter::None => (false, false),
    };
    if seconds {
        headers.push(("retry-after".to_owned(), wait_ms.div_ceil(1000).to_string()));
    }
    if millis {
        headers.push(("retry-after-ms".to_owned(), wait_ms.to_string()));
    }
    let gauge = match refusal.by {
        Dimension::Requests => verdict.requests,
        Dimension::Tokens => verdict.tokens.unwrap_or(verdict.requests),
    };
    // What the bucket has given out; the limit is the header's (per minute by default), so with
    // a small burst this reads "Limit 120, Used 1", which is what a quantized limit looks like.
    let used = gauge.size.saturating_sub(gauge.remaining);
    let again = go_duration(refusal.wait);
    let tokens = match capacity.tokens {
        TokenCharge::Total => "tokens",
        TokenCharge::Prompt => "input tokens",
    };
    let text = match api {
        Api::OpenaiChat => {
            let model = body.model.as_deref().unwrap_or(DEFAULT_MODEL);
            let (kind, per_min) = match refusal.by {
                Dimension::Requests => ("requests", "requests per min (RPM)"),
                Dimension::Tokens => ("tokens", "tokens per min (TPM)"),
            };
            let message = format!(
                "Rate limit reached for {model} on {per_min}: Limit {}, Used {used}, Requested {}. Please try again in {again}. (simulated capacity)",
                gauge.limit, refusal.requested
            );
            json!({"error": {"message": message, "type": kind, "param": null, "code": "rate_limit_exceeded"}})
        }
        Api::AnthropicMessages => {
            let what = match refusal.by {
                Dimension::Requests => "requests",
                Dimension::Tokens => tokens,
            };
            // "At once" is the bucket, whatever the limit header reports.
            let message = format!(
                "This request would exceed the simulated rate limit of {} {what} at once; try again in {again}.",
                gauge.size
            );
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}})
        }
    };
    Outgoing {
        status: 429,
        headers,
        pieces: vec![text.to_string().into_bytes()],
        framing: Framing::ContentLength,
        piece_delay: Duration::ZERO,
    }
}

/// Whole milliseconds, rounded up: waiting a fraction too little would be refused again.
fn ceil_millis(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A duration as Go's `time.Duration` prints it, at millisecond resolution (rounded up), which
/// is the form OpenAI's `x-ratelimit-reset-*` headers use: `0s`, `120ms`, `1.5s`, `6m0s`.
fn go_duration(d: Duration) -> String {
    let ms = ceil_millis(d);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, minutes) = (ms / 3_600_000, ms / 60_000 % 60);
    let (secs, frac) = (ms / 1000 % 60, ms % 1000);
    let mut seconds = secs.to_string();
    if frac > 0 {
        let digits = format!("{frac:03}");
        seconds.push('.');
        seconds.push_str(digits.trim_end_matches('0'));
    }
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// An instant as RFC 3339 in UTC, with milliseconds only when the instant is not a whole second
/// (rounded up, so the time named is never before the budget is full).
fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = ceil_millis(since);
    let (secs, frac) = (ms / 1000, ms % 1000);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let time = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
    if frac == 0 {
        format!("{time}Z")
    } else {
        format!("{time}.{frac:03}Z")
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`, valid far beyond any clock this runs on.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_durations_read_like_go_durations() {
        let ms = Duration::from_millis;
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (ms(120), "120ms"),
            (ms(999), "999ms"),
            (ms(1000), "1s"),
            (ms(1500), "1.5s"),
            (ms(17_342), "17.342s"),
            (ms(360_000), "6m0s"),
            (ms(3_723_400), "1h2m3.4s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn reset_instants_are_rfc3339_utc() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        // 2024-02-29T23:59:59.5Z: a leap day, with a fraction.
        assert_eq!(rfc3339(at(1_709_251_199_500)), "2024-02-29T23:59:59.500Z");
        assert_eq!(rfc3339(at(1_795_972_800_000)), "2026-11-29T17:20:00Z");
    }

    fn capacity(yaml: &str) -> (Capacity, crate::scenario::Scenario) {
        let scenario = crate::scenario::Scenario::from_yaml_str(yaml, "t").unwrap();
        (scenario.capacity().unwrap().clone(), scenario)
    }

    fn names(headers: &[(String, String)]) -> Vec<&str> {
        headers.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn the_header_family_is_the_capacitys_choice() {
        let start = tokio::time::Instant::now();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let yaml = |extra: &str| {
            format!(
                "capacity: {{requestsPerMinute: 60, tokensPerMinute: 6000, burst: 1{extra}}}\nresponses: [{{status: 200}}]\n"
            )
        };
        let headers = |extra: &str, api: Api| {
            let (c, _) = capacity(&yaml(extra));
            let verdict = crate::capacity::Limiter::new(&c, start).admit(start, 10);
            rate_limit_headers(api, &c, &verdict, now)
        };
        assert_eq!(
            names(&headers(", headers: openai", Api::AnthropicMessages)),
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens"
            ]
        );
        assert!(headers(", headers: none", Api::OpenaiChat).is_empty());
        // A prompt-only budget is Anthropic's input-tokens family; OpenAI keeps `-tokens`.
        let anthropic = headers(", headers: anthropic, tokens: prompt", Api::OpenaiChat);
        assert_eq!(
            names(&anthropic)[3..],
            [
                "anthropic-ratelimit-input-tokens-limit",
                "anthropic-ratelimit-input-tokens-remaining",
                "anthropic-ratelimit-input-tokens-reset"
            ]
        );
        assert_eq!(anthropic[3].1, "6000");
        assert_eq!(anthropic[0].1, "60");
        assert_eq!(
            names(&headers(", tokens: prompt", Api::OpenaiChat))[3],
            "x-ratelimit-limit-tokens"
        );
    }

    #[test]
    fn retry_after_follows_the_capacity() {
        let start = tokio::time::Instant::now();
        let shapes = |retry: &str, api: Api| {
            let (c, _) = capacity(&format!(
                "capacity: {{requestsPerMinute: 60, burst: 1, retryAfter: {retry}}}\nresponses: [{{status: 200}}]\n"
            ));
            let mut limiter = crate::capacity::Limiter::new(&c, start);
            limiter.admit(start, 1);
            let verdict = limiter.admit(start, 1);
            let out = capacity_refusal(
                api,
                &c,
                &verdict,
                verdict.refused.unwrap(),
                &BodyFacts::default(),
            );
            let mut got: Vec<String> = out
                .headers
                .into_iter()
                .filter(|(n, _)| n.starts_with("retry-after"))
                .map(|(n, v)| format!("{n}: {v}"))
                .collect();
            got.sort();
            got
        };
        assert_eq!(
            shapes("both", Api::OpenaiChat),
            ["retry-after-ms: 1000", "retry-after: 1"]
        );
        assert_eq!(shapes("both", Api::AnthropicMessages), ["retry-after: 1"]);
        assert_eq!(shapes("seconds", Api::OpenaiChat), ["retry-after: 1"]);
        assert_eq!(
            shapes("milliseconds", Api::AnthropicMessages),
            ["retry-after-ms: 1000"]
        );
        assert!(shapes("none", Api::OpenaiChat).is_empty());
    }
}
