//! `docsfab new [TEMPLATE] [--output PATH]`: write a ready composition to start from
//! (docs/new.md). Without a template, list them.
//!
//! The file is written whole or not at all, and never over an existing file: the text goes to
//! a temporary file created new in the target's directory, which is then hard-linked to the
//! target (a link, unlike a rename, fails when the target exists, so a file that appeared
//! meanwhile is kept) and removed. On a file system without hard links the target is created
//! new and written, and removed again if the write fails.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};

use clap::Args;
use docsfab_policy::host::shown_value;

use crate::app::error::{CliError, emit};

#[derive(Args, Debug)]
pub struct NewArgs {
    /// The template to write (wiki, quickstart); without one, list them.
    #[arg(value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// Where to write the composition (default: TEMPLATE.yaml in the current directory); an
    /// existing file is never overwritten.
    #[arg(long, short, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

/// A composition `docsfab new` can write.
struct Template {
    name: &'static str,
    /// One sentence for the list.
    about: &'static str,
    text: &'static str,
}

const TEMPLATES: [Template; 2] = [
    Template {
        name: "wiki",
        about: "A wiki of a repository: one grounded Markdown page per component under docs/wiki/, and an index that links them.",
        text: include_str!("../../templates/wiki.yaml"),
    },
    Template {
        // The bundled example `docsfab demo` runs (examples/quickstart is a link to this
        // directory), so there is one copy.
        name: "quickstart",
        about: "The bundled two-step example: survey the modules of a crate under src/, then write docs/overview.md.",
        text: include_str!("../../quickstart/composition.yaml"),
    },
];

pub fn run(args: &NewArgs) -> Result<(), CliError> {
    let Some(name) = &args.template else {
        if args.output.is_some() {
            return Err(CliError::bad_input(format!(
                "--output needs a template to write; name one, such as `docsfab new wiki --output PATH` (templates: {}).",
                names()
            )));
        }
        return emit(&listing());
    };
    let template = TEMPLATES.iter().find(|t| t.name == name).ok_or_else(|| {
        CliError::bad_input(format!(
            "there is no template {}; the templates are {} (run `docsfab new` to list them).",
            shown_value(name),
            names()
        ))
    })?;
    let target = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.yaml", template.name)));
    write_new(&target, template.text)?;
    let shown = shell_word(&target.display().to_string());
    emit(&format!(
        "Wrote {shown}.\nNext: docsfab run {shown} --workspace .\n"
    ))
}

/// The template names, for messages: `wiki, quickstart`.
fn names() -> String {
    TEMPLATES
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per template: its name, padded, and its sentence.
fn listing() -> String {
    let width = TEMPLATES.iter().map(|t| t.name.len()).max().unwrap_or(0);
    TEMPLATES
        .iter()
        .map(|t| format!("{:width$}  {}\n", t.name, t.about))
        .collect()
}

/// Writes `text` to `target`, which must not exist, in a directory that does.
fn write_new(target: &Path, text: &str) -> Result<(), CliError> {
    let Some(file_name) = target.file_name() else {
        return Err(CliError::bad_input(format!(
            "{} names no file; pass --output with a file path such as docs/wiki.yaml.",
            target.display()
        )));
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        let what = match dir.exists() {
            true => "is not a directory",
            false => "does not exist",
        };
        return Err(CliError::bad_input(format!(
            "the directory {} {what}; create it, or pass --output with a path in an existing directory.",
            dir.display()
        )));
    }
    if target.symlink_metadata().is_ok() {
        return Err(exists(target));
    }
    let (temp, mut file) = create_temp(dir, &file_name.to_string_lossy())?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all());
    drop(file);
    let placed = written.and_then(|()| std::fs::hard_link(&temp, target));
    let _ = std::fs::remove_file(&temp);
    match placed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(exists(target)),
        // Created and written, but the file system has no hard links: write in place.
        Err(e) if e.kind() == ErrorKind::Unsupported || e.raw_os_error() == Some(libc::EPERM) => {
            write_in_place(target, text)
        }
        Err(e) => Err(cannot_write(target, &e)),
    }
}

/// A temporary file created new beside the target: `.NAME.PID.N.tmp`.
fn create_temp(dir: &Path, file_name: &str) -> Result<(PathBuf, std::fs::File), CliError> {
    let pid = std::process::id();
    let mut last = None;
    for n in 0..16 {
        let temp = dir.join(format!(".{file_name}.{pid}.{n}.tmp"));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(cannot_write_in(dir, &e)),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::from(ErrorKind::AlreadyExists));
    Err(cannot_write_in(dir, &e))
}

/// The fallback without hard links: create the target new, write it, remove it on failure.
fn write_in_place(target: &Path, text: &str) -> Result<(), CliError> {
    let mut file = match OpenOptions::new().write(true).create_new(true).open(target) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(exists(target)),
        Err(e) => return Err(cannot_write(target, &e)),
    };
    match file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
    {
        Ok(()) => Ok(()),
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(target);
            Err(cannot_write(target, &e))
        }
    }
}

fn exists(target: &Path) -> CliError {
    CliError::bad_input(format!(
        "{} already exists; pass --output PATH to write the composition elsewhere, or remove it.",
        target.display()
    ))
}

fn cannot_write_in(dir: &Path, e: &std::io::Error) -> CliError {
    CliError::bad_input(format!(
        "cannot write in the directory {} ({}); pass --output with a path in a directory you can write.",
        dir.display(),
        crate::app::error::plain_reason(&e.to_string(), "unknown reason")
    ))
}

fn cannot_write(target: &Path, e: &std::io::Error) -> CliError {
    CliError::bad_input(format!(
        "cannot write {} ({}); pass --output with a path in a directory you can write.",
        target.display(),
        crate::app::error::plain_reason(&e.to_string(), "unknown reason")
    ))
}

/// `word` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_is_a_valid_composition() {
        for t in &TEMPLATES {
            let c = docsfab_runtime::composition::Composition::parse(t.text, t.name);
            assert!(c.is_ok(), "{}: {:?}", t.name, c.err());
        }
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("wiki.yaml"), "wiki.yaml");
        assert_eq!(shell_word("/tmp/a b/w.yaml"), "'/tmp/a b/w.yaml'");
        assert_eq!(shell_word("it's.yaml"), r"'it'\''s.yaml'");
    }
}
