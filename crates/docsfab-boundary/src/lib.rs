//! The response boundary of docsfab, and the SSE line rules it shares with the provider
//! transports.
//!
//! Pure: bytes in, lines, events and verdicts out. Nothing here does I/O.

pub mod lines;
pub mod sse;

pub use lines::{LineSplitter, strip_boms};
pub use sse::{SseDecoder, SseEvent};
