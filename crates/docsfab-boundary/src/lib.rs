//! The response boundary of docsfab, and the SSE line rules it shares with the provider
//! transports.
//!
//! Pure: bytes in, lines, events and verdicts out. Nothing here does I/O. See
//! `docs/boundary.md` for the rules as implemented.
//!
//! ```
//! use docsfab_record::Api;
//! use docsfab_boundary::{BoundaryConfig, Pass, Verdict};
//!
//! let config = BoundaryConfig::new(Api::OpenaiChat, "gpt-4o", &[]).unwrap();
//! let mut boundary = config.start();
//! boundary.feed(b"data: {\"model\":\"gpt-4o\",\"choices\":[]}\r");
//! boundary.feed(b"\n\r\ndata: [DONE]");
//! assert_eq!(boundary.finish(), Verdict::Pass(Pass::Stream));
//! ```

mod boundary;
pub mod chunk;
mod event;
mod inspect;
pub mod lines;
pub mod redact;
mod scan;
pub mod sse;
mod verdict;

pub use boundary::{Boundary, BoundaryConfig, ConfigError, DEFAULT_MAX_LINE_BYTES};
pub use chunk::Chunk;
pub use event::{Event, EventReader};
pub use lines::{BOM, LineSplitter, strip_boms};
pub use redact::{REDACTED, Redactor, redact};
pub use scan::{MIN_SECRET_LEN, Secret, SecretTooShort};
pub use sse::{SseDecoder, SseEvent};
pub use verdict::{CredentialKind, Pass, Reason, Refusal, Verdict};
