//! Stage-1 edit acceptance by execution: a teacher's edit is kept only when its patch makes the
//! instance's FAIL_TO_PASS tests pass without breaking PASS_TO_PASS, run in the sandbox (a FULL
//! grade). Stronger than SoRFT's line-overlap filter, which a no-op edit on the right line passes.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::rft::eval::edit_to_patch;
use crate::sandbox::runner::{run_instance, MirrorRepos, SandboxConfig};
use crate::swe::instance::Instance;
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// How stage 1 accepts a teacher's edit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EditAcceptance {
    /// The edit's rule reward is positive (it applies and touches a ground-truth line): SoRFT's
    /// filter.
    Overlap,
    /// Overlap, and its patch resolves the instance in the sandbox.
    #[default]
    Execution,
}

/// Whether each `(instance id, patch)` resolves its instance in the sandbox (FAIL_TO_PASS pass,
/// PASS_TO_PASS keep passing), `workers` runs in parallel; an unknown instance is `false`.
pub fn resolve_patches(
    keys: &[(String, String)],
    by_id: &HashMap<&str, &Instance>,
    repos: &Path,
    sb: &SandboxConfig,
    workers: usize,
) -> anyhow::Result<Vec<bool>> {
    use rayon::prelude::*;
    let mirrors = MirrorRepos::new(repos);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers.max(1))
        .build()?;
    Ok(pool.install(|| {
        keys.par_iter()
            .map(|(id, patch)| {
                by_id
                    .get(id.as_str())
                    .is_some_and(|inst| run_instance(sb, &mirrors, inst, "teacher", patch).resolved)
            })
            .collect()
    }))
}

/// Which samples pass execution: `out[i][k]` for sample `k` of record `i`. Only edit records
/// are run (other records are all `true`); an edit whose answer yields no patch is `false`.
/// Identical patches of one instance run once; `workers` sandbox runs go in parallel.
pub fn execution_passes(
    records: &[&SubtaskRecord],
    samples: &[Vec<String>],
    instances: &[Instance],
    repos: &Path,
    sb: &SandboxConfig,
    workers: usize,
) -> anyhow::Result<Vec<Vec<bool>>> {
    let by_id: HashMap<&str, &Instance> = instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i))
        .collect();
    let mut patches: Vec<Vec<Option<String>>> = Vec::with_capacity(records.len());
    let mut jobs: BTreeMap<(String, String), bool> = BTreeMap::new();
    for (r, outs) in records.iter().zip(samples) {
        let p: Vec<Option<String>> = if r.subtask == Subtask::Edit {
            outs.iter().map(|o| edit_to_patch(r, o)).collect()
        } else {
            vec![None; outs.len()]
        };
        for patch in p.iter().flatten() {
            if by_id.contains_key(r.instance_id.as_str()) {
                jobs.insert((r.instance_id.clone(), patch.clone()), false);
            }
        }
        patches.push(p);
    }
    let keys: Vec<(String, String)> = jobs.keys().cloned().collect();
    let results = resolve_patches(&keys, &by_id, repos, sb, workers)?;
    for (k, ok) in keys.into_iter().zip(results) {
        jobs.insert(k, ok);
    }
    Ok(records
        .iter()
        .zip(&patches)
        .map(|(r, ps)| {
            ps.iter()
                .map(|p| match (r.subtask, p) {
                    (Subtask::Edit, Some(p)) => jobs
                        .get(&(r.instance_id.clone(), p.clone()))
                        .copied()
                        .unwrap_or(false),
                    (Subtask::Edit, None) => false,
                    _ => true,
                })
                .collect()
        })
        .collect())
}
