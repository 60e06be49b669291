//! `sorft export`: the four subtasks' prompts with their ground truth in the dataset layouts of
//! Ray-based RL engines, so that they train on sorft's data and score with sorft's rewards.
//!
//! veRL: parquet rows `data_source`, `prompt` (chat messages), `ability`,
//! `reward_model = {style: "rule", ground_truth}`, `extra_info`. OpenRLHF: JSONL with the prompt and
//! the label under the keys its `--input_key` / `--label_key` name. In both, the ground truth is a
//! [`RewardLabel`] as JSON text: everything sorft's rule reward needs, so the reward service and the
//! veRL reward function score an answer without the repositories.

#[cfg(feature = "export-parquet")]
mod parquet_rows;

use crate::swe::instance::{self, Instance};
use crate::swe::repo::RepoStore;
use crate::swe::subtask::{self, EditReward, Shown, Subtask, SubtaskRecord};
use crate::swe::truth::{self, GroundTruth};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the [`RewardLabel`] layout written into exported datasets.
pub const LABEL_VERSION: u32 = 1;

/// Errors of the export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading instances failed.
    #[error(transparent)]
    Instances(#[from] instance::InstanceError),
    /// An output file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The parquet writer failed.
    #[error("{path}: parquet: {msg}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The writer's message.
        msg: String,
    },
    /// Bad options or inputs.
    #[error("{0}")]
    Invalid(String),
}

/// The ground truth of one exported prompt: the subtask record without its prompt. Its JSON text is
/// veRL's `reward_model.ground_truth` and OpenRLHF's label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardLabel {
    /// Layout version ([`LABEL_VERSION`]).
    pub v: u32,
    /// The instance.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// Which subtask.
    pub subtask: Subtask,
    /// What the prompt showed (the only valid targets).
    pub shown: Shown,
    /// Ground truth of the instance.
    pub truth: GroundTruth,
    /// The gold patch (patch-similarity edit reward).
    #[serde(default)]
    pub gold_patch: String,
}

impl RewardLabel {
    /// The label of a record.
    pub fn from_record(rec: &SubtaskRecord) -> RewardLabel {
        RewardLabel {
            v: LABEL_VERSION,
            instance_id: rec.instance_id.clone(),
            repo: rec.repo.clone(),
            subtask: rec.subtask,
            shown: rec.shown.clone(),
            truth: rec.truth.clone(),
            gold_patch: rec.gold_patch.clone(),
        }
    }

    /// Parses a label's JSON text; the error names the first bad field.
    pub fn parse(text: &str) -> Result<RewardLabel, String> {
        let label: RewardLabel =
            serde_json::from_str(text).map_err(|e| format!("not a sorft reward label: {e}"))?;
        if label.v != LABEL_VERSION {
            return Err(format!(
                "reward label version {} (this sorft reads {LABEL_VERSION})",
                label.v
            ));
        }
        Ok(label)
    }

    /// The label as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The subtask record this label came from (empty prompt), to score answers with.
    pub fn to_record(&self) -> SubtaskRecord {
        SubtaskRecord {
            instance_id: self.instance_id.clone(),
            repo: self.repo.clone(),
            subtask: self.subtask,
            prompt: String::new(),
            shown: self.shown.clone(),
            truth: self.truth.clone(),
            gold_patch: self.gold_patch.clone(),
            meta: serde_json::Map::new(),
        }
    }

    /// sorft's rule reward of `answer` (exactly [`SubtaskRecord::reward`]).
    pub fn reward(&self, answer: &str, edit: EditReward) -> crate::swe::reward::RewardBreakdown {
        self.to_record().reward(answer, edit)
    }
}

/// Which engine's layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// veRL parquet.
    Verl,
    /// OpenRLHF JSONL.
    Openrlhf,
}

impl Format {
    /// Parses `verl` or `openrlhf`.
    pub fn parse(s: &str) -> Result<Format, ExportError> {
        match s {
            "verl" => Ok(Format::Verl),
            "openrlhf" => Ok(Format::Openrlhf),
            _ => Err(ExportError::Invalid(format!(
                "unknown format {s:?} (verl or openrlhf)"
            ))),
        }
    }
}

