//! The four SoRFT subtasks as records: prompt, what the prompt showed, ground truth, and the reward
//! of an answer. One [`SubtaskRecord`] per (instance, subtask) is what `sorft data subtasks` writes.

use crate::swe::answer;
use crate::swe::codemap;
use crate::swe::instance::Instance;
use crate::swe::prompt;
use crate::swe::repo::Snapshot;
use crate::swe::reward::{self, RewardBreakdown, Window};
use crate::swe::truth::{FuncTarget, GroundTruth};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One of the four subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Subtask {
    /// File localization.
    File,
    /// Function localization.
    Function,
    /// Line localization.
    Line,
    /// Code edit generation.
    Edit,
}

impl Subtask {
    /// All four, in pipeline order.
    pub const ALL: [Subtask; 4] = [
        Subtask::File,
        Subtask::Function,
        Subtask::Line,
        Subtask::Edit,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Subtask::File => "file",
            Subtask::Function => "function",
            Subtask::Line => "line",
            Subtask::Edit => "edit",
        }
    }
}

/// Which edit reward to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EditReward {
    /// SoRFT: F-beta over modified lines.
    #[default]
    LineFbeta,
    /// SWE-RL: patch similarity.
    PatchSimilarity,
}

/// What a prompt showed: the only valid targets of an answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    /// Files listed (file subtask) or whose skeletons were shown (function subtask).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// Definitions visible in the skeletons (function subtask).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<FuncTarget>,
    /// Code windows (line and edit subtasks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// Full pre-edit text of the files with windows (edit subtask; for the patch-similarity diff).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
}

/// One (instance, subtask) training or evaluation record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubtaskRecord {
    /// The instance.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// Which subtask.
    pub subtask: Subtask,
    /// The prompt text.
    pub prompt: String,
    /// What the prompt showed.
    pub shown: Shown,
    /// Ground truth of the instance.
    pub truth: GroundTruth,
    /// The gold patch (for the patch-similarity reward).
    pub gold_patch: String,
    /// Where the views came from (`ground_truth` or `prediction`) and sizes.
    #[serde(default)]
    pub meta: serde_json::Map<String, serde_json::Value>,
}

impl SubtaskRecord {
    /// Scores a model answer for this record's subtask.
    pub fn reward(&self, answer_text: &str, edit: EditReward) -> RewardBreakdown {
        match self.subtask {
            Subtask::File => reward::file_reward(answer_text, &self.shown.files, &self.truth.files),
            Subtask::Function => {
                reward::function_reward(answer_text, &self.shown.functions, &self.truth.functions)
            }
            Subtask::Line => {
                reward::line_reward(answer_text, &self.shown.windows, &self.truth.lines)
            }
            Subtask::Edit => match edit {
                EditReward::LineFbeta => {
                    reward::edit_reward(answer_text, &self.shown.windows, &self.truth.lines)
                }
                EditReward::PatchSimilarity => reward::patch_similarity_reward(
                    answer_text,
                    &self.shown.windows,
                    &self.shown.sources,
                    &self.gold_patch,
                ),
            },
        }
    }
}

fn record(
    inst: &Instance,
    gt: &GroundTruth,
    subtask: Subtask,
    prompt: String,
    shown: Shown,
    source: &str,
) -> SubtaskRecord {
    let mut meta = serde_json::Map::new();
    meta.insert("view_source".into(), source.into());
    meta.insert("prompt_chars".into(), prompt.len().into());
    SubtaskRecord {
        instance_id: inst.instance_id.clone(),
        repo: inst.repo.clone(),
        subtask,
        prompt,
        shown,
        truth: gt.clone(),
        gold_patch: inst.patch.clone(),
        meta,
    }
}

/// File-localization record: the repository tree.
pub fn file_record(inst: &Instance, snap: &Snapshot, gt: &GroundTruth) -> SubtaskRecord {
    let root = inst.repo.rsplit('/').next().unwrap_or(&inst.repo);
    let tree = codemap::tree_view(root, snap.paths());
    let prompt = prompt::file_prompt(&inst.problem_statement, &tree);
    let shown = Shown {
        files: tree.files,
        ..Shown::default()
    };
    record(inst, gt, Subtask::File, prompt, shown, "repository")
}

