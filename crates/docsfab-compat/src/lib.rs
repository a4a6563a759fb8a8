//! Test-only crate: differential tests of the response boundary against the real stream
//! consumers (the Python and Node OpenAI SDKs, the Python Anthropic SDK and pi-ai).
//!
//! Everything lives in `tests/differential.rs`; the clients are installed by `compat/install.sh`
//! and driven by the scripts in `compat/`. Results: `docs/compat-results.md`.
