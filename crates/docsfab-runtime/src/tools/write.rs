//! The write tool at work: `write_file` through the attempt's snapshots, and whose failure a
//! failed write is (a name the filesystem refuses is the model's; a filesystem that takes
//! nothing is the host's).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{HostFailure, StepTools, ToolReply};
use crate::snapshot::write_atomically;
use crate::workspace::Resolved;

impl StepTools<'_> {
    pub(super) fn write(
        &mut self,
        target: &Resolved,
        content: &str,
    ) -> Result<ToolReply, HostFailure> {
        if target.abs.is_dir() {
            return Ok(ToolReply::error(format!("{} is a directory", target.rel)));
        }
        let rel = PathBuf::from(&target.rel);
        let mut created = Vec::new();
        let failed = match self.write_creating(target, &rel, content, &mut created) {
            Ok(reply) => return Ok(reply),
            Err(failed) => failed,
        };
        // Whatever went wrong, the directories this call made go again, deepest first, so a
        // failed write leaves nothing behind. They hold nothing: the file was not written.
        let mut left = Vec::new();
        for dir in created.iter().rev() {
            if let Err(e) = fs::remove_dir(self.workspace.root().join(dir)) {
                left.push(format!("{}: {e}", dir.display()));
            }
        }
        let host = |what: &str| HostFailure {
            evidence: format!("{what} {}: {}", target.rel, failed.error),
        };
        self.workspace.preflight(&[]).map_err(|f| HostFailure {
            evidence: f.evidence,
        })?;
        if !left.is_empty() {
            return Err(HostFailure {
                evidence: format!(
                    "could not write {}: {}, and could not remove the directories it created: {}",
                    target.rel,
                    failed.error,
                    left.join("; ")
                ),
            });
        }
        // An existing file the host cannot snapshot (a FIFO, an unreadable file) means the host
        // cannot promise to restore it (WRT-1); unless the name itself was the problem, that is
        // the host's failure, as is a filesystem that cannot hold anything more.
        if failed.stage == WriteStage::Snapshot && !is_name_error(&failed.error) {
            return Err(host("could not snapshot"));
        }
        if is_host_error(&failed.error) {
            return Err(host(failed.stage.what()));
        }
        Ok(ToolReply::error(format!(
            "{} {}: {}; nothing was written, choose another path",
            failed.stage.what(),
            target.rel,
            failed.error
        )))
    }

    /// The steps of a write; the directories made are pushed to `created` as they are made, so
    /// that [`StepTools::write`] can remove them when a later step fails.
    fn write_creating(
        &mut self,
        target: &Resolved,
        rel: &Path,
        content: &str,
        created: &mut Vec<PathBuf>,
    ) -> Result<ToolReply, WriteFailure> {
        // The missing parents are created one by one so the restore can remove exactly them.
        let mut dir = PathBuf::new();
        if let Some(parent) = rel.parent() {
            for part in parent.components() {
                dir.push(part);
                let abs = self.workspace.root().join(&dir);
                match fs::symlink_metadata(&abs) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        return Ok(ToolReply::error(format!(
                            "{} is not a directory",
                            dir.display()
                        )));
                    }
                    Err(_) => {
                        fs::create_dir(&abs).map_err(|e| WriteStage::CreateDir.failed(e))?;
                        created.push(dir.clone());
                        self.snapshots.created_dir(&dir);
                    }
                }
            }
        }
        let links = self
            .snapshots
            .before_write(rel)
            .map_err(|e| WriteStage::Snapshot.failed(e))?;
        write_atomically(&target.abs, content.as_bytes())
            .map_err(|e| WriteStage::Write.failed(e))?;
        self.supervisor.forget(&target.rel);
        self.supervisor.record_evidence();
        let mut reply = format!("wrote {} bytes to {}", content.len(), target.rel);
        if let Some(links) = links {
            reply.push_str(&format!(
                " [it had {links} hard links: the write gave this name a file of its own and the \
                 other names keep the old content, which docsfab neither read back nor kept (one \
                 may be outside the workspace); this attempt cannot be undone, so a failure of \
                 this step is not retried]"
            ));
        }
        Ok(ToolReply::ok(reply))
    }
}

/// Where a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteStage {
    CreateDir,
    Snapshot,
    Write,
}

