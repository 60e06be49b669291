//! Deterministic offline generator of SWE-style task instances.
//!
//! Each repository is a small Python package (3-10 modules from [`templates`], with docstrings,
//! cross-module calls and passing unittest suites) under a random name with random module aliases.
//! Each instance injects one bug with a [`mutate`] operator into a root commit of that repository:
//! the gold patch is the fix, FAIL_TO_PASS the tests the bug breaks (removed from the base commit and
//! added back by `test_patch`, as in SWE-bench), PASS_TO_PASS the rest, and the issue text is written
//! from the failing behaviour by [`issue`]. Test ids follow [`runner`]'s canonical unittest form.
//!
//! Harder variants (all off by default, see [`SynthConfig`]): issue styles without the import line
//! ([`issue::IssueStyle`]), distractor modules (near-duplicate copies of real modules under similar
//! names, never imported by the tests) and multi-file bugs (two mutations in two modules, each of
//! which alone breaks tests, so the gold patch must touch both files).
//!
//! The same seed gives byte-identical `instances.jsonl` and identical commits (python3 and git are
//! needed at generation time).

pub mod distractor;
pub mod gitrepo;
pub mod issue;
pub mod mutate;
pub mod runner;
pub mod templates;

use crate::swe::diff::{FilePatch, Patch};
use crate::swe::instance::{self, Instance};
use crate::swe::repo::RepoStore;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Errors of the generator.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// File system error.
    #[error("{path}: {msg}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// python3 is missing or a clean project's tests did not pass.
    #[error("python: {0}")]
    Python(String),
    /// A git command failed.
    #[error("git: {0}")]
    Git(String),
    /// Writing instances failed.
    #[error(transparent)]
    Instances(#[from] instance::InstanceError),
    /// A setting is out of range.
    #[error("synth config: {0}")]
    Config(String),
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct SynthConfig {
    /// Number of instances.
    pub n: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Instances per repository.
    pub per_repo: usize,
    /// Time limit of one test-suite run.
    pub test_timeout: Duration,
    /// Mix of issue styles (default: import only).
    pub issue_styles: issue::IssueStyles,
    /// Share of instances whose bug spans two files (0..=1).
    pub multi_file_fraction: f64,
    /// Distractor modules per project: near-duplicate copies of real modules under similar names.
    pub distractors: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            n: 10,
            seed: 0,
            per_repo: 3,
            test_timeout: Duration::from_secs(20),
            issue_styles: issue::IssueStyles::default(),
            multi_file_fraction: 0.0,
            distractors: 0,
        }
    }
}

impl SynthConfig {
    /// Checks the settings (one-line error).
    pub fn check(&self) -> Result<(), SynthError> {
        self.issue_styles.check().map_err(SynthError::Config)?;
        if !(0.0..=1.0).contains(&self.multi_file_fraction) {
            return Err(SynthError::Config(format!(
                "multi_file_fraction = {} must be in [0, 1]",
                self.multi_file_fraction
            )));
        }
        if self.distractors > 4 {
            return Err(SynthError::Config(format!(
                "distractors = {} must be at most 4",
                self.distractors
            )));
        }
        Ok(())
    }
}

/// What a generation produced.
#[derive(Debug, Clone, Default)]
pub struct SynthReport {
    /// The instances, as written.
    pub instances: Vec<Instance>,
    /// Instances per mutation operator.
    pub operators: BTreeMap<String, usize>,
    /// Mutation candidates tried and rejected (no failing test, timeouts...).
    pub rejected: usize,
    /// Instances per issue style.
    pub styles: BTreeMap<String, usize>,
    /// Instances whose bug spans two files.
    pub multi_file: usize,
}

/// A generated project: its files (clean) and module layout.
#[derive(Debug, Clone)]
pub struct Project {
    /// Project number.
    pub index: usize,
    /// Python package name.
    pub package: String,
    /// `owner/name`.
    pub repo: String,
    /// Version string.
    pub version: String,
    /// Path -> text, fixed code and full tests.
    pub files: BTreeMap<String, String>,
    /// (module path, test path, module name) per module.
    pub modules: Vec<(String, String, String)>,
}

