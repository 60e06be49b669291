//! The offline task generator: determinism and validity (needs python3 and git).

use sorft::swe::instance::read_jsonl;
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{training_records, EditReward};
use sorft::swe::synth::{self, SynthConfig};
use sorft::swe::truth::ground_truth;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn tree_bytes(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn same_seed_gives_identical_bytes_and_instances_are_valid() {
    let cfg = SynthConfig {
        n: 4,
        seed: 7,
        per_repo: 2,
        test_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let ra = synth::generate(&cfg, a.path(), &|_| {}).unwrap();
    synth::generate(&cfg, b.path(), &|_| {}).unwrap();
    assert_eq!(ra.instances.len(), 4);
    let ta = tree_bytes(a.path());
    let tb = tree_bytes(b.path());
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
    for (k, v) in &ta {
        assert!(tb[k] == *v, "{k} differs");
    }
    // A different seed gives different tasks.
    let c = tempfile::tempdir().unwrap();
    let rc = synth::generate(
        &SynthConfig {
            seed: 8,
            n: 2,
            ..cfg.clone()
        },
        c.path(),
        &|_| {},
    )
    .unwrap();
    assert_ne!(rc.instances[0].patch, ra.instances[0].patch);

    let instances = read_jsonl(&a.path().join("instances.jsonl")).unwrap();
    assert_eq!(instances, ra.instances);
    let store = RepoStore::new(a.path().join("repos"));
    for inst in &instances {
        assert!(!inst.fail_to_pass.is_empty() && !inst.pass_to_pass.is_empty());
        assert!(
            inst.fail_to_pass[0].contains(" (tests.test_"),
            "{}",
            inst.fail_to_pass[0]
        );
        synth::validate_instance(inst, &store, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{}: {e}", inst.instance_id));
        // The issue describes the behaviour, never the fix.
        let fix = sorft::swe::diff::Patch::parse(&inst.patch).unwrap();
        for l in fix
            .files
            .iter()
            .flat_map(|f| &f.hunks)
            .flat_map(|h| &h.lines)
        {
            if l.kind == sorft::swe::diff::LineKind::Insert && l.text.trim().len() > 12 {
                assert!(
                    !inst.problem_statement.contains(l.text.trim()),
                    "{}",
                    inst.problem_statement
                );
            }
        }
        // Ground truth and subtasks work on generated instances; the gold edit scores 1.
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        let func = inst.extra["synth"]["function"].as_str().unwrap();
        assert!(
            gt.functions.iter().any(|f| f.name == func),
            "{func} not in {:?}",
            gt.functions
        );
        let recs = training_records(inst, &snap, &gt);
        assert_eq!(recs.len(), 4);
        let gold = sorft::swe::edit::render_blocks(&gt.edits);
        assert_eq!(recs[3].reward(&gold, EditReward::LineFbeta).reward, 1.0);
    }
}

#[test]
fn every_template_project_passes_its_own_tests() {
    // Projects of several indices cover all templates and aliases; the clean suite must pass.
    for index in 0..2 {
        let p = synth::build_project(11, index);
        assert!(
            p.modules.len() >= 3 && p.modules.len() <= 10,
            "{}",
            p.modules.len()
        );
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in &p.files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        let r = synth::runner::run_unittest(dir.path(), Duration::from_secs(30)).unwrap();
        assert!(r.failing().is_empty(), "{}", r.log);
        assert!(r.passing().len() > 15);
    }
}
