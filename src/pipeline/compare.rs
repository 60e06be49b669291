//! Honest stage-to-stage comparisons for `sorft repro`: the repository split (train / dev /
//! test), per-instance score clusters, every stage-to-stage delta with a paired cluster bootstrap
//! interval ([`crate::rft::stats::paired_cluster_bootstrap`]) and McNemar's exact test for hit
//! rates ([`crate::rft::stats::mcnemar`]), and the mean ± std of each delta over seeds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use crate::rft::stats::{mcnemar, mean_std, paired_cluster_bootstrap, Interval, McNemar};
use crate::swe::subtask::SubtaskRecord;

/// Repositories of each split (disjoint; every repository in exactly one).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RepoSplit {
    /// Repositories the stages train on.
    pub train: BTreeSet<String>,
    /// Repositories for tuning (never trained on, never reported as the result).
    pub dev: BTreeSet<String>,
    /// Repositories the reported results come from.
    pub test: BTreeSet<String>,
}

/// Splits sorted repository names: the last `ceil(n * test_fraction)` (at least 1) are test, the
/// `ceil(n * dev_fraction)` before them dev (0 when `dev_fraction` is 0), the rest train (at
/// least 1). `None` when fewer than two repositories make a train and a test split.
pub fn split_repos(repos: &[String], test_fraction: f64, dev_fraction: f64) -> Option<RepoSplit> {
    let mut sorted: Vec<String> = repos.to_vec();
    sorted.sort();
    sorted.dedup();
    let n = sorted.len();
    if n < 2 {
        return None;
    }
    let n_test = ((n as f64 * test_fraction.max(0.0)).ceil() as usize).clamp(1, n - 1);
    let n_dev = if dev_fraction > 0.0 {
        ((n as f64 * dev_fraction).ceil() as usize).min(n - 1 - n_test)
    } else {
        0
    };
    let n_train = n - n_test - n_dev;
    Some(RepoSplit {
        train: sorted[..n_train].iter().cloned().collect(),
        dev: sorted[n_train..n_train + n_dev].iter().cloned().collect(),
        test: sorted[n_train + n_dev..].iter().cloned().collect(),
    })
}

/// Record indices grouped by instance: records of one instance in their order, instances in
/// order of first appearance.
fn by_instance(recs: &[SubtaskRecord]) -> Vec<(&str, Vec<usize>)> {
    let mut order: Vec<&str> = Vec::new();
    let mut by: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (k, r) in recs.iter().enumerate() {
        let id = r.instance_id.as_str();
        if !by.contains_key(id) {
            order.push(id);
        }
        by.entry(id).or_default().push(k);
    }
    order
        .into_iter()
        .filter_map(|id| by.remove(id).map(|ix| (id, ix)))
        .collect()
}

/// Per-record scores grouped into one cluster per instance (records of one instance in their
/// order; instances in order of first appearance): the unit the bootstrap resamples.
pub fn clusters(recs: &[SubtaskRecord], scores: &[f64]) -> Vec<Vec<f64>> {
    by_instance(&recs[..recs.len().min(scores.len())])
        .into_iter()
        .map(|(_, ix)| ix.into_iter().map(|k| scores[k]).collect())
        .collect()
}

/// The instance of each cluster [`clusters`] makes of `recs`, and the cluster's size.
pub fn cluster_ids(recs: &[SubtaskRecord]) -> (Vec<String>, Vec<usize>) {
    by_instance(recs)
        .into_iter()
        .map(|(id, ix)| (id.to_string(), ix.len()))
        .unzip()
}

/// One stage-to-stage difference of one metric.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Delta {
    /// What is compared, e.g. `subtask reward (free, greedy)` or `hit: file`.
    pub metric: String,
    /// The earlier stage.
    pub from: String,
    /// The later stage.
    pub to: String,
    /// Mean difference (`to - from`) with its paired cluster bootstrap 95% interval.
    pub interval: Interval,
    /// McNemar's exact test, for binary outcomes (hit rates, resolved).
    pub mcnemar: Option<McNemar>,
}

impl Delta {
    /// Significant at the 5% level: the interval excludes 0, or for binary outcomes McNemar's
    /// p-value is below 0.05.
    pub fn significant(&self) -> bool {
        match &self.mcnemar {
            Some(m) => m.p_value < 0.05,
            None => self.interval.excludes_zero(),
        }
    }

    /// The key that identifies this delta across seeds.
    pub fn key(&self) -> String {
        format!("{}: {} -> {}", self.metric, self.from, self.to)
    }
}

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 2000;

/// Every stage-to-stage delta (consecutive stages and first -> last) of one metric whose values
/// are per-instance clusters, one entry per stage (`None`: not measured at that stage).
pub fn cluster_deltas(
    metric: &str,
    stages: &[(&str, Option<&Vec<Vec<f64>>>)],
    seed: u64,
) -> Vec<Delta> {
    stage_pairs(stages.len())
        .into_iter()
        .filter_map(|(i, j)| {
            let (a, b) = (stages[i].1?, stages[j].1?);
            let interval = paired_cluster_bootstrap(a, b, RESAMPLES, 0.95, seed).ok()?;
            Some(Delta {
                metric: metric.to_string(),
                from: stages[i].0.to_string(),
                to: stages[j].0.to_string(),
                interval,
                mcnemar: None,
            })
        })
        .collect()
}

