//! One instance end to end: workspace, model change, test patch, jailed test run, grading.

use crate::sandbox::apply::{self, Applied};
use crate::sandbox::grading::{grade, Grade};
use crate::sandbox::integrity::{self, IntegrityAction, IntegrityReport, IntegrityRule};
use crate::sandbox::isolation::Policy;
use crate::sandbox::logparse::StatusMap;
use crate::sandbox::process::{run_jailed, JailCommand, LimitHit, ProcessOutcome};
use crate::sandbox::python::Interpreter;
use crate::sandbox::quota::QuotaLayer;
use crate::sandbox::testcmd::{pytest_config, CommandTable, BOOTSTRAP, END_MARKER};
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
    /// What a model change may not touch (test infrastructure), and what happens when it does.
    pub integrity: IntegrityRule,
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
    /// The model change touches test infrastructure and the integrity rule refuses it.
    IntegrityRefused,
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
    /// What the integrity rule found and did.
    #[serde(default)]
    pub integrity: IntegrityReport,
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
    /// How the run's workspace storage was bounded.
    #[serde(default)]
    pub quota: QuotaLayer,
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
            integrity: IntegrityReport::default(),
            quota: QuotaLayer::default(),
            error: None,
            command: vec![],
            process: None,
            tests: StatusMap::new(),
            grade: None,
            timings: Timings::default(),
        }
    }
}

/// The part of the log the test runner wrote before its end marker with this run's nonce;
/// `None` when the marker is missing (the runner never returned).
fn runner_log<'a>(log: &'a str, nonce: &str) -> Option<&'a str> {
    let marker = format!("{END_MARKER} {nonce} exit=");
    log.rfind(&marker).map(|i| &log[..i])
}

/// 128 random bits, hex: the end marker's nonce, unknown to the code under test.
fn one_time_nonce() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    // Mixed with the clock and the pid, should /dev/urandom be unreadable.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mix = t ^ ((std::process::id() as u128) << 64);
    let x = u128::from_le_bytes(b) ^ mix;
    format!("{x:032x}")
}

