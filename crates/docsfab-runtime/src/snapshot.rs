//! Write snapshots: what a write step's attempt changed, and how to undo it (WRT-1).
//!
//! Before the first write to a file in an attempt, its content (or the fact that it did not
//! exist) is kept, and every directory the attempt creates is noted. [`WriteSnapshots::restore`]
//! puts the workspace back: snapshotted files are rewritten (atomically, with their permissions),
//! files the attempt created are removed, then the directories it created when they are empty.
//! [`WriteSnapshots::verify`] checks the result by SHA-256, so a retry starts only from a
//! workspace proven to be in its pre-attempt state. [`WriteSnapshots::written_files`] says what
//! the attempt changed, before and after, for the record and for `docsfab runs diff`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use docsfab_record::FileWritten;

/// One file as it was before the attempt first wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileSnapshot {
    Existed {
        bytes: Vec<u8>,
        sha256: String,
        permissions: fs::Permissions,
    },
    Absent,
    /// A regular file with more than one hard link: another name for the same content may be
    /// outside the workspace, so only its hash and size are kept, never the content, and the
    /// attempt cannot be undone (see [`RestoreError::HardLinked`]).
    Linked {
        sha256: String,
        bytes: u64,
        links: u64,
    },
}

/// The pre-write state of everything one attempt wrote. Paths are relative to the workspace
/// root the snapshots were made in.
#[derive(Debug, Clone)]
pub struct WriteSnapshots {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileSnapshot>,
    /// The keys of `files` in the order the attempt first wrote them.
    order: Vec<PathBuf>,
    created_dirs: Vec<PathBuf>,
}

/// One file an attempt changed: its content before the attempt's first write and when the
/// attempt ended (`None`: the file did not exist, or could not be read at the end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// Relative to the workspace root.
    pub path: String,
    pub before: Option<Vec<u8>>,
    pub after: Option<Vec<u8>>,
    pub sha256_before: Option<String>,
    pub sha256_after: Option<String>,
    /// The file had more than one hard link before the attempt: its size then; `before` is
    /// `None` (its content is not kept).
    pub linked_before: Option<u64>,
}

impl WrittenFile {
    /// The size of the file before the attempt (0: it did not exist).
    pub fn bytes_before(&self) -> u64 {
        self.linked_before
            .unwrap_or_else(|| self.before.as_ref().map_or(0, |b| b.len() as u64))
    }

    /// The run record's entry for this file.
    pub fn record(&self) -> FileWritten {
        FileWritten {
            path: self.path.clone(),
            bytes: self.after.as_ref().map_or(0, |b| b.len() as u64),
            sha256_before: self.sha256_before.clone(),
            sha256_after: self.sha256_after.clone(),
        }
    }
}

/// A restore or its verification failed; the workspace is not proven clean.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("could not restore {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} does not match its pre-attempt state after the restore: {detail}")]
    Mismatch { path: PathBuf, detail: String },
    #[error(
        "could not restore {path}: it had {links} hard links before the attempt wrote it, and \
         docsfab keeps no copy of a hard-linked file's content (another name for it may be \
         outside the workspace), so the attempt cannot be undone"
    )]
    HardLinked { path: PathBuf, links: u64 },
}