/// Deltas of a binary outcome per instance (a hit, resolved): the rate difference with its
/// bootstrap interval and McNemar's exact test.
pub fn binary_deltas(metric: &str, stages: &[(&str, &Vec<bool>)], seed: u64) -> Vec<Delta> {
    let as_clusters = |v: &Vec<bool>| -> Vec<Vec<f64>> {
        v.iter().map(|&h| vec![if h { 1.0 } else { 0.0 }]).collect()
    };
    stage_pairs(stages.len())
        .into_iter()
        .filter_map(|(i, j)| {
            let (a, b) = (stages[i].1, stages[j].1);
            let interval =
                paired_cluster_bootstrap(&as_clusters(a), &as_clusters(b), RESAMPLES, 0.95, seed)
                    .ok()?;
            Some(Delta {
                metric: metric.to_string(),
                from: stages[i].0.to_string(),
                to: stages[j].0.to_string(),
                interval,
                mcnemar: mcnemar(a, b).ok(),
            })
        })
        .collect()
}

/// (i, i+1) for consecutive stages, then (0, last) when there are three or more.
fn stage_pairs(n: usize) -> Vec<(usize, usize)> {
    let mut p: Vec<(usize, usize)> = (1..n).map(|j| (j - 1, j)).collect();
    if n >= 3 {
        p.push((0, n - 1));
    }
    p
}

/// The markdown table of deltas and a sentence naming the significant ones.
pub fn delta_section(deltas: &[Delta]) -> String {
    let mut md = String::from(
        "| metric | from -> to | delta [95% CI] | McNemar (gained/lost, p) | significant |\n|---|---|---|---|---|\n",
    );
    for d in deltas {
        let mc = d.mcnemar.map_or("-".to_string(), |m| {
            format!("+{}/-{}, p={:.3}", m.gained, m.lost, m.p_value)
        });
        md.push_str(&format!(
            "| {} | {} -> {} | {} | {} | {} |\n",
            d.metric,
            d.from,
            d.to,
            d.interval,
            mc,
            if d.significant() { "yes" } else { "no" }
        ));
    }
    let sig: Vec<String> = deltas
        .iter()
        .filter(|d| d.significant())
        .map(|d| format!("{} ({:+.3})", d.key(), d.interval.estimate))
        .collect();
    md.push('\n');
    if sig.is_empty() {
        md.push_str("No delta is significant at the 5% level (every interval includes 0 and every McNemar p >= 0.05).\n");
    } else {
        md.push_str(&format!(
            "Significant at the 5% level: {}. Every other delta is not.\n",
            sig.join("; ")
        ));
    }
    md
}

/// The deltas of a finished run in `out` (its `report.md` written, its `config.toml` equal to
/// `config_toml`), read from the `"stage": "delta"` lines of its `metrics.jsonl`; `None` when the
/// run is not finished, ran another configuration, or its deltas cannot be read (then it runs
/// again). Lets `repro --seeds ... --resume` skip seeds that already finished.
pub fn finished_deltas(out: &Path, config_toml: &str) -> Option<Vec<Delta>> {
    if !out.join("report.md").is_file() {
        return None;
    }
    let cfg = std::fs::read_to_string(out.join("config.toml")).ok()?;
    if cfg != config_toml {
        return None;
    }
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).ok()?;
    let mut deltas = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("stage").and_then(|s| s.as_str()) == Some("delta") {
            deltas.push(serde_json::from_value(v).ok()?);
        }
    }
    (!deltas.is_empty()).then_some(deltas)
}

