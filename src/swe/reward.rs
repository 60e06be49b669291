//! Rule-based rewards of the four subtasks (SoRFT) and SWE-RL's patch similarity.
//!
//! Localization: 0 for an empty answer or a target the prompt did not show, else F-beta (beta = 3)
//! against the ground truth (answers are deduplicated first). Edit: 0 when no block parses, a SEARCH
//! is not found verbatim in the shown code, or nothing changes; else F-beta between the lines the edit
//! modifies and the ground-truth lines. Patch similarity: mean over files of the sequence-matcher ratio
//! between predicted and gold per-file diffs, -1 on a format error.

use crate::swe::answer;
use crate::swe::diff::{FilePatch, Hunk, Patch};
use crate::swe::edit::{self, EditBlock};
use crate::swe::truth::{self, FuncTarget, LineTarget};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The beta of the F-beta localization rewards (recall weighted 9x precision).
pub const BETA: f64 = 3.0;

/// Why a reward is zero (or -1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum ZeroReason {
    /// No answer could be parsed.
    EmptyAnswer,
    /// The answer names something the prompt did not show.
    InventedTarget {
        /// The invented target, as text.
        target: String,
    },
    /// No SEARCH/REPLACE block parses.
    NoBlocks,
    /// A block's file is not among the shown files.
    UnknownFile {
        /// 1-based block number.
        block: usize,
        /// Its path.
        path: String,
    },
    /// A SEARCH text is not found verbatim in the shown code.
    SearchNotFound {
        /// 1-based block number.
        block: usize,
        /// Its path.
        path: String,
    },
    /// The edit changes nothing.
    NoChange,
    /// Prediction and ground truth do not overlap.
    NoOverlap,
    /// The ground truth is empty (nothing to score against).
    NoTruth,
}

/// A reward with its breakdown, for the RL monitor and FailForge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardBreakdown {
    /// The reward.
    pub reward: f64,
    /// Precision of the prediction (for patch similarity: the mean ratio).
    pub precision: f64,
    /// Recall of the prediction (for patch similarity: the mean ratio).
    pub recall: f64,
    /// Number of distinct predicted items.
    pub predicted: usize,
    /// Number of ground-truth items.
    pub truth: usize,
    /// Why the reward is zero (or -1), when it is.
    pub zero_reason: Option<ZeroReason>,
}

impl RewardBreakdown {
    /// A zero reward for `reason`.
    pub fn zero(reason: ZeroReason, predicted: usize, truth: usize) -> Self {
        RewardBreakdown {
            reward: 0.0,
            precision: 0.0,
            recall: 0.0,
            predicted,
            truth,
            zero_reason: Some(reason),
        }
    }
}

/// F-beta of a precision and a recall (0 when both are 0).
pub fn f_beta(precision: f64, recall: f64, beta: f64) -> f64 {
    let b2 = beta * beta;
    let denom = b2 * precision + recall;
    if denom <= 0.0 {
        0.0
    } else {
        (1.0 + b2) * precision * recall / denom
    }
}

/// F-beta (beta = 3) between a predicted set and a ground-truth set.
pub fn set_reward<T: Ord>(pred: &BTreeSet<T>, truth: &BTreeSet<T>) -> RewardBreakdown {
    if pred.is_empty() {
        return RewardBreakdown::zero(ZeroReason::EmptyAnswer, 0, truth.len());
    }
    if truth.is_empty() {
        return RewardBreakdown::zero(ZeroReason::NoTruth, pred.len(), 0);
    }
    let hit = pred.intersection(truth).count() as f64;
    let precision = hit / pred.len() as f64;
    let recall = hit / truth.len() as f64;
    let reward = f_beta(precision, recall, BETA);
    RewardBreakdown {
        reward,
        precision,
        recall,
        predicted: pred.len(),
        truth: truth.len(),
        zero_reason: (hit == 0.0).then_some(ZeroReason::NoOverlap),
    }
}