/// Options of [`export`].
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Output layout.
    pub format: Format,
    /// Subtasks to export (pipeline order is kept).
    pub subtasks: Vec<Subtask>,
    /// Distractor files in function-localization prompts (as `sorft data subtasks --distractors`).
    pub distractors: usize,
    /// Split name: the file name (`SPLIT.parquet` / `SPLIT.jsonl`) and `extra_info.split`.
    pub split: String,
    /// veRL `data_source` of every row.
    pub data_source: String,
    /// OpenRLHF prompt key (its `--input_key`).
    pub input_key: String,
    /// OpenRLHF label key (its `--label_key`).
    pub label_key: String,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            format: Format::Verl,
            subtasks: Subtask::ALL.to_vec(),
            distractors: 0,
            split: "train".into(),
            data_source: "sorft".into(),
            input_key: "input".into(),
            label_key: "label".into(),
        }
    }
}

/// One exported prompt, engine-neutral.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRow {
    /// veRL `data_source`.
    pub data_source: String,
    /// The user message (sorft's prompts are one user turn).
    pub prompt: String,
    /// veRL `ability`: `swe_<subtask>`.
    pub ability: String,
    /// [`RewardLabel`] JSON.
    pub ground_truth: String,
    /// Split name.
    pub split: String,
    /// Row number in the file.
    pub index: i64,
    /// The instance.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// Subtask name.
    pub subtask: String,
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Default)]
pub struct ExportSummary {
    /// The file written.
    pub path: PathBuf,
    /// Rows per subtask.
    pub rows: BTreeMap<String, usize>,
    /// Instances left out, with the reason (first few).
    pub skipped: Vec<String>,
    /// Instances read.
    pub instances: usize,
}

/// The subtask records of `instances` (as `sorft data subtasks` builds them), and the instances
/// that gave none, with why.
pub fn build_records(
    instances: &[Instance],
    repos: &Path,
    opts: &subtask::RecordOptions,
) -> (Vec<SubtaskRecord>, Vec<String>) {
    use rayon::prelude::*;
    let store = RepoStore::new(repos);
    let per: Vec<Result<Vec<SubtaskRecord>, String>> = instances
        .par_iter()
        .map(|inst| {
            let snap = store
                .snapshot(&inst.repo, &inst.base_commit)
                .map_err(|e| format!("{}: {e}", inst.instance_id))?;
            let gt = truth::ground_truth(&inst.patch, &snap)
                .map_err(|e| format!("{}: {e}", inst.instance_id))?;
            Ok(subtask::training_records_with(inst, &snap, &gt, opts))
        })
        .collect();
    let mut recs = Vec::new();
    let mut skipped = Vec::new();
    for r in per {
        match r {
            Ok(v) => recs.extend(v),
            Err(e) => skipped.push(e),
        }
    }
    (recs, skipped)
}

