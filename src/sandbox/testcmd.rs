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
