//! faultbench's scoring on hand-made records: the false-alarm upper bound, the injection-effect
//! check (it must catch a fault that changed nothing), and the detection / diagnosis rules added
//! for flaky tests and length explosion on hand-made series.

use sorft::rft::monitor::bench::{
    binomial_upper95, effects, evaluate, inert_runs, BenchConfig, RunRecord, RunSpec, Split,
};
use sorft::rft::monitor::features::StepRecord;
use sorft::rft::monitor::inject::Strength;
use sorft::rft::monitor::taxonomy::FaultType;
use sorft::rft::monitor::MonitorMode;

fn run(fault: Option<FaultType>, rewards: &[f64]) -> RunRecord {
    RunRecord {
        spec: RunSpec {
            id: "x".into(),
            seed: 2,
            split: Split::Test,
            rl_seed: 7,
            family: FaultType::RewardSignFlip.family(),
            fault,
            strength: Strength::Easy,
            onset: 3,
        },
        mode: MonitorMode::Off,
        steps: rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| StepRecord {
                step: i + 1,
                values: [
                    ("reward_mean".to_string(), r),
                    // Timings differ between any two runs: never an effect.
                    ("time_rollout".to_string(), i as f64 + rewards.len() as f64),
                ]
                .into_iter()
                .collect(),
            })
            .collect(),
        final_reward: rewards.iter().rev().take(3).sum::<f64>() / 3.0,
        events: Vec::new(),
        stopped: false,
        error: None,
        wall_s: 0.0,
    }
}

#[test]
fn the_false_alarm_upper_bound_is_exact_binomial() {
    // No alarm in n steps: 1 - 0.05^(1/n) (about 3/n).
    let u = binomial_upper95(0, 400);
    assert!((u - (1.0 - 0.05f64.powf(1.0 / 400.0))).abs() < 1e-9, "{u}");
    // One alarm in 100 steps: the Clopper-Pearson one-sided bound is 0.0466.
    let u1 = binomial_upper95(1, 100);
    assert!((u1 - 0.0466).abs() < 5e-4, "{u1}");
    // More alarms, higher bound; always above the rate itself; no steps: no knowledge.
    assert!(binomial_upper95(5, 100) > u1 && binomial_upper95(5, 100) > 0.05);
    assert_eq!(binomial_upper95(0, 0), 1.0);
}

#[test]
fn the_effect_check_catches_an_injection_that_changed_nothing() {
    let clean = run(None, &[0.2, 0.3, 0.25, 0.3, 0.2]);
    let flipped = run(
        Some(FaultType::RewardSignFlip),
        &[0.2, 0.3, -0.25, -0.3, -0.2],
    );
    let e = effects(&[clean.clone(), flipped]);
    let f = &e["reward_sign_flip"];
    assert_eq!((f.runs, f.changed, f.reward_changed), (1, 1, 1));
    assert!(f.final_faulty < 0.0 && f.final_clean > 0.0);
    // The planted fault: an injection that did nothing (the old reward-0 setup) is reported as
    // unchanged, timings aside.
    let mut inert = run(Some(FaultType::RewardSignFlip), &[0.2, 0.3, 0.25, 0.3, 0.2]);
    inert.steps[3].values.insert("time_rollout".into(), 99.0);
    let e = effects(&[clean, inert]);
    assert_eq!(
        (
            e["reward_sign_flip"].changed,
            e["reward_sign_flip"].reward_changed
        ),
        (0, 0)
    );
}

/// Run `id` of `seed` (split by seed: 1 tunes, 2 tests) with `fault`, RL seed `rl`.
fn named(id: &str, seed: u64, rl: u64, fault: Option<FaultType>, rewards: &[f64]) -> RunRecord {
    let mut r = run(fault, rewards);
    r.spec.id = id.into();
    r.spec.seed = seed;
    r.spec.rl_seed = rl;
    r.spec.split = if seed == 1 { Split::Tune } else { Split::Test };
    r.spec.onset = 5;
    r
}