/// Rows of the chosen subtasks' records, numbered in order.
pub fn rows(records: &[SubtaskRecord], opts: &ExportOptions) -> Vec<ExportRow> {
    records
        .iter()
        .filter(|r| opts.subtasks.contains(&r.subtask))
        .enumerate()
        .map(|(i, r)| ExportRow {
            data_source: opts.data_source.clone(),
            prompt: r.prompt.clone(),
            ability: format!("swe_{}", r.subtask.name()),
            ground_truth: RewardLabel::from_record(r).to_json(),
            split: opts.split.clone(),
            index: i as i64,
            instance_id: r.instance_id.clone(),
            repo: r.repo.clone(),
            subtask: r.subtask.name().to_string(),
        })
        .collect()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes OpenRLHF JSONL: the prompt under `input_key`, the label under `label_key`, plus
/// `instance_id`, `subtask` and `data_source` for bookkeeping.
pub fn write_openrlhf(
    rows: &[ExportRow],
    path: &Path,
    input_key: &str,
    label_key: &str,
) -> Result<(), ExportError> {
    if input_key == label_key || input_key.is_empty() || label_key.is_empty() {
        return Err(ExportError::Invalid(format!(
            "--input-key {input_key:?} and --label-key {label_key:?} must be two different non-empty keys"
        )));
    }
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut w = std::io::BufWriter::new(file);
    for r in rows {
        let mut obj = serde_json::Map::new();
        obj.insert("data_source".into(), r.data_source.clone().into());
        obj.insert("instance_id".into(), r.instance_id.clone().into());
        obj.insert("subtask".into(), r.subtask.clone().into());
        // The two engine keys last, so that they win should they collide with a bookkeeping key.
        obj.insert(input_key.into(), r.prompt.clone().into());
        obj.insert(label_key.into(), r.ground_truth.clone().into());
        let line = serde_json::Value::Object(obj).to_string();
        writeln!(w, "{line}").map_err(io_err(path))?;
    }
    w.flush().map_err(io_err(path))
}

/// Writes veRL parquet (needs the `export-parquet` feature).
pub fn write_verl(rows: &[ExportRow], path: &Path) -> Result<(), ExportError> {
    #[cfg(feature = "export-parquet")]
    {
        parquet_rows::write(rows, path)
    }
    #[cfg(not(feature = "export-parquet"))]
    {
        let _ = (rows, path);
        Err(ExportError::Invalid(
            "this sorft was built without the `export-parquet` feature; rebuild with it or use --format openrlhf".into(),
        ))
    }
}

/// Reads instances, builds their subtask records and writes `OUT/SPLIT.parquet` (veRL) or
/// `OUT/SPLIT.jsonl` (OpenRLHF).
pub fn export(
    instances: &Path,
    repos: &Path,
    out: &Path,
    opts: &ExportOptions,
) -> Result<ExportSummary, ExportError> {
    if !repos.is_dir() {
        return Err(ExportError::Invalid(format!(
            "--repos {}: not a folder",
            repos.display()
        )));
    }
    if opts.subtasks.is_empty() {
        return Err(ExportError::Invalid("no subtask to export".into()));
    }
    if opts.split.is_empty() || opts.split.contains('/') {
        return Err(ExportError::Invalid(format!(
            "--split {:?}: must be a plain file name",
            opts.split
        )));
    }
    let list = instance::read_jsonl(instances)?;
    let record_opts = subtask::RecordOptions {
        distractor_files: opts.distractors,
    };
    let (records, skipped) = build_records(&list, repos, &record_opts);
    let rows = rows(&records, opts);
    if rows.is_empty() {
        return Err(ExportError::Invalid(format!(
            "no row to export from {} instances; first problem: {}",
            list.len(),
            skipped.first().map(String::as_str).unwrap_or("none")
        )));
    }
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let path = match opts.format {
        Format::Verl => out.join(format!("{}.parquet", opts.split)),
        Format::Openrlhf => out.join(format!("{}.jsonl", opts.split)),
    };
    match opts.format {
        Format::Verl => write_verl(&rows, &path)?,
        Format::Openrlhf => write_openrlhf(&rows, &path, &opts.input_key, &opts.label_key)?,
    }
    let mut counts = BTreeMap::new();
    for r in &rows {
        *counts.entry(r.subtask.clone()).or_insert(0) += 1;
    }
    Ok(ExportSummary {
        path,
        rows: counts,
        skipped,
        instances: list.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SubtaskRecord {
        SubtaskRecord {
            instance_id: "o__r-1".into(),
            repo: "o/r".into(),
            subtask: Subtask::File,
            prompt: "which file?".into(),
            shown: Shown {
                files: vec!["a.py".into(), "b.py".into()],
                ..Shown::default()
            },
            truth: GroundTruth {
                files: vec!["a.py".into()],
                ..GroundTruth::default()
            },
            gold_patch: String::new(),
            meta: serde_json::Map::new(),
        }
    }

    #[test]
    fn a_label_scores_like_its_record() {
        let rec = record();
        let label = RewardLabel::parse(&RewardLabel::from_record(&rec).to_json()).unwrap();
        for answer in ["a.py", "b.py", "a.py\nb.py", "", "c.py", "```\na.py\n```"] {
            assert_eq!(
                label.reward(answer, EditReward::LineFbeta),
                rec.reward(answer, EditReward::LineFbeta),
                "{answer:?}"
            );
        }
        assert!(label.reward("a.py", EditReward::LineFbeta).reward > 0.99);
    }

    #[test]
    fn bad_labels_are_refused_with_a_reason() {
        assert!(RewardLabel::parse("{").unwrap_err().contains("not a sorft"));
        let mut v: serde_json::Value =
            serde_json::from_str(&RewardLabel::from_record(&record()).to_json()).unwrap();
        v["v"] = 99.into();
        assert!(RewardLabel::parse(&v.to_string())
            .unwrap_err()
            .contains("version 99"));
    }

    #[test]
    fn openrlhf_rows_use_the_requested_keys() {
        let rows = rows(&[record()], &ExportOptions::default());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.jsonl");
        write_openrlhf(&rows, &p, "context_messages", "answer").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&p).unwrap().trim()).unwrap();
        assert_eq!(v["context_messages"], "which file?");
        assert!(RewardLabel::parse(v["answer"].as_str().unwrap()).is_ok());
        assert!(write_openrlhf(&rows, &p, "x", "x").is_err());
    }
}