/// File localization reward: `shown` = files the prompt listed, `truth` = modified files.
pub fn file_reward(answer_text: &str, shown: &[String], truth: &[String]) -> RewardBreakdown {
    let pred: BTreeSet<String> = answer::parse_files(answer_text).into_iter().collect();
    let truth: BTreeSet<String> = truth.iter().cloned().collect();
    if let Some(bad) = pred.iter().find(|p| !shown.contains(p)) {
        return RewardBreakdown::zero(
            ZeroReason::InventedTarget {
                target: bad.clone(),
            },
            pred.len(),
            truth.len(),
        );
    }
    set_reward(&pred, &truth)
}

/// Function localization reward; items compare by (path, qualified name), the kind word is not scored.
pub fn function_reward(
    answer_text: &str,
    shown: &[FuncTarget],
    truth: &[FuncTarget],
) -> RewardBreakdown {
    let shown: BTreeSet<(&str, &str)> = shown
        .iter()
        .map(|f| (f.path.as_str(), f.name.as_str()))
        .collect();
    let parsed = answer::parse_functions(answer_text);
    let pred: BTreeSet<(String, String)> = parsed
        .iter()
        .map(|l| (l.path.clone(), l.name.clone()))
        .collect();
    let truth: BTreeSet<(String, String)> = truth
        .iter()
        .map(|f| (f.path.clone(), f.name.clone()))
        .collect();
    if let Some((p, n)) = pred
        .iter()
        .find(|(p, n)| !shown.contains(&(p.as_str(), n.as_str())))
    {
        return RewardBreakdown::zero(
            ZeroReason::InventedTarget {
                target: format!("{p}: {n}"),
            },
            pred.len(),
            truth.len(),
        );
    }
    set_reward(&pred, &truth)
}

/// A contiguous slice of a file shown in a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// File path.
    pub path: String,
    /// 1-based number of the first line.
    pub start_line: usize,
    /// The lines verbatim (with line endings).
    pub text: String,
}

impl Window {
    /// Number of lines.
    pub fn len(&self) -> usize {
        self.text.split_inclusive('\n').count()
    }

    /// Whether the window holds no line.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Whether 1-based `line` of the file is in the window.
    pub fn contains(&self, path: &str, line: usize) -> bool {
        path == self.path && line >= self.start_line && line < self.start_line + self.len()
    }
}

/// Line localization reward: `shown` windows bound the valid lines.
pub fn line_reward(answer_text: &str, shown: &[Window], truth: &[LineTarget]) -> RewardBreakdown {
    let pred: BTreeSet<(String, usize)> = answer::parse_lines(answer_text)
        .into_iter()
        .map(|l| (l.path, l.line))
        .collect();
    let truth: BTreeSet<(String, usize)> = truth.iter().map(|l| (l.path.clone(), l.line)).collect();
    if let Some((p, n)) = pred
        .iter()
        .find(|(p, n)| !shown.iter().any(|w| w.contains(p, *n)))
    {
        return RewardBreakdown::zero(
            ZeroReason::InventedTarget {
                target: format!("{p}: line {n}"),
            },
            pred.len(),
            truth.len(),
        );
    }
    set_reward(&pred, &truth)
}

/// The result of applying edit blocks to shown windows.
#[derive(Debug, Clone)]
pub struct WindowEdit {
    /// (window index, new text) of every changed window.
    pub changed: Vec<(usize, String)>,
}