fn project_rng(seed: u64, index: usize, salt: u64) -> ChaCha8Rng {
    let mixed = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        ^ salt;
    ChaCha8Rng::seed_from_u64(mixed)
}

/// Renames module references `from` -> `to` (imports and `from.` attribute uses, never locals).
fn rename_module(src: &str, from: &str, to: &str) -> String {
    if from == to {
        return src.to_string();
    }
    let re = match Regex::new(&format!(r"\b{}\b", regex::escape(from))) {
        Ok(r) => r,
        Err(_) => return src.to_string(),
    };
    let mut out = String::with_capacity(src.len());
    for line in src.split_inclusive('\n') {
        let is_import = line.trim_start().starts_with("from ") && line.contains(" import ");
        let mut last = 0;
        for m in re.find_iter(line) {
            let prev = line[..m.start()].chars().last();
            let next = line[m.end()..].chars().next();
            let ok = prev != Some('.') && (next == Some('.') || is_import);
            if ok {
                out.push_str(&line[last..m.start()]);
                out.push_str(to);
                last = m.end();
            }
        }
        out.push_str(&line[last..]);
    }
    out
}

/// Builds project `index` of `seed`.
pub fn build_project(seed: u64, index: usize) -> Project {
    let mut rng = project_rng(seed, index, 1);
    let word = templates::PACKAGE_WORDS
        .choose(&mut rng)
        .copied()
        .unwrap_or("pkg");
    let package = format!("{word}{index}");
    let version = format!("0.{}.{}", rng.random_range(1..10), rng.random_range(0..5));
    let want = rng.random_range(3..=8usize);
    let mut order: Vec<&templates::Template> = templates::TEMPLATES.iter().collect();
    order.shuffle(&mut rng);
    let mut chosen: BTreeSet<&str> = BTreeSet::new();
    for t in order {
        if chosen.len() >= want {
            break;
        }
        let mut closure = vec![t.name];
        let mut k = 0;
        while k < closure.len() {
            if let Some(tt) = templates::by_name(closure[k]) {
                for d in tt.deps {
                    if !closure.contains(d) {
                        closure.push(d);
                    }
                }
            }
            k += 1;
        }
        let new: Vec<&str> = closure
            .into_iter()
            .filter(|c| !chosen.contains(c))
            .collect();
        if chosen.len() + new.len() <= 10 {
            chosen.extend(new);
        }
    }
    let aliases: BTreeMap<&str, &str> = chosen
        .iter()
        .map(|n| {
            let t = templates::by_name(n);
            let a = t
                .and_then(|t| t.aliases.choose(&mut rng).copied())
                .unwrap_or(n);
            (*n, a)
        })
        .collect();
    let rename_all = |src: &str| {
        let mut s = src.replace("PKG", &package);
        for (from, to) in &aliases {
            s = rename_module(&s, from, to);
        }
        s
    };
    let mut files = BTreeMap::new();
    let mut modules = Vec::new();
    let mut readme =
        format!("# {package}\n\nUtilities for everyday data chores.\n\n## Modules\n\n");
    for name in &chosen {
        let Some(t) = templates::by_name(name) else {
            continue;
        };
        let alias = aliases.get(name).copied().unwrap_or(name);
        let mpath = format!("{package}/{alias}.py");
        let tpath = format!("tests/test_{alias}.py");
        let doc = t.module.lines().next().unwrap_or("").trim_matches('"');
        readme.push_str(&format!("- `{mpath}`: {doc}\n"));
        files.insert(mpath.clone(), rename_all(t.module));
        files.insert(tpath.clone(), rename_all(t.tests));
        modules.push((mpath, tpath, alias.to_string()));
    }
    let names: Vec<String> = modules.iter().map(|m| format!("\"{}\"", m.2)).collect();
    files.insert(
        format!("{package}/__init__.py"),
        format!(
            "\"\"\"{package}: utilities for everyday data chores.\"\"\"\n\n__version__ = \"{version}\"\n__all__ = [{}]\n",
            names.join(", ")
        ),
    );
    files.insert("tests/__init__.py".into(), String::new());
    files.insert("README.md".into(), readme);
    files.insert(
        "pyproject.toml".into(),
        format!("[project]\nname = \"{package}\"\nversion = \"{version}\"\nrequires-python = \">=3.8\"\n"),
    );
    Project {
        index,
        package: package.clone(),
        repo: format!("synth/{package}"),
        version,
        files,
        modules,
    }
}

