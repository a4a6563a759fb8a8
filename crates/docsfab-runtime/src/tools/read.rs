//! The read tools at work: `list_files`, `read_file` and `search_text`, and how a source file is
//! opened (a regular file with a single link, judged on the opened descriptor) and searched.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use docsfab_record::CallResult;

use super::{HostFailure, MAX_MATCH_LINE_BYTES, MAX_SEARCH_FILE_BYTES, MAX_SEARCH_MATCHES};
use super::{StepTools, ToolReply};
use crate::supervision::ReadVerdict;
use crate::workspace::{MAX_LIST_ENTRIES, Resolved, walk};

impl StepTools<'_> {
    /// A filesystem error on the model's path is a tool error, unless the workspace itself is
    /// gone, which is the host's failure.
    fn io_error(&self, rel: &str, e: &io::Error) -> Result<ToolReply, HostFailure> {
        self.workspace.preflight(&[]).map_err(|f| HostFailure {
            evidence: f.evidence,
        })?;
        let shown = if rel.is_empty() { "." } else { rel };
        Ok(ToolReply::error(match e.kind() {
            io::ErrorKind::NotFound => format!("{shown} does not exist"),
            _ => format!("{shown}: {e}"),
        }))
    }

    pub(super) fn list(&mut self, target: &Resolved) -> Result<ToolReply, HostFailure> {
        match fs::metadata(&target.abs) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Ok(ToolReply::error(format!(
                    "{} is a file, not a directory",
                    target.rel
                )));
            }
            Err(e) => return self.io_error(&target.rel, &e),
        }
        let mut entries = Vec::new();
        let complete = walk(&target.abs, self.workspace.root(), &mut |rel, is_dir| {
            entries.push(if is_dir { format!("{rel}/") } else { rel });
            entries.len() < MAX_LIST_ENTRIES
        });
        if let Err(e) = complete.as_ref() {
            return self.io_error(&target.rel, e);
        }
        let mut text = entries.join("\n");
        if complete.ok() == Some(false) {
            text.push_str(&format!(
                "\n[stopped after {MAX_LIST_ENTRIES} entries; list a subdirectory]"
            ));
        }
        self.supervisor.record_evidence();
        Ok(ToolReply::ok(text))
    }

    pub(super) fn read(
        &mut self,
        target: &Resolved,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ToolReply, HostFailure> {
        let (file, size) = match open_source(&target.abs) {
            Ok((file, meta)) => (file, meta.len()),
            Err(Unreadable::Io(e)) => return self.io_error(&target.rel, &e),
            Err(Unreadable::Special(SpecialKind::Directory)) => {
                return Ok(ToolReply::error(format!(
                    "{} is a directory; use list_files",
                    target.rel
                )));
            }
            Err(refused) => return Ok(ToolReply::error(refused.explain(&target.rel))),
        };
        if offset > size {
            return Ok(ToolReply::error(format!(
                "offset {offset} is past the end of {} ({size} bytes)",
                target.rel
            )));
        }
        let end = length.map_or(size, |l| offset.saturating_add(l).min(size));
        if let ReadVerdict::NoticeOnly { notice } =
            self.supervisor.check_read(&target.rel, offset..end)
        {
            return Ok(ToolReply {
                result: CallResult::Notice,
                text: format!("notice: {notice}"),
            });
        }
        let wanted = end - offset;
        if !self.budget.try_spend(wanted) {
            return Ok(ToolReply::error(format!(
                "reading {} bytes {offset}..{end} needs {wanted} bytes of source, but only {} of \
                 this attempt's {} remain; read a smaller range with offset and length, or \
                 answer with what you have",
                target.rel,
                self.budget.remaining(),
                self.budget.limit()
            )));
        }
        let bytes = match read_range(file, offset, wanted) {
            Ok(b) => b,
            Err(e) => {
                // Nothing was returned, so nothing is spent.
                self.budget.refund(wanted);
                return self.io_error(&target.rel, &e);
            }
        };
        self.supervisor.record_read(&target.rel, offset..end);
        Ok(ToolReply::ok(format!(
            "[{} bytes {offset}..{end} of {size}]\n{}",
            target.rel,
            String::from_utf8_lossy(&bytes)
        )))
    }

    pub(super) fn search(
        &mut self,
        pattern: &str,
        target: &Resolved,
    ) -> Result<ToolReply, HostFailure> {
        let regex = match regex::bytes::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
        {
            Ok(r) => r,
            Err(e) => return Ok(ToolReply::error(format!("the pattern is not a regex: {e}"))),
        };
        let is_dir = match fs::symlink_metadata(&target.abs) {
            Ok(meta) => meta.is_dir(),
            Err(e) => return self.io_error(&target.rel, &e),
        };
        // A single file named by the model is refused with the reason, as read_file would.
        let single = if is_dir {
            None
        } else {
            match open_source(&target.abs) {
                Ok(opened) => Some(opened),
                Err(Unreadable::Io(e)) => return self.io_error(&target.rel, &e),
                Err(refused) => return Ok(ToolReply::error(refused.explain(&target.rel))),
            }
        };
        if let ReadVerdict::NoticeOnly { notice } =
            self.supervisor.check_search(pattern, &target.rel)
        {
            return Ok(ToolReply {
                result: CallResult::Notice,
                text: format!("notice: {notice}"),
            });
        }
        let files = if is_dir {
            match self.files_under(&target.abs) {
                Ok(files) => files,
                Err(e) => return self.io_error(&target.rel, &e),
            }
        } else {
            vec![(target.rel.clone(), target.abs.clone())]
        };
        if is_dir {
            self.observed.listing(self.workspace, &target.rel);
        }
        for (rel, _) in &files {
            self.observed.file(self.workspace, rel);
        }
        let found = find_matches(&regex, files, single);
        if !self.budget.try_spend(found.source_bytes) {
            return Ok(ToolReply::error(format!(
                "the matches hold {} bytes of source, but only {} of this attempt's \
                 {} remain; narrow the pattern or the path, or answer with what you have",
                found.source_bytes,
                self.budget.remaining(),
                self.budget.limit()
            )));
        }
        self.supervisor.record_search(pattern, &target.rel);
        Ok(ToolReply::ok(found.reply_text()))
    }

    /// The regular files under `dir` (workspace-relative and absolute), in walk order.
    fn files_under(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        let root = self.workspace.root();
        let mut files = Vec::new();
        walk(dir, root, &mut |rel, is_dir| {
            let abs = root.join(&rel);
            // Only regular files: a symlink found on the walk was not resolved by the jail.
            if !is_dir && fs::symlink_metadata(&abs).is_ok_and(|m| m.is_file()) {
                files.push((rel, abs));
            }
            true
        })?;
        Ok(files)
    }
}

