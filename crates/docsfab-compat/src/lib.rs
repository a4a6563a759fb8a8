//! Test-only crate: differential tests of the response boundary against the real stream
//! consumers (the Python and Node OpenAI SDKs, the Python Anthropic SDK and pi-ai).
//!
//! The differential test lives in `tests/differential.rs`; the clients are installed by
//! `compat/install.sh` and driven by the scripts in `compat/`. Results: `docs/compat-results.md`.
//! The helpers below (where the clients live, installing them) are shared with the route's SDK
//! test in `crates/docsfab/tests/route_sdk.rs`, which needs the `docsfab` binary cargo built for it.

use std::path::{Path, PathBuf};

/// The repository root (this crate is `crates/docsfab-compat`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Where compat/install.sh puts the clients: `DOCSFAB_COMPAT_DIR` (which the script reads too),
/// else target/compat, which git ignores.
pub fn compat_dir(root: &Path) -> PathBuf {
    std::env::var_os("DOCSFAB_COMPAT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/compat"))
}

/// Runs compat/install.sh (idempotent, under a lock: quick when the pinned clients are there)
/// and panics with its output when it fails.
pub fn install_clients(root: &Path) {
    let script = root.join("compat/install.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "compat/install.sh failed, so the real stream consumers the test needs are missing (is \
         the package registry reachable?). Run `bash compat/install.sh` by hand to see why.\n\
         stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
