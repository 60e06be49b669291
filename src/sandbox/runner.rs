//! One instance end to end: workspace, model change, test patch, jailed test run, grading.

use crate::sandbox::apply::{self, Applied};
use crate::sandbox::grading::{grade, Grade};
use crate::sandbox::isolation::Policy;
use crate::sandbox::logparse::StatusMap;
use crate::sandbox::process::{run_jailed, JailCommand, LimitHit, ProcessOutcome};
use crate::sandbox::python::Interpreter;
use crate::sandbox::testcmd::CommandTable;
use crate::sandbox::workspace::{RepoSource, Workspace};
use crate::sandbox::Limits;
use crate::swe::instance::Instance;
use crate::swe::repo::{RepoStore, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Settings shared by every run.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// Resource limits per run.
    pub limits: Limits,
    /// Isolation layers to use.
    pub policy: Policy,
    /// Interpreter running the tests.
    pub python: Interpreter,
    /// Test command table.
    pub commands: CommandTable,
    /// Directory under which workspaces are created.
    pub work_dir: PathBuf,
}

/// Where an instance's repository comes from.
pub trait RepoProvider: Sync {
    /// The tree of `commit` of `repo`.
    fn snapshot(&self, repo: &str, commit: &str) -> Result<Arc<Snapshot>, String>;
}

/// Snapshots from the `--repos` git mirrors, read once per (repo, commit) and kept in memory.
#[derive(Debug)]
pub struct MirrorRepos {
    store: RepoStore,
    cache: Mutex<HashMap<(String, String), Arc<Snapshot>>>,
}

impl MirrorRepos {
    /// Mirrors under `root` (`root/owner__name`).
    pub fn new(root: impl Into<PathBuf>) -> MirrorRepos {
        MirrorRepos {
            store: RepoStore::new(root),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl RepoProvider for MirrorRepos {
    fn snapshot(&self, repo: &str, commit: &str) -> Result<Arc<Snapshot>, String> {
        let key = (repo.to_string(), commit.to_string());
        if let Some(s) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(s);
        }
        let snap = Arc::new(
            self.store
                .snapshot(repo, commit)
                .map_err(|e| e.to_string())?,
        );
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, snap.clone());
        }
        Ok(snap)
    }
}

/// How a run ended, from the grader's point of view.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Tests ran and every FAIL_TO_PASS/PASS_TO_PASS test passed.
    Resolved,
    /// Tests ran; the grade is PARTIAL or NO.
    Unresolved,
    /// The model change was empty.
    EmptyPatch,
    /// The model change did not apply.
    PatchFailed,
    /// The test patch did not apply on top of the model change.
    TestPatchFailed,
    /// The tests were stopped by a limit (timeout, output, CPU).
    LimitHit,
    /// The sandbox could not run (repository, workspace, spawn).
    Error,
}

/// Wall-clock seconds spent in each phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    /// Creating the workspace.
    pub setup: f64,
    /// Applying the model change and test patch.
    pub apply: f64,
    /// Running the tests.
    pub tests: f64,
    /// Everything, cleanup included.
    pub total: f64,
}

/// The record of one instance's run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// The instance.
    pub instance_id: String,
    /// Who produced the change.
    pub model_name_or_path: String,
    /// Outcome.
    pub status: RunStatus,
    /// True when the model change applied.
    pub applied: bool,
    /// True only on a FULL grade.
    pub resolved: bool,
    /// How the model change applied.
    pub apply: Option<Applied>,
    /// The first error (apply, sandbox), one line.
    pub error: Option<String>,
    /// The test command run (interpreter and arguments).
    pub command: Vec<String>,
    /// The jailed process's outcome (exit, limits, output tail, layers).
    pub process: Option<ProcessOutcome>,
    /// Per-test statuses parsed from the log.
    pub tests: StatusMap,
    /// The grade.
    pub grade: Option<Grade>,
    /// Phase timings.
    pub timings: Timings,
}

