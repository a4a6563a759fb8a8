//! The workspace jail: every path a tool is given is resolved here before anything runs.
//!
//! Paths are relative to the workspace root. An absolute path, a `..` component, or a path that
//! reaches outside the root through a symlink is refused; a write must also land under one of
//! the step's `writeRoots` after symlinks are resolved (so `docs -> src` cannot widen a root).
//! The check and the later use are separate system calls, so a process racing to swap a
//! directory for a symlink between them is outside this jail's guarantee; the model cannot do
//! that, because no tool creates symlinks.
//!
//! A name the filesystem cannot hold is refused here too, before anything is created: a
//! component over [`NAME_MAX_BYTES`], an absolute path over [`PATH_MAX_BYTES`], and for writes a
//! path deeper than [`MAX_WRITE_DEPTH`] or a name with a control character. The model gets a
//! refusal it can act on instead of a filesystem error halfway through a write.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::ledger::PreflightFailure;

/// The longest file or directory name Linux filesystems hold (`NAME_MAX`), in bytes.
pub const NAME_MAX_BYTES: usize = 255;
/// The longest path a system call takes (`PATH_MAX`, counting the closing NUL), in bytes.
pub const PATH_MAX_BYTES: usize = 4096;
/// How many names deep below the workspace root a written file may be. Documentation trees are
/// a handful of levels deep; a deeper path is a runaway, not a layout.
pub const MAX_WRITE_DEPTH: usize = 64;
/// Room a write keeps below [`PATH_MAX_BYTES`] for the temporary file it writes beside the
/// target (`.docsfab-write-` and a random suffix) before renaming it into place.
const WRITE_PATH_HEADROOM: usize = 64;

/// A workspace root, canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

/// A path inside the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Relative to the root with symlinks resolved, `/`-separated; empty for the root itself.
    pub rel: String,
    /// Absolute, under the canonical root.
    pub abs: PathBuf,
}

/// Why host authorization refused a path. The model gets this as a tool error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    #[error("{0:?} is absolute; give a path relative to the workspace")]
    Absolute(String),
    #[error("{0:?} contains `..`; give a path inside the workspace without `..`")]
    ParentComponent(String),
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
    #[error("{0:?} resolves outside the workspace")]
    Escapes(String),
    #[error("{path:?} is outside the step's writeRoots ({roots})")]
    OutsideWriteRoots { path: String, roots: String },
    #[error("{0:?} names the workspace itself, not a file")]
    NotAFile(String),
    #[error(
        "{path:?} has a name of {bytes} bytes, but a file or directory name holds at most \
         {NAME_MAX_BYTES}; use a shorter name"
    )]
    NameTooLong { path: String, bytes: usize },
    #[error(
        "{path:?} is {bytes} bytes long together with the workspace's own path, more than the \
         {limit} bytes a path can have; use a shorter path"
    )]
    PathTooLong {
        path: String,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "{path:?} is {depth} names deep; a written file may be at most {MAX_WRITE_DEPTH} deep, \
         use a shallower path"
    )]
    TooDeep { path: String, depth: usize },
    #[error(
        "{0:?} contains a control character (such as a newline or tab); use a name without one"
    )]
    ControlCharacter(String),
}