fn read_range(mut file: fs::File, offset: u64, length: u64) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.take(length).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A file type a read tool does not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpecialKind {
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl SpecialKind {
    /// `None` for a regular file.
    fn of(file_type: fs::FileType) -> Option<SpecialKind> {
        Some(if file_type.is_file() {
            return None;
        } else if file_type.is_dir() {
            SpecialKind::Directory
        } else if file_type.is_symlink() {
            SpecialKind::Symlink
        } else if file_type.is_fifo() {
            SpecialKind::Fifo
        } else if file_type.is_socket() {
            SpecialKind::Socket
        } else if file_type.is_char_device() {
            SpecialKind::CharDevice
        } else if file_type.is_block_device() {
            SpecialKind::BlockDevice
        } else {
            SpecialKind::Other
        })
    }

    fn name(self) -> &'static str {
        match self {
            SpecialKind::Directory => "a directory",
            SpecialKind::Symlink => "a symbolic link",
            SpecialKind::Fifo => "a named pipe (FIFO)",
            SpecialKind::Socket => "a socket",
            SpecialKind::CharDevice => "a character device",
            SpecialKind::BlockDevice => "a block device",
            SpecialKind::Other => "not a regular file",
        }
    }
}

/// Why a read tool does not return a file's content.
#[derive(Debug)]
enum Unreadable {
    /// Not a regular file: reading a FIFO blocks, a device may never end.
    Special(SpecialKind),
    /// The content has this many links; another of them may be outside the workspace.
    Linked(u64),
    Io(io::Error),
}

