//! Per-instance scores of an evaluated checkpoint, saved beside a run's report
//! (`scores_<stage>.json`), and the paired deltas between checkpoints: the stages of one run
//! (`sorft repro`'s table) or the same stage of several runs on the same test split (`sorft data
//! compare`: curation modes, ablations, algorithms side by side).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::engine::rng::random_u64;
use crate::pipeline::compare::{binary_deltas, cluster_deltas, delta_section, Delta};
use crate::swe::subtask::Subtask;

/// Per-instance scores of one checkpoint on the test split.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageScores {
    /// Subtask rewards, free greedy decoding, one cluster per instance.
    pub free: Vec<Vec<f64>>,
    /// Subtask rewards, constrained greedy decoding (when measured).
    pub constrained: Option<Vec<Vec<f64>>>,
    /// Sampled subtask rewards (when measured).
    pub sampled: Option<Vec<Vec<f64>>>,
    /// Agentless pipeline outcomes per instance: `file`, `function`, `line`, `edit` hits and
    /// `resolved`.
    pub hits: BTreeMap<String, Vec<bool>>,
    /// Characters the model wrote per instance over the pipeline's answers (inference cost).
    #[serde(default)]
    pub answer_chars: Vec<f64>,
}

/// One checkpoint's scores as saved: which instances the clusters and the pipeline rows belong
/// to, so that runs are paired instance by instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SavedScores {
    /// `initial`, `sft` or `sft+rl`.
    pub stage: String,
    /// Instance of each subtask-reward cluster, in cluster order.
    pub cluster_instances: Vec<String>,
    /// Records per cluster (pairs clusters only when the prompts match).
    pub cluster_sizes: Vec<usize>,
    /// Instance of each pipeline row (`hits`, `answer_chars`), in row order.
    pub pipeline_instances: Vec<String>,
    /// The scores.
    pub scores: StageScores,
}

/// The file a stage's scores are saved to in a run folder.
pub fn scores_path(run: &Path, stage: &str) -> std::path::PathBuf {
    run.join(format!("scores_{}.json", stage.replace('+', "_")))
}

/// Writes `s` to its file in `run`.
pub fn save(run: &Path, s: &SavedScores) -> anyhow::Result<()> {
    let p = scores_path(run, &s.stage);
    let text = serde_json::to_string(s)?;
    std::fs::write(&p, text).with_context(|| p.display().to_string())
}

/// Reads a stage's saved scores from a run folder, checking that its rows are consistent.
pub fn load(run: &Path, stage: &str) -> anyhow::Result<SavedScores> {
    let p = scores_path(run, stage);
    let text = std::fs::read_to_string(&p).with_context(|| {
        format!(
            "{}: no saved scores (evaluate the run with this version of sorft)",
            p.display()
        )
    })?;
    let s: SavedScores =
        serde_json::from_str(&text).with_context(|| format!("{}: malformed", p.display()))?;
    let n = s.cluster_instances.len();
    let rows_ok = |v: &Option<Vec<Vec<f64>>>| v.as_ref().is_none_or(|c| c.len() == n);
    let pipe = s.pipeline_instances.len();
    if s.cluster_sizes.len() != n
        || s.scores.free.len() != n
        || !rows_ok(&s.scores.constrained)
        || !rows_ok(&s.scores.sampled)
        || s.scores.hits.values().any(|h| h.len() != pipe)
        || !(s.scores.answer_chars.is_empty() || s.scores.answer_chars.len() == pipe)
    {
        anyhow::bail!(
            "{}: malformed (row counts disagree with the instance lists)",
            p.display()
        );
    }
    Ok(s)
}

