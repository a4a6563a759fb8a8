//! The work of the commands, and what several of them share: errors and their exit codes,
//! DOCSFAB_HOME and host.yaml (and `host_file`, how `setup` writes it), the run store, running
//! a composition and its workspace lock, printing records, diffs and the HTML report, progress,
//! telemetry, the throttle's plan, the fitted fault model, what `doctor` finds (`doctor/`), and
//! the job service behind `serve` (`jobs/`). A command module imports from here, never from
//! another command.

pub mod carry;
pub mod diff;
pub mod doctor;
pub mod env_names;
pub mod error;
pub mod execute;
pub mod fault_model;
pub mod gateway;
pub mod home;
pub mod host_file;
pub mod jobs;
pub mod launch;
pub mod preflight;
pub mod print;
pub mod progress;
pub mod report;
pub mod store;
pub mod telemetry;
pub mod throttle;
pub mod workspace_lock;
