//! A bounded worker pool running many instances at once, with a summary.

use crate::sandbox::integrity::IntegrityAction;
use crate::sandbox::runner::{run_instance, RepoProvider, RunResult, RunStatus, SandboxConfig};
use crate::swe::instance::Instance;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

/// One unit of work: an instance and the change to evaluate.
#[derive(Clone, Debug)]
pub struct Job {
    /// The instance.
    pub instance: Instance,
    /// Producer of the change (`model_name_or_path`).
    pub model: String,
    /// The change (diff or SEARCH/REPLACE blocks).
    pub patch: String,
}

/// Runs `jobs` on `workers` threads; `on_result` sees each result as it completes (in the
/// calling thread). Returns the results in job order.
pub fn run_all(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    jobs: &[Job],
    workers: usize,
    mut on_result: impl FnMut(&RunResult),
) -> Vec<RunResult> {
    let workers = workers.clamp(1, jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, RunResult)>();
    let mut slots: Vec<Option<RunResult>> = vec![None; jobs.len()];
    std::thread::scope(|s| {
        for _ in 0..workers {
            let tx = tx.clone();
            let next = &next;
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                if crate::sandbox::cleanup::interrupted() {
                    break;
                }
                let r = run_instance(cfg, repos, &job.instance, &job.model, &job.patch);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, r) in rx {
            on_result(&r);
            slots[i] = Some(r);
        }
    });
    slots.into_iter().flatten().collect()
}

/// Totals over a batch.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Instances run.
    pub total: usize,
    /// Model changes that applied.
    pub applied: usize,
    /// Instances resolved.
    pub resolved: usize,
    /// 100 * applied / total.
    pub pct_applied: f64,
    /// 100 * resolved / total.
    pub pct_resolved: f64,
    /// Runs stopped by a limit.
    pub limit_hit: usize,
    /// Runs the sandbox could not carry out.
    pub errors: usize,
    /// Runs whose model change had test-infrastructure files stripped.
    #[serde(default)]
    pub integrity_stripped: usize,
    /// Runs refused by the integrity rule.
    #[serde(default)]
    pub integrity_refused: usize,
    /// Instance ids not resolved.
    pub unresolved_ids: Vec<String>,
    /// Sum of per-run wall-clock seconds.
    pub run_secs: f64,
}

impl Summary {
    /// Summarises results.
    pub fn of(results: &[RunResult]) -> Summary {
        let total = results.len();
        let applied = results.iter().filter(|r| r.applied).count();
        let resolved = results.iter().filter(|r| r.resolved).count();
        let pct = |n: usize| {
            if total == 0 {
                0.0
            } else {
                100.0 * n as f64 / total as f64
            }
        };
        Summary {
            total,
            applied,
            resolved,
            pct_applied: pct(applied),
            pct_resolved: pct(resolved),
            limit_hit: results
                .iter()
                .filter(|r| r.status == RunStatus::LimitHit)
                .count(),
            errors: results
                .iter()
                .filter(|r| r.status == RunStatus::Error)
                .count(),
            integrity_stripped: results
                .iter()
                .filter(|r| r.integrity.action == IntegrityAction::Stripped)
                .count(),
            integrity_refused: results
                .iter()
                .filter(|r| r.integrity.action == IntegrityAction::Refused)
                .count(),
            unresolved_ids: results
                .iter()
                .filter(|r| !r.resolved)
                .map(|r| r.instance_id.clone())
                .collect(),
            run_secs: results.iter().map(|r| r.timings.total).sum(),
        }
    }
}