/// Mean ± std of each delta over seeds (in the order of the first seed's deltas), with how many
/// seeds agree in sign with the mean.
pub fn seeds_section(runs: &[(u64, Vec<Delta>)]) -> String {
    let mut keys: Vec<String> = Vec::new();
    let mut vals: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut sig: BTreeMap<String, usize> = BTreeMap::new();
    for (_, ds) in runs {
        for d in ds {
            let k = d.key();
            if !vals.contains_key(&k) {
                keys.push(k.clone());
            }
            vals.entry(k.clone()).or_default().push(d.interval.estimate);
            *sig.entry(k).or_default() += d.significant() as usize;
        }
    }
    let seeds: Vec<String> = runs.iter().map(|(s, _)| s.to_string()).collect();
    let mut md = format!(
        "# sorft repro over seeds {}\n\n| delta | mean ± std | per seed | same sign | significant in |\n|---|---|---|---|---|\n",
        seeds.join(", ")
    );
    for k in keys {
        let v = &vals[&k];
        let Some((m, s)) = mean_std(v) else { continue };
        let same = v
            .iter()
            .filter(|x| x.signum() == m.signum() && **x != 0.0)
            .count();
        let each: Vec<String> = v.iter().map(|x| format!("{x:+.3}")).collect();
        md.push_str(&format!(
            "| {k} | {m:+.3} ± {s:.3} | {} | {same}/{} | {}/{} |\n",
            each.join(" "),
            v.len(),
            sig[&k],
            v.len()
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("repo{i:02}")).collect()
    }

    #[test]
    fn finished_deltas_are_read_only_from_a_finished_run_of_the_same_configuration() {
        let dir = std::env::temp_dir().join(format!("sorft-seeds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = Delta {
            metric: "subtask reward (free, greedy)".into(),
            from: "initial".into(),
            to: "sft".into(),
            interval: Interval {
                estimate: 0.25,
                lo: 0.1,
                hi: 0.4,
            },
            mcnemar: None,
        };
        let mut line = serde_json::to_value(&d).unwrap();
        line["stage"] = "delta".into();
        let metrics = format!("{{\"stage\":\"eval:sft\",\"x\":1}}\n{line}\n");
        std::fs::write(dir.join("metrics.jsonl"), &metrics).unwrap();
        std::fs::write(dir.join("config.toml"), "seed = 1\n").unwrap();
        // No report yet: the run did not finish.
        assert!(finished_deltas(&dir, "seed = 1\n").is_none());
        std::fs::write(dir.join("report.md"), "# report\n").unwrap();
        let got = finished_deltas(&dir, "seed = 1\n").unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key(), d.key());
        assert_eq!(got[0].interval, d.interval);
        // Another configuration, or a malformed line: run again.
        assert!(finished_deltas(&dir, "seed = 2\n").is_none());
        std::fs::write(dir.join("metrics.jsonl"), format!("{metrics}not json\n")).unwrap();
        assert!(finished_deltas(&dir, "seed = 1\n").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_split_is_disjoint_complete_and_keeps_a_training_repository() {
        let r = names(20);
        let s = split_repos(&r, 0.25, 0.15).unwrap();
        assert_eq!((s.train.len(), s.dev.len(), s.test.len()), (12, 3, 5));
        let all: BTreeSet<String> = s.train.union(&s.dev).chain(&s.test).cloned().collect();
        assert_eq!(all.len(), 20);
        assert!(s.train.is_disjoint(&s.test) && s.dev.is_disjoint(&s.test));
        let t = split_repos(&names(3), 0.9, 0.9).unwrap();
        assert_eq!((t.train.len(), t.dev.len(), t.test.len()), (1, 0, 2));
        assert_eq!(split_repos(&names(4), 0.25, 0.0).unwrap().dev.len(), 0);
        assert!(split_repos(&names(1), 0.25, 0.1).is_none());
    }

    #[test]
    fn deltas_find_a_real_gain_and_not_noise() {
        // 60 instances, 4 subtasks each: stage b is 0.3 better everywhere; stage c equals b.
        let a: Vec<Vec<f64>> = (0..60).map(|i| vec![(i % 3) as f64 * 0.1; 4]).collect();
        let b: Vec<Vec<f64>> = a
            .iter()
            .map(|c| c.iter().map(|x| x + 0.3).collect())
            .collect();
        let c = b.clone();
        let ds = cluster_deltas(
            "reward",
            &[
                ("initial", Some(&a)),
                ("sft", Some(&b)),
                ("sft+rl", Some(&c)),
            ],
            1,
        );
        assert_eq!(ds.len(), 3);
        assert!(ds[0].significant() && (ds[0].interval.estimate - 0.3).abs() < 1e-9);
        assert!(!ds[1].significant());
        assert_eq!(ds[2].key(), "reward: initial -> sft+rl");
        let md = delta_section(&ds);
        assert!(
            md.contains("Significant at the 5% level: reward: initial -> sft"),
            "{md}"
        );
        // A stage not measured gives no delta rather than a fake one.
        assert_eq!(
            cluster_deltas("r", &[("a", Some(&a)), ("b", None)], 1).len(),
            0
        );
    }

    #[test]
    fn hit_deltas_use_mcnemar() {
        let before = vec![false; 30];
        let mut after = vec![false; 30];
        for h in after.iter_mut().take(12) {
            *h = true;
        }
        let ds = binary_deltas("hit: file", &[("sft", &before), ("sft+rl", &after)], 2);
        let m = ds[0].mcnemar.unwrap();
        assert_eq!((m.gained, m.lost), (12, 0));
        assert!(ds[0].significant());
        let flat = binary_deltas("hit: file", &[("sft", &before), ("sft+rl", &before)], 2);
        assert!(!flat[0].significant());
        assert!(delta_section(&flat).contains("No delta is significant"));
    }

    #[test]
    fn seeds_section_reports_mean_std_and_sign_agreement() {
        let d = |e: f64| Delta {
            metric: "m".into(),
            from: "a".into(),
            to: "b".into(),
            interval: Interval {
                estimate: e,
                lo: e - 0.1,
                hi: e + 0.1,
            },
            mcnemar: None,
        };
        let md = seeds_section(&[(0, vec![d(0.2)]), (1, vec![d(0.4)]), (2, vec![d(-0.3)])]);
        assert!(md.contains("| m: a -> b | +0.100 ± 0.361 |"), "{md}");
        assert!(md.contains("| 2/3 |"), "{md}");
    }
}
