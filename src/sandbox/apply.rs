//! Applying a model's change (unified diff or SEARCH/REPLACE blocks) and an instance's
//! test_patch to a workspace, with a fallback chain like SWE-bench's: exact first, then
//! whitespace-insensitive, then limited context fuzz. Paths are checked before anything is
//! written; the result names the strategy, or exactly which hunk failed and why.

use crate::sandbox::paths::{self, UnsafePath};
use crate::swe::diff::{FilePatch, FileStatus, Hunk, LineKind, Patch};
use crate::swe::edit;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// How a patch was applied, from strictest to loosest.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Context and removed lines matched verbatim (at the stated line or an offset).
    Exact,
    /// Matched with whitespace differences ignored.
    IgnoreWhitespace,
    /// Matched after dropping up to this many context lines at each end of a hunk.
    Fuzz(u8),
}

/// Largest context fuzz tried (GNU patch's default is 2; SWE-bench allows more).
pub const MAX_FUZZ: u8 = 3;

/// Why a patch did not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The patch text is not a diff (nor SEARCH/REPLACE blocks).
    #[error("{what} is not a valid diff: {msg}")]
    Parse {
        /// "model patch" or "test patch".
        what: &'static str,
        /// The parser's message.
        msg: String,
    },
    /// A path reaches outside the repository.
    #[error("{what}: {source}")]
    Unsafe {
        /// Which patch.
        what: &'static str,
        /// The refused path.
        source: UnsafePath,
    },
    /// A hunk did not apply with any strategy.
    #[error("{what}: {path}: hunk {hunk} (old line {old_start}) does not apply: {reason}")]
    Hunk {
        /// Which patch.
        what: &'static str,
        /// The file.
        path: String,
        /// 1-based hunk number in the file.
        hunk: usize,
        /// The hunk's stated old start line.
        old_start: usize,
        /// Why (what the loosest strategy found).
        reason: String,
    },
    /// A SEARCH/REPLACE block failed.
    #[error("{what}: {msg}")]
    Edit {
        /// Which patch.
        what: &'static str,
        /// The edit layer's message.
        msg: String,
    },
    /// The file-level operation is impossible (missing file, existing file, binary).
    #[error("{what}: {path}: {reason}")]
    File {
        /// Which patch.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// A successful application.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Applied {
    /// The loosest strategy any file needed.
    pub strategy: Strategy,
    /// Files written or removed.
    pub files: Vec<String>,
}

