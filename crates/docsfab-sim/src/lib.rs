//! A fault-injecting LLM provider simulator.
//!
//! It serves OpenAI Chat Completions (`POST /v1/chat/completions`) and Anthropic Messages
//! (`POST /v1/messages`) on loopback and answers each request as a [`Scenario`] scripts it:
//! any HTTP status, a dropped connection, a reset or clean close at an exact body byte, a stall,
//! a streamed or JSON answer with text, JSON or tool calls, and faults inside the stream. Every
//! request is recorded in a [`RequestLogEntry`] with the SHA-256 of its body, so tests can prove
//! that a replay sent the same bytes. A scenario may also give the provider a capacity (token
//! buckets for requests and tokens): requests over it get 429 with an honest Retry-After, and every
//! response carries the API's rate-limit headers. The format is described in `docs/simulator.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), docsfab_sim::SimError> {
//! use docsfab_sim::{Scenario, SimServer};
//! let scenario = Scenario::from_yaml_str(
//!     "responses:\n  - status: 408\n    repeat: 2\n  - answer: {text: hello}\n",
//!     "inline",
//! )?;
//! let server = SimServer::start("127.0.0.1:0".parse().unwrap(), scenario, None).await?;
//! println!("point the client at {}", server.base_url());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod cache;
mod capacity;
mod error;
mod http;
mod render;
mod rng;
mod scenario;
mod server;

pub use cache::BilledUsage;
pub use capacity::OutsideCounts;
pub use error::SimError;
pub use scenario::Scenario;
pub use server::{CAPACITY_ENTRY, RequestLogEntry, STREAM_OPTIONS_ENTRY, SimServer, serve_command};
