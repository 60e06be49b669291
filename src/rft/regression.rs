//! Regression tests as Agentless finds them: the repository's own tests that pass at the base
//! commit, found by running the suite in the sandbox (not read from the benchmark's
//! PASS_TO_PASS list), cached per repository and commit; a candidate patch is then run against
//! them and scored by how many it breaks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::sandbox::logparse::{LogParser, StatusMap, TestStatus};
use crate::sandbox::runner::{run_repository_tests, RepoProvider, SandboxConfig};
use crate::swe::instance::Instance;

/// The tests of one repository at one commit that pass there (canonical names).
pub type Suite = BTreeSet<String>;

/// Regression suites by (repository, commit), in memory and optionally in a folder on disk
/// (one JSON list per repository and commit), so that repeated evaluations run each suite once.
#[derive(Debug, Default)]
pub struct RegressionSuites {
    dir: Option<PathBuf>,
    suites: BTreeMap<(String, String), Suite>,
}

impl RegressionSuites {
    /// An empty cache; `dir` (created when needed) keeps suites across runs.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            suites: BTreeMap::new(),
        }
    }

    fn file(&self, repo: &str, commit: &str) -> Option<PathBuf> {
        let safe: String = repo
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { '_' })
            .collect();
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{safe}@{commit}.json")))
    }

    /// The suite of `inst`'s repository at its base commit, running the tests there the first
    /// time (a run that yields no results gives an empty suite).
    pub fn suite(
        &mut self,
        cfg: &SandboxConfig,
        repos: &dyn RepoProvider,
        inst: &Instance,
    ) -> &Suite {
        let key = (inst.repo.clone(), inst.base_commit.clone());
        if !self.suites.contains_key(&key) {
            let file = self.file(&inst.repo, &inst.base_commit);
            let cached: Option<Suite> = file
                .as_ref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .and_then(|t| serde_json::from_str(&t).ok());
            let suite = match cached {
                Some(s) => s,
                None => {
                    let r = run_repository_tests(cfg, repos, inst, None);
                    let s = passing(parser_of(cfg, inst), &r.tests);
                    if let Some(f) = &file {
                        // The cache is an optimisation: a write that fails only costs a rerun.
                        if let Some(parent) = f.parent() {
                            let _ = std::fs::create_dir_all(parent);
                        }
                        if let Ok(text) = serde_json::to_string(&s) {
                            let _ = std::fs::write(f, text);
                        }
                    }
                    s
                }
            };
            self.suites.insert(key.clone(), suite);
        }
        &self.suites[&key]
    }

    /// Fills the cache for every distinct (repository, base commit) of `instances`, `workers`
    /// suites at a time.
    pub fn prepare(
        &mut self,
        cfg: &SandboxConfig,
        repos: &dyn RepoProvider,
        instances: &[&Instance],
        workers: usize,
    ) -> anyhow::Result<()> {
        let mut todo: BTreeMap<(String, String), &Instance> = BTreeMap::new();
        for inst in instances {
            let key = (inst.repo.clone(), inst.base_commit.clone());
            let on_disk = self
                .file(&inst.repo, &inst.base_commit)
                .is_some_and(|f| f.exists());
            if !self.suites.contains_key(&key) && !on_disk {
                todo.insert(key, inst);
            }
        }
        let found: Vec<((String, String), Suite)> = {
            use rayon::prelude::*;
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(workers.max(1))
                .build()?;
            let todo: Vec<_> = todo.into_iter().collect();
            pool.install(|| {
                todo.par_iter()
                    .map(|(k, inst)| {
                        let mut one = RegressionSuites::new(self.dir.clone());
                        (k.clone(), one.suite(cfg, repos, inst).clone())
                    })
                    .collect()
            })
        };
        self.suites.extend(found);
        for inst in instances {
            self.suite(cfg, repos, inst);
        }
        Ok(())
    }
}

/// The log parser of `inst`'s test command (it canonicalises test names).
fn parser_of(cfg: &SandboxConfig, inst: &Instance) -> &'static dyn LogParser {
    cfg.commands
        .lookup(&inst.repo, Some(inst.version.as_str()))
        .runner
        .parser()
}

/// The canonical names of the tests that passed in `statuses`.
pub fn passing(parser: &dyn LogParser, statuses: &StatusMap) -> Suite {
    statuses
        .iter()
        .filter(|(_, s)| matches!(s, TestStatus::Passed))
        .map(|(k, _)| parser.normalize(k))
        .collect()
}

/// How many tests of `suite` do not pass (or are missing) in `statuses`, the result of running
/// the repository's tests with a candidate patch; skipped tests count as kept.
pub fn broken(parser: &dyn LogParser, suite: &Suite, statuses: &StatusMap) -> usize {
    let now: BTreeMap<String, TestStatus> = statuses
        .iter()
        .map(|(k, v)| (parser.normalize(k), *v))
        .collect();
    suite
        .iter()
        .filter(|t| {
            !matches!(
                now.get(*t),
                Some(TestStatus::Passed | TestStatus::Skipped | TestStatus::Xfail)
            )
        })
        .count()
}

/// Runs the repository's tests with `patch` applied and counts the regression tests of `suite`
/// it breaks (all of them when the patch does not apply or the run yields nothing).
pub fn failing_regression(
    cfg: &SandboxConfig,
    repos: &dyn RepoProvider,
    inst: &Instance,
    suite: &Suite,
    patch: &str,
) -> usize {
    let r = run_repository_tests(cfg, repos, inst, Some(patch));
    if !r.applied {
        return suite.len();
    }
    broken(parser_of(cfg, inst), suite, &r.tests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_counts_failures_and_missing_tests_of_the_suite_only() {
        let parser = crate::sandbox::logparse::PytestParser;
        let suite: Suite = ["t.py::a", "t.py::b", "t.py::c", "t.py::d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut st = StatusMap::new();
        st.insert("t.py::a".into(), TestStatus::Passed);
        st.insert("t.py::b".into(), TestStatus::Failed);
        st.insert("t.py::c".into(), TestStatus::Skipped);
        st.insert("t.py::e".into(), TestStatus::Failed); // not a regression test
                                                         // b fails, d is missing.
        assert_eq!(broken(&parser, &suite, &st), 2);
        assert_eq!(passing(&parser, &st).len(), 1);
    }
}
