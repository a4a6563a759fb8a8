//! The shared provider throttle of docsfab.
//!
//! Every provider request asks [`Throttle::acquire`] first and reports back with
//! [`Permit::finish`]. The decision is the pure [`ThrottleState`] (in [`core`]): a cap on
//! requests in flight, a reactive hold after a 429, pacing from the provider's rate-limit
//! headers ([`headers`]) and an adaptive window when there are none. The state lives in
//! `DOCSFAB_HOME/throttle.db`, or in the run store's PostgreSQL database ([`store`],
//! [`Backend`]), so every docsfab process on the same home (or database) shares the in-flight
//! count, the hold and the pacing. See docs/throttle.md.
//!
//! A wait here is not a replay: it is recorded as the turn's `heldMs`, bounded by the attempt
//! deadline, and touches none of the retry budgets.

pub mod core;
mod driver;
pub mod headers;
mod lease;
pub mod process;
pub mod store;

pub use crate::core::{
    Admit, Ask, DEFAULT_MAX_CONCURRENT, LEASE_MS, Lease, LeaseReport, MAX_CONCURRENT_RANGE,
    MaxConcurrentOutOfRange, Mode, Outcome, Reason, Settings, ThrottleState,
};
pub use driver::{AcquireError, DEFAULT_POLL, Permit, Request, Throttle};
pub use headers::RateHeaders;
pub use store::{Backend, StoreError};