impl RunResult {
    fn new(inst: &Instance, model: &str) -> RunResult {
        RunResult {
            instance_id: inst.instance_id.clone(),
            model_name_or_path: model.to_string(),
            status: RunStatus::Error,
            applied: false,
            resolved: false,
            apply: None,
            error: None,
            command: vec![],
            process: None,
            tests: StatusMap::new(),
            grade: None,
            timings: Timings::default(),
        }
    }
}

/// Runs one instance with `model_patch` (a diff or SEARCH/REPLACE blocks). Never fails: every
/// problem ends up in the result's status and error.
pub fn run_instance(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    inst: &Instance,
    model: &str,
    model_patch: &str,
) -> RunResult {
    let t0 = Instant::now();
    let mut r = RunResult::new(inst, model);
    run_phases(cfg, repos, inst, model_patch, &mut r, t0);
    r.timings.total = t0.elapsed().as_secs_f64();
    r
}

fn run_phases(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    inst: &Instance,
    model_patch: &str,
    r: &mut RunResult,
    t0: Instant,
) {
    if model_patch.trim().is_empty() {
        r.status = RunStatus::EmptyPatch;
        r.error = Some("empty model patch".into());
        return;
    }
    let snap = match repos.snapshot(&inst.repo, &inst.base_commit) {
        Ok(s) => s,
        Err(e) => {
            r.error = Some(e);
            return;
        }
    };
    let ws = match Workspace::create_from(&cfg.work_dir, RepoSource::Snapshot(&snap)) {
        Ok(w) => w,
        Err(e) => {
            r.error = Some(e.to_string());
            return;
        }
    };
    r.timings.setup = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    match apply::apply_model_change(ws.repo(), model_patch) {
        Ok(a) => {
            r.applied = true;
            r.apply = Some(a);
        }
        Err(e) => {
            r.status = RunStatus::PatchFailed;
            r.error = Some(e.to_string());
            r.timings.apply = t1.elapsed().as_secs_f64();
            return;
        }
    }
    let mut written: Vec<String> = r
        .apply
        .as_ref()
        .map(|a| a.files.clone())
        .unwrap_or_default();
    if !inst.test_patch.trim().is_empty() {
        match apply::apply_diff(ws.repo(), &inst.test_patch, "test patch") {
            Ok(a) => written.extend(a.files),
            Err(e) => {
                r.status = RunStatus::TestPatchFailed;
                r.error = Some(e.to_string());
                r.timings.apply = t1.elapsed().as_secs_f64();
                return;
            }
        }
    }
    if let Err(e) = ws.hand_over_paths(&written) {
        r.error = Some(e.to_string());
        return;
    }
    r.timings.apply = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let tc = cfg.commands.lookup(&inst.repo, Some(inst.version.as_str()));
    let files = apply::test_files(&inst.test_patch);
    let args = tc.args_for(&files);
    r.command = std::iter::once(cfg.python.program.display().to_string())
        .chain(args.iter().cloned())
        .collect();
    let cmd = JailCommand {
        program: cfg.python.program.clone(),
        args: args.into_iter().map(Into::into).collect(),
        env: vec![],
    };
    let paths = ws.jail_paths(cfg.python.read_roots.clone());
    let out = match run_jailed(&cmd, &paths, &cfg.policy, &cfg.limits, ws.ids()) {
        Ok(o) => o,
        Err(e) => {
            r.error = Some(e.to_string());
            return;
        }
    };
    r.timings.tests = t2.elapsed().as_secs_f64();
    let parser = tc.runner.parser();
    r.tests = parser.parse(&out.output.tail);
    let g = grade(&r.tests, parser, &inst.fail_to_pass, &inst.pass_to_pass);
    r.resolved = g.resolved;
    r.status = if g.resolved {
        RunStatus::Resolved
    } else if out
        .limits_hit
        .iter()
        .any(|l| matches!(l, LimitHit::WallTime | LimitHit::Output | LimitHit::CpuTime))
    {
        r.error = Some(format!("stopped by limit {:?}", out.limits_hit));
        RunStatus::LimitHit
    } else {
        r.error = g.reason.clone();
        RunStatus::Unresolved
    };
    r.grade = Some(g);
    r.process = Some(out);
}
