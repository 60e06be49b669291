//! Stage-1 edit acceptance by execution: the gold edit resolves its instance in the sandbox and
//! is kept; an edit that touches the ground-truth line (positive rule reward, which SoRFT's
//! overlap filter accepts) but does not fix the bug fails execution and is dropped.

use sorft::rft::accept::execution_passes;
use sorft::rft::eval::sandbox_config;
use sorft::rft::teacher::{rejection_filter_checked, rejection_filter_indexed, TeacherItem};
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
fn execution_keeps_fixes_and_drops_edits_that_only_touch_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 3,
            seed: 5,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    let store = RepoStore::new(dir.path().join("repos"));
    let mut recs = Vec::new();
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        recs.extend(
            training_records(inst, &snap, &gt)
                .into_iter()
                .filter(|r| r.subtask == Subtask::Edit),
        );
    }
    let pairs: Vec<(&SubtaskRecord, Vec<String>)> = recs
        .iter()
        .filter_map(|r| Some((r, vec![render_blocks(&r.truth.edits), touch_but_break(r)?])))
        .collect();
    assert!(!pairs.is_empty());
    let records: Vec<&SubtaskRecord> = pairs.iter().map(|p| p.0).collect();
    let samples: Vec<Vec<String>> = pairs.iter().map(|p| p.1.clone()).collect();
    let problem = String::new();
    let items: Vec<TeacherItem> = records
        .iter()
        .map(|r| TeacherItem {
            record: r,
            problem: &problem,
        })
        .collect();
    // The overlap filter accepts the line-touching edit ...
    let (_, overlap) = rejection_filter_indexed(&items, &samples, EditReward::LineFbeta);
    let n = pairs.len();
    assert_eq!(overlap["edit"].passed, 2 * n, "{overlap:?}");
    // ... execution does not.
    let sb = sandbox_config(60.0).unwrap();
    let ran = execution_passes(
        &records,
        &samples,
        &report.instances,
        &dir.path().join("repos"),
        &sb,
        2,
    )
    .unwrap();
    for (k, r) in ran.iter().enumerate() {
        assert_eq!(r, &vec![true, false], "{}", records[k].instance_id);
    }
    let (kept, stats) =
        rejection_filter_checked(&items, &samples, EditReward::LineFbeta, Some(&ran));
    assert_eq!(
        (stats["edit"].passed, stats["edit"].failed_execution),
        (n, n)
    );
    assert_eq!(kept.len(), n);
}
