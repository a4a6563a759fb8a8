//! Retry-After parsing (REP-8, STP-15 feed on it).

use std::time::{Duration, SystemTime};

use docsfab_policy::retry_after::parse_retry_after;

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

// Proves REP-8.
#[test]
fn delta_seconds_rep_8() {
    assert_eq!(parse_retry_after(Some("7"), None, now()), Some(7_000));
    assert_eq!(parse_retry_after(Some(" 0 "), None, now()), Some(0));
    assert_eq!(parse_retry_after(Some("1.5"), None, now()), Some(1_500));
    assert_eq!(parse_retry_after(Some("0.0001"), None, now()), Some(1));
}

// Proves REP-8.
#[test]
fn http_date_rep_8() {
    let at = now() + Duration::from_secs(30);
    let text = httpdate::fmt_http_date(at);
    assert_eq!(parse_retry_after(Some(&text), None, now()), Some(30_000));
    let past = httpdate::fmt_http_date(now() - Duration::from_secs(30));
    assert_eq!(parse_retry_after(Some(&past), None, now()), Some(0));
    assert_eq!(
        parse_retry_after(Some("Sunday, 06-Nov-94 08:49:37 GMT"), None, now()),
        Some(0)
    );
}

// Proves REP-8.
#[test]
fn retry_after_ms_is_preferred_rep_8() {
    assert_eq!(parse_retry_after(Some("7"), Some("250"), now()), Some(250));
    assert_eq!(parse_retry_after(None, Some("250.2"), now()), Some(251));
    // An invalid ms header falls back to retry-after.
    assert_eq!(
        parse_retry_after(Some("2"), Some("soon"), now()),
        Some(2_000)
    );
}

// Proves REP-8.
#[test]
fn junk_and_negative_are_none_rep_8() {
    for v in [
        "", " ", "-1", "-0.5", "abc", "1e3", "1.", ".5", "+3", "3 s", "NaN", "∞",
    ] {
        assert_eq!(parse_retry_after(Some(v), None, now()), None, "{v:?}");
        assert_eq!(parse_retry_after(None, Some(v), now()), None, "{v:?}");
    }
    assert_eq!(parse_retry_after(None, None, now()), None);
}

// Proves REP-8.
#[test]
fn huge_values_saturate_rep_8() {
    let huge = "99999999999999999999999999999999";
    assert_eq!(parse_retry_after(Some(huge), None, now()), Some(u64::MAX));
    assert_eq!(parse_retry_after(None, Some(huge), now()), Some(u64::MAX));
    assert_eq!(
        parse_retry_after(Some("18446744073709552"), None, now()),
        Some(u64::MAX)
    );
}

proptest::proptest! {
    #[test]
    fn never_panics_on_any_text(a in ".*", b in ".*", secs in 0u64..4_000_000_000) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let _ = parse_retry_after(Some(&a), Some(&b), now);
        let _ = parse_retry_after(Some(&a), None, now);
    }
}
