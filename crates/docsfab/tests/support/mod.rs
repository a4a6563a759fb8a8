//! Helpers shared by this crate's tests (a directory module, so cargo does not build it as a
//! test of its own). Two kinds: `run` for the `docsfab run`/`runs`/signal/`sim serve`/demo tests
//! (a `docsfab sim serve` process, a temporary DOCSFAB_HOME, a small workspace), `route` for the
//! `docsfab route serve` tests (an in-process simulator and a raw HTTP/1.1 client).
#![allow(dead_code)] // each test file uses one kind

pub mod route;
pub mod run;
