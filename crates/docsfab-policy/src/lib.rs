//! The pure retry policy of docsfab.
//!
//! Every decision the retry system makes lives here as a function of recorded history and a
//! caller-supplied `now`. Nothing in this crate reads a clock, sleeps, touches the network or the
//! filesystem, or draws random numbers; the async drivers in `docsfab-provider` and
//! `docsfab-runtime` do what these decisions say. That is what lets the exact schedules and
//! budgets be proven by fast unit and property tests.

pub mod catalog;
pub mod class;
pub mod envelope;
pub mod host;
pub mod indent;
pub mod replay;
pub mod retry_after;
pub mod rules;
pub mod step;
