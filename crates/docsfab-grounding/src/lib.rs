//! Grounding: whether what a documentation page cites exists in the tree it describes
//! (docs/grounding.md). Pure: text in, verdicts out; the caller reads the files.
//!
//! * [`extract`]: what a Markdown text cites, with its line: workspace paths and line ranges
//!   (`src/lib.rs`, `src/lib.rs:12-30`), code names in backticks (`snake_case`, `CamelCase`,
//!   `a::b`, `x.method()`, `f()`), and relative links (`[x](../y.md)`). Fenced code blocks are
//!   examples, not claims, and are skipped; so are backticked spans that are plain words,
//!   commands, flags, numbers or literals.
//! * [`Index`]: the tree as a set of paths and the set of code words its source text holds.
//! * [`Index::judge`]: each citation grounded or unknown; an unknown name comes with the nearest
//!   real ones. Names of the standard library and of declared dependencies are `external`:
//!   neither grounded by the tree nor counted against it.
//! * [`stale`]: whether a cited line range still hashes as it did when it was judged.

mod extract;
mod index;
pub mod stale;

pub use extract::{Citation, Kind, extract};
pub use index::{Index, Judged, Report, Unknown, Verdict};