/// Removes the named test methods from a unittest file (an emptied class gets `pass`).
pub fn remove_tests(src: &str, drop: &BTreeSet<(String, String)>) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut keep = vec![true; lines.len()];
    let mut class = String::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some(rest) = l.strip_prefix("class ") {
            class = rest.split(['(', ':']).next().unwrap_or("").to_string();
        }
        if let Some(rest) = l.strip_prefix("    def ") {
            let name = rest.split('(').next().unwrap_or("").to_string();
            if drop.contains(&(class.clone(), name)) {
                let mut j = i + 1;
                while j < lines.len()
                    && (lines[j].starts_with("        ") || lines[j].trim().is_empty())
                {
                    j += 1;
                }
                // Drop the blank lines before it too (keep one separator).
                let mut k = i;
                while k > 0 && lines[k - 1].trim().is_empty() && keep[k - 1] {
                    k -= 1;
                    keep[k] = false;
                }
                for kk in keep.iter_mut().take(j).skip(i) {
                    *kk = false;
                }
                i = j;
                continue;
            }
        }
        i += 1;
    }
    let mut out: Vec<String> = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        if keep[k] {
            out.push((*l).to_string());
        }
    }
    // Re-separate definitions and fill emptied classes.
    let mut fixed: Vec<String> = Vec::new();
    for (k, l) in out.iter().enumerate() {
        if l.starts_with("    def ") && fixed.last().is_some_and(|p| p.starts_with("        ")) {
            fixed.push(String::new());
        }
        if l.starts_with("class ") && fixed.last().is_some_and(|p| !p.trim().is_empty()) {
            fixed.push(String::new());
            fixed.push(String::new());
        }
        fixed.push(l.clone());
        if l.starts_with("class ") {
            let next = out.get(k + 1).map(|s| s.as_str()).unwrap_or("");
            if !next.starts_with("    ") {
                fixed.push("    pass".into());
            }
        }
    }
    let mut s = fixed.join("\n");
    s.push('\n');
    s
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> SynthError {
    SynthError::Io {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

fn write_tree(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), SynthError> {
    for (p, t) in files {
        let full = dir.join(p);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
        }
        std::fs::write(&full, t).map_err(|e| io_err(&full, e))?;
    }
    Ok(())
}

/// A project with its generated bugs and the number of rejected candidates.
type ProjectBugs = (Project, Vec<Draft>, usize);

/// One generated bug before it is committed.
#[derive(Debug, Clone)]
struct Draft {
    /// One mutation, or two in two files (a multi-file bug).
    mutations: Vec<mutate::Mutation>,
    base: BTreeMap<String, String>,
    patch: String,
    test_patch: String,
    fail_to_pass: Vec<String>,
    pass_to_pass: Vec<String>,
    problem: String,
    style: issue::IssueStyle,
}

fn split_id(id: &str) -> (String, String, String) {
    // "test_x (tests.test_mod.TestClass.test_x)" -> ("tests/test_mod.py", "TestClass", "test_x")
    let dotted = id.split(" (").nth(1).unwrap_or("").trim_end_matches(')');
    let parts: Vec<&str> = dotted.split('.').collect();
    if parts.len() < 3 {
        return (String::new(), String::new(), String::new());
    }
    let n = parts.len();
    (
        format!("{}.py", parts[..n - 2].join("/")),
        parts[n - 2].to_string(),
        parts[n - 1].to_string(),
    )
}

fn patch_between(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> String {
    let mut p = Patch::default();
    for (path, n) in new {
        if let Some(o) = old.get(path) {
            if o != n {
                p.files
                    .push(FilePatch::from_texts(Some((path, o)), Some((path, n))));
            }
        }
    }
    p.to_string()
}

/// Runs the suite with `muts` applied (one per file), restoring the files afterwards.
fn trial(
    dir: &Path,
    proj: &Project,
    muts: &[&mutate::Mutation],
    timeout: Duration,
) -> Result<runner::RunResult, SynthError> {
    for m in muts {
        let orig = proj.files.get(&m.path).map(|s| s.as_str()).unwrap_or("");
        let full = dir.join(&m.path);
        std::fs::write(&full, m.apply(orig)).map_err(|e| io_err(&full, e))?;
    }
    let run = runner::run_unittest(dir, timeout).map_err(|e| SynthError::Python(e.to_string()));
    for m in muts {
        let orig = proj.files.get(&m.path).map(|s| s.as_str()).unwrap_or("");
        let full = dir.join(&m.path);
        std::fs::write(&full, orig).map_err(|e| io_err(&full, e))?;
    }
    run
}

/// The failing tests of a trial when it makes a usable bug: some but not all tests fail, none
/// time out, and the same tests ran as on the clean project.
fn usable(run: &runner::RunResult, all_ids: &BTreeSet<String>) -> Option<BTreeSet<String>> {
    let failing = run.failing();
    let ids: BTreeSet<String> = run.outcomes.keys().cloned().collect();
    if run.timed_out || failing.is_empty() || ids != *all_ids || failing.len() == all_ids.len() {
        return None;
    }
    Some(failing.into_iter().collect())
}

/// What a draft is built from: the project, its scratch folder and the issue settings.
struct DraftCtx<'a> {
    proj: &'a Project,
    dir: &'a Path,
    all_ids: &'a BTreeSet<String>,
    styles: issue::IssueStyles,
}

/// The issue text for one failing test of `pool` (traceback issues prefer a test that raised).
fn issue_for(
    ctx: &DraftCtx<'_>,
    run: &runner::RunResult,
    pool: &BTreeSet<String>,
    style: issue::IssueStyle,
    rng: &mut ChaCha8Rng,
) -> String {
    let fail_list: Vec<&String> = pool.iter().collect();
    let raised: Vec<&String> = fail_list
        .iter()
        .copied()
        .filter(|t| run.outcomes.get(*t) == Some(&runner::Outcome::Error))
        .collect();
    let from = if style == issue::IssueStyle::Traceback && !raised.is_empty() {
        &raised
    } else {
        &fail_list
    };
    let chosen = from.choose(rng).map(|s| s.as_str()).unwrap_or("");
    let (tfile, _, _) = split_id(chosen);
    let proj = ctx.proj;
    let module = proj
        .modules
        .iter()
        .find(|mm| mm.1 == tfile)
        .map(|mm| mm.2.clone())
        .unwrap_or_default();
    let names: Vec<String> = proj.modules.iter().map(|m| m.2.clone()).collect();
    let report = run.reports.get(chosen).cloned().unwrap_or_default();
    let prefix = format!("{}/", ctx.dir.display());
    let failure = issue::Failure {
        package: &proj.package,
        module: &module,
        test_src: proj.files.get(&tfile).map(|s| s.as_str()).unwrap_or(""),
        test_id: chosen,
        report: &report,
        tmp_prefix: &prefix,
        version: &proj.version,
        modules: &names,
    };
    issue::write_issue_styled(&failure, style, rng)
}

/// Builds a draft from accepted mutations, the run with all of them applied and the failing
/// tests each one causes alone (the issue describes one failure per mutation).
fn make_draft(
    ctx: &DraftCtx<'_>,
    muts: Vec<mutate::Mutation>,
    run: &runner::RunResult,
    parts: &[BTreeSet<String>],
    rng: &mut ChaCha8Rng,
) -> Option<Draft> {
    let proj = ctx.proj;
    let f2p = usable(run, ctx.all_ids)?;
    let p2p: Vec<String> = ctx
        .all_ids
        .iter()
        .filter(|i| !f2p.contains(*i))
        .cloned()
        .collect();
    // Base tree: the bug, and test files without the failing tests.
    let mut drop_by_file: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for id in &f2p {
        let (file, class, name) = split_id(id);
        drop_by_file.entry(file).or_default().insert((class, name));
    }
    let mut base = proj.files.clone();
    for m in &muts {
        let orig = proj.files.get(&m.path)?;
        base.insert(m.path.clone(), m.apply(orig));
    }
    for (file, drop) in &drop_by_file {
        if let Some(src) = proj.files.get(file) {
            base.insert(file.clone(), remove_tests(src, drop));
        }
    }
    let mut with_tests = base.clone();
    for file in drop_by_file.keys() {
        if let Some(src) = proj.files.get(file) {
            with_tests.insert(file.clone(), src.clone());
        }
    }
    let test_patch = patch_between(&base, &with_tests);
    let patch = patch_between(&with_tests, &proj.files);
    let style = ctx.styles.pick(rng);
    let mut problem = issue_for(ctx, run, parts.first().unwrap_or(&f2p), style, rng);
    for part in parts.iter().skip(1) {
        let more = issue_for(ctx, run, part, style, rng);
        let body = more.split_once("\n\n").map(|x| x.1).unwrap_or(&more);
        problem.push_str(&format!(
            "\nThere is a second problem, maybe related:\n\n{body}"
        ));
    }
    Some(Draft {
        mutations: muts,
        base,
        patch,
        test_patch,
        fail_to_pass: f2p.into_iter().collect(),
        pass_to_pass: p2p,
        problem,
        style,
    })
}

/// Mutation candidates of a project, grouped by operator, shuffled and taken round-robin.
fn candidate_queue(proj: &Project, rng: &mut ChaCha8Rng) -> Vec<mutate::Mutation> {
    let mut by_op: BTreeMap<&'static str, Vec<mutate::Mutation>> = BTreeMap::new();
    for (mpath, _, _) in &proj.modules {
        if let Some(src) = proj.files.get(mpath) {
            for m in mutate::candidates(mpath, src) {
                by_op.entry(m.operator).or_default().push(m);
            }
        }
    }
    let mut ops: Vec<(&'static str, Vec<mutate::Mutation>)> = by_op.into_iter().collect();
    for (_, v) in ops.iter_mut() {
        v.shuffle(rng);
    }
    ops.shuffle(rng);
    let mut queue = Vec::new();
    let longest = ops.iter().map(|o| o.1.len()).max().unwrap_or(0);
    for k in 0..longest {
        for (_, v) in &ops {
            if let Some(m) = v.get(k) {
                queue.push(m.clone());
            }
        }
    }
    queue
}

/// Whether the next draft is a multi-file bug (draws nothing when the fraction is 0).
fn draw_multi(cfg: &SynthConfig, rng: &mut ChaCha8Rng) -> bool {
    cfg.multi_file_fraction > 0.0 && rng.random::<f64>() < cfg.multi_file_fraction
}

/// Generates up to `count` bugs for a project; returns them and the number of rejected candidates.
fn bugs_for_project(
    proj: &Project,
    cfg: &SynthConfig,
    count: usize,
) -> Result<(Vec<Draft>, usize), SynthError> {
    let timeout = cfg.test_timeout;
    let scratch = tempfile::tempdir().map_err(|e| io_err(Path::new("tmp"), e))?;
    let dir = scratch.path();
    write_tree(dir, &proj.files)?;
    let clean =
        runner::run_unittest(dir, timeout).map_err(|e| SynthError::Python(e.to_string()))?;
    let all_ids: BTreeSet<String> = clean.outcomes.keys().cloned().collect();
    if all_ids.is_empty() || !clean.failing().is_empty() || clean.timed_out {
        let tail: String = clean
            .log
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ");
        return Err(SynthError::Python(format!(
            "clean tests of {} do not pass: {tail}",
            proj.package
        )));
    }
    let mut rng = project_rng(cfg.seed, proj.index, 2);
    let queue = candidate_queue(proj, &mut rng);
    let ctx = DraftCtx {
        proj,
        dir,
        all_ids: &all_ids,
        styles: cfg.issue_styles,
    };
    let mut drafts = Vec::new();
    let mut rejected = 0;
    let mut used_functions = BTreeSet::new();
    // The first half of a multi-file bug, waiting for a partner in another file.
    let mut pending: Option<(mutate::Mutation, BTreeSet<String>, runner::RunResult)> = None;
    let mut want_multi = draw_multi(cfg, &mut rng);
    for m in queue {
        if drafts.len() >= count || rejected > 60 + 20 * count {
            break;
        }
        if used_functions.contains(&(m.path.clone(), m.function.clone()))
            || pending.as_ref().is_some_and(|p| p.0.path == m.path)
        {
            continue;
        }
        let run = trial(dir, proj, &[&m], timeout)?;
        let Some(failing) = usable(&run, &all_ids) else {
            rejected += 1;
            continue;
        };
        if !want_multi {
            used_functions.insert((m.path.clone(), m.function.clone()));
            drafts.extend(make_draft(&ctx, vec![m], &run, &[failing], &mut rng));
            want_multi = draw_multi(cfg, &mut rng);
            continue;
        }
        let Some((first, f1, run1)) = pending.take() else {
            pending = Some((m, failing, run));
            continue;
        };
        // Both must still break their own tests together: then fixing one file leaves the
        // other's failures, so the gold patch needs both.
        let both = trial(dir, proj, &[&first, &m], timeout)?;
        match usable(&both, &all_ids) {
            Some(f) if f1.is_subset(&f) && failing.is_subset(&f) => {
                used_functions.insert((first.path.clone(), first.function.clone()));
                used_functions.insert((m.path.clone(), m.function.clone()));
                drafts.extend(make_draft(
                    &ctx,
                    vec![first, m],
                    &both,
                    &[f1, failing],
                    &mut rng,
                ));
                want_multi = draw_multi(cfg, &mut rng);
            }
            _ => {
                rejected += 1;
                pending = Some((first, f1, run1));
            }
        }
    }
    // No partner found: the first half stands alone.
    if let Some((first, f1, run1)) = pending {
        if drafts.len() < count {
            drafts.extend(make_draft(&ctx, vec![first], &run1, &[f1], &mut rng));
        }
    }
    Ok((drafts, rejected))
}

/// Checks that python3 runs.
pub fn check_python() -> Result<(), SynthError> {
    let out = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .map_err(|e| {
            SynthError::Python(format!("python3 is needed to check generated tests: {e}"))
        })?;
    if !out.status.success() {
        return Err(SynthError::Python("python3 --version failed".into()));
    }
    Ok(())
}

const BASE_TIME: u64 = 1_704_067_200; // 2024-01-01T00:00:00Z

/// Generates `cfg.n` instances into `out/instances.jsonl` and `out/repos/owner__name` mirrors.
/// `progress` is called with the number of instances done so far.
pub fn generate(
    cfg: &SynthConfig,
    out: &Path,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<SynthReport, SynthError> {
    cfg.check()?;
    check_python()?;
    let repos = out.join("repos");
    std::fs::create_dir_all(&repos).map_err(|e| io_err(&repos, e))?;
    let per = cfg.per_repo.max(1);
    let mut report = SynthReport::default();
    let mut next_project = 0usize;
    let done = std::sync::atomic::AtomicUsize::new(0);
    while report.instances.len() < cfg.n {
        let missing = cfg.n - report.instances.len();
        let batch = missing.div_ceil(per).max(1);
        let indices: Vec<usize> = (next_project..next_project + batch).collect();
        next_project += batch;
        let results: Vec<Result<ProjectBugs, SynthError>> = indices
            .par_iter()
            .map(|&i| {
                let mut proj = build_project(cfg.seed, i);
                if cfg.distractors > 0 {
                    let mut rng = project_rng(cfg.seed, i, 3);
                    distractor::add_distractors(&mut proj, cfg.distractors, &mut rng);
                }
                let (drafts, rej) = bugs_for_project(&proj, cfg, per)?;
                done.fetch_add(drafts.len(), std::sync::atomic::Ordering::Relaxed);
                progress(done.load(std::sync::atomic::Ordering::Relaxed));
                Ok((proj, drafts, rej))
            })
            .collect();
        for r in results {
            let (proj, drafts, rej) = r?;
            report.rejected += rej;
            if drafts.is_empty() {
                continue;
            }
            let mirror = repos.join(instance::repo_dir_name(&proj.repo));
            if mirror.exists() {
                std::fs::remove_dir_all(&mirror).map_err(|e| io_err(&mirror, e))?;
            }
            gitrepo::init_bare(&mirror).map_err(SynthError::Git)?;
            for (k, d) in drafts.into_iter().enumerate() {
                if report.instances.len() >= cfg.n {
                    break;
                }
                let g = report.instances.len() as u64;
                let branch = format!("task-{}", k + 1);
                let commit = gitrepo::commit_files(
                    &mirror,
                    &d.base,
                    &format!("{} {}", proj.package, proj.version),
                    BASE_TIME + g * 3600,
                    &branch,
                )
                .map_err(SynthError::Git)?;
                if k == 0 {
                    gitrepo::set_head(&mirror, &branch).map_err(SynthError::Git)?;
                }
                let Some(first) = d.mutations.first() else {
                    continue;
                };
                let mut extra = serde_json::Map::new();
                extra.insert(
                    "synth".into(),
                    serde_json::json!({
                        "seed": cfg.seed,
                        "operator": first.operator,
                        "file": first.path,
                        "function": first.function,
                        "files": d.mutations.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(),
                        "functions": d.mutations.iter().map(|m| m.function.as_str()).collect::<Vec<_>>(),
                        "style": d.style.name(),
                    }),
                );
                for m in &d.mutations {
                    *report.operators.entry(m.operator.to_string()).or_default() += 1;
                }
                *report.styles.entry(d.style.name().to_string()).or_default() += 1;
                if d.mutations.len() > 1 {
                    report.multi_file += 1;
                }
                let day = g / 24;
                report.instances.push(Instance {
                    instance_id: format!("{}-{}", instance::repo_dir_name(&proj.repo), k + 1),
                    repo: proj.repo.clone(),
                    base_commit: commit.clone(),
                    patch: d.patch,
                    test_patch: d.test_patch,
                    problem_statement: d.problem,
                    hints_text: String::new(),
                    created_at: format!(
                        "2024-{:02}-{:02}T{:02}:00:00Z",
                        1 + (day / 28) % 12,
                        1 + day % 28,
                        g % 24
                    ),
                    version: proj.version.clone(),
                    fail_to_pass: d.fail_to_pass,
                    pass_to_pass: d.pass_to_pass,
                    environment_setup_commit: commit,
                    extra,
                });
            }
        }
    }
    instance::write_jsonl(&out.join("instances.jsonl"), &report.instances)?;
    Ok(report)
}

/// Checks one instance end to end from its mirror: with `test_patch` applied, FAIL_TO_PASS fail and
/// PASS_TO_PASS pass; after the gold patch, all pass. Returns a one-line reason on failure.
pub fn validate_instance(
    inst: &Instance,
    store: &RepoStore,
    timeout: Duration,
) -> Result<(), String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = scratch.path();
    store
        .checkout(&inst.repo, &inst.base_commit, dir)
        .map_err(|e| e.to_string())?;
    let tp = Patch::parse(&inst.test_patch).map_err(|e| format!("test_patch: {e}"))?;
    tp.apply_to_dir(dir)
        .map_err(|e| format!("test_patch: {e}"))?;
    let before = runner::run_unittest(dir, timeout).map_err(|e| e.to_string())?;
    let ok = |r: &runner::RunResult, id: &String| r.outcomes.get(id) == Some(&runner::Outcome::Ok);
    if let Some(t) = inst.fail_to_pass.iter().find(|t| ok(&before, t)) {
        return Err(format!("FAIL_TO_PASS test passes before the fix: {t}"));
    }
    if let Some(t) = inst.pass_to_pass.iter().find(|t| !ok(&before, t)) {
        return Err(format!("PASS_TO_PASS test fails before the fix: {t}"));
    }
    let gold = Patch::parse(&inst.patch).map_err(|e| format!("patch: {e}"))?;
    gold.apply_to_dir(dir).map_err(|e| format!("patch: {e}"))?;
    let after = runner::run_unittest(dir, timeout).map_err(|e| e.to_string())?;
    if let Some(t) = inst
        .fail_to_pass
        .iter()
        .chain(&inst.pass_to_pass)
        .find(|t| !ok(&after, t))
    {
        return Err(format!("test fails after the fix: {t}"));
    }
    Ok(())
}
