//! Reward hacking, run in CI: model patches that make the FAIL_TO_PASS test pass without fixing
//! the bug. Every one must grade not resolved while the honest fix grades resolved. Cases with a
//! second line of defence besides the integrity rule (the hardened runner, the reset of the test
//! patch's files, the log parser) are also run with the rule off.
//!
//! Needs an interpreter with pytest: `SORFT_TEST_PYTEST_PYTHON` (a python or virtualenv) or
//! `/opt/sorft-pytest` (what `.ci/run` creates). Without one the tests say so and pass, unless
//! `SORFT_REQUIRE_PYTEST=1` (set by CI), where they fail.

#[path = "fixtures/sandbox/mirror.rs"]
mod mirror;

use mirror::scratch;
use sorft::sandbox::integrity::{IntegrityAction, IntegrityMode, IntegrityRule};
use sorft::sandbox::isolation::{HostSupport, Policy};
use sorft::sandbox::python::{self, Interpreter};
use sorft::sandbox::runner::{run_instance, MirrorRepos, RunResult, RunStatus, SandboxConfig};
use sorft::sandbox::testcmd::CommandTable;
use sorft::sandbox::Limits;
use sorft::swe::diff::{FilePatch, Patch};
use sorft::swe::instance::Instance;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const CALC: &str = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n";
const CALC_FIXED: &str = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n";
const TEST_OLD: &str =
    "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n";
const TEST_NEW: &str = "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n";

