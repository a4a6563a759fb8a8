//! The job service behind `docsfab serve` (docs/serve.md): the run store is also the job queue,
//! a submitted run is `queued` in it, and this process's runner claims queued runs, at most
//! `--jobs` at once, first come first served, and runs each like `docsfab run` would. Any
//! number of serve processes may share one store; each claims runs for itself.
//!
//! `service` is what the API and the runner share (the store, the workspace root, this
//! process's jobs); `submit` checks a submission and, at claim time, builds its run (`clone`
//! for a git workspace); `resume` queues resumes; `runner` claims, polls cancel requests and
//! reaps; `job` runs one claimed run; `metrics` sums the runs finished here; `drain` is what
//! SIGTERM and SIGINT do.

pub mod clone;
pub mod drain;
pub mod job;
pub mod metrics;
pub mod resume;
pub mod runner;
pub mod service;
pub mod submit;