/// Function-localization record over the skeletons of `files` (ground truth or a prediction).
pub fn function_record(
    inst: &Instance,
    snap: &Snapshot,
    gt: &GroundTruth,
    files: &[String],
    source: &str,
) -> SubtaskRecord {
    let (view, functions) = prompt::skeleton_view(snap, files);
    let prompt = prompt::function_prompt(&inst.problem_statement, &view);
    let shown = Shown {
        files: files.to_vec(),
        functions,
        ..Shown::default()
    };
    record(inst, gt, Subtask::Function, prompt, shown, source)
}

/// Line-localization record over `windows`.
pub fn line_record(
    inst: &Instance,
    snap: &Snapshot,
    gt: &GroundTruth,
    windows: Vec<Window>,
    source: &str,
) -> SubtaskRecord {
    let prompt = prompt::line_prompt(
        &inst.problem_statement,
        &prompt::numbered_view(snap, &windows),
    );
    let shown = Shown {
        windows,
        ..Shown::default()
    };
    record(inst, gt, Subtask::Line, prompt, shown, source)
}

/// Edit record over `windows`; keeps the full text of their files for the patch-similarity reward.
pub fn edit_record(
    inst: &Instance,
    snap: &Snapshot,
    gt: &GroundTruth,
    windows: Vec<Window>,
    source: &str,
) -> SubtaskRecord {
    let prompt = prompt::edit_prompt(&inst.problem_statement, &prompt::raw_view(&windows));
    let sources = windows
        .iter()
        .filter_map(|w| snap.text(&w.path).map(|t| (w.path.clone(), t.to_string())))
        .collect();
    let shown = Shown {
        windows,
        sources,
        ..Shown::default()
    };
    record(inst, gt, Subtask::Edit, prompt, shown, source)
}

/// The training records of an instance, later stages built from ground truth. Subtasks without
/// ground truth (no function target, no modified line) are left out.
pub fn training_records(inst: &Instance, snap: &Snapshot, gt: &GroundTruth) -> Vec<SubtaskRecord> {
    let mut out = Vec::new();
    if gt.files.is_empty() {
        return out;
    }
    out.push(file_record(inst, snap, gt));
    if !gt.functions.is_empty() {
        out.push(function_record(inst, snap, gt, &gt.files, "ground_truth"));
    }
    if !gt.lines.is_empty() {
        let windows = prompt::truth_windows(snap, &gt.functions, &gt.lines);
        out.push(line_record(inst, snap, gt, windows.clone(), "ground_truth"));
        out.push(edit_record(inst, snap, gt, windows, "ground_truth"));
    }
    out
}

/// The next stage's record built from a model's answer to `prev` (evaluation chaining):
/// file answer -> function record, function answer -> line record, line answer -> edit record.
pub fn next_from_prediction(
    inst: &Instance,
    snap: &Snapshot,
    prev: &SubtaskRecord,
    answer_text: &str,
) -> Option<SubtaskRecord> {
    let gt = &prev.truth;
    match prev.subtask {
        Subtask::File => {
            let files: Vec<String> = answer::parse_files(answer_text)
                .into_iter()
                .filter(|f| snap.text(f).is_some())
                .collect();
            (!files.is_empty()).then(|| function_record(inst, snap, gt, &files, "prediction"))
        }
        Subtask::Function => {
            let pred = answer::parse_functions(answer_text);
            let windows = prompt::predicted_windows(snap, &pred);
            (!windows.is_empty()).then(|| line_record(inst, snap, gt, windows, "prediction"))
        }
        Subtask::Line => {
            let lines: Vec<crate::swe::truth::LineTarget> = answer::parse_lines(answer_text)
                .into_iter()
                .map(|l| crate::swe::truth::LineTarget {
                    path: l.path,
                    line: l.line,
                })
                .collect();
            let windows = prompt::windows_for_locations(snap, &[], &lines);
            (!windows.is_empty()).then(|| edit_record(inst, snap, gt, windows, "prediction"))
        }
        Subtask::Edit => None,
    }
}