/// Applies blocks to the shown windows: each SEARCH must lie verbatim inside one window of its file.
pub fn apply_to_windows(
    windows: &[Window],
    blocks: &[EditBlock],
) -> Result<WindowEdit, ZeroReason> {
    if blocks.is_empty() {
        return Err(ZeroReason::NoBlocks);
    }
    let mut texts: Vec<String> = windows.iter().map(|w| w.text.clone()).collect();
    for (i, b) in blocks.iter().enumerate() {
        let block = i + 1;
        let mine: Vec<usize> = (0..windows.len())
            .filter(|&k| windows[k].path == b.path)
            .collect();
        if mine.is_empty() {
            return Err(ZeroReason::UnknownFile {
                block,
                path: b.path.clone(),
            });
        }
        if b.search.trim().is_empty() {
            return Err(ZeroReason::SearchNotFound {
                block,
                path: b.path.clone(),
            });
        }
        let applied = mine
            .iter()
            .find_map(|&k| edit::apply_block(&texts[k], b).map(|t| (k, t)));
        match applied {
            Some((k, t)) => texts[k] = t,
            None => {
                return Err(ZeroReason::SearchNotFound {
                    block,
                    path: b.path.clone(),
                })
            }
        }
    }
    let changed: Vec<(usize, String)> = texts
        .into_iter()
        .enumerate()
        .filter(|(k, t)| *t != windows[*k].text)
        .collect();
    if changed.is_empty() {
        return Err(ZeroReason::NoChange);
    }
    Ok(WindowEdit { changed })
}

/// Edit reward (SoRFT): F-beta between the pre-edit lines the edit modifies and the truth lines.
pub fn edit_reward(answer_text: &str, shown: &[Window], truth: &[LineTarget]) -> RewardBreakdown {
    let blocks = answer::parse_edit(answer_text);
    let truth_set: BTreeSet<(String, usize)> =
        truth.iter().map(|l| (l.path.clone(), l.line)).collect();
    let n_blocks = blocks.len();
    let edit = match apply_to_windows(shown, &blocks) {
        Ok(e) => e,
        Err(reason) => return RewardBreakdown::zero(reason, n_blocks, truth_set.len()),
    };
    let mut pred = BTreeSet::new();
    for (k, new) in &edit.changed {
        let w = &shown[*k];
        for n in truth::modified_lines(&w.text, new) {
            pred.insert((w.path.clone(), n + w.start_line - 1));
        }
    }
    set_reward(&pred, &truth_set)
}

fn shift(hunks: &mut [Hunk], old_off: usize, new_off: usize) {
    for h in hunks {
        h.old_start += old_off;
        h.new_start += new_off;
    }
}

/// Per-file predicted diffs from an edit applied to windows. With the file's full pre-edit text in
/// `sources`, the windows are spliced back into it and diffed whole (as the gold diff was); otherwise
/// the window diffs are shifted to file line numbers.
pub fn predicted_file_diffs(
    windows: &[Window],
    edit: &WindowEdit,
    sources: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let changed: BTreeMap<usize, &String> = edit.changed.iter().map(|(k, t)| (*k, t)).collect();
    let mut by_file: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (k, w) in windows.iter().enumerate() {
        by_file.entry(w.path.as_str()).or_default().push(k);
    }
    let mut out = BTreeMap::new();
    for (path, mut ks) in by_file {
        ks.sort_by_key(|&k| windows[k].start_line);
        if !ks.iter().any(|k| changed.contains_key(k)) {
            continue;
        }
        if let Some(src) = sources.get(path) {
            let lines: Vec<&str> = src.split_inclusive('\n').collect();
            let mut new = String::with_capacity(src.len() + 64);
            let mut next = 0usize; // 0-based next line to copy
            for &k in &ks {
                let w = &windows[k];
                let a = (w.start_line - 1).min(lines.len());
                let b = (a + w.len()).min(lines.len());
                if a < next {
                    continue; // overlapping windows: keep the first
                }
                new.extend(lines[next..a].iter().copied());
                match changed.get(&k) {
                    Some(t) => new.push_str(t),
                    None => new.extend(lines[a..b].iter().copied()),
                }
                next = b;
            }
            new.extend(lines[next.min(lines.len())..].iter().copied());
            let fp = FilePatch::from_texts(Some((path, src)), Some((path, &new)));
            if !fp.hunks.is_empty() {
                out.insert(path.to_string(), fp.to_string());
            }
            continue;
        }
        let mut hunks = Vec::new();
        let mut delta: isize = 0;
        for k in ks {
            let w = &windows[k];
            let Some(new) = changed.get(&k) else { continue };
            let mut hs = crate::swe::diff::diff_hunks(&w.text, new, 3);
            let old_off = w.start_line - 1;
            let new_off = (old_off as isize + delta).max(0) as usize;
            shift(&mut hs, old_off, new_off);
            delta += new.split_inclusive('\n').count() as isize - w.len() as isize;
            hunks.extend(hs);
        }
        if hunks.is_empty() {
            continue;
        }
        let fp = FilePatch {
            hunks,
            ..FilePatch::from_texts(Some((path, "")), Some((path, "")))
        };
        out.insert(path.to_string(), fp.to_string());
    }
    out
}

