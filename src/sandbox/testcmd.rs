//! The test command of an instance: a table keyed by repository (and version), with pytest
//! `-rA` as the default and unittest for the task generator's synthetic repositories.

use crate::sandbox::error::{Result, SandboxError};
use crate::sandbox::logparse::{LogParser, PytestParser, UnittestParser};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The runner a test command uses (which also picks the log parser).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// `python -m pytest -rA <files>`.
    Pytest,
    /// `python -m unittest -v <files>`.
    Unittest,
}

impl Runner {
    /// Arguments after the interpreter, before the test files.
    pub fn default_args(self) -> Vec<String> {
        match self {
            Runner::Pytest => vec!["-m".into(), "pytest".into(), "-rA".into()],
            Runner::Unittest => vec!["-m".into(), "unittest".into(), "-v".into()],
        }
    }

    /// The parser of this runner's log.
    pub fn parser(self) -> &'static dyn LogParser {
        match self {
            Runner::Pytest => &PytestParser,
            Runner::Unittest => &UnittestParser,
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CommandEntry {
    /// Repository (`owner/name`); a trailing `*` matches any repository with that prefix.
    pub repo: String,
    /// Version, or any version when absent.
    #[serde(default)]
    pub version: Option<String>,
    /// The runner.
    pub runner: Runner,
    /// Arguments replacing the runner's defaults (the test files are appended).
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Append the test patch's files (true, SWE-bench's way) or run the whole suite (false).
    #[serde(default = "yes")]
    pub pass_files: bool,
}

fn yes() -> bool {
    true
}

/// A resolved test command: interpreter arguments (the files are appended at run time).
#[derive(Clone, Debug, PartialEq)]
pub struct TestCommand {
    /// The runner.
    pub runner: Runner,
    /// Arguments after the interpreter.
    pub args: Vec<String>,
    /// Whether the test files are appended.
    pub pass_files: bool,
}

impl TestCommand {
    /// The full argument list for these test files.
    pub fn args_for(&self, test_files: &[String]) -> Vec<String> {
        let mut a = self.args.clone();
        if self.pass_files {
            a.extend(test_files.iter().cloned());
        }
        a
    }

    /// The argument list run in the sandbox: `-m pytest` / `-m unittest` replaced by the
    /// hardened [`BOOTSTRAP`] (runner imported before the repository is on `sys.path`, end
    /// marker after it returns), pytest with `-p no:cacheprovider`, a fixed `--rootdir` and
    /// `--confcutdir` (the repository) and an explicit ini file `ini`; unittest with `-b`
    /// (test output buffered, so it cannot forge progress lines). Other argument lists are kept.
    pub fn hardened_args(&self, test_files: &[String], repo: &Path, ini: &Path) -> Vec<String> {
        let args = self.args_for(test_files);
        let module = match args.as_slice() {
            [m, name, ..] if m == "-m" && (name == "pytest" || name == "unittest") => name.clone(),
            _ => return args,
        };
        let mut out = vec!["-c".to_string(), BOOTSTRAP.to_string(), module.clone()];
        if module == "pytest" {
            out.extend([
                "-p".to_string(),
                "no:cacheprovider".to_string(),
                format!("--rootdir={}", repo.display()),
                format!("--confcutdir={}", repo.display()),
                "-c".to_string(),
                ini.display().to_string(),
            ]);
        } else {
            out.push("-b".to_string());
        }
        out.extend(args.into_iter().skip(2));
        out
    }
}

/// The line the hardened runner prints after the test runner returns: `MARKER nonce exit=N`.
pub const END_MARKER: &str = "@@sorft-runner-end@@";

/// Python code run with `-c` in place of `-m pytest` / `-m unittest`. It drops the working
/// directory from `sys.path` (like `-P`, so a repository file cannot shadow the runner), imports
/// the runner and its built-in plugins, puts the repository back on the path, reads a one-time
/// nonce from stdin (then closed), runs the tests and prints [`END_MARKER`] with the nonce and
/// exit status. The grader reads only the log before that marker; a run that never prints it
/// (`os._exit`, a crash, a kill) has no results.
pub const BOOTSTRAP: &str = r#"import sys, os
if sys.path and sys.path[0] in ('', '.', os.getcwd()):
    del sys.path[0]
def _sorft_run(module, args):
    import importlib
    nonce = sys.stdin.readline().strip()
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    if module == 'pytest':
        import pytest
        try:
            from _pytest.config import default_plugins
        except ImportError:
            default_plugins = ()
        for name in default_plugins:
            try:
                importlib.import_module('_pytest.' + name)
            except Exception:
                pass
        sys.path.insert(0, os.getcwd())
        rc = int(pytest.main(args))
    else:
        import unittest, unittest.main, unittest.runner, unittest.loader
        sys.path.insert(0, os.getcwd())
        prog = unittest.main(module=None, argv=['python -m unittest'] + args, exit=False)
        rc = 0 if prog.result.wasSuccessful() else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, ('\n@@sorft-runner-end@@ %s exit=%d\n' % (nonce, rc)).encode())
    return rc