/// Every delta between consecutive checkpoints (and first -> last with three or more): subtask
/// rewards (free greedy first, the primary metric; constrained; sampled) with paired cluster
/// bootstrap intervals, the Agentless pipeline's hit rates and %Resolved with McNemar's test,
/// and the pipeline's answer length.
pub fn scores_deltas(stages: &[(&str, &StageScores)], seed: u64) -> Vec<Delta> {
    let seed = random_u64(seed, 0xb007, 0);
    let mut out = Vec::new();
    let metric = |f: &dyn Fn(&StageScores) -> Option<&Vec<Vec<f64>>>| -> Vec<(&str, Option<&Vec<Vec<f64>>>)> {
        stages.iter().map(|(name, s)| (*name, f(s))).collect()
    };
    out.extend(cluster_deltas(
        "subtask reward (free, greedy)",
        &metric(&|s| Some(&s.free)),
        seed,
    ));
    out.extend(cluster_deltas(
        "subtask reward (constrained, greedy)",
        &metric(&|s| s.constrained.as_ref()),
        seed,
    ));
    out.extend(cluster_deltas(
        "subtask reward (sampled)",
        &metric(&|s| s.sampled.as_ref()),
        seed,
    ));
    let mut keys: Vec<String> = Subtask::ALL.iter().map(|s| s.name().to_string()).collect();
    keys.push("resolved".to_string());
    for k in keys {
        let per: Option<Vec<(&str, &Vec<bool>)>> = stages
            .iter()
            .map(|(name, s)| s.hits.get(&k).map(|h| (*name, h)))
            .collect();
        if let Some(per) = per {
            let name = if k == "resolved" {
                "pipeline %Resolved".to_string()
            } else {
                format!("pipeline {k} hit")
            };
            out.extend(binary_deltas(&name, &per, seed));
        }
    }
    let chars: Vec<Vec<Vec<f64>>> = stages
        .iter()
        .map(|(_, s)| s.answer_chars.iter().map(|&c| vec![c]).collect())
        .collect();
    if chars.iter().all(|c| !c.is_empty()) {
        let per: Vec<(&str, Option<&Vec<Vec<f64>>>)> = stages
            .iter()
            .zip(&chars)
            .map(|((name, _), c)| (*name, Some(c)))
            .collect();
        out.extend(cluster_deltas("pipeline answer chars", &per, seed));
    }
    out
}

/// The markdown comparison of one stage across runs: each run against the first (the
/// baseline), paired instance by instance. Fails with one line when the runs were evaluated on
/// different instances or prompts.
pub fn compare_runs(runs: &[(String, SavedScores)], seed: u64) -> anyhow::Result<String> {
    let Some((base_name, base)) = runs.first() else {
        anyhow::bail!("no runs to compare");
    };
    if runs.len() < 2 {
        anyhow::bail!("compare needs at least two runs (a baseline and another)");
    }
    let mut md = format!(
        "Stage `{}` of each run against `{}`, paired over {} test instances.\n\n",
        base.stage,
        base_name,
        base.cluster_instances.len()
    );
    md.push_str(&means_table(runs));
    let mut deltas = Vec::new();
    for (name, s) in &runs[1..] {
        if s.cluster_instances != base.cluster_instances
            || s.cluster_sizes != base.cluster_sizes
            || s.pipeline_instances != base.pipeline_instances
        {
            anyhow::bail!(
                "{name} and {base_name} were evaluated on different test instances or prompts (same seed and data settings are needed)"
            );
        }
        deltas.extend(scores_deltas(
            &[
                (base_name.as_str(), &base.scores),
                (name.as_str(), &s.scores),
            ],
            seed,
        ));
    }
    md.push('\n');
    md.push_str(&delta_section(&deltas));
    Ok(md)
}

