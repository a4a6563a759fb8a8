//! A git workspace of a claimed run: `git clone URL` and `git checkout REF` into
//! `DOCSFAB_HOME/serve/workspaces/RUN_ID`, git run directly (no shell, never prompting for
//! credentials) and stopped early by the run's cancellation and its job deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// What stops a git command early: the run's cancellation and its job deadline.
pub struct Bound<'a> {
    pub cancel: &'a CancellationToken,
    pub until: Instant,
}

/// `git clone URL` and `git checkout REF` into `DOCSFAB_HOME/serve/workspaces/RUN_ID`; the
/// clone's canonical path, or why it failed.
pub fn clone(
    home: &Path,
    run_id: &str,
    url: &str,
    reference: &str,
    bound: &Bound<'_>,
) -> Result<PathBuf, String> {
    let dir = home.join("serve").join("workspaces").join(run_id);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {} for the clone ({e})", parent.display()))?;
    }
    git(
        &[
            "clone".as_ref(),
            "--quiet".as_ref(),
            "--".as_ref(),
            url.as_ref(),
            dir.as_os_str(),
        ],
        bound,
    )
    .map_err(|why| {
        format!(
            "git clone of {url} failed ({why}); check the URL and that this server can reach it"
        )
    })?;
    let commit = resolve(&dir, reference).ok_or_else(|| {
        format!("{url} has no branch, tag or commit {reference:?}; submit a ref the repository has")
    })?;
    git(
        &[
            "-C".as_ref(),
            dir.as_os_str(),
            "checkout".as_ref(),
            "--quiet".as_ref(),
            "--detach".as_ref(),
            commit.as_ref(),
        ],
        bound,
    )
    .map_err(|why| format!("git checkout of {reference:?} in {url} failed ({why})"))?;
    std::fs::canonicalize(&dir).map_err(|e| format!("cannot read the clone's path ({e})"))
}

/// The commit `reference` names in the clone: a branch of the origin, else a tag or commit.
fn resolve(dir: &Path, reference: &str) -> Option<String> {
    [
        format!("refs/remotes/origin/{reference}"),
        reference.to_owned(),
    ]
    .into_iter()
    .find_map(|name| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
            .arg(format!("{name}^{{commit}}"))
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        let sha = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !sha.is_empty()).then_some(sha)
    })
}

/// Runs git (no shell, no prompt) to its end, or kills it when the run is cancelled or its
/// deadline passes; `Err` is git's last stderr line, redacted.
fn git(args: &[&std::ffi::OsStr], bound: &Bound<'_>) -> Result<(), String> {
    use std::io::Read as _;
    let mut child = std::process::Command::new("git")
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git: {e}"))?;
    // Read on a thread so a chatty git never blocks on a full pipe.
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if bound.cancel.is_cancelled() => break Err("the run was cancelled"),
            Ok(None) if Instant::now() >= bound.until => break Err("the job deadline passed"),
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break Err("git could not be waited for"),
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(why) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(why.to_owned());
        }
    };
    let text = reader.join().unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let line = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no message");
    Err(docsfab_boundary::redact::Redactor::default().line(line))
}