sys.exit(_sorft_run(sys.argv[1], sys.argv[2:]))
"#;

/// The pytest configuration file a run uses, from the base commit's files (pytest's own order
/// of precedence at the root): `pytest.ini`, `.pytest.ini`, `pyproject.toml` with
/// `[tool.pytest.ini_options]`, `tox.ini` with `[pytest]`, `setup.cfg` with `[tool:pytest]`.
pub fn pytest_config(text_of: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    const CANDIDATES: &[(&str, Option<&str>)] = &[
        ("pytest.ini", None),
        (".pytest.ini", None),
        ("pyproject.toml", Some("[tool.pytest.ini_options]")),
        ("tox.ini", Some("[pytest]")),
        ("setup.cfg", Some("[tool:pytest]")),
    ];
    CANDIDATES.iter().find_map(|(name, section)| {
        let text = text_of(name)?;
        match section {
            Some(sec) if !text.contains(sec) => None,
            _ => Some(*name),
        }
    })
}

/// Test commands keyed by repository and version.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CommandTable {
    /// Rows; the most specific match wins (exact repo+version, then repo, then prefix).
    pub entries: Vec<CommandEntry>,
}

/// Repository prefix of the task generator's synthetic repositories.
pub const SYNTH_REPO_PREFIX: &str = "synth/";

impl Default for CommandTable {
    fn default() -> Self {
        CommandTable {
            entries: vec![CommandEntry {
                repo: format!("{SYNTH_REPO_PREFIX}*"),
                version: None,
                runner: Runner::Unittest,
                args: None,
                // The generator's PASS_TO_PASS spans the whole suite: run it all.
                pass_files: false,
            }],
        }
    }
}

