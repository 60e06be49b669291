//! Deterministic git mirrors: fixed author, committer and dates, so the same files give the same
//! commit ids on every run.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// Author and committer of generated commits.
pub const AUTHOR: (&str, &str) = ("sorft synth", "synth@sorft.invalid");

fn git(
    repo: &Path,
    work: Option<&Path>,
    index: Option<&Path>,
    date: u64,
    args: &[&str],
) -> Result<String, String> {
    let mut cmd = Command::new("git");
    cmd.arg("--git-dir").arg(repo);
    if let Some(w) = work {
        cmd.arg("--work-tree").arg(w);
    }
    if let Some(i) = index {
        cmd.env("GIT_INDEX_FILE", i);
    }
    let d = format!("{date} +0000");
    let out = cmd
        .args(args)
        .env("GIT_AUTHOR_NAME", AUTHOR.0)
        .env("GIT_AUTHOR_EMAIL", AUTHOR.1)
        .env("GIT_COMMITTER_NAME", AUTHOR.0)
        .env("GIT_COMMITTER_EMAIL", AUTHOR.1)
        .env("GIT_AUTHOR_DATE", &d)
        .env("GIT_COMMITTER_DATE", &d)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("git {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("failed")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Creates an empty bare repository (no hooks or sample files).
pub fn init_bare(repo: &Path) -> Result<(), String> {
    std::fs::create_dir_all(repo).map_err(|e| format!("{}: {e}", repo.display()))?;
    let out = Command::new("git")
        .args(["init", "-q", "--bare", "--template="])
        .arg(repo)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .map_err(|e| format!("git init: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git init: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Commits `files` as a root commit (no parent, so history reveals nothing) on `refs/heads/{branch}`;
/// returns the commit id.
pub fn commit_files(
    repo: &Path,
    files: &BTreeMap<String, String>,
    message: &str,
    date: u64,
    branch: &str,
) -> Result<String, String> {
    let scratch = tempfile::tempdir().map_err(|e| format!("scratch dir: {e}"))?;
    let work = scratch.path().join("w");
    let index = scratch.path().join("index");
    for (p, t) in files {
        let full = work.join(p);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&full, t).map_err(|e| format!("{}: {e}", full.display()))?;
    }
    git(repo, Some(&work), Some(&index), date, &["add", "-A", "."])?;
    let tree = git(repo, Some(&work), Some(&index), date, &["write-tree"])?;
    let commit = git(
        repo,
        None,
        None,
        date,
        &["commit-tree", &tree, "-m", message],
    )?;
    git(
        repo,
        None,
        None,
        date,
        &["update-ref", &format!("refs/heads/{branch}"), &commit],
    )?;
    Ok(commit)
}

/// Points HEAD at `refs/heads/{branch}`.
pub fn set_head(repo: &Path, branch: &str) -> Result<(), String> {
    git(
        repo,
        None,
        None,
        0,
        &["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")],
    )
    .map(|_| ())
}