/// Per-file gold diffs of a patch, normalised the same way (no `index` lines, no hunk sections);
/// test files are left out. A patch that does not parse gives no files.
pub fn gold_file_diffs(gold_patch: &str) -> BTreeMap<String, String> {
    let Ok(p) = Patch::parse(gold_patch) else {
        return BTreeMap::new();
    };
    p.files
        .into_iter()
        .filter(|f| !crate::swe::codemap::is_test_path(f.path()))
        .map(|mut f| {
            f.index = None;
            for h in &mut f.hunks {
                h.section.clear();
            }
            (f.path().to_string(), f.to_string())
        })
        .collect()
}

/// SWE-RL patch-similarity reward: mean over the union of files of the sequence-matcher ratio of
/// predicted vs gold per-file diffs; -1 on a format error (no block, unknown file, SEARCH not found).
pub fn patch_similarity_reward(
    answer_text: &str,
    shown: &[Window],
    sources: &BTreeMap<String, String>,
    gold_patch: &str,
) -> RewardBreakdown {
    let blocks = answer::parse_edit(answer_text);
    let gold = gold_file_diffs(gold_patch);
    let n_blocks = blocks.len();
    let edit = match apply_to_windows(shown, &blocks) {
        Ok(e) => e,
        Err(ZeroReason::NoChange) => {
            return RewardBreakdown::zero(ZeroReason::NoChange, n_blocks, gold.len())
        }
        Err(reason) => {
            return RewardBreakdown {
                reward: -1.0,
                ..RewardBreakdown::zero(reason, n_blocks, gold.len())
            }
        }
    };
    let pred = predicted_file_diffs(shown, &edit, sources);
    let files: BTreeSet<&String> = gold.keys().chain(pred.keys()).collect();
    let empty = String::new();
    let mut total = 0.0;
    for f in &files {
        let g = gold.get(*f).unwrap_or(&empty);
        let p = pred.get(*f).unwrap_or(&empty);
        total += f64::from(similar::TextDiff::from_chars(g.as_str(), p.as_str()).ratio());
    }
    let ratio = if files.is_empty() {
        0.0
    } else {
        total / files.len() as f64
    };
    RewardBreakdown {
        reward: ratio,
        precision: ratio,
        recall: ratio,
        predicted: pred.len(),
        truth: gold.len(),
        zero_reason: (ratio == 0.0).then_some(ZeroReason::NoOverlap),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f_beta_by_hand() {
        // P = 1/2, R = 1: (1+9) * 0.5 * 1 / (9*0.5 + 1) = 5 / 5.5
        assert!((f_beta(0.5, 1.0, 3.0) - 5.0 / 5.5).abs() < 1e-12);
        // P = 1, R = 1/2: 10 * 0.5 / (9 + 0.5) = 5 / 9.5
        assert!((f_beta(1.0, 0.5, 3.0) - 5.0 / 9.5).abs() < 1e-12);
        assert_eq!(f_beta(0.0, 0.0, 3.0), 0.0);
    }
}