fn normalize_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Applies hunks to `original` with one strategy; on failure returns (hunk index, reason).
pub fn apply_hunks_with(
    original: &str,
    hunks: &[Hunk],
    strategy: Strategy,
) -> Result<String, (usize, String)> {
    let lines: Vec<&str> = original.split_inclusive('\n').collect();
    let crlf = original.contains("\r\n");
    let (loose, fuzz) = match strategy {
        Strategy::Exact => (false, 0usize),
        Strategy::IgnoreWhitespace => (true, 0),
        Strategy::Fuzz(f) => (true, f as usize),
    };
    let norm_lines: Vec<String> = if loose {
        lines.iter().map(|l| normalize_ws(l)).collect()
    } else {
        Vec::new()
    };
    let mut out = String::with_capacity(original.len() + 256);
    let mut cursor = 0usize;
    let mut delta: i64 = 0;
    for (hi, h) in hunks.iter().enumerate() {
        // Leading and trailing context lines that fuzz may drop.
        let lead = h
            .lines
            .iter()
            .take_while(|l| l.kind == LineKind::Context)
            .count();
        let trail = h
            .lines
            .iter()
            .rev()
            .take_while(|l| l.kind == LineKind::Context)
            .count()
            .min(h.lines.len() - lead);
        let mut placed = None;
        'fuzz: for f in 0..=fuzz {
            let (cut_front, cut_back) = (f.min(lead), f.min(trail));
            let body = &h.lines[cut_front..h.lines.len() - cut_back];
            let old: Vec<&str> = body
                .iter()
                .filter(|l| l.kind != LineKind::Insert)
                .map(|l| l.text.as_str())
                .collect();
            let old_norm: Vec<String> = if loose {
                old.iter().map(|l| normalize_ws(l)).collect()
            } else {
                Vec::new()
            };
            let fits = |pos: usize| -> bool {
                if pos < cursor || pos + old.len() > lines.len() {
                    return false;
                }
                if loose {
                    norm_lines[pos..pos + old.len()] == old_norm[..]
                } else {
                    lines[pos..pos + old.len()] == old[..]
                }
            };
            let stated = if h.old_lines == 0 {
                h.old_start
            } else {
                h.old_start.saturating_sub(1)
            } + cut_front;
            let expected =
                (stated as i64 + delta).clamp(cursor as i64, lines.len() as i64) as usize;
            if old.is_empty() {
                placed = Some((expected, body, stated));
                break 'fuzz;
            }
            for d in 0..=lines.len() {
                if fits(expected + d) {
                    placed = Some((expected + d, body, stated));
                    break 'fuzz;
                }
                if d > 0 && d <= expected && fits(expected - d) {
                    placed = Some((expected - d, body, stated));
                    break 'fuzz;
                }
            }
        }
        let Some((pos, body, stated)) = placed else {
            let reason = match strategy {
                Strategy::Exact => "context or removed lines not found verbatim".to_string(),
                Strategy::IgnoreWhitespace => {
                    "context or removed lines not found, even ignoring whitespace".to_string()
                }
                Strategy::Fuzz(f) => format!(
                    "context or removed lines not found, even ignoring whitespace with fuzz {f}"
                ),
            };
            return Err((hi + 1, reason));
        };
        delta = pos as i64 - stated as i64;
        out.extend(lines[cursor..pos].iter().copied());
        let mut src = pos;
        for l in body {
            match l.kind {
                LineKind::Context => {
                    // Keep the file's own version of a context line.
                    out.push_str(lines[src]);
                    src += 1;
                }
                LineKind::Delete => src += 1,
                LineKind::Insert => {
                    if loose && crlf && l.text.ends_with('\n') && !l.text.ends_with("\r\n") {
                        out.push_str(&l.text[..l.text.len() - 1]);
                        out.push_str("\r\n");
                    } else {
                        out.push_str(&l.text);
                    }
                }
            }
        }
        cursor = src;
    }
    out.extend(lines[cursor.min(lines.len())..].iter().copied());
    Ok(out)
}

/// The chain of strategies, strictest first.
pub fn strategies() -> Vec<Strategy> {
    let mut v = vec![Strategy::Exact, Strategy::IgnoreWhitespace];
    v.extend((1..=MAX_FUZZ).map(Strategy::Fuzz));
    v
}

fn is_symlink_mode(m: &Option<String>) -> bool {
    m.as_deref() == Some("120000")
}

/// A pending change to one path.
enum Change {
    Write { text: String, mode: Option<u32> },
    Symlink(String),
    Remove,
}

/// Applies a unified diff to the repository at `root`. `what` names the patch in errors.
pub fn apply_diff(root: &Path, text: &str, what: &'static str) -> Result<Applied, ApplyError> {
    let patch = Patch::parse(text).map_err(|e| ApplyError::Parse {
        what,
        msg: e.to_string(),
    })?;
    apply_patch(root, &patch, what)
}

