//! The built-in teacher and the rejection filter on generated instances: answers parse, some
//! agree with ground truth and some do not, and the filter keeps exactly the agreeing ones.

use std::collections::BTreeMap;

use sorft::rft::eval::edit_to_patch;
use sorft::rft::teacher::{
    rejection_filter, sample_per_subtask, BuiltinTeacher, Teacher, TeacherItem, CANNOT_FIX,
};
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{training_records, EditReward, Subtask, SubtaskRecord};
use sorft::swe::synth::{generate, SynthConfig};
use sorft::swe::truth::ground_truth;

/// Subtask records (with their issue texts) of four generated instances.
fn records(dir: &std::path::Path) -> Vec<(SubtaskRecord, String)> {
    let cfg = SynthConfig {
        n: 4,
        seed: 11,
        ..Default::default()
    };
    let report = generate(&cfg, dir, &|_| {}).unwrap();
    let store = RepoStore::new(dir.join("repos"));
    let mut records: Vec<(SubtaskRecord, String)> = Vec::new();
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        for r in training_records(inst, &snap, &gt) {
            records.push((r, inst.problem_statement.clone()));
        }
    }
    records
}

/// The teacher's view of each record.
fn teacher_items(records: &[(SubtaskRecord, String)]) -> Vec<TeacherItem<'_>> {
    records
        .iter()
        .map(|(r, p)| TeacherItem {
            record: r,
            problem: p,
        })
        .collect()
}

#[test]
fn edit_prompts_get_their_own_sample_count_and_the_others_keep_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    let items = teacher_items(&records);
    let mut t = BuiltinTeacher::default();
    let plain = sample_per_subtask(&mut t, &items, 3, 0, 5).unwrap();
    let more = sample_per_subtask(&mut t, &items, 3, 9, 5).unwrap();
    let mut edits = 0;
    for ((item, a), b) in items.iter().zip(&plain).zip(&more) {
        assert_eq!(a.len(), 3);
        if item.record.subtask == Subtask::Edit {
            edits += 1;
            assert_eq!(b.len(), 9);
            assert_eq!(
                &b[..3],
                &a[..],
                "the first samples changed with the edit count"
            );
        } else {
            assert_eq!(a, b, "a localization prompt's samples changed");
        }
    }
    assert!(edits > 0);
}

#[test]
fn builtin_teacher_is_right_sometimes_and_the_filter_keeps_only_agreeing_samples() {
    let dir = tempfile::tempdir().unwrap();
    let records = records(dir.path());
    assert!(records.len() >= 8);
    let items = teacher_items(&records);
    let mut t = BuiltinTeacher::default();
    let a = t.sample(&items, 6, 3).unwrap();
    assert_eq!(
        a,
        t.sample(&items, 6, 3).unwrap(),
        "not deterministic by seed"
    );
    let (kept, stats) = rejection_filter(&items, &a, EditReward::LineFbeta);
    let mut by_subtask: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut edits, mut refusals) = (0usize, 0usize);
    for (item, outs) in items.iter().zip(&a) {
        for o in outs {
            let r = item.record.reward(o, EditReward::LineFbeta);
            let e = by_subtask
                .entry(item.record.subtask.name().into())
                .or_default();
            e.0 += 1;
            e.1 += (r.reward > 0.0) as usize;
            if item.record.subtask.name() == "edit" {
                // An edit either changes code or says it cannot fix the issue: no no-op edits.
                edits += 1;
                if o == CANNOT_FIX {
                    refusals += 1;
                    assert_eq!(r.reward, 0.0);
                    continue;
                }
                assert!(
                    edit_to_patch(item.record, o).is_some(),
                    "an edit that changes nothing: {o}"
                );
                assert!(!o.contains("# reviewed"), "{o}");
            }
            // Every answer parses into something (no empty-answer zeros).
            assert_ne!(
                r.zero_reason,
                Some(sorft::swe::reward::ZeroReason::EmptyAnswer),
                "{}: {o}",
                item.record.subtask.name()
            );
        }
    }
    assert!(
        edits > 0 && refusals < edits,
        "{refusals} refusals of {edits} edits"
    );
    let file = by_subtask["file"];
    assert!(file.1 > 0, "the teacher never found a file");
    let total_pass: usize = by_subtask.values().map(|v| v.1).sum();
    let total: usize = by_subtask.values().map(|v| v.0).sum();
    assert!(
        total_pass < total,
        "the teacher is never wrong, the filter would be pointless"
    );
    for (name, st) in &stats {
        assert_eq!(st.passed, by_subtask[name].1);
        assert!(st.kept <= st.passed);
    }
    assert_eq!(kept.len(), stats.values().map(|s| s.kept).sum::<usize>());
    for conv in &kept {
        assert_eq!(conv[0].role, "user");
        assert_eq!(conv[1].role, "assistant");
    }
    eprintln!("teacher acceptance: {by_subtask:?}");
}