impl WriteStage {
    fn what(self) -> &'static str {
        match self {
            WriteStage::CreateDir => "could not create a directory for",
            WriteStage::Snapshot => "could not snapshot",
            WriteStage::Write => "could not write",
        }
    }
    fn failed(self, error: io::Error) -> WriteFailure {
        WriteFailure { stage: self, error }
    }
}

#[derive(Debug)]
struct WriteFailure {
    stage: WriteStage,
    error: io::Error,
}

/// The filesystem refused the name the model chose (too long, a file where a directory should
/// be, a character it does not take): the model can choose another.
fn is_name_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENAMETOOLONG | libc::ENOTDIR | libc::EISDIR | libc::EINVAL | libc::ELOOP)
            | Some(libc::EILSEQ)
    )
}

/// The filesystem cannot take any write (full, read-only, over quota, failing): no other name
/// would do better, so the attempt ends on the host's evidence.
fn is_host_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO)
    )
}

#[cfg(test)]
mod tests {
    use docsfab_record::CallResult;

    use super::*;
    use crate::composition::Tool;
    use crate::tools::{Authorized, Op, ToolPolicy};
    use crate::workspace::Workspace;

    /// A write step's tools on a workspace with `docs/`.
    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("docs")).unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    fn policy() -> ToolPolicy {
        ToolPolicy {
            offered: vec![Tool::WriteFile],
            write_roots: vec!["docs/".into()],
            source_read_bytes: 0,
        }
    }

    /// A write of `rel` as if the jail had let it through, so the filesystem's own refusal is
    /// what the write meets: the second line of defence behind the jail's name checks.
    fn unchecked_write(tools: &mut StepTools<'_>, root: &Path, rel: &str) -> ToolReply {
        let target = Resolved {
            rel: rel.to_owned(),
            abs: root.join(rel),
        };
        let op = Op::Write {
            target,
            content: "x".into(),
        };
        tools.execute(Authorized { op }).unwrap()
    }

    fn entries(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn hardening_a_name_the_filesystem_refuses_is_a_tool_error_and_the_made_dirs_go() {
        let (_d, ws) = workspace();
        let root = ws.root().to_owned();
        let mut tools = StepTools::for_attempt(&ws, policy());
        // The file name is refused by the filesystem after `docs/new` was made for it.
        let rel = format!("docs/new/{}.md", "a".repeat(300));
        let reply = unchecked_write(&mut tools, &root, &rel);
        assert_eq!(reply.result, CallResult::ToolError);
        assert!(reply.text.contains("File name too long"), "{}", reply.text);
        assert!(reply.text.contains("nothing was written"), "{}", reply.text);
        assert_eq!(entries(&root.join("docs")), 0, "docs/new was removed");
        tools.snapshots.restore().unwrap();
    }

    #[test]
    fn hardening_a_path_past_path_max_is_a_tool_error_and_leaves_no_directory() {
        let (_d, ws) = workspace();
        let root = ws.root().to_owned();
        let mut tools = StepTools::for_attempt(&ws, policy());
        // As in the finding: directories are made until the path passes PATH_MAX.
        let rel = format!("docs/{}x.md", "dd/".repeat(2_000));
        let reply = unchecked_write(&mut tools, &root, &rel);
        assert_eq!(reply.result, CallResult::ToolError);
        assert!(
            reply
                .text
                .starts_with("error: could not create a directory for"),
            "{}",
            &reply.text[..80]
        );
        assert_eq!(
            entries(&root.join("docs")),
            0,
            "every made directory was removed"
        );
        // The same tools still write a good path.
        let ok = unchecked_write(&mut tools, &root, "docs/ok.md");
        assert_eq!(ok.result, CallResult::Ok);
    }

    #[test]
    fn hardening_only_a_filesystem_that_takes_nothing_is_the_hosts_failure() {
        let os = io::Error::from_raw_os_error;
        for code in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EIO] {
            assert!(is_host_error(&os(code)), "{code}");
            assert!(!is_name_error(&os(code)), "{code}");
        }
        for code in [
            libc::ENAMETOOLONG,
            libc::ENOTDIR,
            libc::EISDIR,
            libc::EINVAL,
        ] {
            assert!(is_name_error(&os(code)), "{code}");
            assert!(!is_host_error(&os(code)), "{code}");
        }
        // Not a name the model chose: an existing special file the snapshot cannot keep.
        assert!(!is_name_error(&io::Error::other(
            "docs/pipe.md is not a regular file"
        )));
    }
}
