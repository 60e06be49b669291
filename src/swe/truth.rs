//! Ground truth for the four subtasks, derived from a gold patch and the pre-patch snapshot.
//!
//! - files: modified pre-existing non-test files (added files and test files are not targets);
//! - functions: pre-patch functions, classes and methods the patch touches (tree-sitter); an addition
//!   counts for the definition enclosing it, or for the module (`module_level`);
//! - lines: pre-patch line numbers; a pure insertion counts as the line it follows (line 1 at file start);
//! - edits: the change as SEARCH/REPLACE blocks.

use crate::swe::codemap::{self, DefKind, Definition, Lang};
use crate::swe::diff::{self, ApplyError, FileStatus, Hunk, LineKind, ParseError, Patch};
use crate::swe::edit::{self, EditBlock};
use crate::swe::repo::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Errors deriving ground truth.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// The gold patch does not parse.
    #[error("gold patch: {0}")]
    Parse(#[from] ParseError),
    /// The gold patch does not apply to the snapshot.
    #[error("gold patch: {0}")]
    Apply(#[from] ApplyError),
    /// A file the patch modifies is missing from the snapshot or is not UTF-8.
    #[error("gold patch modifies {path}, which is not a text file of the snapshot")]
    Missing {
        /// The file.
        path: String,
    },
}

/// A function-level target: a definition in a file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FuncTarget {
    /// File path.
    pub path: String,
    /// Function, class or method.
    pub kind: DefKind,
    /// Qualified name.
    pub name: String,
}

/// A line-level target: a pre-patch line of a file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LineTarget {
    /// File path.
    pub path: String,
    /// 1-based pre-patch line.
    pub line: usize,
}

/// Ground truth of one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// Modified non-test files, in patch order.
    pub files: Vec<String>,
    /// Modified definitions (pre-patch), sorted.
    pub functions: Vec<FuncTarget>,
    /// Files with changes at module level, outside any definition.
    pub module_level: Vec<String>,
    /// Modified pre-patch lines, sorted.
    pub lines: Vec<LineTarget>,
    /// The edit as SEARCH/REPLACE blocks against the pre-patch files.
    pub edits: Vec<EditBlock>,
}

/// A change point in a file: a removed line, or a pure insertion after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Pre-patch line `n` is removed or replaced.
    Removed(usize),
    /// New lines go after pre-patch line `after` (0 = file start); `indent` of the first non-blank
    /// inserted line, `decorator` when it starts with `@`.
    Inserted {
        /// Line the insertion follows.
        after: usize,
        /// Indentation of the first non-blank inserted line.
        indent: usize,
        /// The first non-blank inserted line starts with `@`.
        decorator: bool,
    },
}

/// The change points of hunks.
pub fn change_points(hunks: &[Hunk]) -> Vec<Change> {
    let mut out = Vec::new();
    for h in hunks {
        let mut n = if h.old_lines == 0 {
            h.old_start + 1
        } else {
            h.old_start
        };
        let mut prev_removed = false;
        let mut pending: Option<usize> = None; // insertion run start (after line)
        let mut first_text: Option<&str> = None;
        let flush = |out: &mut Vec<Change>, pending: &mut Option<usize>, ft: &mut Option<&str>| {
            if let Some(after) = pending.take() {
                let t = ft.take().unwrap_or("");
                out.push(Change::Inserted {
                    after,
                    indent: t.len() - t.trim_start().len(),
                    decorator: t.trim_start().starts_with('@'),
                });
            }
        };
        for l in &h.lines {
            match l.kind {
                LineKind::Context => {
                    flush(&mut out, &mut pending, &mut first_text);
                    prev_removed = false;
                    n += 1;
                }
                LineKind::Delete => {
                    flush(&mut out, &mut pending, &mut first_text);
                    out.push(Change::Removed(n));
                    prev_removed = true;
                    n += 1;
                }
                LineKind::Insert => {
                    if prev_removed {
                        continue; // a replacement: the removed lines already mark it
                    }
                    if pending.is_none() {
                        pending = Some(n - 1);
                    }
                    if first_text.is_none() && !l.text.trim().is_empty() {
                        first_text = Some(l.text.as_str());
                    }
                }
            }
        }
        flush(&mut out, &mut pending, &mut first_text);
    }
    out
}

/// The pre-patch line a change point marks.
pub fn change_line(c: Change) -> usize {
    match c {
        Change::Removed(n) => n,
        Change::Inserted { after, .. } => after.max(1),
    }
}

/// Pre-patch lines modified when `old` becomes `new`.
pub fn modified_lines(old: &str, new: &str) -> BTreeSet<usize> {
    change_points(&diff::diff_hunks(old, new, 0))
        .into_iter()
        .map(change_line)
        .collect()
}

/// The localization unit a change belongs to, or `None` for module level.
pub fn unit_of_change(defs: &[Definition], c: Change) -> Option<&Definition> {
    match c {
        Change::Removed(n) => codemap::unit_at(defs, n),
        Change::Inserted {
            after,
            indent,
            decorator,
        } => {
            let units: Vec<&Definition> = codemap::units(defs).collect();
            if decorator {
                if let Some(d) = units.iter().find(|d| d.start_line == after + 1) {
                    return Some(d);
                }
            }
            units
                .iter()
                .filter(|d| {
                    d.contains(after)
                        && (d.contains(after + 1) || indent > d.indent)
                        && d.start_line <= after
                })
                .min_by_key(|d| d.end_line - d.start_line)
                .copied()
        }
    }
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// Derives the ground truth of a gold patch against the pre-patch snapshot.
pub fn ground_truth(patch_text: &str, snapshot: &Snapshot) -> Result<GroundTruth, TruthError> {
    let patch = Patch::parse(patch_text)?;
    let mut gt = GroundTruth::default();
    let mut functions = BTreeSet::new();
    let mut lines = BTreeSet::new();
    for fp in &patch.files {
        let Some(old_path) = fp.old_path.as_deref() else {
            continue; // added files are not localization targets
        };
        if codemap::is_test_path(old_path) {
            continue;
        }
        let old = snapshot.text(old_path).ok_or_else(|| TruthError::Missing {
            path: old_path.to_string(),
        })?;
        let new = fp.apply_text(old)?;
        let points = change_points(&fp.hunks);
        if points.is_empty() && fp.status != FileStatus::Deleted {
            // A pure rename or mode change: the file is still a target.
            push_unique(&mut gt.files, old_path.to_string());
            continue;
        }
        push_unique(&mut gt.files, old_path.to_string());
        let lang = Lang::from_path(old_path);
        let defs = lang
            .map(|l| codemap::definitions(l, old))
            .unwrap_or_default();
        for &c in &points {
            lines.insert(LineTarget {
                path: old_path.to_string(),
                line: change_line(c),
            });
            if lang.is_none() {
                continue; // no grammar: no function-level targets
            }
            match unit_of_change(&defs, c) {
                Some(d) => {
                    functions.insert(FuncTarget {
                        path: old_path.to_string(),
                        kind: d.kind,
                        name: d.name.clone(),
                    });
                }
                None => push_unique(&mut gt.module_level, old_path.to_string()),
            }
        }
        if fp.status != FileStatus::Deleted {
            gt.edits
                .extend(edit::blocks_from_texts(old_path, old, &new, 1));
        }
    }
    gt.functions = functions.into_iter().collect();
    gt.lines = lines.into_iter().collect();
    Ok(gt)
}
