//! docsfab's composition runtime: the building blocks the agent loop drives.
//!
//! - [`record`]: the run record (`docsfab runs show --json`) and its JSON Schema check.
//! - [`ledger`]: the tool ledger, the turn governor and the execution lease (LSE-1..3).
//! - [`tools`]: the tools and the validation of their calls.
//! - [`store`]: the SQLite run store, with crash recovery to `interrupted`.
pub mod composition;
pub mod ledger;
pub mod record;
pub mod tools;
pub mod store;