impl CommandTable {
    /// Reads a JSON table (`{"entries": [...]}`) and puts its rows before the built-in ones.
    pub fn load(path: &Path) -> Result<CommandTable> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SandboxError::io(format!("reading {}", path.display()), e))?;
        let mut t: CommandTable = serde_json::from_str(&text).map_err(|e| SandboxError::Input {
            file: path.to_path_buf(),
            message: e.to_string(),
        })?;
        t.entries.extend(CommandTable::default().entries);
        Ok(t)
    }

    /// The command for `repo` at `version` (pytest `-rA` when no row matches).
    pub fn lookup(&self, repo: &str, version: Option<&str>) -> TestCommand {
        let score = |e: &CommandEntry| -> Option<u8> {
            let repo_ok = match e.repo.strip_suffix('*') {
                Some(prefix) => repo.starts_with(prefix),
                None => e.repo == repo,
            };
            if !repo_ok {
                return None;
            }
            let exact = !e.repo.ends_with('*');
            match (&e.version, version) {
                (Some(v), Some(w)) if v == w => Some(if exact { 3 } else { 2 }),
                (Some(_), _) => None,
                (None, _) => Some(if exact { 1 } else { 0 }),
            }
        };
        let best = self
            .entries
            .iter()
            .filter_map(|e| score(e).map(|s| (s, e)))
            .fold(None::<(u8, &CommandEntry)>, |acc, (s, e)| match acc {
                Some((bs, _)) if bs >= s => acc,
                _ => Some((s, e)),
            });
        match best {
            Some((_, e)) => TestCommand {
                runner: e.runner,
                args: e.args.clone().unwrap_or_else(|| e.runner.default_args()),
                pass_files: e.pass_files,
            },
            None => TestCommand {
                runner: Runner::Pytest,
                args: Runner::Pytest.default_args(),
                pass_files: true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardened_args_replace_the_module_runner() {
        let t = CommandTable::default();
        let p = t.lookup("x/y", None);
        let a = p.hardened_args(
            &["t.py".into()],
            Path::new("/w/repo"),
            Path::new("/w/p.ini"),
        );
        assert_eq!(&a[..3], ["-c", BOOTSTRAP, "pytest"]);
        for want in [
            "no:cacheprovider",
            "--rootdir=/w/repo",
            "--confcutdir=/w/repo",
            "/w/p.ini",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert_eq!(a.last().unwrap(), "t.py");
        assert!(a.iter().any(|x| x == "-rA"));
        let u = t
            .lookup("synth/x", None)
            .hardened_args(&[], Path::new("/r"), Path::new("/i"));
        assert_eq!(&u[2..], ["unittest", "-b", "-v"]);
        let custom = TestCommand {
            runner: Runner::Pytest,
            args: vec!["runtests.py".into()],
            pass_files: false,
        };
        assert_eq!(
            custom.hardened_args(&[], Path::new("/r"), Path::new("/i")),
            ["runtests.py"]
        );
    }

    #[test]
    fn pytest_config_follows_precedence() {
        let files = |m: &'static [(&'static str, &'static str)]| {
            move |n: &str| m.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
        };
        assert_eq!(pytest_config(files(&[])), None);
        assert_eq!(pytest_config(files(&[("setup.cfg", "[metadata]\n")])), None);
        assert_eq!(
            pytest_config(files(&[
                ("setup.cfg", "[tool:pytest]\n"),
                ("tox.ini", "[tox]\n")
            ])),
            Some("setup.cfg")
        );
        assert_eq!(
            pytest_config(files(&[
                ("setup.cfg", "[tool:pytest]\n"),
                ("pytest.ini", "")
            ])),
            Some("pytest.ini")
        );
    }

    #[test]
    fn lookup_prefers_specific_rows() {
        let mut t = CommandTable::default();
        t.entries.push(CommandEntry {
            repo: "astropy/astropy".into(),
            version: Some("4.3".into()),
            runner: Runner::Pytest,
            pass_files: true,
            args: Some(vec![
                "-m".into(),
                "pytest".into(),
                "-rA".into(),
                "-p".into(),
                "no:cacheprovider".into(),
            ]),
        });
        assert_eq!(t.lookup("django/django", None).runner, Runner::Pytest);
        assert_eq!(
            t.lookup("django/django", None).args,
            Runner::Pytest.default_args()
        );
        assert_eq!(t.lookup("synth/calc-1", None).runner, Runner::Unittest);
        assert_eq!(t.lookup("astropy/astropy", Some("4.3")).args.len(), 5);
        assert_eq!(t.lookup("astropy/astropy", Some("5.0")).args.len(), 3);
        let c = t.lookup("x/y", None);
        assert_eq!(c.args_for(&["t.py".into()]).last().unwrap(), "t.py");
        let s = t.lookup("synth/pkg", None);
        assert_eq!(
            s.args_for(&["t.py".into()]),
            Runner::Unittest.default_args()
        );
    }
}
