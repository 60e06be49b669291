//! The grading integrity rule: a model change may fix the code under test, not the tests or the
//! machinery that runs and reports them.
//!
//! A path is *test infrastructure* when it is
//! - a `conftest.py` anywhere;
//! - a file that can hold pytest/tox configuration (`pytest.ini`, `.pytest.ini`, `tox.ini`,
//!   `setup.cfg`, `pyproject.toml`) anywhere;
//! - under a test directory (`tests/`, `test/`, `testing/`) or a test module (`test_*.py`,
//!   `*_test.py`, `tests.py`);
//! - an interpreter start-up hook (`sitecustomize.py`, `usercustomize.py`, `*.pth`) or package
//!   metadata that can register plugins (`*.dist-info/`, `*.egg-info/`);
//! - a top-level module that would shadow the test runner (`pytest`, `_pytest`, `pluggy`,
//!   `unittest`, `py`, `iniconfig`);
//! - a module named as a plugin (`-p NAME`, `pytest_plugins`) by the repository's test
//!   configuration or conftest files after the change;
//! - any other file whose added lines reach into the test runner or the interpreter's
//!   machinery ([`TAMPER_TOKENS`]: `_pytest`, `pytest.`, `unittest.`, `os._exit`, import hooks,
//!   frame and `gc` walking, `__code__` swaps, ...) — a heuristic, since in-process code can
//!   rewrite the tests it is run by; a token the gold patch itself adds is allowed.
//!
//! Per instance, the paths the gold patch itself touches are exempt (a repository whose real
//! fixes edit such files), as are configured path prefixes. What happens to the remaining
//! violations is the [`IntegrityMode`]: refuse the whole change, strip those files back to the
//! base commit, or only report.

use crate::swe::diff::Patch;
use crate::swe::repo::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// What to do with a model change that touches test infrastructure.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityMode {
    /// The run is not graded: status `integrity_refused`.
    Refuse,
    /// Those files are restored to the base commit, the rest of the change is graded.
    #[default]
    Strip,
    /// Violations are reported but left in place (for experiments only).
    Off,
}

impl std::str::FromStr for IntegrityMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "refuse" => Ok(IntegrityMode::Refuse),
            "strip" => Ok(IntegrityMode::Strip),
            "off" => Ok(IntegrityMode::Off),
            _ => Err(format!(
                "unknown integrity mode {s:?} (use refuse, strip or off)"
            )),
        }
    }
}

/// The integrity rule of a sandbox configuration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IntegrityRule {
    /// What to do with violations.
    pub mode: IntegrityMode,
    /// Exempt the paths the instance's gold patch touches.
    pub allow_gold_paths: bool,
    /// Repository-relative path prefixes that are always exempt.
    pub allow: Vec<String>,
}

impl Default for IntegrityRule {
    fn default() -> Self {
        IntegrityRule {
            mode: IntegrityMode::Strip,
            allow_gold_paths: true,
            allow: vec![],
        }
    }
}

/// Why a path counts as test infrastructure.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum InfraKind {
    /// A `conftest.py`.
    Conftest,
    /// A file that can hold pytest or tox configuration.
    TestConfig,
    /// A file under a test directory, or a test module.
    TestFile,
    /// `sitecustomize.py`, `usercustomize.py`, a `.pth` file or package metadata.
    StartupHook,
    /// A top-level module shadowing the test runner.
    RunnerShadow,
    /// A module the test configuration loads as a plugin.
    ConfigPlugin,
    /// Added code that reaches into the test runner or interpreter machinery.
    RunnerTamper,
}

/// Substrings of added lines that mark a change as tampering with the test run (see the module
/// documentation); compared case-sensitively.
pub const TAMPER_TOKENS: &[&str] = &[
    "_pytest",
    "pluggy",
    "import pytest",
    "from pytest",
    "pytest.",
    "import unittest",
    "from unittest",
    "unittest.",
    "os._exit",
    "sys.exit",
    "sys.settrace",
    "sys.setprofile",
    "sys._getframe",
    "sys.meta_path",
    "sys.path_hooks",
    "gc.get_objects",
    "gc.get_referrers",
    "__code__",
    "builtins",
    "atexit",
    "PYTEST_",
    "conftest",
];

