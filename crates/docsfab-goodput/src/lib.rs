//! `docsfab sim goodput`: what a retry policy does to step success under a fault model.
//!
//! Pure: no clock, no I/O, no randomness beyond the seeded [`rng::Rng`]. The docsfab policy is
//! never re-implemented here: [`sim`] only feeds outcomes drawn from the [`model::FaultModel`] to
//! `docsfab_policy::replay::decide` and `docsfab_policy::step::decide` and obeys what they say.
//! The peers' presets ([`policy::PeerPreset`]) model other clients' documented defaults, which
//! have no counterpart in docsfab.

pub mod model;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sim;
