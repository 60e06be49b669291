//! Stage-2 edit reward from execution: the gold edit scores 1, an edit that touches the
//! ground-truth line (positive rule reward) but does not fix the bug scores 0 under execution and
//! only rule shaping under mixed; results are cached; renamed prompts map back to the mirror;
//! multi-file gold edits resolve in the sandbox. Prints the scoring seconds of each mode.

use std::time::Instant;

use sorft::pipeline::augment::rename_item;
use sorft::rft::eval::sandbox_config;
use sorft::rft::exec_reward::{EditExec, ExecReward, MIXED_RULE_WEIGHT};
use sorft::rft::rl::RlItem;
use sorft::swe::edit::render_blocks;
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{training_records, EditReward, Subtask, SubtaskRecord};
use sorft::swe::synth::{generate, SynthConfig};
use sorft::swe::truth::ground_truth;

/// An edit that replaces the first ground-truth line with `pass`: it touches the right line.
fn touch_but_break(r: &SubtaskRecord) -> Option<String> {
    let gt = r.truth.lines.first()?;
    r.shown.windows.iter().find_map(|w| {
        if w.path != gt.path || gt.line < w.start_line {
            return None;
        }
        let line = w.text.lines().nth(gt.line - w.start_line)?;
        let indent = &line[..line.len() - line.trim_start().len()];
        Some(format!(
            "```python\n### {}\n<<<<<<< SEARCH\n{line}\n=======\n{indent}pass\n>>>>>>> REPLACE\n```",
            w.path
        ))
    })
}

#[test]
fn execution_reward_catches_edits_that_only_touch_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 2,
            seed: 4,
            per_repo: 2,
            multi_file_fraction: 1.0,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    assert!(report.multi_file >= 1);
    let store = RepoStore::new(dir.path().join("repos"));
    let mut all = Vec::new();
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        all.extend(training_records(inst, &snap, &gt));
    }
    let edits: Vec<&SubtaskRecord> = all.iter().filter(|r| r.subtask == Subtask::Edit).collect();
    let file_rec = all.iter().find(|r| r.subtask == Subtask::File).unwrap();
    assert!(edits.iter().any(|r| r.truth.files.len() == 2));
    let sb = sandbox_config(60.0).unwrap();
    let repos = dir.path().join("repos");
    let mut jobs: Vec<(&SubtaskRecord, String, f64)> = Vec::new();
    for r in &edits {
        let gold = render_blocks(&r.truth.edits);
        let bad = touch_but_break(r).unwrap();
        let rule_bad = r.reward(&bad, EditReward::LineFbeta).reward;
        assert!(rule_bad > 0.0, "the planted edit passes the rule reward");
        jobs.push((*r, gold, 1.0));
        jobs.push((*r, bad, rule_bad));
    }
    jobs.push((file_rec, "nothing".into(), 0.25));
    let triples: Vec<(&SubtaskRecord, &str, f64)> =
        jobs.iter().map(|(r, t, x)| (*r, t.as_str(), *x)).collect();
    for mode in [EditExec::Rule, EditExec::Execution, EditExec::Mixed] {
        let exec = ExecReward::new(mode, &report.instances, repos.clone(), sb.clone(), 2);
        let t = Instant::now();
        let got = exec.rewards(&triples).unwrap();
        let cold = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let again = exec.rewards(&triples).unwrap();
        let warm = t.elapsed().as_secs_f64();
        println!(
            "{mode:?}: {} answers, cold {cold:.2} s, cached {warm:.3} s, {:?}",
            triples.len(),
            exec.stats()
        );
        assert_eq!(got, again);
        assert_eq!(
            *got.last().unwrap(),
            0.25,
            "non-edit answers keep the rule reward"
        );
        for (k, (_, _, rule)) in jobs.iter().enumerate().take(jobs.len() - 1) {
            let gold = k % 2 == 0;
            let want = match (mode, gold) {
                (EditExec::Rule, _) => *rule,
                (_, true) => 1.0,
                (EditExec::Execution, false) => 0.0,
                (EditExec::Mixed, false) => MIXED_RULE_WEIGHT * rule,
            };
            assert_eq!(got[k], want, "{mode:?} answer {k}");
        }
        if mode != EditExec::Rule {
            let s = exec.stats();
            assert_eq!(s.runs, 2 * edits.len(), "each distinct patch runs once");
            assert_eq!(s.cache_hits, 2 * edits.len());
        }
    }
}

#[test]
fn renamed_prompts_are_run_under_the_real_package_name() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 1,
            seed: 5,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    let inst = &report.instances[0];
    let store = RepoStore::new(dir.path().join("repos"));
    let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
    let gt = ground_truth(&inst.patch, &snap).unwrap();
    let rec = training_records(inst, &snap, &gt)
        .into_iter()
        .find(|r| r.subtask == Subtask::Edit)
        .unwrap();
    let item = rename_item(
        &RlItem {
            record: rec,
            problem: inst.problem_statement.clone(),
        },
        "zorbix42",
    )
    .unwrap();
    assert!(item.record.repo.ends_with("zorbix42"));
    let gold = render_blocks(&item.record.truth.edits);
    assert!(gold.contains("zorbix42/"));
    let exec = ExecReward::new(
        EditExec::Execution,
        &report.instances,
        dir.path().join("repos"),
        sandbox_config(60.0).unwrap(),
        1,
    );
    let got = exec.rewards(&[(&item.record, &gold, 1.0)]).unwrap();
    assert_eq!(got, vec![1.0]);
}
