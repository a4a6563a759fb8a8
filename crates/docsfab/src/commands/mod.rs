//! One module per command or command group: each parses its arguments, does its work through
//! `crate::app` and prints. No command imports another.

pub mod check_docs;
pub mod demo;
pub mod doctor;
pub mod new;
pub mod route;
pub mod run;
pub mod runs;
pub mod serve;
pub mod setup;
pub mod sim;