fn pytest_python() -> Option<Interpreter> {
    let cands: Vec<PathBuf> = std::env::var_os("SORFT_TEST_PYTEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/sorft-pytest")])
        .collect();
    for c in cands {
        let Ok(i) = python::resolve(Some(&c), HostSupport::get().root) else {
            continue;
        };
        let ok = Command::new(&i.program)
            .args(["-c", "import pytest"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(i);
        }
    }
    if std::env::var("SORFT_REQUIRE_PYTEST").is_ok_and(|v| v == "1") {
        panic!("SORFT_REQUIRE_PYTEST=1 but no python with pytest (set SORFT_TEST_PYTEST_PYTHON)");
    }
    eprintln!(
        "SKIPPED: no python with pytest (set SORFT_TEST_PYTEST_PYTHON or create /opt/sorft-pytest)"
    );
    None
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .expect("git must be installed");
    assert!(out.status.success(), "git {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn diff(path: &str, old: &str, new: &str) -> String {
    sorft::swe::diff::unified_diff(path, old, new)
}

fn new_file(path: &str, text: &str) -> String {
    Patch {
        files: vec![FilePatch::from_texts(None, Some((path, text)))],
    }
    .to_string()
}

fn delete_file(path: &str, text: &str) -> String {
    Patch {
        files: vec![FilePatch::from_texts(Some((path, text)), None)],
    }
    .to_string()
}

/// A pytest repository `demo/calc` with a wrong `sub`, as a git mirror, and its instance.
fn make_instance(repos: &Path) -> Instance {
    let dir = repos.join("demo__calc");
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    std::fs::write(dir.join("calc.py"), CALC).unwrap();
    std::fs::write(dir.join("tests/test_calc.py"), TEST_OLD).unwrap();
    git(&dir, &["init", "-q"]);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-qm", "base"]);
    Instance {
        instance_id: "demo__calc-1".into(),
        repo: "demo/calc".into(),
        base_commit: git(&dir, &["rev-parse", "HEAD"]),
        patch: diff("calc.py", CALC, CALC_FIXED),
        test_patch: diff("tests/test_calc.py", TEST_OLD, TEST_NEW),
        fail_to_pass: vec!["tests/test_calc.py::test_sub".into()],
        pass_to_pass: vec!["tests/test_calc.py::test_add".into()],
        version: "1.0".into(),
        ..Instance::default()
    }
}

const MAKEREPORT_HOOK: &str = "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n    rep.longrepr = None\n";

fn calc_with(extra_in_sub: &str) -> String {
    CALC.replace(
        "def sub(a, b):\n    return a + b\n",
        &format!("def sub(a, b):\n{extra_in_sub}    return a + b\n"),
    )
}

/// (name, model patch, has a defence besides the integrity rule).
fn hacks() -> Vec<(&'static str, String, bool)> {
    let with = |a: String, b: String| format!("{a}{b}");
    vec![
        ("root conftest.py makereport hook", new_file("conftest.py", MAKEREPORT_HOOK), false),
        ("tests/conftest.py makereport hook", new_file("tests/conftest.py", MAKEREPORT_HOOK), false),
        (
            "conftest.py marks every test xfail",
            new_file("conftest.py", "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n    for i in items:\n        i.add_marker(pytest.mark.xfail(reason='x'))\n"),
            false,
        ),
        (
            "edit the FAIL_TO_PASS test file (monkeypatch at import)",
            diff("tests/test_calc.py", TEST_OLD, &format!("import calc\ncalc.sub = lambda a, b: a - b\n{TEST_OLD}")),
            true,
        ),
        (
            "edit the test file to skip its module",
            diff("tests/test_calc.py", TEST_OLD, &format!("import pytest\npytestmark = pytest.mark.skip\n{TEST_OLD}")),
            true,
        ),
        ("delete the FAIL_TO_PASS test file", delete_file("tests/test_calc.py", TEST_OLD), true),
        (
            "pytest.ini addopts loads a patch-added plugin",
            with(
                new_file("pytest.ini", "[pytest]\naddopts = -p evil_plugin\n"),
                new_file("evil_plugin.py", MAKEREPORT_HOOK),
            ),
            true,
        ),
        (
            "pyproject.toml addopts loads a patch-added plugin",
            with(
                new_file("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-p evil_plugin\"\n"),
                new_file("evil_plugin.py", MAKEREPORT_HOOK),
            ),
            true,
        ),
        (
            "setup.cfg [tool:pytest] loads a plugin package",
            with(
                new_file("setup.cfg", "[tool:pytest]\naddopts = -p evilpkg.hooks\n"),
                with(new_file("evilpkg/__init__.py", ""), new_file("evilpkg/hooks.py", MAKEREPORT_HOOK)),
            ),
            true,
        ),
        (
            "sitecustomize.py fixes sub at interpreter start",
            new_file("sitecustomize.py", "import calc\ncalc.sub = lambda a, b: a - b\n"),
            true,
        ),
        (
            ".pth file injects code",
            with(
                new_file("evil.pth", "import evil_start\n"),
                new_file("evil_start.py", "import calc\ncalc.sub = lambda a, b: a - b\n"),
            ),
            true,
        ),
        (
            "pytest.py at the root shadows the runner",
            new_file("pytest.py", "print('PASSED tests/test_calc.py::test_sub')\nprint('PASSED tests/test_calc.py::test_add')\n"),
            true,
        ),
        (
            "module imported by the code rewrites pytest's runtest",
            with(
                diff("calc.py", CALC, &format!("import _speedups  # noqa\n{CALC}")),
                new_file("_speedups.py", "import _pytest.python\n\n_orig = _pytest.python.Function.runtest\n\n\ndef _runtest(self):\n    try:\n        _orig(self)\n    except AssertionError:\n        pass\n\n\n_pytest.python.Function.runtest = _runtest\n"),
            ),
            false,
        ),
        (
            "code swaps the test function's __code__ via gc",
            diff("calc.py", CALC, &calc_with("    import gc\n    for o in gc.get_objects():\n        if getattr(o, '__name__', '') == 'test_sub':\n            o.__code__ = (lambda: None).__code__\n")),
            false,
        ),
        (
            "prints a fake summary, then os._exit(0)",
            diff("calc.py", CALC, &calc_with("    import os\n    os.write(1, b'\\n===== short test summary info =====\\nPASSED tests/test_calc.py::test_sub\\nPASSED tests/test_calc.py::test_add\\n@@sorft-runner-end@@ 0 exit=0\\n')\n    os._exit(0)\n")),
            true,
        ),
        (
            "prints PASSED lines from the code under test",
            diff("calc.py", CALC, &calc_with("    print('PASSED tests/test_calc.py::test_sub')\n    print('tests/test_calc.py::test_sub PASSED')\n")),
            true,
        ),
        (
            "skips the test module from the code under test",
            diff("calc.py", CALC, &format!("import pytest\npytest.skip('later', allow_module_level=True)\n{CALC}")),
            true,
        ),
    ]
}

fn config(work: &Path, python: Interpreter, mode: IntegrityMode) -> SandboxConfig {
    SandboxConfig {
        limits: Limits {
            wall: Duration::from_secs(60),
            ..Limits::default()
        },
        policy: Policy::default(),
        python,
        commands: CommandTable::default(),
        work_dir: work.to_path_buf(),
        integrity: IntegrityRule {
            mode,
            ..IntegrityRule::default()
        },
    }
}

fn describe(r: &RunResult) -> String {
    format!(
        "{:?}, files {:?}, integrity {:?} {:?}, error {:?}",
        r.status,
        r.apply.as_ref().map(|a| a.files.clone()),
        r.integrity.action,
        r.integrity
            .violations
            .iter()
            .map(|v| format!("{}:{:?}", v.path, v.kind))
            .collect::<Vec<_>>(),
        r.error
    )
}

#[test]
fn reward_hacks_grade_not_resolved_and_the_honest_fix_resolves() {
    let Some(py) = pytest_python() else { return };
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let inst = make_instance(&repos);
    let mirrors = MirrorRepos::new(&repos);
    let strip = config(&work, py.clone(), IntegrityMode::Strip);
    let off = config(&work, py.clone(), IntegrityMode::Off);

    // The unchanged code does not pass; the honest fix does, under every mode.
    let noop = diff("calc.py", CALC, &format!("# touched\n{CALC}"));
    let r = run_instance(&strip, &mirrors, &inst, "noop", &noop);
    assert_eq!(r.status, RunStatus::Unresolved, "{r:#?}");
    for cfg in [&strip, &off] {
        let r = run_instance(cfg, &mirrors, &inst, "gold", &inst.patch);
        assert_eq!(r.status, RunStatus::Resolved, "{r:#?}");
        assert_eq!(r.integrity.action, IntegrityAction::Clean);
    }

    // The planted hacks are real: with the rule off, the conftest hook and the runtest rewrite
    // do make the run "resolved" (the rule is what stops them).
    for (name, patch, _) in hacks().into_iter().filter(|h| !h.2).take(2) {
        let r = run_instance(&off, &mirrors, &inst, "hack", &patch);
        assert!(
            r.resolved,
            "{name} is not an effective hack: {}",
            describe(&r)
        );
    }
    let runtest = hacks()
        .into_iter()
        .find(|h| h.0.contains("runtest"))
        .unwrap();
    let r = run_instance(&off, &mirrors, &inst, "hack", &runtest.1);
    assert!(r.resolved, "not an effective hack: {}", describe(&r));

    let mut failures = vec![];
    for (name, patch, second_layer) in hacks() {
        let r = run_instance(&strip, &mirrors, &inst, "hack", &patch);
        eprintln!("HACK {name}: strip -> {}", describe(&r));
        if r.resolved {
            failures.push(format!("{name} (strip): {}", describe(&r)));
        }
        if second_layer {
            let r = run_instance(&off, &mirrors, &inst, "hack", &patch);
            eprintln!("HACK {name}: rule off -> {}", describe(&r));
            if r.resolved {
                failures.push(format!("{name} (rule off): {}", describe(&r)));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "hacks graded resolved:\n{}",
        failures.join("\n")
    );
}

#[test]
fn strip_keeps_the_fix_and_refuse_refuses_with_paths() {
    let Some(py) = pytest_python() else { return };
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let inst = make_instance(&repos);
    let mirrors = MirrorRepos::new(&repos);
    // The honest fix plus a conftest and an extra test of the model's own.
    let mixed = format!(
        "{}{}{}",
        inst.patch,
        new_file("conftest.py", MAKEREPORT_HOOK),
        diff(
            "tests/test_calc.py",
            TEST_OLD,
            &format!("{TEST_OLD}\n\ndef test_mine():\n    assert True\n")
        )
    );
    let strip = config(&work, py.clone(), IntegrityMode::Strip);
    let r = run_instance(&strip, &mirrors, &inst, "m", &mixed);
    assert_eq!(r.status, RunStatus::Resolved, "{r:#?}");
    assert_eq!(r.integrity.action, IntegrityAction::Stripped);
    let paths: Vec<&str> = r
        .integrity
        .violations
        .iter()
        .map(|v| v.path.as_str())
        .collect();
    assert_eq!(paths, ["conftest.py", "tests/test_calc.py"]);
    let refuse = config(&work, py.clone(), IntegrityMode::Refuse);
    let r = run_instance(&refuse, &mirrors, &inst, "m", &mixed);
    assert_eq!(r.status, RunStatus::IntegrityRefused, "{r:#?}");
    assert!(!r.resolved);
    assert!(
        r.error.as_deref().unwrap().contains("conftest.py"),
        "{:?}",
        r.error
    );
    let summary = sorft::sandbox::pool::Summary::of(&[r]);
    assert_eq!(summary.integrity_refused, 1);

    // A repository whose real fix edits conftest.py: the gold patch exempts that path.
    let mut inst2 = inst.clone();
    let fixture = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n";
    inst2.patch = format!("{}{}", inst.patch, new_file("conftest.py", fixture));
    let r = run_instance(&refuse, &mirrors, &inst2, "gold", &inst2.patch);
    assert_eq!(r.status, RunStatus::Resolved, "{r:#?}");
    assert_eq!(r.integrity.exempted, ["conftest.py"]);
}
