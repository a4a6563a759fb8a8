//! tally: count words and lines in text, the way `wc` does.

pub mod count;
pub mod report;

pub use count::{Counts, count};
pub use report::render;