/// The pytest ini file of a run: the base commit's configuration file in the workspace when it
/// has one (changes to it are test infrastructure), otherwise an empty sandbox-owned file, so
/// that a configuration file the change adds is never read.
fn pytest_ini(ws: &Workspace, base: &Snapshot) -> Result<PathBuf, String> {
    if let Some(name) = pytest_config(|n| base.text(n).map(str::to_string)) {
        return Ok(ws.repo().join(name));
    }
    let p = ws.tmp().join("sorft-pytest.ini");
    std::fs::write(&p, "[pytest]\n").map_err(|e| format!("writing {}: {e}", p.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| format!("chmod {}: {e}", p.display()))?;
    Ok(p)
}

/// Applies the integrity rule to the files the model change wrote: records the verdict, strips
/// violating files back to the base commit, or refuses the run. False when the run stops here.
fn enforce_integrity(
    cfg: &SandboxConfig,
    inst: &Instance,
    ws: &Workspace,
    snap: &Snapshot,
    written: &[String],
    r: &mut RunResult,
) -> bool {
    let report = integrity::check(&cfg.integrity, ws.repo(), snap, written, &inst.patch);
    let paths: Vec<String> = report.violations.iter().map(|v| v.path.clone()).collect();
    let action = report.action;
    r.integrity = report;
    match action {
        IntegrityAction::Refused => {
            r.status = RunStatus::IntegrityRefused;
            r.error = Some(format!(
                "model change touches test infrastructure: {}",
                paths.join(", ")
            ));
            false
        }
        IntegrityAction::Stripped => match integrity::restore_to_base(ws.repo(), snap, &paths) {
            Ok(()) => true,
            Err(e) => {
                r.status = RunStatus::Error;
                r.error = Some(format!("stripping test infrastructure: {e}"));
                false
            }
        },
        IntegrityAction::Clean | IntegrityAction::Ignored => true,
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
    if model_patch.trim().is_empty() {
        r.status = RunStatus::EmptyPatch;
        r.error = Some("empty model patch".into());
        return r;
    }
    run_phases(cfg, repos, inst, Some(model_patch), &mut r, t0);
    r.timings.total = t0.elapsed().as_secs_f64();
    r
}

/// Runs the repository's own tests at the instance's base commit, with `model_patch` applied
/// when given and without the instance's test patch (regression testing): the statuses are in
/// the result's `tests`; its grade (against empty test lists) means nothing. Never fails.
pub fn run_repository_tests(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    inst: &Instance,
    model_patch: Option<&str>,
) -> RunResult {
    let t0 = Instant::now();
    let bare = Instance {
        test_patch: String::new(),
        fail_to_pass: Vec::new(),
        pass_to_pass: Vec::new(),
        ..inst.clone()
    };
    let mut r = RunResult::new(&bare, "regression");
    run_phases(cfg, repos, &bare, model_patch, &mut r, t0);
    r.timings.total = t0.elapsed().as_secs_f64();
    r
}

fn run_phases(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    inst: &Instance,
    model_patch: Option<&str>,
    r: &mut RunResult,
    t0: Instant,
) {
    let snap = match repos.snapshot(&inst.repo, &inst.base_commit) {
        Ok(s) => s,
        Err(e) => {
            r.error = Some(e);
            return;
        }
    };
    let quota = cfg.limits.quota();
    let ws = match Workspace::create_with(&cfg.work_dir, RepoSource::Snapshot(&snap), Some(&quota))
    {
        Ok(w) => {
            r.quota = w.quota().clone();
            w
        }
        Err(e) => {
            r.error = Some(e.to_string());
            return;
        }
    };
    r.timings.setup = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    match model_patch.map(|p| apply::apply_model_change(ws.repo(), p)) {
        Some(Ok(a)) => {
            r.applied = true;
            r.apply = Some(a);
        }
        Some(Err(e)) => {
            r.status = RunStatus::PatchFailed;
            r.error = Some(e.to_string());
            r.timings.apply = t1.elapsed().as_secs_f64();
            return;
        }
        None => {}
    }
    let mut written: Vec<String> = r
        .apply
        .as_ref()
        .map(|a| a.files.clone())
        .unwrap_or_default();
    if !enforce_integrity(cfg, inst, &ws, &snap, &written, r) {
        r.timings.apply = t1.elapsed().as_secs_f64();
        return;
    }
    if !inst.test_patch.trim().is_empty() {
        // As SWE-bench does: the files the test patch touches are reset to the base commit
        // first, so model edits to them are discarded.
        let test_paths: Vec<String> = integrity::patch_paths(&inst.test_patch)
            .into_iter()
            .collect();
        if let Err(e) = integrity::restore_to_base(ws.repo(), &snap, &test_paths) {
            r.status = RunStatus::TestPatchFailed;
            r.error = Some(format!("resetting the test patch's files: {e}"));
            return;
        }
        written.extend(test_paths);
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
    let ini = match pytest_ini(&ws, &snap) {
        Ok(p) => p,
        Err(e) => {
            r.error = Some(e);
            return;
        }
    };
    let args = tc.hardened_args(&files, ws.repo(), &ini);
    let hardened =
        args.first().is_some_and(|a| a == "-c") && args.get(1).is_some_and(|a| a == BOOTSTRAP);
    let nonce = one_time_nonce();
    r.command = std::iter::once(cfg.python.program.display().to_string())
        .chain(args.iter().cloned())
        .collect();
    let cmd = JailCommand {
        program: cfg.python.program.clone(),
        args: args.into_iter().map(Into::into).collect(),
        env: vec![("PYTEST_DISABLE_PLUGIN_AUTOLOAD".into(), "1".into())],
        stdin: hardened.then(|| format!("{nonce}\n").into_bytes()),
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
    let log = if hardened {
        runner_log(&out.output.tail, &nonce)
    } else {
        Some(out.output.tail.as_str())
    };
    r.tests = log.map(|l| parser.parse(l)).unwrap_or_default();
    let mut g = grade(&r.tests, parser, &inst.fail_to_pass, &inst.pass_to_pass);
    if log.is_none() {
        g.reason = Some(
            "the test runner did not finish (no end marker: os._exit, a crash or a kill)".into(),
        );
    }
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
