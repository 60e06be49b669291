//! Harder synthetic issues: traceback-only and behaviour-only issue styles (no import line),
//! distractor modules and multi-file bugs. Every instance must still validate (needs python3, git).

use sorft::swe::diff::Patch;
use sorft::swe::edit::render_blocks;
use sorft::swe::instance::Instance;
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{training_records, EditReward};
use sorft::swe::synth::issue::IssueStyles;
use sorft::swe::synth::{self, runner, SynthConfig, SynthReport};
use sorft::swe::truth::ground_truth;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn only(import: f64, traceback: f64, behaviour: f64) -> IssueStyles {
    IssueStyles {
        import,
        traceback,
        behaviour,
    }
}

fn gen(cfg: &SynthConfig, dir: &Path) -> SynthReport {
    synth::generate(cfg, dir, &|_| {}).unwrap()
}

fn package(inst: &Instance) -> &str {
    inst.repo.split('/').nth(1).unwrap()
}

fn validate_all(report: &SynthReport, dir: &Path) {
    let store = RepoStore::new(dir.join("repos"));
    for inst in &report.instances {
        synth::validate_instance(inst, &store, T)
            .unwrap_or_else(|e| panic!("{}: {e}", inst.instance_id));
    }
}

#[test]
fn traceback_and_behaviour_issues_validate_and_carry_no_import_line() {
    for (styles, name) in [
        (only(0.0, 1.0, 0.0), "traceback"),
        (only(0.0, 0.0, 1.0), "behaviour"),
        (only(1.0, 0.0, 0.0), "import"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SynthConfig {
            n: 2,
            seed: 3,
            per_repo: 2,
            issue_styles: styles,
            ..Default::default()
        };
        let report = gen(&cfg, dir.path());
        assert_eq!(report.instances.len(), 2);
        assert_eq!(report.styles.get(name), Some(&2), "{:?}", report.styles);
        validate_all(&report, dir.path());
        for inst in &report.instances {
            let p = &inst.problem_statement;
            let import = format!("from {} import", package(inst));
            assert_eq!(inst.extra["synth"]["style"], name);
            match name {
                "import" => assert!(p.contains(&import), "{p}"),
                "traceback" => {
                    assert!(!p.contains(" import "), "{p}");
                    assert!(p.contains("Traceback (most recent call last)"), "{p}");
                    assert!(p.contains("File \""), "{p}");
                }
                _ => {
                    assert!(!p.contains(" import "), "{p}");
                    assert!(!p.contains(".py"), "behaviour issues name no path: {p}");
                    assert!(!p.contains("Traceback"), "{p}");
                }
            }
        }
    }
}

#[test]
fn multi_file_bugs_need_both_files_and_truth_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        n: 2,
        seed: 4,
        per_repo: 2,
        multi_file_fraction: 1.0,
        issue_styles: only(1.0, 1.0, 1.0),
        ..Default::default()
    };
    let report = gen(&cfg, dir.path());
    assert!(report.multi_file >= 1, "{report:?}");
    validate_all(&report, dir.path());
    // Deterministic by seed.
    let again = tempfile::tempdir().unwrap();
    assert_eq!(gen(&cfg, again.path()).instances, report.instances);
    let store = RepoStore::new(dir.path().join("repos"));
    let inst = report
        .instances
        .iter()
        .find(|i| i.extra["synth"]["files"].as_array().map(Vec::len) == Some(2))
        .unwrap();
    let files: Vec<String> = inst.extra["synth"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert_ne!(files[0], files[1]);
    let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
    let gt = ground_truth(&inst.patch, &snap).unwrap();
    for f in &files {
        assert!(gt.files.contains(f), "{f} not in {:?}", gt.files);
        assert!(gt.edits.iter().any(|e| &e.path == f), "{f}");
    }
    // The edit subtask shows both files and the gold edit scores 1.
    let recs = training_records(inst, &snap, &gt);
    let edit = recs.last().unwrap();
    assert_eq!(
        edit.reward(&render_blocks(&gt.edits), EditReward::LineFbeta)
            .reward,
        1.0
    );
    // Fixing only one file leaves a FAIL_TO_PASS test failing.
    let gold = Patch::parse(&inst.patch).unwrap();
    for kept in files.iter().take(2) {
        let scratch = tempfile::tempdir().unwrap();
        store
            .checkout(&inst.repo, &inst.base_commit, scratch.path())
            .unwrap();
        Patch::parse(&inst.test_patch)
            .unwrap()
            .apply_to_dir(scratch.path())
            .unwrap();
        let mut half = gold.clone();
        half.files
            .retain(|f| f.old_path.as_deref() == Some(kept.as_str()));
        assert_eq!(half.files.len(), 1);
        half.apply_to_dir(scratch.path()).unwrap();
        let run = runner::run_unittest(scratch.path(), T).unwrap();
        assert!(
            inst.fail_to_pass
                .iter()
                .any(|t| run.outcomes.get(t) != Some(&runner::Outcome::Ok)),
            "fixing only {} resolves {}",
            kept,
            inst.instance_id
        );
    }
}

#[test]
fn distractor_modules_are_in_the_repository_but_never_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig {
        n: 2,
        seed: 6,
        per_repo: 2,
        distractors: 2,
        ..Default::default()
    };
    let report = gen(&cfg, dir.path());
    validate_all(&report, dir.path());
    let store = RepoStore::new(dir.path().join("repos"));
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        let paths: Vec<String> = snap.paths().map(|p| p.to_string()).collect();
        let decoys: Vec<&String> = paths
            .iter()
            .filter(|p| {
                synth::distractor::SUFFIXES
                    .iter()
                    .any(|s| p.ends_with(&format!("_{s}.py")))
            })
            .collect();
        assert_eq!(decoys.len(), 2, "{paths:?}");
        assert!(gt.files.iter().all(|f| !decoys.contains(&f)));
    }
}

#[test]
fn bad_settings_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    for cfg in [
        SynthConfig {
            multi_file_fraction: 1.5,
            ..Default::default()
        },
        SynthConfig {
            issue_styles: only(0.0, 0.0, 0.0),
            ..Default::default()
        },
        SynthConfig {
            issue_styles: only(-1.0, 1.0, 0.0),
            ..Default::default()
        },
    ] {
        let e = synth::generate(&cfg, dir.path(), &|_| {}).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("synth config:") && !msg.contains('\n'),
            "{msg}"
        );
    }
}
