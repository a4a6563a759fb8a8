//! The rate-limit hints a provider sends on its response head, read once into plain numbers.
//!
//! Two families are understood:
//! - OpenAI: `x-ratelimit-remaining-{requests,tokens}` with `x-ratelimit-reset-{requests,tokens}`,
//!   the reset a Go-style duration (`6m0s`, `1.5s`, `120ms`) from the moment of the response;
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{remaining,reset}`,
//!   the reset an RFC 3339 instant.
//!
//! Plus `retry-after` / `retry-after-ms`, parsed by the policy crate's one parser. Pure: the
//! caller passes `now` as milliseconds since the Unix epoch (wall time, because the hints are
//! shared between processes, which share no monotonic clock).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_policy::retry_after::parse_retry_after;
use serde::{Deserialize, Serialize};

/// A reset further away than this is not believed (a skewed clock or a daily quota); pacing
/// over it would stall every send for longer than any attempt deadline.
pub const MAX_RESET_HORIZON_MS: u64 = 15 * 60 * 1000;

/// Which of the provider's budgets an observation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetKind {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

impl BudgetKind {
    pub const ALL: [BudgetKind; 4] = [
        BudgetKind::Requests,
        BudgetKind::Tokens,
        BudgetKind::InputTokens,
        BudgetKind::OutputTokens,
    ];

    fn anthropic_stem(self) -> &'static str {
        match self {
            BudgetKind::Requests => "requests",
            BudgetKind::Tokens => "tokens",
            BudgetKind::InputTokens => "input-tokens",
            BudgetKind::OutputTokens => "output-tokens",
        }
    }

    /// OpenAI sends only the requests and the combined tokens pair.
    fn openai_stem(self) -> Option<&'static str> {
        match self {
            BudgetKind::Requests => Some("requests"),
            BudgetKind::Tokens => Some("tokens"),
            BudgetKind::InputTokens | BudgetKind::OutputTokens => None,
        }
    }
}

/// One budget as the provider reported it: what is left and when it is whole again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    pub kind: BudgetKind,
    /// The budget's size, when the provider says it (`x-ratelimit-limit-*`,
    /// `anthropic-ratelimit-*-limit`); with it the refill rate can be learnt.
    #[serde(default)]
    pub limit: Option<u64>,
    pub remaining: u64,
    /// Milliseconds since the Unix epoch.
    pub reset_at_ms: u64,
}

/// Everything the throttle reads from one response head.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// When the head was read (milliseconds since the Unix epoch): the instant `remaining` was
    /// true. `None` means "when it is fed back".
    pub at_ms: Option<u64>,
    /// `retry-after-ms` or `retry-after`, in milliseconds from the response.
    pub retry_after_ms: Option<u64>,
    pub observations: Vec<Observation>,
}

impl RateHeaders {
    /// No hints at all (a transport failure before a head, or a provider that sends none).
    pub fn none() -> RateHeaders {
        RateHeaders::default()
    }

    /// Reads the hints from `(name, value)` pairs (names in any case), as of `now_ms`: call it
    /// when the response head arrives, not when the body ends.
    /// A malformed or missing value drops that one hint; a budget counts only when both its
    /// remaining and its reset are readable.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        now_ms: u64,
    ) -> RateHeaders {
        let pairs: Vec<(String, &str)> = pairs
            .into_iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
            .collect();
        let get = |name: &str| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        let now = UNIX_EPOCH + Duration::from_millis(now_ms);
        let retry_after_ms = parse_retry_after(get("retry-after"), get("retry-after-ms"), now);
        let mut observations = Vec::new();
        for kind in BudgetKind::ALL {
            let anthropic = kind.anthropic_stem();
            let remaining = get(&format!("anthropic-ratelimit-{anthropic}-remaining"));
            let reset =
                get(&format!("anthropic-ratelimit-{anthropic}-reset")).and_then(parse_rfc3339_ms);
            let mut limit =
                get(&format!("anthropic-ratelimit-{anthropic}-limit")).and_then(parse_count);
            let mut found = remaining.and_then(parse_count).zip(reset);
            if found.is_none()
                && let Some(stem) = kind.openai_stem()
            {
                limit = get(&format!("x-ratelimit-limit-{stem}")).and_then(parse_count);
                let remaining = get(&format!("x-ratelimit-remaining-{stem}")).and_then(parse_count);
                let reset = get(&format!("x-ratelimit-reset-{stem}"))
                    .and_then(parse_go_duration_ms)
                    .map(|d| now_ms.saturating_add(d));
                found = remaining.zip(reset);
            }
            if let Some((remaining, reset_at_ms)) = found
                && reset_at_ms.saturating_sub(now_ms) <= MAX_RESET_HORIZON_MS
            {
                observations.push(Observation {
                    kind,
                    limit: limit.filter(|&l| l >= remaining),
                    remaining,
                    reset_at_ms,
                });
            }
        }
        RateHeaders {
            at_ms: Some(now_ms),
            retry_after_ms,
            observations,
        }
    }

    /// The same hints on a clock `offset_ms` ahead of the one they were read by: the instants
    /// move, the durations (`retry_after_ms`) do not. A store that decides by another clock
    /// (PostgreSQL's) moves them onto it, so a host's skew does not skew the pacing.
    pub fn shifted(&self, offset_ms: i64) -> RateHeaders {
        let shift = |t: u64| t.saturating_add_signed(offset_ms);
        RateHeaders {
            at_ms: self.at_ms.map(shift),
            retry_after_ms: self.retry_after_ms,
            observations: self
                .observations
                .iter()
                .map(|o| Observation {
                    reset_at_ms: shift(o.reset_at_ms),
                    ..*o
                })
                .collect(),
        }
    }
}

/// Wall time as milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn parse_count(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().unwrap_or(u64::MAX))
}

/// A Go `time.Duration` string as OpenAI prints it (`1h2m3.5s`, `6m0s`, `120ms`, `0s`), in
/// milliseconds rounded up (pacing a little late is safe, early is not).
pub fn parse_go_duration_ms(v: &str) -> Option<u64> {
    let bytes = v.as_bytes();
    if bytes.is_empty() {
        return None;
    }
    let mut i = 0;
    let mut total_ns: f64 = 0.0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let number: f64 = v.get(start..i)?.parse().ok()?;
        let unit_start = i;
        while i < bytes.len() && !(bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let ns_per_unit = match v.get(unit_start..i)? {
            "h" => 3.6e12,
            "m" => 6e10,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" | "μs" => 1e3,
            "ns" => 1.0,
            _ => return None,
        };
        total_ns += number * ns_per_unit;
    }
    if !total_ns.is_finite() {
        return None;
    }
    let ms = (total_ns / 1e6).ceil();
    // `as` saturates for floats out of range, which is what an absurd reset deserves.
    Some(ms as u64)
}

/// An RFC 3339 instant (`2026-12-01T14:00:30Z`, `...30.250+01:00`) as milliseconds since the
/// Unix epoch, rounded up to the next millisecond.
pub fn parse_rfc3339_ms(v: &str) -> Option<u64> {
    let b = v.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = v.get(range)?;
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut frac_ns: i64 = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac = v.get(start..i)?;
        let padded: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        frac_ns = padded.parse().ok()?;
    }
    let offset_s = match v.get(i..)? {
        "Z" | "z" => 0,
        rest if rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':' =>
        {
            let h = digits(i + 1..i + 3)?;
            let m = digits(i + 4..i + 6)?;
            let sign = if rest.as_bytes()[0] == b'-' { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    let ms = secs
        .checked_mul(1000)?
        .checked_add((frac_ns + 999_999) / 1_000_000)?;
    u64::try_from(ms).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_shifting_onto_another_clock_moves_instants_not_durations() {
        let read = RateHeaders::from_pairs(
            [
                ("retry-after-ms", "1500"),
                ("x-ratelimit-remaining-requests", "3"),
                ("x-ratelimit-reset-requests", "2s"),
            ],
            10_000,
        );
        let ahead = read.shifted(-4_000);
        assert_eq!(ahead.at_ms, Some(6_000));
        assert_eq!(ahead.retry_after_ms, Some(1_500));
        assert_eq!(ahead.observations[0].reset_at_ms, 8_000);
        assert_eq!(ahead.observations[0].remaining, 3);
        assert_eq!(read.shifted(5_000).observations[0].reset_at_ms, 17_000);
        assert_eq!(RateHeaders::none().shifted(-1).at_ms, None);
    }

    #[test]
    fn go_durations_as_openai_prints_them() {
        assert_eq!(parse_go_duration_ms("6m0s"), Some(360_000));
        assert_eq!(parse_go_duration_ms("1.5s"), Some(1_500));
        assert_eq!(parse_go_duration_ms("120ms"), Some(120));
        assert_eq!(parse_go_duration_ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_go_duration_ms("0s"), Some(0));
        assert_eq!(parse_go_duration_ms("17.3µs"), Some(1));
        for bad in ["", "5", "s", "1x", "-1s", "1..5s"] {
            assert_eq!(parse_go_duration_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rfc3339_instants_with_fraction_and_offset() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T12:00:00Z"),
            Some(1_709_208_000_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T13:00:00.250+01:00"),
            Some(1_709_208_000_250)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T12:00:00.0001Z"),
            Some(1_709_208_000_001)
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:00:00",
            "2024-02-29T12:00:00+0100",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn openai_headers_give_requests_and_tokens_budgets_relative_to_now() {
        let now = 1_000_000;
        let h = RateHeaders::from_pairs(
            [
                ("x-ratelimit-limit-requests", "60"),
                ("X-RateLimit-Remaining-Requests", "59"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-remaining-tokens", "149000"),
                ("x-ratelimit-reset-tokens", "6m0s"),
                ("retry-after", "2"),
            ],
            now,
        );
        assert_eq!(h.retry_after_ms, Some(2_000));
        assert_eq!(
            h.observations,
            vec![
                Observation {
                    kind: BudgetKind::Requests,
                    limit: Some(60),
                    remaining: 59,
                    reset_at_ms: now + 1_000
                },
                Observation {
                    kind: BudgetKind::Tokens,
                    limit: None,
                    remaining: 149_000,
                    reset_at_ms: now + 360_000
                },
            ]
        );
    }

    #[test]
    fn anthropic_headers_give_all_four_budgets_at_absolute_resets() {
        let now = parse_rfc3339_ms("2026-12-01T14:00:00Z").unwrap();
        let h = RateHeaders::from_pairs(
            [
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-reset", "2026-12-01T14:00:01Z"),
                ("anthropic-ratelimit-tokens-remaining", "0"),
                ("anthropic-ratelimit-tokens-reset", "2026-12-01T14:00:30Z"),
                ("anthropic-ratelimit-input-tokens-remaining", "1000"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2026-12-01T14:00:02Z",
                ),
                ("anthropic-ratelimit-output-tokens-remaining", "500"),
                (
                    "anthropic-ratelimit-output-tokens-reset",
                    "2026-12-01T14:00:03Z",
                ),
            ],
            now,
        );
        let kinds: Vec<_> = h
            .observations
            .iter()
            .map(|o| (o.kind, o.remaining, o.reset_at_ms - now))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (BudgetKind::Requests, 49, 1_000),
                (BudgetKind::Tokens, 0, 30_000),
                (BudgetKind::InputTokens, 1_000, 2_000),
                (BudgetKind::OutputTokens, 500, 3_000),
            ]
        );
    }

    #[test]
    fn a_half_budget_or_a_reset_beyond_the_horizon_is_dropped() {
        let h = RateHeaders::from_pairs(
            [
                ("x-ratelimit-remaining-requests", "5"),
                ("x-ratelimit-remaining-tokens", "5"),
                ("x-ratelimit-reset-tokens", "24h0m0s"),
            ],
            0,
        );
        assert_eq!((h.retry_after_ms, h.observations), (None, vec![]));
    }
}