fn file_err(what: &'static str, path: &str, reason: impl Into<String>) -> ApplyError {
    ApplyError::File {
        what,
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Applies a parsed patch: validates every path first, computes every file's new content with
/// the loosest strategy it needs, then writes (nothing is written when any file fails).
pub fn apply_patch(root: &Path, patch: &Patch, what: &'static str) -> Result<Applied, ApplyError> {
    let unsafe_err = |source| ApplyError::Unsafe { what, source };
    // 1. Paths: syntactic checks and symlinks already on disk.
    for fp in &patch.files {
        for p in [&fp.old_path, &fp.new_path].into_iter().flatten() {
            paths::check_relative(p).map_err(unsafe_err)?;
        }
    }
    let mut changes: BTreeMap<String, Change> = BTreeMap::new();
    let mut loosest = Strategy::Exact;
    // Files the patch created earlier (a later file patch may not write through them).
    let mut created_links: Vec<String> = vec![];
    for fp in &patch.files {
        for p in [&fp.old_path, &fp.new_path].into_iter().flatten() {
            if created_links
                .iter()
                .any(|l| p.starts_with(&format!("{l}/")))
            {
                return Err(unsafe_err(UnsafePath {
                    path: p.clone(),
                    reason: "writes through a symlink created by the patch",
                }));
            }
        }
        if fp.binary {
            return Err(file_err(what, fp.path(), "binary change cannot be applied"));
        }
        let old_text = match &fp.old_path {
            Some(p) if !is_symlink_mode(&fp.old_mode) => {
                let full = paths::resolve_for_write(root, p).map_err(unsafe_err)?;
                let pending = changes.get(p.as_str()).and_then(|c| match c {
                    Change::Write { text, .. } => Some(text.clone()),
                    _ => None,
                });
                match pending {
                    Some(t) => Some(t),
                    None => {
                        let bytes = std::fs::read(&full)
                            .map_err(|_| file_err(what, p, "file does not exist"))?;
                        Some(
                            String::from_utf8(bytes)
                                .map_err(|_| file_err(what, p, "not UTF-8 text"))?,
                        )
                    }
                }
            }
            _ => None,
        };
        if let Some(p) = &fp.new_path {
            let full = paths::resolve_for_write(root, p).map_err(unsafe_err)?;
            if fp.old_path.is_none() && std::fs::symlink_metadata(&full).is_ok() {
                return Err(file_err(what, p, "file already exists"));
            }
        }
        let new_text = apply_file(fp, old_text.as_deref().unwrap_or(""), what, &mut loosest)?;
        if fp.status == FileStatus::Renamed || fp.new_path.is_none() {
            if let Some(p) = &fp.old_path {
                changes.insert(p.clone(), Change::Remove);
            }
        }
        if let Some(p) = &fp.new_path {
            if is_symlink_mode(&fp.new_mode) {
                paths::check_symlink_target(p, &new_text).map_err(unsafe_err)?;
                created_links.push(p.clone());
                changes.insert(p.clone(), Change::Symlink(new_text));
            } else {
                let mode =
                    fp.new_mode
                        .as_deref()
                        .map(|m| if m.ends_with("755") { 0o755 } else { 0o644 });
                changes.insert(
                    p.clone(),
                    Change::Write {
                        text: new_text,
                        mode,
                    },
                );
            }
        } else if !new_text.is_empty() {
            return Err(file_err(
                what,
                fp.path(),
                "file deletion leaves content behind",
            ));
        }
    }
    // 2. Write.
    let mut files = vec![];
    for (p, change) in changes {
        let full = paths::resolve_for_write(root, &p).map_err(unsafe_err)?;
        let io = |e: std::io::Error| file_err(what, &p, e.to_string());
        match change {
            Change::Remove => {
                std::fs::remove_file(&full).map_err(io)?;
            }
            Change::Write { text, mode } => {
                if let Some(parent) = full.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                std::fs::write(&full, text).map_err(io)?;
                if let Some(m) = mode {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(m))
                        .map_err(io)?;
                }
            }
            Change::Symlink(target) => {
                if let Some(parent) = full.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                if std::fs::symlink_metadata(&full).is_ok() {
                    std::fs::remove_file(&full).map_err(io)?;
                }
                std::os::unix::fs::symlink(target.trim_end_matches(['\n', '\r']), &full)
                    .map_err(io)?;
            }
        }
        files.push(p);
    }
    Ok(Applied {
        strategy: loosest,
        files,
    })
}

/// New text of one file, trying the strategy chain; records the loosest strategy used.
fn apply_file(
    fp: &FilePatch,
    old: &str,
    what: &'static str,
    loosest: &mut Strategy,
) -> Result<String, ApplyError> {
    if fp.hunks.is_empty() {
        return Ok(old.to_string());
    }
    let mut last = None;
    for s in strategies() {
        match apply_hunks_with(old, &fp.hunks, s) {
            Ok(t) => {
                *loosest = (*loosest).max(s);
                return Ok(t);
            }
            Err(e) => last = Some(e),
        }
    }
    let (hunk, reason) = last.unwrap_or((1, "no strategy applies".into()));
    Err(ApplyError::Hunk {
        what,
        path: fp.path().to_string(),
        hunk,
        old_start: fp.hunks.get(hunk - 1).map_or(0, |h| h.old_start),
        reason,
    })
}

/// True when the text looks like SEARCH/REPLACE blocks rather than a diff.
pub fn is_edit_blocks(text: &str) -> bool {
    text.lines()
        .any(|l| l.trim_start().starts_with("<<<<<<< SEARCH"))
}

/// Applies a model change in either format: SEARCH/REPLACE blocks (turned into a diff against
/// the workspace's files) or a unified diff.
pub fn apply_model_change(root: &Path, text: &str) -> Result<Applied, ApplyError> {
    const WHAT: &str = "model patch";
    if !is_edit_blocks(text) {
        return apply_diff(root, text, WHAT);
    }
    let blocks = edit::parse_blocks(text);
    let mut files = BTreeMap::new();
    for b in &blocks {
        let full = paths::resolve_for_write(root, &b.path)
            .map_err(|source| ApplyError::Unsafe { what: WHAT, source })?;
        if let Ok(t) = std::fs::read_to_string(&full) {
            files.insert(b.path.clone(), t);
        }
    }
    let patch = edit::blocks_to_patch(&files, &blocks).map_err(|e| ApplyError::Edit {
        what: WHAT,
        msg: e.to_string(),
    })?;
    apply_patch(root, &patch, WHAT)
}

/// Test files a test patch touches (added or modified, not deleted), in patch order.
pub fn test_files(test_patch: &str) -> Vec<String> {
    Patch::parse(test_patch)
        .map(|p| p.files.iter().filter_map(|f| f.new_path.clone()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::diff::unified_diff;

    const OLD: &str = "a\nb\nc\nd\ne\nf\ng\nh\n";

    #[test]
    fn exact_then_whitespace_then_fuzz() {
        let new = "a\nb\nc\nD\ne\nf\ng\nh\n";
        let diff = unified_diff("x.txt", OLD, new);
        let p = Patch::parse(&diff).unwrap();
        let h = &p.files[0].hunks;
        assert_eq!(apply_hunks_with(OLD, h, Strategy::Exact).unwrap(), new);
        // Shifted by two lines: the offset search finds it.
        let shifted = format!("0\n1\n{OLD}");
        assert_eq!(
            apply_hunks_with(&shifted, h, Strategy::Exact).unwrap(),
            format!("0\n1\n{new}")
        );
        // Whitespace drift in context.
        let ws = OLD.replace("c\n", "c  \n");
        assert!(apply_hunks_with(&ws, h, Strategy::Exact).is_err());
        assert_eq!(
            apply_hunks_with(&ws, h, Strategy::IgnoreWhitespace).unwrap(),
            "a\nb\nc  \nD\ne\nf\ng\nh\n"
        );
        // A changed first context line needs fuzz 1.
        let drift = OLD.replace("a\n", "A\n");
        let (hunk, reason) = apply_hunks_with(&drift, h, Strategy::IgnoreWhitespace).unwrap_err();
        assert_eq!(hunk, 1);
        assert!(reason.contains("not found"));
        assert_eq!(
            apply_hunks_with(&drift, h, Strategy::Fuzz(1)).unwrap(),
            "A\nb\nc\nD\ne\nf\ng\nh\n"
        );
    }

    #[test]
    fn apply_patch_reports_strategy_and_failing_hunk() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.txt"), OLD.replace("a\n", "A\n")).unwrap();
        let diff = unified_diff("x.txt", OLD, &OLD.replace("d\n", "D\n"));
        let r = apply_diff(d.path(), &diff, "model patch").unwrap();
        assert_eq!(r.strategy, Strategy::Fuzz(1));
        // A removed line that is not there fails with the hunk named.
        let bad = unified_diff("x.txt", "q\nr\ns\n", "q\nR\ns\n");
        let e = apply_diff(d.path(), &bad, "model patch").unwrap_err();
        match e {
            ApplyError::Hunk { hunk, path, .. } => {
                assert_eq!((hunk, path.as_str()), (1, "x.txt"));
            }
            other => panic!("{other:?}"),
        }
        // Nothing was written by the failed patch.
        assert!(std::fs::read_to_string(d.path().join("x.txt"))
            .unwrap()
            .contains("D\n"));
    }

    #[test]
    fn search_replace_blocks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("m.py"), "x = 1\ny = 2\n").unwrap();
        let text = "### m.py\n<<<<<<< SEARCH\ny = 2\n=======\ny = 3\n>>>>>>> REPLACE\n";
        let r = apply_model_change(d.path(), text).unwrap();
        assert_eq!(r.strategy, Strategy::Exact);
        assert_eq!(
            std::fs::read_to_string(d.path().join("m.py")).unwrap(),
            "x = 1\ny = 3\n"
        );
        let escape = "### ../evil.py\n<<<<<<< SEARCH\n=======\nboom\n>>>>>>> REPLACE\n";
        assert!(matches!(
            apply_model_change(d.path(), escape),
            Err(ApplyError::Unsafe { .. })
        ));
    }
}
