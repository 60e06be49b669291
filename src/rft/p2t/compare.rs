//! Paired comparison of two `sorft repro` runs on the same held-out instances (e.g. stage-1
//! curation by rejection sampling against P2T): per-instance Agentless subtask rewards (a paired
//! cluster bootstrap of the mean difference), %Resolved (McNemar's exact test) and the mean length
//! of the generated answers, read from the runs' `predictions_<stage>.jsonl`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::rft::stats::{mcnemar, paired_cluster_bootstrap, StatsError};

/// Why two runs could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A predictions file could not be read.
    #[error("{path}: {msg}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
    /// The statistics failed (different instances, nothing to compare).
    #[error("{0}")]
    Stats(#[from] StatsError),
}

/// One held-out instance of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Subtask rewards along the chain (0 where it broke).
    pub rewards: [f64; 4],
    /// Resolved.
    pub resolved: bool,
    /// Characters of all generated answers.
    pub answer_chars: f64,
}

/// Rows of `dir/predictions_<stage>.jsonl` by instance id (lines need `rewards` and `resolved`).
pub fn read_run(dir: &Path, stage: &str) -> Result<BTreeMap<String, Row>, CompareError> {
    let path = dir.join(format!("predictions_{}.jsonl", stage.replace('+', "_")));
    let err = |msg: String| CompareError::Read {
        path: path.display().to_string(),
        msg,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (k, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| err(format!("line {}: {e}", k + 1)))?;
        let id = v["instance_id"]
            .as_str()
            .ok_or_else(|| err(format!("line {}: no instance_id", k + 1)))?;
        let rewards = v["rewards"].as_object().ok_or_else(|| {
            err(format!(
                "line {}: no rewards (a run made before P2T)",
                k + 1
            ))
        })?;
        let r = |s: &str| rewards.get(s).and_then(|x| x.as_f64()).unwrap_or(0.0);
        out.insert(
            id.to_string(),
            Row {
                rewards: [r("file"), r("function"), r("line"), r("edit")],
                resolved: v["resolved"].as_bool().unwrap_or(false),
                answer_chars: v["answer_chars"].as_f64().unwrap_or(0.0),
            },
        );
    }
    Ok(out)
}

/// A markdown table row comparing run `b` with run `a` at checkpoint `stage`.
pub fn compare(a: &Path, b: &Path, stage: &str, seed: u64) -> Result<String, CompareError> {
    let ra = read_run(a, stage)?;
    let rb = read_run(b, stage)?;
    let ids: Vec<&String> = ra.keys().filter(|k| rb.contains_key(*k)).collect();
    if ids.len() != ra.len() || ids.len() != rb.len() {
        return Err(StatsError::Unpaired(format!(
            "{} vs {} instances, {} shared",
            ra.len(),
            rb.len(),
            ids.len()
        ))
        .into());
    }
    let scores = |r: &BTreeMap<String, Row>| -> Vec<Vec<f64>> {
        ids.iter().map(|i| r[*i].rewards.to_vec()).collect()
    };
    let chars = |r: &BTreeMap<String, Row>| -> Vec<Vec<f64>> {
        ids.iter().map(|i| vec![r[*i].answer_chars]).collect()
    };
    let resolved =
        |r: &BTreeMap<String, Row>| -> Vec<bool> { ids.iter().map(|i| r[*i].resolved).collect() };
    let mean = |v: &[Vec<f64>]| {
        let all: Vec<f64> = v.iter().flatten().copied().collect();
        all.iter().sum::<f64>() / all.len().max(1) as f64
    };
    let pct = |v: &[bool]| 100.0 * v.iter().filter(|x| **x).count() as f64 / v.len().max(1) as f64;
    let reward = paired_cluster_bootstrap(&scores(&ra), &scores(&rb), 2000, 0.95, seed)?;
    let len = paired_cluster_bootstrap(&chars(&ra), &chars(&rb), 2000, 0.95, seed)?;
    let m = mcnemar(&resolved(&ra), &resolved(&rb))?;
    Ok(format!(
        "| {stage} | {} | {:.3} -> {:.3} | {reward} | {:.1} -> {:.1} (+{} -{}, p={:.3}) | {:.0} -> {:.0} | {:+.1} [{:+.1}, {:+.1}] |",
        ids.len(),
        mean(&scores(&ra)),
        mean(&scores(&rb)),
        pct(&resolved(&ra)),
        pct(&resolved(&rb)),
        m.gained,
        m.lost,
        m.p_value,
        mean(&chars(&ra)),
        mean(&chars(&rb)),
        len.estimate,
        len.lo,
        len.hi
    ))
}

/// The header of [`compare`]'s rows.
pub const HEADER: &str = "| checkpoint | instances | mean subtask reward (a -> b) | delta [95% paired bootstrap] | %Resolved (a -> b; gained, lost, McNemar p) | answer chars (a -> b) | delta chars [95%] |\n|---|---|---|---|---|---|---|";

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rows: &[(&str, f64, bool, f64)]) {
        let text: String = rows
            .iter()
            .map(|(id, r, res, c)| {
                format!(
                    "{}\n",
                    serde_json::json!({"instance_id": id, "model_patch": "", "rewards": {"file": r, "edit": r}, "resolved": res, "answer_chars": c})
                )
            })
            .collect();
        std::fs::write(dir.join("predictions_sft.jsonl"), text).unwrap();
    }

    #[test]
    fn paired_rows_compare_and_unpaired_runs_are_errors() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        write(
            a.path(),
            &[("x", 0.0, false, 100.0), ("y", 1.0, true, 200.0)],
        );
        write(b.path(), &[("x", 1.0, true, 50.0), ("y", 1.0, true, 100.0)]);
        let row = compare(a.path(), b.path(), "sft", 0).unwrap();
        assert!(row.contains("| 2 | 0.250 -> 0.500 |"), "{row}");
        assert!(row.contains("50.0 -> 100.0 (+1 -0"), "{row}");
        assert!(row.contains("150 -> 75"), "{row}");
        write(b.path(), &[("x", 1.0, true, 50.0)]);
        assert!(compare(a.path(), b.path(), "sft", 0).is_err());
        std::fs::write(
            b.path().join("predictions_sft.jsonl"),
            "{\"instance_id\": \"x\"}\n",
        )
        .unwrap();
        let e = compare(a.path(), b.path(), "sft", 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no rewards"), "{e}");
    }
}