/// The SHA-256 of `bytes`, lowercase hex: what [`WriteSnapshots::verify`] compares.
fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl WriteSnapshots {
    /// Snapshots for an attempt in the workspace at `root` (canonical).
    pub fn new(root: &Path) -> WriteSnapshots {
        WriteSnapshots {
            root: root.to_owned(),
            files: BTreeMap::new(),
            order: Vec::new(),
            created_dirs: Vec::new(),
        }
    }

    /// Keeps the state of `rel` before the attempt's first write to it. Later calls for the
    /// same file keep the first snapshot. Returns the file's link count when it had more than
    /// one (its content is not kept: see [`FileSnapshot::Linked`]).
    pub fn before_write(&mut self, rel: &Path) -> io::Result<Option<u64>> {
        if let Some(snapshot) = self.files.get(rel) {
            return Ok(match snapshot {
                FileSnapshot::Linked { links, .. } => Some(*links),
                _ => None,
            });
        }
        let path = self.root.join(rel);
        let snapshot = match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() && meta.nlink() > 1 => {
                let bytes = read_regular(&path, rel)?;
                FileSnapshot::Linked {
                    sha256: sha256_hex(&bytes),
                    bytes: bytes.len() as u64,
                    links: meta.nlink(),
                }
            }
            Ok(meta) if meta.is_file() => {
                let bytes = read_regular(&path, rel)?;
                FileSnapshot::Existed {
                    sha256: sha256_hex(&bytes),
                    bytes,
                    permissions: meta.permissions(),
                }
            }
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} is not a regular file",
                    rel.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => FileSnapshot::Absent,
            Err(e) => return Err(e),
        };
        let links = match &snapshot {
            FileSnapshot::Linked { links, .. } => Some(*links),
            _ => None,
        };
        self.files.insert(rel.to_owned(), snapshot);
        self.order.push(rel.to_owned());
        Ok(links)
    }

    /// Notes a directory the attempt created (parents before children).
    pub fn created_dir(&mut self, rel: &Path) {
        self.created_dirs.push(rel.to_owned());
    }

    /// Whether the attempt wrote anything.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.created_dirs.is_empty()
    }

    /// The files the attempt wrote.
    pub fn written(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// Every file the attempt changed, in first-write order, read from the workspace now: call
    /// it when the attempt ends, before any restore. A file that ended as it began (a write that
    /// failed, or the same bytes written again) is left out.
    pub fn written_files(&self) -> Vec<WrittenFile> {
        let mut out = Vec::new();
        for rel in &self.order {
            let (before, sha256_before, linked_before) = match &self.files[rel] {
                FileSnapshot::Existed { bytes, sha256, .. } => {
                    (Some(bytes.clone()), Some(sha256.clone()), None)
                }
                FileSnapshot::Linked { sha256, bytes, .. } => {
                    (None, Some(sha256.clone()), Some(*bytes))
                }
                FileSnapshot::Absent => (None, None, None),
            };
            // Gone or unreadable: nothing the attempt left there can be shown.
            let after = read_regular(&self.root.join(rel), rel).ok();
            let sha256_after = after.as_deref().map(sha256_hex);
            if sha256_after == sha256_before {
                continue;
            }
            out.push(WrittenFile {
                path: rel.to_string_lossy().into_owned(),
                before,
                after,
                sha256_before,
                sha256_after,
                linked_before,
            });
        }
        out
    }

    /// Puts every written file back as it was and removes what the attempt created, then
    /// verifies the result.
    pub fn restore(&self) -> Result<(), RestoreError> {
        // Refused before anything is touched: writing the content back would copy a file that
        // may be outside the workspace into it, where the read tools would then read it.
        for (rel, snapshot) in &self.files {
            if let FileSnapshot::Linked { links, .. } = snapshot {
                return Err(RestoreError::HardLinked {
                    path: rel.clone(),
                    links: *links,
                });
            }
        }
        for (rel, snapshot) in &self.files {
            let path = self.root.join(rel);
            let io_err = |source| RestoreError::Io {
                path: rel.clone(),
                source,
            };
            match snapshot {
                FileSnapshot::Existed {
                    bytes, permissions, ..
                } => {
                    if let Some(parent) = path.parent() {
                        fs::create_dir_all(parent).map_err(io_err)?;
                    }
                    write_atomically(&path, bytes).map_err(io_err)?;
                    fs::set_permissions(&path, permissions.clone()).map_err(io_err)?;
                }
                FileSnapshot::Absent => match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(e)),
                },
                // Refused above, before any file was touched.
                FileSnapshot::Linked { .. } => {}
            }
        }
        for rel in self.created_dirs.iter().rev() {
            // Only empty directories go: anything else in them was not the attempt's.
            let _ = fs::remove_dir(self.root.join(rel));
        }
        self.verify()
    }

    /// Checks that every written file is back in its pre-attempt state.
    pub fn verify(&self) -> Result<(), RestoreError> {
        for (rel, snapshot) in &self.files {
            let path = self.root.join(rel);
            let mismatch = |detail: String| RestoreError::Mismatch {
                path: rel.clone(),
                detail,
            };
            match snapshot {
                FileSnapshot::Existed { sha256, .. } => {
                    let now = fs::read(&path).map_err(|e| mismatch(e.to_string()))?;
                    let got = sha256_hex(&now);
                    if &got != sha256 {
                        return Err(mismatch(format!("sha256 {got}, expected {sha256}")));
                    }
                }
                FileSnapshot::Absent => {
                    if fs::symlink_metadata(&path).is_ok() {
                        return Err(mismatch("exists but did not before".to_owned()));
                    }
                }
                FileSnapshot::Linked { links, .. } => {
                    return Err(RestoreError::HardLinked {
                        path: rel.clone(),
                        links: *links,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The content of the regular file at `path`. Opened without blocking and without following a
/// final symlink, and checked on the descriptor, so a FIFO swapped in after the caller's check
/// cannot hang the snapshot.
fn read_regular(path: &Path, rel: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            rel.display()
        )));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees a half-written file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("a file path without a parent"))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".docsfab-write-")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn restore_keeps_content_and_permissions_and_verify_catches_drift_wrt_1() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.md");
        fs::write(&file, "before").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        let mut snaps = WriteSnapshots::new(dir.path());
        snaps.before_write(Path::new("a.md")).unwrap();
        write_atomically(&file, b"after").unwrap();
        snaps.before_write(Path::new("a.md")).unwrap(); // the first snapshot is kept
        assert!(matches!(snaps.verify(), Err(RestoreError::Mismatch { .. })));
        snaps.restore().unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "before");
        let mode = fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!snaps.is_empty());
        assert_eq!(snaps.written().count(), 1);
    }

    #[test]
    fn written_files_are_in_first_write_order_and_skip_what_ended_as_it_began() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("z.md"), "old z").unwrap();
        fs::write(dir.path().join("same.md"), "same").unwrap();
        let mut snaps = WriteSnapshots::new(dir.path());
        for (name, content) in [("z.md", "new z"), ("a.md", "new a"), ("same.md", "same")] {
            snaps.before_write(Path::new(name)).unwrap();
            write_atomically(&dir.path().join(name), content.as_bytes()).unwrap();
        }
        let written = snaps.written_files();
        let paths: Vec<&str> = written.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["z.md", "a.md"]);
        let z = written[0].record();
        assert_eq!(z.bytes, 5);
        assert_eq!(
            z.sha256_before.as_deref(),
            Some(sha256_hex(b"old z").as_str())
        );
        assert_eq!(
            z.sha256_after.as_deref(),
            Some(sha256_hex(b"new z").as_str())
        );
        assert_eq!(written[1].before, None);
        assert_eq!(written[1].record().sha256_before, None);
        assert_eq!(written[1].after.as_deref(), Some(&b"new a"[..]));
    }
}