/// Means per run: subtask rewards, hit rates, %Resolved, answer length.
fn means_table(runs: &[(String, SavedScores)]) -> String {
    let flat = |c: &Vec<Vec<f64>>| -> f64 {
        let v: Vec<f64> = c.iter().flatten().copied().collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let opt = |c: &Option<Vec<Vec<f64>>>| {
        c.as_ref()
            .map_or("-".to_string(), |c| format!("{:.3}", flat(c)))
    };
    let rate = |h: Option<&Vec<bool>>| {
        h.map_or("-".to_string(), |h| {
            format!(
                "{:.1}%",
                100.0 * h.iter().filter(|&&x| x).count() as f64 / h.len().max(1) as f64
            )
        })
    };
    let mut md = String::from("| run | free greedy | constrained greedy | sampled | file hit | function hit | line hit | %Resolved | answer chars |\n|---|---|---|---|---|---|---|---|---|\n");
    for (name, s) in runs {
        let sc = &s.scores;
        let chars = if sc.answer_chars.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.0}",
                sc.answer_chars.iter().sum::<f64>() / sc.answer_chars.len() as f64
            )
        };
        md.push_str(&format!(
            "| {name} | {:.3} | {} | {} | {} | {} | {} | {} | {chars} |\n",
            flat(&sc.free),
            opt(&sc.constrained),
            opt(&sc.sampled),
            rate(sc.hits.get("file")),
            rate(sc.hits.get("function")),
            rate(sc.hits.get("line")),
            rate(sc.hits.get("resolved")),
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(
        n: usize,
        score: impl Fn(usize) -> f64,
        resolved: impl Fn(usize) -> bool,
    ) -> SavedScores {
        let ids: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
        let clusters: Vec<Vec<f64>> = (0..n).map(|i| vec![score(i), score(i)]).collect();
        let mut hits = BTreeMap::new();
        hits.insert("resolved".to_string(), (0..n).map(resolved).collect());
        SavedScores {
            stage: "sft".to_string(),
            cluster_instances: ids.clone(),
            cluster_sizes: vec![2; n],
            pipeline_instances: ids,
            scores: StageScores {
                free: clusters,
                constrained: None,
                sampled: None,
                hits,
                answer_chars: (0..n).map(|i| i as f64).collect(),
            },
        }
    }

    #[test]
    fn a_planted_gain_is_significant_and_no_change_is_not() {
        let base = saved(40, |i| if i % 4 == 0 { 0.5 } else { 0.0 }, |_| false);
        let better = saved(40, |i| if i % 4 == 3 { 0.0 } else { 0.5 }, |i| i % 2 == 0);
        let md = compare_runs(
            &[
                ("base".into(), base.clone()),
                ("better".into(), better),
                ("same".into(), base),
            ],
            1,
        )
        .unwrap();
        assert!(
            md.contains("subtask reward (free, greedy): base -> better (+0.250)"),
            "{md}"
        );
        assert!(md.contains("pipeline %Resolved: base -> better"), "{md}");
        assert!(!md.contains("base -> same (+"), "{md}");
        assert!(md.contains("| better | 0.375 |"), "{md}");
    }

    #[test]
    fn runs_on_other_instances_or_malformed_files_are_refused() {
        let a = saved(10, |_| 0.0, |_| false);
        let mut b = a.clone();
        b.pipeline_instances[3] = "other".to_string();
        let e = compare_runs(&[("a".into(), a.clone()), ("b".into(), b)], 0).unwrap_err();
        assert!(e.to_string().contains("different test instances"), "{e}");
        assert!(compare_runs(&[("a".into(), a.clone())], 0).is_err());

        let dir = tempfile::tempdir().unwrap();
        let mut bad = a.clone();
        bad.scores.free.pop();
        save(dir.path(), &bad).unwrap();
        let e = load(dir.path(), "sft").unwrap_err();
        assert!(format!("{e:#}").contains("malformed"), "{e:#}");
        std::fs::write(scores_path(dir.path(), "sft"), "{not json").unwrap();
        assert!(load(dir.path(), "sft").is_err());
        assert!(load(dir.path(), "sft+rl").is_err());
        save(dir.path(), &a).unwrap();
        assert_eq!(load(dir.path(), "sft").unwrap().cluster_instances.len(), 10);
    }
}