impl Unreadable {
    /// The tool error the model sees (not for [`Unreadable::Io`], which goes through
    /// [`StepTools::io_error`]).
    fn explain(&self, rel: &str) -> String {
        match self {
            Unreadable::Special(kind) => format!(
                "{rel} is {}, not a regular file; the read tools read regular files only",
                kind.name()
            ),
            Unreadable::Linked(links) => format!(
                "{rel} has {links} hard links; docsfab reads only files with a single link, \
                 because another link to the same content may be outside the workspace"
            ),
            Unreadable::Io(e) => format!("{rel}: {e}"),
        }
    }
}

/// What a search found: the matching lines as shown, the source bytes they hold, and the
/// files skipped for having more than one hard link.
struct Matches {
    lines: Vec<String>,
    source_bytes: u64,
    linked: u64,
}

/// Searches `files` in order, up to [`MAX_SEARCH_MATCHES`] lines. `single` is the already
/// opened file when the model named one file (so it is not opened twice).
fn find_matches(
    regex: &regex::bytes::Regex,
    files: Vec<(String, PathBuf)>,
    mut single: Option<(fs::File, fs::Metadata)>,
) -> Matches {
    let mut found = Matches {
        lines: Vec::new(),
        source_bytes: 0,
        linked: 0,
    };
    'files: for (rel, abs) in files {
        let opened = match single.take() {
            Some(opened) => Ok(opened),
            None => open_source(&abs),
        };
        let (file, meta) = match opened {
            Ok(opened) => opened,
            Err(Unreadable::Linked(_)) => {
                found.linked += 1;
                continue;
            }
            // Swapped for something else since the walk, or unreadable: not source.
            Err(_) => continue,
        };
        if meta.len() > MAX_SEARCH_FILE_BYTES {
            continue;
        }
        let mut bytes = Vec::new();
        // The limit holds even if the file grows after the descriptor's size was read.
        if file
            .take(MAX_SEARCH_FILE_BYTES)
            .read_to_end(&mut bytes)
            .is_err()
        {
            continue;
        }
        if bytes[..bytes.len().min(8192)].contains(&0) {
            continue; // binary
        }
        for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if regex.is_match(line) {
                let shown = cut_utf8(line, MAX_MATCH_LINE_BYTES);
                found.source_bytes += shown.len() as u64;
                found.lines.push(format!("{rel}:{}: {shown}", n + 1));
                if found.lines.len() >= MAX_SEARCH_MATCHES {
                    break 'files;
                }
            }
        }
    }
    found
}

impl Matches {
    /// The reply the model gets: the lines, or `no matches`, and a note for a search stopped at
    /// its cap or for skipped hard-linked files.
    fn reply_text(&self) -> String {
        let mut text = if self.lines.is_empty() {
            "no matches".to_owned()
        } else {
            self.lines.join("\n")
        };
        if self.lines.len() >= MAX_SEARCH_MATCHES {
            text.push_str(&format!(
                "\n[stopped after {MAX_SEARCH_MATCHES} matches; narrow the search]"
            ));
        }
        if self.linked > 0 {
            let linked = self.linked;
            let files = if linked == 1 { "file" } else { "files" };
            text.push_str(&format!(
                "\n[skipped {linked} {files} with more than one hard link: another link to the \
                 same content may be outside the workspace, so docsfab does not read it]"
            ));
        }
        text
    }
}

/// Opens a file whose content a read tool may return: a regular file with one link.
///
/// The path is checked first so a special file is never opened (opening a device can have
/// effects), then opened without following a final symlink and without blocking on a FIFO,
/// and the descriptor's own metadata (fstat) decides: whatever replaced the path in between,
/// the content read is that of the file checked. The metadata returned is the descriptor's.
fn open_source(abs: &Path) -> Result<(fs::File, fs::Metadata), Unreadable> {
    let check = |meta: &fs::Metadata| {
        if let Some(kind) = SpecialKind::of(meta.file_type()) {
            return Err(Unreadable::Special(kind));
        }
        if meta.nlink() > 1 {
            return Err(Unreadable::Linked(meta.nlink()));
        }
        Ok(())
    };
    check(&fs::symlink_metadata(abs).map_err(Unreadable::Io)?)?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(abs)
        .map_err(Unreadable::Io)?;
    let meta = file.metadata().map_err(Unreadable::Io)?;
    check(&meta)?;
    Ok((file, meta))
}

/// At most `max` bytes of `line`, cut back to a character boundary, without a trailing CR.
fn cut_utf8(line: &[u8], max: usize) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if text.len() <= max {
        return text.into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
