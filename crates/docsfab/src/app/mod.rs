//! What several commands share: errors and their exit codes, DOCSFAB_HOME and host.yaml, the
//! run store, running a composition, printing records, diffs and the HTML report, progress,
//! telemetry, the throttle's plan, and the fitted fault model. A command module imports from
//! here, never from another command.

pub mod carry;
pub mod diff;
pub mod env_names;
pub mod error;
pub mod execute;
pub mod fault_model;
pub mod gateway;
pub mod home;
pub mod launch;
pub mod preflight;
pub mod print;
pub mod progress;
pub mod report;
pub mod store;
pub mod telemetry;
pub mod throttle;
