//! Stage-2 edit reward from execution: the SEARCH/REPLACE answer becomes a patch
//! ([`crate::rft::eval::edit_to_patch`]) that runs in the sandbox with the instance's
//! FAIL_TO_PASS and PASS_TO_PASS tests ([`crate::rft::accept::resolve_patches`], each run bounded
//! by the sandbox's wall limit). `execution`: the reward is 1 when the instance is resolved, else
//! 0, so an edit that only touches the right line earns nothing. `mixed`: 1 when resolved, else
//! [`MIXED_RULE_WEIGHT`] times the rule reward (shaping for near misses). Results are cached by
//! (instance, normalised patch), so a group's identical answers and later repeats run once.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::rft::accept::resolve_patches;
use crate::rft::eval::edit_to_patch;
use crate::sandbox::runner::SandboxConfig;
use crate::swe::instance::Instance;
use crate::swe::subtask::{EditReward, Subtask, SubtaskRecord};

/// One scored edit: its job index, its cache key (instance, normalised patch) and its patch.
type ScoredEdit = (usize, Option<(String, String)>, Option<String>);

/// How stage 2 scores edit answers (`stage2.edit_exec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EditExec {
    /// The rule reward only (`stage2.edit_reward`: line F-beta or patch similarity).
    #[default]
    Rule,
    /// 1 when the edit's patch resolves the instance in the sandbox, else 0.
    Execution,
    /// 1 when resolved, else [`MIXED_RULE_WEIGHT`] times the rule reward.
    Mixed,
}

/// The weight of the rule reward for unresolved edits under [`EditExec::Mixed`].
pub const MIXED_RULE_WEIGHT: f64 = 0.5;

/// The cache key of a patch: its lines with trailing spaces and blank lines dropped.
pub fn normalise_patch(patch: &str) -> String {
    patch
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Counters of an [`ExecReward`] (for notes and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStats {
    /// Sandbox runs done.
    pub runs: usize,
    /// Answers scored from the cache.
    pub cache_hits: usize,
    /// Edit answers with no patch (reward 0 under execution).
    pub no_patch: usize,
}

/// The execution scorer of stage-2 edit answers, with its cache.
pub struct ExecReward {
    mode: EditExec,
    instances: HashMap<String, Instance>,
    repos: PathBuf,
    sb: SandboxConfig,
    workers: usize,
    cache: Mutex<HashMap<(String, String), bool>>,
    stats: Mutex<ExecStats>,
}

impl std::fmt::Debug for ExecReward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecReward")
            .field("mode", &self.mode)
            .field("instances", &self.instances.len())
            .field("repos", &self.repos)
            .finish()
    }
}

impl ExecReward {
    /// A scorer over `instances` (their mirrors under `repos`), `workers` sandbox runs at once.
    pub fn new(
        mode: EditExec,
        instances: &[Instance],
        repos: PathBuf,
        sb: SandboxConfig,
        workers: usize,
    ) -> Self {
        ExecReward {
            mode,
            instances: instances
                .iter()
                .map(|i| (i.instance_id.clone(), i.clone()))
                .collect(),
            repos,
            sb,
            workers: workers.max(1),
            cache: Mutex::new(HashMap::new()),
            stats: Mutex::new(ExecStats::default()),
        }
    }

    /// The mode.
    pub fn mode(&self) -> EditExec {
        self.mode
    }

