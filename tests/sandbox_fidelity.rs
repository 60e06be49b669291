//! Fidelity on a real repository: SWE-bench-style instances built from consecutive releases of
//! more-itertools (a small pure-Python library; its sdists carry the test suite). For each pair
//! of releases, the gold patch is the change of every non-test file and the test patch the
//! change of `tests/`; FAIL_TO_PASS and PASS_TO_PASS come from running the tests *outside* the
//! sandbox (base + test patch, then + gold). Every gold patch must grade resolved inside the
//! sandbox, and a patch that fixes nothing must not. Gold resolution is the sandbox's acceptance
//! figure, printed as `FIDELITY gold resolved k/n`.
//!
//! Needs the sdists (`scripts/fidelity-deps.sh`, cached in `$SORFT_FIDELITY_CACHE`, default
//! `/var/tmp/sorft-fidelity`) and a python with pytest (as `sandbox_hacks.rs`). Without them the
//! test says SKIPPED, unless `SORFT_REQUIRE_FIDELITY=1` (set by CI), where it fails.

#[path = "fixtures/sandbox/mirror.rs"]
mod mirror;

use mirror::scratch;
use sorft::sandbox::isolation::{HostSupport, Policy};
use sorft::sandbox::logparse::{LogParser, PytestParser, TestStatus};
use sorft::sandbox::python::{self, Interpreter};
use sorft::sandbox::runner::{run_instance, MirrorRepos, RunStatus, SandboxConfig};
use sorft::sandbox::testcmd::CommandTable;
use sorft::sandbox::Limits;
use sorft::swe::instance::Instance;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const REPO: &str = "more-itertools/more-itertools";

fn required() -> bool {
    std::env::var("SORFT_REQUIRE_FIDELITY").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    assert!(!required(), "SORFT_REQUIRE_FIDELITY=1 but {why}");
    eprintln!("SKIPPED: {why}");
}

fn pytest_python() -> Option<Interpreter> {
    let cands: Vec<PathBuf> = std::env::var_os("SORFT_TEST_PYTEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/sorft-pytest")])
        .collect();
    cands.into_iter().find_map(|c| {
        let i = python::resolve(Some(&c), HostSupport::get().root).ok()?;
        let ok = Command::new(&i.program)
            .args(["-c", "import pytest"])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(i)
    })
}

/// The releases used, oldest first (as `scripts/fidelity-deps.sh` downloads them). Later
/// releases add tests that loop for minutes on the previous release's code.
const RELEASES: &[&str] = &["10.1.0", "10.2.0", "10.3.0", "10.4.0"];

/// The cached sdists of [`RELEASES`]; empty when any is missing.
fn sdists() -> Vec<(String, PathBuf)> {
    let dir = std::env::var_os("SORFT_FIDELITY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/sorft-fidelity"));
    let v: Vec<(String, PathBuf)> = RELEASES
        .iter()
        .map(|r| {
            (
                r.to_string(),
                dir.join(format!("more-itertools-{r}.tar.gz")),
            )
        })
        .filter(|(_, p)| p.is_file())
        .collect();
    if v.len() == RELEASES.len() {
        v
    } else {
        vec![]
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn git(dir: &Path, args: &[&str]) -> String {
    run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.autocrlf=false",
        ])
        .args(args))
}

