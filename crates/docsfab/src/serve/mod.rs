//! `docsfab serve` (h15-serve writes the server; this branch only carries the web page).
#![allow(dead_code)] // the router that uses the page lives on h15-serve

pub mod page;
