//! What an attempt looked at in the workspace, kept so that a later run can tell whether the
//! step's result still holds for today's tree (docs/resume.md).
//!
//! A file is kept by the SHA-256 of its whole content (a read of a byte range still depends on
//! the file, and hashing the whole is the conservative choice); a directory by the entries a
//! `list_files` of it shows. The first look at a path in an attempt is the one kept: a later
//! look can only follow the attempt's own writes, which are judged by their own hashes.

use std::collections::HashSet;
use std::fs;
use std::io::Read;

use docsfab_record::StepInput;
use sha2::{Digest, Sha256};

use crate::workspace::{MAX_LIST_ENTRIES, Workspace, walk};

/// The inputs of one attempt, in the order it first looked at them.
#[derive(Debug, Default)]
pub struct Observed {
    inputs: Vec<StepInput>,
    seen: HashSet<(bool, String)>,
}

impl Observed {
    /// Notes the file at `rel` as it is now, unless this attempt looked at it already.
    pub fn file(&mut self, workspace: &Workspace, rel: &str) {
        if self.seen.insert((false, rel.to_owned())) {
            self.inputs.push(StepInput::File {
                path: rel.to_owned(),
                sha256: file_sha256(workspace, rel),
            });
        }
    }

    /// Notes the directory at `rel` as a listing shows it now.
    pub fn listing(&mut self, workspace: &Workspace, rel: &str) {
        if self.seen.insert((true, rel.to_owned())) {
            self.inputs.push(StepInput::Listing {
                path: rel.to_owned(),
                entries: listing(workspace, rel),
            });
        }
    }

    pub fn inputs(&self) -> &[StepInput] {
        &self.inputs
    }
}

/// The SHA-256 (hex) of the regular file at `rel`, as the jail resolves it; `None` when there is
/// none or it cannot be read.
pub fn file_sha256(workspace: &Workspace, rel: &str) -> Option<String> {
    let resolved = workspace.resolve(rel).ok()?;
    let meta = fs::symlink_metadata(&resolved.abs).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut file = fs::File::open(&resolved.abs).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hex::encode(hasher.finalize()))
}

/// The entries under the directory at `rel` as `list_files` walks them (directories end in
/// `/`, at most [`MAX_LIST_ENTRIES`]); `None` when no directory is there.
pub fn listing(workspace: &Workspace, rel: &str) -> Option<Vec<String>> {
    let resolved = workspace.resolve(rel).ok()?;
    if !fs::metadata(&resolved.abs).ok()?.is_dir() {
        return None;
    }
    let mut entries = Vec::new();
    walk(&resolved.abs, workspace.root(), &mut |rel, is_dir| {
        entries.push(if is_dir { format!("{rel}/") } else { rel });
        entries.len() < MAX_LIST_ENTRIES
    })
    .ok()?;
    Some(entries)
}
