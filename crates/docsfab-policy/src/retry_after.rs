//! Retry-After parsing: delta seconds, an HTTP date, and the `retry-after-ms` header some
//! providers send.

use std::time::SystemTime;

/// The provider's requested wait in milliseconds, from the `retry-after-ms` header (preferred
/// when valid) or `retry-after` (delta seconds or HTTP date, relative to `now`).
/// `None` when neither is present or parseable.
///
/// Accepted forms: a non-negative decimal number (a fraction is rounded up to the next whole
/// millisecond, as SDKs accept `1.5`), or an IMF-fixdate/RFC 850/asctime date for
/// `retry-after`. A date already past gives `Some(0)`. Negative numbers, junk and empty values
/// give `None`. Values too large for `u64` saturate at `u64::MAX`; the wait caps clamp them later.
pub fn parse_retry_after(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
    now: SystemTime,
) -> Option<u64> {
    if let Some(ms) = retry_after_ms.and_then(|v| parse_decimal_scaled(v, 1)) {
        return Some(ms);
    }
    let value = retry_after?.trim();
    if let Some(ms) = parse_decimal_scaled(value, 1000) {
        return Some(ms);
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let ahead = date.duration_since(now).unwrap_or_default();
    // Round up: waiting a fraction of a millisecond too little would hit the throttle again.
    let whole = ahead.as_millis();
    let ms = if ahead.subsec_nanos() % 1_000_000 == 0 {
        whole
    } else {
        whole.saturating_add(1)
    };
    Some(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Parses `digits[.digits]` and multiplies by `scale` (1 for milliseconds, 1000 for seconds),
/// rounding any remainder up. Saturates instead of overflowing.
fn parse_decimal_scaled(value: &str, scale: u64) -> Option<u64> {
    let value = value.trim();
    let (int_part, frac_part) = match value.split_once('.') {
        Some((i, f)) => (i, f),
        None => (value, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int_part.is_empty() || !all_digits(int_part) || !all_digits(frac_part) {
        return None;
    }
    if value.ends_with('.') {
        return None;
    }
    let whole = int_part.bytes().fold(0u64, |acc, b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    let mut total = whole.saturating_mul(scale);
    // The fraction contributes fraction × scale; only its ceiling matters.
    let mut frac_scaled = 0u64;
    let mut any_rest = false;
    let mut unit = scale;
    for b in frac_part.bytes() {
        let digit = u64::from(b - b'0');
        if unit >= 10 {
            unit /= 10;
            frac_scaled = frac_scaled.saturating_add(digit.saturating_mul(unit));
        } else if digit != 0 {
            any_rest = true;
        }
    }
    total = total.saturating_add(frac_scaled);
    if any_rest {
        total = total.saturating_add(1);
    }
    Some(total)
}