/// One model-changed path that the rule flags.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// Repository-relative path.
    pub path: String,
    /// Why it is test infrastructure.
    pub kind: InfraKind,
    /// For [`InfraKind::RunnerTamper`], the token found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// What the rule did to one run's model change.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityAction {
    /// No violation.
    #[default]
    Clean,
    /// Violating files were restored to the base commit.
    Stripped,
    /// The change was refused.
    Refused,
    /// Violations found but the rule is off.
    Ignored,
}

/// The rule's verdict on one run, recorded in its result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IntegrityReport {
    /// What was done.
    pub action: IntegrityAction,
    /// Flagged paths (after exemptions).
    pub violations: Vec<Violation>,
    /// Infrastructure paths exempted because the gold patch or the allow list names them.
    pub exempted: Vec<String>,
}

impl IntegrityReport {
    /// True when the rule fired (stripped or refused something).
    pub fn fired(&self) -> bool {
        matches!(
            self.action,
            IntegrityAction::Stripped | IntegrityAction::Refused
        )
    }
}

const CONFIG_FILES: &[&str] = &[
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
];
const TEST_DIRS: &[&str] = &["tests", "test", "testing"];
const RUNNER_MODULES: &[&str] = &["pytest", "_pytest", "pluggy", "unittest", "py", "iniconfig"];

/// Classifies one repository-relative path by name alone.
pub fn classify(path: &str) -> Option<InfraKind> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let name = *comps.last()?;
    if name == "conftest.py" {
        return Some(InfraKind::Conftest);
    }
    if CONFIG_FILES.contains(&name) {
        return Some(InfraKind::TestConfig);
    }
    if name == "sitecustomize.py"
        || name == "usercustomize.py"
        || name.ends_with(".pth")
        || comps
            .iter()
            .any(|c| c.ends_with(".dist-info") || c.ends_with(".egg-info"))
    {
        return Some(InfraKind::StartupHook);
    }
    let top = comps[0].strip_suffix(".py").unwrap_or(comps[0]);
    if RUNNER_MODULES.contains(&top) && (comps.len() > 1 || comps[0].ends_with(".py")) {
        return Some(InfraKind::RunnerShadow);
    }
    let dirs = &comps[..comps.len() - 1];
    let test_module = name.ends_with(".py")
        && (name.starts_with("test_") || name.ends_with("_test.py") || name == "tests.py");
    if test_module || dirs.iter().any(|d| TEST_DIRS.contains(d)) {
        return Some(InfraKind::TestFile);
    }
    None
}

/// Plugin module names a config or conftest text loads: `-p NAME` / `-pNAME` options and
/// `pytest_plugins` entries (`no:NAME` disables rather than loads, and is skipped).
pub fn plugin_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let is_ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    for line in text.lines() {
        let tokens: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "\"'[],=()".contains(c))
            .filter(|t| !t.is_empty())
            .collect();
        for (i, t) in tokens.iter().enumerate() {
            let name = if *t == "-p" {
                tokens.get(i + 1).copied()
            } else {
                t.strip_prefix("-p")
            };
            if let Some(n) = name.filter(|n| is_ident(n)) {
                out.insert(n.to_string());
            }
        }
        if line.contains("pytest_plugins") {
            for t in tokens.iter().skip(1) {
                if is_ident(t) && *t != "pytest_plugins" {
                    out.insert(t.to_string());
                }
            }
        }
    }
    out
}

/// Files whose text may name plugins: every config file and conftest in the repository.
fn plugin_sources(repo: &Path, touched: &[String]) -> Vec<std::path::PathBuf> {
    let mut files: Vec<std::path::PathBuf> = CONFIG_FILES.iter().map(|f| repo.join(f)).collect();
    files.extend(
        touched
            .iter()
            .filter(|p| {
                matches!(
                    classify(p),
                    Some(InfraKind::Conftest | InfraKind::TestConfig)
                )
            })
            .map(|p| repo.join(p)),
    );
    files
}