impl Workspace {
    /// Opens the workspace at `dir`, which must be an existing directory.
    pub fn open(dir: &Path) -> Result<Workspace, PreflightFailure> {
        let root = fs::canonicalize(dir).map_err(|e| PreflightFailure {
            evidence: format!("the workspace {} cannot be opened: {e}", dir.display()),
        })?;
        if !root.is_dir() {
            return Err(PreflightFailure {
                evidence: format!("the workspace {} is not a directory", dir.display()),
            });
        }
        Ok(Workspace { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host checks before each provider turn (LSE-2): the root is still the same existing
    /// directory, and every write root that exists is a directory that stays inside it.
    pub fn preflight(&self, write_roots: &[String]) -> Result<(), PreflightFailure> {
        let fail = |evidence: String| Err(PreflightFailure { evidence });
        match fs::canonicalize(&self.root) {
            Err(e) => {
                return fail(format!(
                    "the workspace {} is gone: {e}",
                    self.root.display()
                ));
            }
            Ok(now) if now != self.root => {
                return fail(format!(
                    "the workspace {} now resolves to {}",
                    self.root.display(),
                    now.display()
                ));
            }
            Ok(_) if !self.root.is_dir() => {
                return fail(format!(
                    "the workspace {} is no longer a directory",
                    self.root.display()
                ));
            }
            Ok(_) => {}
        }
        for root in write_roots {
            let Ok(parts) = lexical(root) else {
                return fail(format!("the write root {root:?} is not a relative path"));
            };
            let path = self.root.join(parts.join("/"));
            match fs::canonicalize(&path) {
                Ok(real) if !real.starts_with(&self.root) => {
                    return fail(format!(
                        "the write root {root:?} resolves outside the workspace"
                    ));
                }
                Ok(real) if !real.is_dir() => {
                    return fail(format!("the write root {root:?} is not a directory"));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return fail(format!("the write root {root:?} cannot be checked: {e}")),
            }
        }
        Ok(())
    }

    /// Resolves a path for reading or listing. The path need not exist; whatever part of it
    /// exists must resolve inside the workspace.
    pub fn resolve(&self, path: &str) -> Result<Resolved, PathRefusal> {
        let parts = lexical(path)?;
        // The deepest existing prefix is resolved through its symlinks; the rest does not exist
        // yet and so holds no symlink.
        let mut existing = self.root.clone();
        let mut depth = 0;
        for part in &parts {
            let next = existing.join(part);
            if fs::symlink_metadata(&next).is_err() {
                break;
            }
            existing = next;
            depth += 1;
        }
        let real =
            fs::canonicalize(&existing).map_err(|_| PathRefusal::Escapes(path.to_owned()))?;
        if !real.starts_with(&self.root) {
            return Err(PathRefusal::Escapes(path.to_owned()));
        }
        let abs = parts[depth..].iter().fold(real, |p, part| p.join(part));
        // No file can have a longer path, so nothing useful is refused; the model learns why.
        let bytes = abs.as_os_str().len();
        if bytes >= PATH_MAX_BYTES {
            return Err(PathRefusal::PathTooLong {
                path: shorten(path),
                bytes,
                limit: PATH_MAX_BYTES - 1,
            });
        }
        let rel = abs
            .strip_prefix(&self.root)
            .map_err(|_| PathRefusal::Escapes(path.to_owned()))?
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .collect::<Vec<_>>()
            .join("/");
        Ok(Resolved { rel, abs })
    }

    /// Resolves a path for `write_file`: inside the workspace and, after symlinks, under one of
    /// `write_roots`.
    pub fn resolve_for_write(
        &self,
        path: &str,
        write_roots: &[String],
    ) -> Result<Resolved, PathRefusal> {
        let resolved = self.resolve(path)?;
        if path.chars().any(char::is_control) {
            return Err(PathRefusal::ControlCharacter(shorten(path)));
        }
        if resolved.rel.is_empty() {
            return Err(PathRefusal::NotAFile(path.to_owned()));
        }
        let target: Vec<&str> = resolved.rel.split('/').collect();
        // Checked on the resolved path, which is what the write creates directories along.
        if target.len() > MAX_WRITE_DEPTH {
            return Err(PathRefusal::TooDeep {
                path: shorten(path),
                depth: target.len(),
            });
        }
        let bytes = resolved.abs.as_os_str().len();
        let limit = PATH_MAX_BYTES - 1 - WRITE_PATH_HEADROOM;
        if bytes > limit {
            return Err(PathRefusal::PathTooLong {
                path: shorten(path),
                bytes,
                limit,
            });
        }
        let inside = write_roots.iter().any(|root| match lexical(root) {
            Ok(prefix) => prefix.len() < target.len() && target.starts_with(&prefix),
            Err(_) => false,
        });
        if inside {
            Ok(resolved)
        } else {
            Err(PathRefusal::OutsideWriteRoots {
                path: path.to_owned(),
                roots: write_roots.join(", "),
            })
        }
    }
}

/// Characters of a refused path the refusal repeats: enough to recognise the call, while a
/// runaway path is not echoed back whole into the conversation and the run record.
const SHOWN_PATH_CHARS: usize = 80;

/// Entries `list_files` returns at most; the reply says when it stopped early.
pub const MAX_LIST_ENTRIES: usize = 2_000;

/// Directories that `list_files` and `search_text` never list or descend into: version control
/// and build output, which are not source and can be huge. `read_file` still reads inside them.
pub const SKIPPED_DIRS: [&str; 3] = [".git", "target", "node_modules"];

/// Walks `dir` depth-first in name order, calling `visit(rel, is_dir)` for each entry until it
/// returns false. Symlinks are listed as files and never followed; [`SKIPPED_DIRS`] are skipped.
/// Returns whether the walk completed.
pub(crate) fn walk(
    dir: &Path,
    root: &Path,
    visit: &mut dyn FnMut(String, bool) -> bool,
) -> io::Result<bool> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    names.sort();
    for path in names {
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        let skipped = path
            .file_name()
            .is_some_and(|n| SKIPPED_DIRS.iter().any(|skip| n == *skip));
        if is_dir && skipped {
            continue;
        }
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        let rel = rel.to_string_lossy().into_owned();
        if !visit(rel, is_dir) {
            return Ok(false);
        }
        if is_dir && !walk(&path, root, visit)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `path`, cut to [`SHOWN_PATH_CHARS`] characters with an ellipsis when longer.
fn shorten(path: &str) -> String {
    match path.char_indices().nth(SHOWN_PATH_CHARS) {
        Some((cut, _)) => format!("{}...", &path[..cut]),
        None => path.to_owned(),
    }
}

/// Splits a relative path into its names, refusing anything that could leave the root before
/// the filesystem is consulted. `""` and `"."` are the root.
fn lexical(path: &str) -> Result<Vec<&str>, PathRefusal> {
    if path.contains('\0') {
        return Err(PathRefusal::Nul(path.to_owned()));
    }
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => match name.to_str() {
                Some(name) if name.len() > NAME_MAX_BYTES => {
                    return Err(PathRefusal::NameTooLong {
                        path: shorten(path),
                        bytes: name.len(),
                    });
                }
                Some(name) => parts.push(name),
                None => return Err(PathRefusal::Escapes(path.to_owned())),
            },
            Component::CurDir => {}
            Component::ParentDir => return Err(PathRefusal::ParentComponent(path.to_owned())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(PathRefusal::Absolute(path.to_owned()));
            }
        }
    }
    Ok(parts)
}
