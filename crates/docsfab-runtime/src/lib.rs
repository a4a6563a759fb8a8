//! docsfab's composition runtime: the building blocks the agent loop drives.
//!
//! - [`composition`]: the composition file, parsed and checked.
//! - [`executor`]: running a composition: steps in order, each step's attempts and the step
//!   retry decisions between them, the run record committed as it goes.
//! - [`agent`]: one attempt of one step, the agent loop of provider turns and tool batches.
//! - [`record`]: the run record (`docsfab runs show --json`) and its JSON Schema check.
//! - [`ledger`]: the tool ledger, the turn governor and the execution lease (LSE-1..3).
//! - [`tools`]: the tools and the validation of their calls.
//! - [`batch`]: one turn's tool batch through validation, authorization, lease and execution.
//! - [`contract`]: judging a read-only step's answer against its JSON Schema.
//! - [`grounding`]: judging what a contract answer cites against the workspace.
//! - [`store`]: the run store (SQLite or PostgreSQL, by URL) and job queue, with crash recovery
//!   to `interrupted`.
//! - [`workspace`]: the workspace jail that resolves every tool path.
//! - [`supervision`]: read supervision, notice-only re-reads and `no-progress` (LSE-4).
//! - [`snapshot`]: write snapshots and the verified restore of a write step's attempt.
//! - [`settlement`]: write settlement from the ledger and the lease (WRT-1..3).
//! - [`written`]: the bounded contents of the files a run wrote, kept for `docsfab runs diff`.
pub mod agent;
pub mod batch;
pub mod composition;
pub mod contract;
pub mod executor;
pub mod fanout;
pub mod grounding;
pub mod ledger;
pub mod observed;
pub mod progress;
pub mod record;
pub mod reuse;
pub mod settlement;
pub mod snapshot;
pub mod stats;
pub mod store;
pub mod supervision;
pub mod tools;
pub mod workspace;
pub mod written;
