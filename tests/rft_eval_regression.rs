//! Regression tests found by running the repository's tests at the base commit, on a planted
//! case: the base commit gains one failing and one passing unrelated test. The failing one must
//! not count as a regression test; a patch breaking passing tests must lose the selection even
//! with more votes; %Resolved against samples comes from prefixes of one set of samples.

use std::collections::BTreeMap;

use sorft::rft::eval::{evaluate_with, sandbox_config, Answerer, EvalConfig};
use sorft::rft::regression::{failing_regression, RegressionSuites};
use sorft::sandbox::runner::MirrorRepos;
use sorft::swe::edit::render_blocks;
use sorft::swe::instance::Instance;
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{Subtask, SubtaskRecord};
use sorft::swe::synth::gitrepo::commit_files;
use sorft::swe::synth::{generate, SynthConfig};

const PLANTED: &str = "import unittest\n\n\nclass TestPlanted(unittest.TestCase):\n    def test_planted_passes(self):\n        self.assertEqual(1 + 1, 2)\n\n    def test_planted_fails(self):\n        self.assertEqual(1 + 1, 3)\n";

/// One synthetic instance whose base commit also holds tests/test_planted.py.
fn planted(dir: &std::path::Path) -> (Instance, std::path::PathBuf) {
    let report = generate(
        &SynthConfig {
            n: 1,
            seed: 5,
            ..Default::default()
        },
        dir,
        &|_| {},
    )
    .unwrap();
    let mut inst = report.instances[0].clone();
    let repos = dir.join("repos");
    let store = RepoStore::new(&repos);
    let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
    let mut files: BTreeMap<String, String> = snap
        .files
        .iter()
        .map(|(p, f)| (p.clone(), String::from_utf8(f.bytes.clone()).unwrap()))
        .collect();
    files.insert("tests/test_planted.py".into(), PLANTED.into());
    let commit = commit_files(
        &store.mirror_path(&inst.repo),
        &files,
        "planted",
        1_600_000_000,
        "planted",
    )
    .unwrap();
    inst.base_commit = commit;
    (inst, repos)
}

/// The gold edit, with a line that leaves a bracket open (a syntax error that breaks every test
/// importing the module) when `broken`.
fn gold_edit(r: &SubtaskRecord, broken: bool) -> String {
    let mut edits = r.truth.edits.clone();
    if broken {
        for e in &mut edits {
            let last = e.replace.lines().last().unwrap_or("").to_string();
            let indent = &last[..last.len() - last.trim_start().len()];
            let nl = if e.replace.ends_with('\n') { "\n" } else { "" };
            e.replace = format!(
                "{}\n{indent}planted = ({nl}",
                e.replace.trim_end_matches('\n')
            );
        }
    }
    render_blocks(&edits)
}

/// Localizes from ground truth; edits: the greedy and first sampled edits break the module,
/// the last is the gold edit.
struct Breaker;

impl Answerer for Breaker {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        t: f32,
        _s: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        Ok(recs
            .iter()
            .map(|r| {
                let t_ = &r.truth;
                let one = match r.subtask {
                    Subtask::File => format!("```\n{}\n```", t_.files.join("\n")),
                    Subtask::Function => {
                        let mut s = String::from("```\n");
                        for f in &t_.functions {
                            s.push_str(&format!("{}\n{}: {}\n", f.path, f.kind.word(), f.name));
                        }
                        s + "```"
                    }
                    Subtask::Line => {
                        let mut s = String::from("```\n");
                        for l in &t_.lines {
                            s.push_str(&format!("{}\nline: {}\n", l.path, l.line));
                        }
                        s + "```"
                    }
                    Subtask::Edit => {
                        return if t == 0.0 {
                            vec![gold_edit(r, true)]
                        } else {
                            vec![gold_edit(r, true), gold_edit(r, false)]
                                .into_iter()
                                .take(n)
                                .collect()
                        };
                    }
                };
                vec![one; n]
            })
            .collect())
    }
}

#[test]
fn a_failing_base_test_is_no_regression_test_and_a_breaking_patch_loses() {
    let dir = tempfile::tempdir().unwrap();
    let (inst, repos) = planted(dir.path());
    let sb = sandbox_config(60.0).unwrap();
    let mirrors = MirrorRepos::new(&repos);
    let cache = dir.path().join("cache");
    let mut suites = RegressionSuites::new(Some(cache.clone()));
    let suite = suites.suite(&sb, &mirrors, &inst).clone();
    assert!(
        suite.iter().any(|t| t.contains("test_planted_passes")),
        "{suite:?}"
    );
    assert!(
        !suite.iter().any(|t| t.contains("test_planted_fails")),
        "a test failing at the base commit is no regression test: {suite:?}"
    );
    // More than the planted test: the repository's own suite passes at the base commit.
    assert!(suite.len() > 1, "{suite:?}");
    // Cached on disk per repository and commit: a fresh cache reads it back.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    let again = RegressionSuites::new(Some(cache.clone()))
        .suite(&sb, &mirrors, &inst)
        .clone();
    assert_eq!(again, suite);
    // The gold patch breaks none of them (the failing planted test does not count).
    assert_eq!(
        failing_regression(&sb, &mirrors, &inst, &suite, &inst.patch),
        0
    );

    let cfg = EvalConfig {
        edit_samples: 3,
        workers: 2,
        test_timeout: 60.0,
        ..Default::default()
    };
    let instances = vec![inst];
    let (outs, sum) = evaluate_with(
        &mut Breaker,
        &instances,
        &repos,
        &cfg,
        &mut suites,
        &mut |_| {},
    )
    .unwrap();
    // Two votes for the breaking patch, one for the gold: the regression tests decide.
    assert!(outs[0].resolved, "{outs:?}");
    assert!(!outs[0].patch.contains("planted = ("), "{}", outs[0].patch);
    assert_eq!(sum.resolved_pct, 100.0);
    // With 1 or 2 samples only the breaking patch was there.
    assert_eq!(
        sum.resolved_curve,
        vec![(1, 0.0), (2, 0.0), (3, 100.0)],
        "{sum:?}"
    );
}
