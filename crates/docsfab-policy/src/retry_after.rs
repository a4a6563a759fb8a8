//! Retry-After parsing: delta seconds, an HTTP date, and the `retry-after-ms` header some
//! providers send.

use std::time::SystemTime;

/// The provider's requested wait in milliseconds, from the `retry-after-ms` header (preferred
/// when valid) or `retry-after` (delta seconds or HTTP date, relative to `now`).
/// `None` when neither is present or parseable.
pub fn parse_retry_after(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
    now: SystemTime,
) -> Option<u64> {
    let _ = (retry_after, retry_after_ms, now);
    todo!("policy: parse_retry_after")
}