    /// The counters so far.
    pub fn stats(&self) -> ExecStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Final rewards of `(record, answer, rule reward)` triples: non-edit records and the `rule`
    /// mode keep the rule reward; edit answers are run (uncached ones in parallel) and scored
    /// as the mode says. An edit of an instance the scorer does not know keeps its rule reward.
    pub fn rewards(&self, jobs: &[(&SubtaskRecord, &str, f64)]) -> anyhow::Result<Vec<f64>> {
        let mut out: Vec<f64> = jobs.iter().map(|j| j.2).collect();
        if self.mode == EditExec::Rule {
            return Ok(out);
        }
        // (index, cache key, patch) of every scored edit; None patch = no change / unparsable.
        let mut scored: Vec<ScoredEdit> = Vec::new();
        for (k, (rec, answer, _)) in jobs.iter().enumerate() {
            if rec.subtask != Subtask::Edit || !self.instances.contains_key(&rec.instance_id) {
                continue;
            }
            let patch = edit_to_patch(rec, answer).map(|p| self.original_names(rec, p));
            let key = patch
                .as_ref()
                .map(|p| (rec.instance_id.clone(), normalise_patch(p)));
            scored.push((k, key, patch));
        }
        let mut todo: BTreeMap<(String, String), String> = BTreeMap::new();
        let mut hits = 0;
        {
            let cache = self
                .cache
                .lock()
                .map_err(|_| anyhow::anyhow!("execution reward cache poisoned"))?;
            for (_, key, patch) in &scored {
                if let (Some(key), Some(patch)) = (key, patch) {
                    if cache.contains_key(key) {
                        hits += 1;
                    } else {
                        todo.entry(key.clone()).or_insert_with(|| patch.clone());
                    }
                }
            }
        }
        let keys: Vec<(String, String)> = todo.keys().cloned().collect();
        let runs: Vec<(String, String)> = todo
            .iter()
            .map(|((id, _), patch)| (id.clone(), patch.clone()))
            .collect();
        let by_id: HashMap<&str, &Instance> = self
            .instances
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let resolved = resolve_patches(&runs, &by_id, &self.repos, &self.sb, self.workers)?;
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| anyhow::anyhow!("execution reward cache poisoned"))?;
        for (key, ok) in keys.into_iter().zip(resolved) {
            cache.insert(key, ok);
        }
        let mut no_patch = 0;
        for (k, key, _) in &scored {
            let ok = match key {
                Some(key) => cache.get(key).copied().unwrap_or(false),
                None => {
                    no_patch += 1;
                    false
                }
            };
            out[*k] = self.combine(ok, jobs[*k].2);
        }
        if let Ok(mut s) = self.stats.lock() {
            s.runs += runs.len();
            s.cache_hits += hits;
            s.no_patch += no_patch;
        }
        Ok(out)
    }

    /// A patch of a package-renamed prompt ([`crate::pipeline::augment`]) with the instance's
    /// real package name back, so that it applies to the mirror.
    fn original_names(&self, rec: &SubtaskRecord, patch: String) -> String {
        use crate::pipeline::augment::{package_of, Renamer};
        let Some(inst) = self.instances.get(&rec.instance_id) else {
            return patch;
        };
        let (shown, real) = (package_of(&rec.repo), package_of(&inst.repo));
        match Renamer::new(shown) {
            Some(r) if shown != real => r.apply(&patch, real),
            _ => patch,
        }
    }

    /// The reward of an edit that did (`resolved`) or did not resolve, with rule reward `rule`.
    pub fn combine(&self, resolved: bool, rule: f64) -> f64 {
        match (self.mode, resolved) {
            (EditExec::Rule, _) => rule,
            (_, true) => 1.0,
            (EditExec::Execution, false) => 0.0,
            (EditExec::Mixed, false) => MIXED_RULE_WEIGHT * rule.max(0.0),
        }
    }
}

/// A step's execution rewards: `Some(reward)` for each edit answer when `exec` scores by
/// execution, else `None` (the caller keeps the rule reward). `record_of(j)` is answer `j`'s record.
pub fn step_rewards<'a>(
    exec: Option<&ExecReward>,
    texts: &[&str],
    record_of: impl Fn(usize) -> &'a SubtaskRecord,
    edit_reward: EditReward,
) -> anyhow::Result<Vec<Option<f64>>> {
    let mut out = vec![None; texts.len()];
    let Some(exec) = exec.filter(|e| e.mode != EditExec::Rule) else {
        return Ok(out);
    };
    let idx: Vec<usize> = (0..texts.len())
        .filter(|&j| record_of(j).subtask == Subtask::Edit)
        .collect();
    let jobs: Vec<(&SubtaskRecord, &str, f64)> = idx
        .iter()
        .map(|&j| {
            let rec = record_of(j);
            (rec, texts[j], rec.reward(texts[j], edit_reward).reward)
        })
        .collect();
    for (j, x) in idx.into_iter().zip(exec.rewards(&jobs)?) {
        out[j] = Some(x);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalised_patches_ignore_trailing_space_and_blank_lines() {
        assert_eq!(
            normalise_patch("a  \n\n-b\n+c \n"),
            normalise_patch("a\n-b\n+c")
        );
        assert_ne!(normalise_patch("-b\n+c"), normalise_patch("-b\n+d"));
    }
}