#[test]
fn runs_whose_fault_left_no_trace_are_scored_apart() {
    let calm = [0.5; 7];
    let flip = [0.5, 0.5, 0.5, 0.5, -2.0, -2.0, -2.0];
    let recs = vec![
        named("t-fault", 1, 1, Some(FaultType::RewardSignFlip), &flip),
        named("t-clean", 1, 1, None, &calm),
        named("a-fault", 2, 2, Some(FaultType::RewardSignFlip), &flip),
        named("a-clean", 2, 2, None, &calm),
        // The planted inert run: its records equal its twin's from the onset on.
        named("b-fault", 2, 3, Some(FaultType::RewardSignFlip), &calm),
        named("b-clean", 2, 3, None, &calm),
    ];
    let inert = inert_runs(&recs);
    assert_eq!(inert.into_iter().collect::<Vec<_>>(), vec!["b-fault"]);
    let r = evaluate(&recs, &BenchConfig::quick());
    assert_eq!(r.inert, vec!["b-fault".to_string()]);
    // Every faulty run: the inert one is a miss (recall 1/2); with it left out: 1/1.
    let (all, eff) = (&r.scores[0], &r.effective[0]);
    assert_eq!((all.overall.n, eff.overall.n), (2, 1));
    assert!((all.overall.r - 0.5).abs() < 1e-12, "{:?}", all.overall);
    assert!((eff.overall.r - 1.0).abs() < 1e-12, "{:?}", eff.overall);
    // The clean twins stay in both; the inert run's 4 steps before its onset leave with it.
    assert_eq!(all.clean_steps, eff.clean_steps + 4);
    // The split follows the seeds asked for, not the label stored with a record: seed 1 held
    // out has one faulty run, none inert.
    let swapped = BenchConfig {
        tune_seeds: vec![2],
        test_seeds: vec![1],
        ..BenchConfig::quick()
    };
    let r = evaluate(&recs, &swapped);
    assert_eq!((r.scores[0].overall.n, r.inert.len()), (1, 0));
}

fn step(step: usize, values: &[(&str, f64)]) -> StepRecord {
    StepRecord {
        step,
        values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[test]
fn identical_answers_scored_differently_are_flaky_tests() {
    use sorft::rft::monitor::features::answer_disagreement;
    let texts = [
        "noise </think>\n```\na.py\n```",
        "other noise </think>\n```\na.py\n```",
        "x </think>\n```\nb.py\n```",
        "y </think>\n```\na.py\n```",
    ];
    // Prompt 0 answered a.py twice, scored the same; the a.py of prompt 1 is another prompt.
    assert_eq!(
        answer_disagreement(&texts, &[1.0, 1.0, 0.0, 0.0], &[0, 0, 1, 1]),
        0.0
    );
    // The planted fault: the same a.py for prompt 0 scored 1 and 0.
    assert_eq!(
        answer_disagreement(&texts, &[1.0, 0.0, 0.0, 0.0], &[0, 0, 1, 1]),
        1.0
    );
    // Different answers may score differently; no identical pair: 0.
    assert_eq!(answer_disagreement(&texts[1..3], &[1.0, 0.0], &[0, 0]), 0.0);
}

#[test]
fn the_detector_flags_answer_disagreement_and_diagnoses_flaky_tests() {
    use sorft::rft::monitor::detect::{Detector, RobustConfig, RobustDetector};
    use sorft::rft::monitor::diagnose::diagnose;
    let healthy = |s| {
        step(
            s,
            &[
                ("reward_mean", 0.3),
                ("reward_std", 0.2),
                ("answer_disagree", 0.0),
            ],
        )
    };
    let mut d = RobustDetector::new(RobustConfig::default());
    for s in 1..=4 {
        assert!(d.observe(&healthy(s)).is_none(), "false alarm at step {s}");
    }
    let a = d
        .observe(&step(
            5,
            &[
                ("reward_mean", 0.3),
                ("reward_std", 0.25),
                ("answer_disagree", 0.5),
            ],
        ))
        .expect("flaky scorer missed");
    assert_eq!(diagnose(&a).fault, Some(FaultType::FlakyTests));
    // Off (negative limit): the same step raises nothing.
    let mut off = RobustDetector::new(RobustConfig {
        disagree_limit: -1.0,
        ..RobustConfig::default()
    });
    for s in 1..=4 {
        assert!(off.observe(&healthy(s)).is_none());
    }
    assert!(off
        .observe(&step(
            5,
            &[
                ("reward_mean", 0.3),
                ("reward_std", 0.25),
                ("answer_disagree", 0.5)
            ],
        ))
        .is_none());
}