/// True when the module `name` (dotted) would be loaded from `path`.
fn module_at(name: &str, path: &str) -> bool {
    let base = name.replace('.', "/");
    let stripped = path.strip_prefix("src/").unwrap_or(path);
    stripped == format!("{base}.py") || stripped.starts_with(&format!("{base}/"))
}

/// Paths a patch touches (old and new names).
pub fn patch_paths(patch: &str) -> BTreeSet<String> {
    Patch::parse(patch)
        .map(|p| {
            p.files
                .iter()
                .flat_map(|f| [f.old_path.clone(), f.new_path.clone()])
                .flatten()
                .collect()
        })
        .unwrap_or_default()
}

/// Lines a patch adds.
fn added_lines(patch: &str) -> Vec<String> {
    Patch::parse(patch)
        .map(|p| {
            p.files
                .iter()
                .flat_map(|f| f.hunks.iter().flat_map(|h| h.lines.iter()))
                .filter(|l| l.kind == crate::swe::diff::LineKind::Insert)
                .map(|l| l.text.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The first tamper token in a line of `new` that `base` does not have, skipping `allowed`.
fn tamper_token(base: &str, new: &str, allowed: &BTreeSet<&str>) -> Option<&'static str> {
    let old: BTreeSet<&str> = base.lines().map(str::trim).collect();
    new.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !old.contains(l))
        .find_map(|l| {
            TAMPER_TOKENS
                .iter()
                .find(|t| !allowed.contains(**t) && l.contains(**t))
                .copied()
        })
}

/// Checks the files a model change touched (`touched`, already applied in `repo`, whose base
/// commit is `base`) against the rule. `gold_patch` is the instance's reference fix (may be
/// empty).
pub fn check(
    rule: &IntegrityRule,
    repo: &Path,
    base: &Snapshot,
    touched: &[String],
    gold_patch: &str,
) -> IntegrityReport {
    let gold_added = added_lines(gold_patch);
    let allowed_tokens: BTreeSet<&str> = TAMPER_TOKENS
        .iter()
        .copied()
        .filter(|t| rule.allow_gold_paths && gold_added.iter().any(|l| l.contains(t)))
        .collect();
    let gold = if rule.allow_gold_paths {
        patch_paths(gold_patch)
    } else {
        BTreeSet::new()
    };
    let mut plugins = BTreeSet::new();
    for f in plugin_sources(repo, touched) {
        if let Ok(t) = std::fs::read_to_string(&f) {
            plugins.extend(plugin_names(&t));
        }
    }
    let mut report = IntegrityReport::default();
    for p in touched {
        let mut token = None;
        let kind = classify(p)
            .or_else(|| {
                plugins
                    .iter()
                    .any(|n| module_at(n, p))
                    .then_some(InfraKind::ConfigPlugin)
            })
            .or_else(|| {
                let new = std::fs::read(repo.join(p)).ok()?;
                let old = base.files.get(p).map(|f| f.bytes.as_slice()).unwrap_or(b"");
                token = tamper_token(
                    &String::from_utf8_lossy(old),
                    &String::from_utf8_lossy(&new),
                    &allowed_tokens,
                );
                token.map(|_| InfraKind::RunnerTamper)
            });
        let Some(kind) = kind else { continue };
        // Tampering is exempt only by token (above), not because the gold patch edits the file.
        let gold_path = kind != InfraKind::RunnerTamper && gold.contains(p);
        if gold_path || rule.allow.iter().any(|a| p.starts_with(a.as_str())) {
            report.exempted.push(p.clone());
        } else {
            report.violations.push(Violation {
                path: p.clone(),
                kind,
                token: token.map(str::to_string),
            });
        }
    }
    report.violations.sort();
    report.violations.dedup();
    report.action = match (report.violations.is_empty(), rule.mode) {
        (true, _) => IntegrityAction::Clean,
        (false, IntegrityMode::Refuse) => IntegrityAction::Refused,
        (false, IntegrityMode::Strip) => IntegrityAction::Stripped,
        (false, IntegrityMode::Off) => IntegrityAction::Ignored,
    };
    report
}

/// Restores `paths` in `repo` to their state in `base`: rewritten from the snapshot, or removed
/// when the base commit does not have them. Refuses to write through symlinks.
pub fn restore_to_base(repo: &Path, base: &Snapshot, paths: &[String]) -> Result<(), String> {
    for p in paths {
        let full = crate::sandbox::paths::resolve_for_write(repo, p).map_err(|e| e.to_string())?;
        match base.files.get(p) {
            Some(f) => {
                if let Ok(m) = std::fs::symlink_metadata(&full) {
                    if m.is_dir() {
                        std::fs::remove_dir_all(&full)
                            .map_err(|e| format!("restoring {p}: {e}"))?;
                    }
                }
                if let Some(parent) = full.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| format!("restoring {p}: {e}"))?;
                }
                std::fs::write(&full, &f.bytes).map_err(|e| format!("restoring {p}: {e}"))?;
                use std::os::unix::fs::PermissionsExt;
                let mode = if f.executable { 0o755 } else { 0o644 };
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| format!("restoring {p}: {e}"))?;
            }
            None => match std::fs::symlink_metadata(&full) {
                Ok(m) if m.is_dir() => {
                    std::fs::remove_dir_all(&full).map_err(|e| format!("removing {p}: {e}"))?
                }
                Ok(_) => std::fs::remove_file(&full).map_err(|e| format!("removing {p}: {e}"))?,
                Err(_) => {}
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_infrastructure_paths() {
        assert_eq!(classify("conftest.py"), Some(InfraKind::Conftest));
        assert_eq!(classify("pkg/sub/conftest.py"), Some(InfraKind::Conftest));
        assert_eq!(classify("pytest.ini"), Some(InfraKind::TestConfig));
        assert_eq!(classify("pyproject.toml"), Some(InfraKind::TestConfig));
        assert_eq!(classify("tests/helpers.py"), Some(InfraKind::TestFile));
        assert_eq!(classify("pkg/test_util.py"), Some(InfraKind::TestFile));
        assert_eq!(classify("sitecustomize.py"), Some(InfraKind::StartupHook));
        assert_eq!(classify("evil.pth"), Some(InfraKind::StartupHook));
        assert_eq!(
            classify("x-1.0.dist-info/entry_points.txt"),
            Some(InfraKind::StartupHook)
        );
        assert_eq!(classify("pytest.py"), Some(InfraKind::RunnerShadow));
        assert_eq!(classify("_pytest/runner.py"), Some(InfraKind::RunnerShadow));
        assert_eq!(
            classify("unittest/__init__.py"),
            Some(InfraKind::RunnerShadow)
        );
        assert_eq!(classify("calc.py"), None);
        assert_eq!(classify("pkg/testing_utils.py"), None);
        assert_eq!(classify("pkg/pytest_helpers.py"), None);
        assert_eq!(classify("docs/py/readme.md"), None);
    }

    #[test]
    fn finds_plugin_names_in_config_text() {
        let ini = "[pytest]\naddopts = -p evil_plugin -rA -pother.mod -p no:cacheprovider\n";
        let n = plugin_names(ini);
        assert!(
            n.contains("evil_plugin") && n.contains("other.mod"),
            "{n:?}"
        );
        assert!(!n.iter().any(|x| x.contains("no")), "{n:?}");
        let conf = "pytest_plugins = ['helpers.fixtures', \"more\"]\n";
        let n = plugin_names(conf);
        assert!(
            n.contains("helpers.fixtures") && n.contains("more"),
            "{n:?}"
        );
        assert!(module_at("helpers.fixtures", "helpers/fixtures.py"));
        assert!(module_at("evil_plugin", "src/evil_plugin/__init__.py"));
        assert!(!module_at("evil", "evil_plugin.py"));
    }

    #[test]
    fn check_strips_refuses_and_exempts_gold_paths() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pytest.ini"), "[pytest]\naddopts = -p hook\n").unwrap();
        let touched: Vec<String> = ["calc.py", "conftest.py", "hook.py", "tests/test_calc.py"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rule = IntegrityRule::default();
        let base = Snapshot::default();
        let r = check(&rule, d.path(), &base, &touched, "");
        assert_eq!(r.action, IntegrityAction::Stripped);
        let paths: Vec<&str> = r.violations.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(paths, ["conftest.py", "hook.py", "tests/test_calc.py"]);
        assert!(r.fired());
        let gold = "--- a/conftest.py\n+++ b/conftest.py\n@@ -1 +1 @@\n-a\n+b\n";
        let r = check(&rule, d.path(), &base, &touched, gold);
        assert_eq!(r.exempted, ["conftest.py"]);
        assert_eq!(r.violations.len(), 2);
        let refuse = IntegrityRule {
            mode: IntegrityMode::Refuse,
            ..IntegrityRule::default()
        };
        assert_eq!(
            check(&refuse, d.path(), &base, &touched, "").action,
            IntegrityAction::Refused
        );
        let clean = check(&refuse, d.path(), &base, &["calc.py".into()], "");
        assert_eq!(clean.action, IntegrityAction::Clean);
        assert!(!clean.fired());
    }

    #[test]
    fn added_runner_tampering_is_flagged_unless_the_gold_patch_adds_it() {
        let d = tempfile::tempdir().unwrap();
        let base = Snapshot::from_texts([("calc.py", "import os\ndef f():\n    return 1\n")]);
        let write = |t: &str| std::fs::write(d.path().join("calc.py"), t).unwrap();
        let rule = IntegrityRule::default();
        let touched = ["calc.py".to_string()];
        write("import os\ndef f():\n    return 2\n");
        assert_eq!(
            check(&rule, d.path(), &base, &touched, "").action,
            IntegrityAction::Clean
        );
        write("import os\ndef f():\n    os._exit(0)\n");
        let r = check(&rule, d.path(), &base, &touched, "");
        assert_eq!(r.violations[0].kind, InfraKind::RunnerTamper);
        assert_eq!(r.violations[0].token.as_deref(), Some("os._exit"));
        // A comment mentioning a token is not code.
        write("import os\ndef f():\n    # os._exit is not used\n    return 1\n");
        assert_eq!(
            check(&rule, d.path(), &base, &touched, "").action,
            IntegrityAction::Clean
        );
        let gold = "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n import os\n def f():\n-    return 1\n+    os._exit(3)\n";
        write("import os\ndef f():\n    os._exit(0)\n");
        assert_eq!(
            check(&rule, d.path(), &base, &touched, gold).action,
            IntegrityAction::Clean
        );
        // The gold patch editing the same file does not exempt other tokens.
        write("import os\ndef f():\n    import gc; gc.get_objects()\n");
        let r = check(&rule, d.path(), &base, &touched, gold);
        assert_eq!(r.violations[0].token.as_deref(), Some("gc.get_objects"));
    }

    #[test]
    fn restore_rewrites_or_removes() {
        let d = tempfile::tempdir().unwrap();
        let snap = Snapshot::from_texts([("a.py", "base\n")]);
        std::fs::write(d.path().join("a.py"), "changed\n").unwrap();
        std::fs::create_dir_all(d.path().join("new")).unwrap();
        std::fs::write(d.path().join("new/conftest.py"), "x").unwrap();
        restore_to_base(
            d.path(),
            &snap,
            &["a.py".into(), "new/conftest.py".into(), "absent.py".into()],
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("a.py")).unwrap(),
            "base\n"
        );
        assert!(!d.path().join("new/conftest.py").exists());
    }
}