/// Replaces the mirror's working tree (all but `.git`) by release `tarball`'s files.
fn load_release(mirror: &Path, tarball: &Path, scratch: &Path) {
    for e in std::fs::read_dir(mirror).unwrap().flatten() {
        if e.file_name() != ".git" {
            let p = e.path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    let x = scratch.join("x");
    let _ = std::fs::remove_dir_all(&x);
    std::fs::create_dir_all(&x).unwrap();
    run(Command::new("tar")
        .args(["xzf"])
        .arg(tarball)
        .args(["-C"])
        .arg(&x)
        .args(["--strip-components=1"]));
    // Packaging metadata is not source.
    let _ = std::fs::remove_file(x.join("PKG-INFO"));
    run(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", x.display()))
        .arg(mirror));
}

/// Per-test statuses of the repository at `commit` with `patches` applied, run outside the
/// sandbox (the library's own tests, trusted).
fn statuses(
    mirror: &Path,
    commit: &str,
    patches: &[&str],
    files: &[String],
    py: &Interpreter,
    scratch: &Path,
) -> std::collections::BTreeMap<String, TestStatus> {
    let wt = scratch.join("wt");
    let _ = std::fs::remove_dir_all(&wt);
    std::fs::create_dir_all(&wt).unwrap();
    let tar = scratch.join("tree.tar");
    git(mirror, &["archive", "-o", tar.to_str().unwrap(), commit]);
    run(Command::new("tar").arg("xf").arg(&tar).arg("-C").arg(&wt));
    for (i, p) in patches.iter().enumerate() {
        let f = scratch.join(format!("p{i}.diff"));
        std::fs::write(&f, p).unwrap();
        run(Command::new("git").arg("-C").arg(&wt).arg("apply").arg(&f));
    }
    // Trusted code, but a new test may loop on old code: killed after two minutes.
    let out = Command::new("timeout")
        .args(["-s", "KILL", "120"])
        .arg(&py.program)
        .args(["-m", "pytest", "-rA", "-p", "no:cacheprovider", "-q"])
        .args(files)
        .current_dir(&wt)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("pytest");
    assert_ne!(
        out.status.code(),
        None,
        "pytest outside the sandbox was killed after 120 s (a test hangs on this release pair)"
    );
    PytestParser.parse(&String::from_utf8_lossy(&out.stdout))
}

/// Builds the mirror and one instance per pair of consecutive releases.
fn build_instances(repos: &Path, py: &Interpreter, scratch: &Path) -> Vec<Instance> {
    let mirror = repos.join("more-itertools__more-itertools");
    std::fs::create_dir_all(&mirror).unwrap();
    git(&mirror, &["init", "-q"]);
    let releases = sdists();
    let mut out = vec![];
    let mut base: Option<(String, String)> = None;
    for (ver, tarball) in &releases {
        load_release(&mirror, tarball, scratch);
        git(&mirror, &["add", "-A"]);
        if let Some((base_ver, base_commit)) = &base {
            let gold = git(&mirror, &["diff", "--cached", "--", ".", ":(exclude)tests"]);
            let test_patch = git(&mirror, &["diff", "--cached", "--", "tests"]);
            let files = sorft::sandbox::apply::test_files(&test_patch);
            if !test_patch.is_empty() && !files.is_empty() {
                let before = statuses(&mirror, base_commit, &[&test_patch], &files, py, scratch);
                let after = statuses(
                    &mirror,
                    base_commit,
                    &[&test_patch, &gold],
                    &files,
                    py,
                    scratch,
                );
                let passed = |m: &std::collections::BTreeMap<String, TestStatus>, t: &str| {
                    m.get(t) == Some(&TestStatus::Passed)
                };
                let f2p: Vec<String> = after
                    .keys()
                    .filter(|t| passed(&after, t) && !passed(&before, t))
                    .cloned()
                    .collect();
                let p2p: Vec<String> = after
                    .keys()
                    .filter(|t| passed(&after, t) && passed(&before, t))
                    .cloned()
                    .collect();
                eprintln!(
                    "instance {base_ver} -> {ver}: {} FAIL_TO_PASS, {} PASS_TO_PASS",
                    f2p.len(),
                    p2p.len()
                );
                if !f2p.is_empty() {
                    out.push(Instance {
                        instance_id: format!("more-itertools__more-itertools-{ver}"),
                        repo: REPO.into(),
                        base_commit: base_commit.clone(),
                        patch: gold,
                        test_patch,
                        fail_to_pass: f2p,
                        pass_to_pass: p2p,
                        version: base_ver.clone(),
                        ..Instance::default()
                    });
                }
            }
        }
        git(&mirror, &["commit", "-qm", ver, "--allow-empty"]);
        base = Some((
            ver.clone(),
            git(&mirror, &["rev-parse", "HEAD"]).trim().into(),
        ));
    }
    out
}

#[test]
fn gold_patches_of_real_releases_resolve_in_the_sandbox() {
    let Some(py) = pytest_python() else {
        return skip("no python with pytest (SORFT_TEST_PYTEST_PYTHON or /opt/sorft-pytest)");
    };
    if sdists().len() < 2 {
        return skip("no more-itertools sdists (run scripts/fidelity-deps.sh)");
    }
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    let tmp = d.path().join("host");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&tmp).unwrap();
    let t = std::time::Instant::now();
    let instances = build_instances(&repos, &py, &tmp);
    eprintln!(
        "built {} instances in {:.1} s",
        instances.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        instances.len() >= 3,
        "only {} instances with FAIL_TO_PASS tests",
        instances.len()
    );
    let cfg = SandboxConfig {
        limits: Limits {
            wall: Duration::from_secs(120),
            cpu_secs: 120,
            ..Limits::default()
        },
        policy: Policy::default(),
        python: py.clone(),
        commands: CommandTable::default(),
        work_dir: work.clone(),
        integrity: Default::default(),
    };
    let mirrors = MirrorRepos::new(&repos);
    let mut resolved = 0;
    let mut failures = vec![];
    for inst in &instances {
        let r = run_instance(&cfg, &mirrors, inst, "gold", &inst.patch);
        eprintln!(
            "GOLD {}: {:?} ({} F2P, {} P2P, integrity {:?}, {:.1} s)",
            inst.instance_id,
            r.status,
            inst.fail_to_pass.len(),
            inst.pass_to_pass.len(),
            r.integrity.action,
            r.timings.tests
        );
        if r.resolved {
            resolved += 1;
        } else {
            failures.push(format!(
                "{}: {:?} {:?}",
                inst.instance_id, r.status, r.error
            ));
        }
    }
    eprintln!("FIDELITY gold resolved {resolved}/{}", instances.len());
    assert!(
        failures.is_empty(),
        "gold patches not resolved: {failures:#?}"
    );
    // The control: a change that fixes nothing (a comment in the package) must not resolve.
    let inst = &instances[0];
    let noop = "--- a/more_itertools/__init__.py\n+++ b/more_itertools/__init__.py\n@@ -1 +1,2 @@\n+# touched\n";
    let first_line = mirror_line(&repos, inst);
    let noop = format!("{noop}{first_line}\n");
    // Some new tests loop forever on the old code: a short wall limit keeps the control cheap.
    let mut short = cfg.clone();
    short.limits.wall = Duration::from_secs(20);
    short.limits.cpu_secs = 20;
    let t = std::time::Instant::now();
    let r = run_instance(&short, &mirrors, inst, "noop", &noop);
    eprintln!(
        "NOOP {}: {:?} in {:.1} s",
        inst.instance_id,
        r.status,
        t.elapsed().as_secs_f64()
    );
    assert!(r.applied && !r.resolved, "{:?} {:?}", r.status, r.error);
    assert_ne!(r.status, RunStatus::Resolved);
}

/// The first line of `more_itertools/__init__.py` at the instance's base commit, as diff context.
fn mirror_line(repos: &Path, inst: &Instance) -> String {
    let text = git(
        &repos.join("more-itertools__more-itertools"),
        &[
            "show",
            &format!("{}:more_itertools/__init__.py", inst.base_commit),
        ],
    );
    format!(" {}", text.lines().next().unwrap_or_default())
}
