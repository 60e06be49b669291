//! RFT-FM in real RL steps on the tiny model: the injection hooks change what they should, the
//! health features see it, and each remediation action acts on the trainer; the benchmark's
//! scorer catches a planted detector fault; `sorft monitor` reads an external log.

mod train_util;

use sorft::engine::{Backend, Cpu};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::load_dir;
use sorft::rft::monitor::bench::{score, RunRecord, RunSpec, Split};
use sorft::rft::monitor::detect::{Detector, RobustConfig, RobustDetector};
use sorft::rft::monitor::features::StepRecord;
use sorft::rft::monitor::inject::{Injection, Strength};
use sorft::rft::monitor::remediate::Action;
use sorft::rft::monitor::supervisor::Verdict;
use sorft::rft::monitor::taxonomy::{FaultFamily, FaultType};
use sorft::rft::monitor::{MonitorMode, Supervisor};
use sorft::rft::rl::{Algorithm, RlConfig, RlTrainer};

fn cfg() -> RlConfig {
    RlConfig {
        algorithm: Algorithm::Grpo,
        steps: 4,
        prompts_per_step: 2,
        group_size: 2,
        ppo_epochs: 1,
        minibatch: 4,
        lr: 1e-3,
        max_new_tokens: 6,
        entropy_coef: 0.01,
        skip_uniform_groups: false,
        ..Default::default()
    }
}

#[test]
fn injected_faults_show_in_health_and_every_action_acts_on_the_trainer() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 1, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let (mut policy, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let mut tr = RlTrainer::new(&policy, &tok, &items, cfg()).unwrap();
    let lr0 = tr.cfg.lr;
    let w0 = Cpu.to_host_f32(&policy.embed).unwrap();
    // Remediate mode, learning rate x300 from step 2.
    tr.fault = Some(Injection::new(FaultType::LrTooHigh, Strength::Easy, 2, 3));
    let mut sup = Supervisor::new(MonitorMode::Remediate, &tr.cfg);
    sup.start(&tr, &policy).unwrap();
    let mut m1 = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    assert_eq!(
        sup.after_step(&mut tr, &mut policy, &mut m1).unwrap(),
        Verdict::Continue
    );
    assert!(m1.monitor.is_empty(), "{:?}", m1.monitor);
    assert!((m1.health.lr - lr0 as f64).abs() < 1e-9);
    assert!(m1.health.reward_min <= m1.health.reward_max);
    let w1 = Cpu.to_host_f32(&policy.embed).unwrap();
    assert_ne!(w0, w1, "step 1 trained");
    let mut m2 = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    assert!(
        m2.health.lr > 100.0 * lr0 as f64,
        "the hook raised the lr: {}",
        m2.health.lr
    );
    sup.after_step(&mut tr, &mut policy, &mut m2).unwrap();
    let ev = &m2.monitor[0];
    assert_eq!(
        ev.diagnosis.as_ref().unwrap().fault,
        Some(FaultType::LrTooHigh)
    );
    assert_eq!(ev.action, Some(Action::Rollback { lr_factor: 0.5 }));
    // Rolled back to the weights after step 1 and the healthy lr, halved.
    assert_eq!(Cpu.to_host_f32(&policy.embed).unwrap(), w1);
    assert!((tr.cfg.lr - lr0 * 0.5).abs() < 1e-12);
    assert!(serde_json::to_string(&m2).unwrap().contains("lr_too_high"));
    // Entropy: a collapsed temperature is restored with a bonus.
    tr.fault = Some(Injection::new(
        FaultType::EntropyCollapse,
        Strength::Easy,
        3,
        3,
    ));
    let t0 = tr.cfg.temperature;
    let mut m3 = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    assert!((m3.health.temperature - 0.1 * t0 as f64).abs() < 1e-6);
    sup.after_step(&mut tr, &mut policy, &mut m3).unwrap();
    assert!(
        matches!(m3.monitor[0].action, Some(Action::RestoreEntropy { .. })),
        "{:?}",
        m3.monitor
    );
    assert_eq!(tr.cfg.temperature, t0);
    assert!(tr.cfg.entropy_coef > 0.01);
    // Sandbox failures: workers restarted, the fault is gone.
    tr.fault = Some(Injection::new(
        FaultType::SandboxFailure,
        Strength::Easy,
        4,
        3,
    ));
    let mut m4 = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    assert_eq!(m4.health.sandbox_error_rate, 1.0);
    assert_eq!(m4.reward_mean, 0.0);
    let (w4, cfg4, q4) = (
        Cpu.to_host_f32(&policy.embed).unwrap(),
        tr.cfg.clone(),
        tr.quarantined.clone(),
    );
    sup.after_step(&mut tr, &mut policy, &mut m4).unwrap();
    assert_eq!(m4.monitor[0].action, Some(Action::RestartWorkers));
    // Stage 2 has no long-lived worker: the restart touches neither the weights, nor the
    // settings, nor the quarantine; it only clears the simulated worker fault.
    assert!(!tr.fault.as_ref().unwrap().armed);
    assert_eq!(Cpu.to_host_f32(&policy.embed).unwrap(), w4);
    assert_eq!((&tr.cfg, &tr.quarantined), (&cfg4, &q4));
    // A failure a restart cannot clear (here: the fault re-armed at once) comes back at the
    // next step and stops the run at its healthy weights.
    tr.fault.as_mut().unwrap().armed = true;
    let mut m5 = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    let v = sup.after_step(&mut tr, &mut policy, &mut m5).unwrap();
    assert!(
        matches!(&v, Verdict::Stop(r) if r.contains("workers keep failing")),
        "{v:?} {:?}",
        m5.monitor
    );
    assert_eq!(sup.stopped().map(|s| s.contains("workers")), Some(true));
}

#[test]
fn duplicated_prompts_are_quarantined_and_broken_rewards_stop_the_run() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 1, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let (mut policy, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let c = RlConfig {
        prompts_per_step: 4,
        group_size: 1,
        ..cfg()
    };
    let mut tr = RlTrainer::new(&policy, &tok, &items, c).unwrap();
    tr.fault = Some(Injection::new(
        FaultType::DuplicatedPrompts,
        Strength::Easy,
        1,
        3,
    ));
    let mut sup = Supervisor::new(MonitorMode::Remediate, &tr.cfg);
    sup.start(&tr, &policy).unwrap();
    // Healthy steps first (disarmed), then the fault: batches of one prompt are judged by the
    // chance of such a run under uniform draws, which a step or two brings below 1/1000.
    tr.fault.as_mut().unwrap().armed = false;
    for _ in 0..3 {
        let mut m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
        sup.after_step(&mut tr, &mut policy, &mut m).unwrap();
    }
    tr.fault.as_mut().unwrap().armed = true;
    let pool = tr.prompts_len();
    let chance_of_one = 1.0 / (pool as f64).powi(3);
    let mut acted = None;
    for _ in 0..3 {
        let mut m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
        assert_eq!(m.health.prompt_unique_frac, 0.25);
        let c = m.health.prompt_dup_chance.unwrap();
        assert!((c - chance_of_one).abs() < 1e-12, "{c} vs {chance_of_one}");
        let dup = tr.last_chosen[0];
        sup.after_step(&mut tr, &mut policy, &mut m).unwrap();
        if let Some(a) = m.monitor.last().and_then(|e| e.action.clone()) {
            acted = Some((a, dup));
            break;
        }
    }
    let (action, dup) = acted.expect("the duplicated prompts were acted on");
    assert_eq!(action, Action::QuarantinePrompts { prompts: vec![dup] });
    assert!(tr.quarantined.contains(&dup));
    let _ = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    assert!(!tr.last_chosen.contains(&dup));
    // A reward scale blow-up: nothing safe remains, the run stops at its healthy weights.
    tr.fault = Some(Injection::new(FaultType::RewardScale, Strength::Easy, 1, 3));
    let healthy = Cpu.to_host_f32(&policy.embed).unwrap();
    let mut m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
    let v = sup.after_step(&mut tr, &mut policy, &mut m).unwrap();
    if m.health.reward_max > 1.0 {
        assert!(matches!(v, Verdict::Stop(_)), "{:?}", m.monitor);
        assert_eq!(Cpu.to_host_f32(&policy.embed).unwrap(), healthy);
    } else {
        // Every reward was 0 (x50 is still 0): nothing to see, nothing done.
        assert_eq!(v, Verdict::Continue);
    }
}

fn record(fault: Option<FaultType>, onset: usize, values: &[f64]) -> RunRecord {
    RunRecord {
        spec: RunSpec {
            id: "x".into(),
            seed: 1,
            split: Split::Test,
            rl_seed: 1,
            family: FaultFamily::PG,
            fault,
            strength: Strength::Easy,
            onset,
        },
        mode: MonitorMode::Off,
        steps: values
            .iter()
            .enumerate()
            .map(|(i, &v)| StepRecord {
                step: i + 1,
                values: [("lr".to_string(), v)].into_iter().collect(),
            })
            .collect(),
        final_reward: 0.0,
        events: Vec::new(),
        stopped: false,
        error: None,
        wall_s: 0.0,
    }
}

struct AlwaysAlarm;
impl Detector for AlwaysAlarm {
    fn name(&self) -> &'static str {
        "always"
    }
    fn observe(&mut self, r: &StepRecord) -> Option<sorft::rft::monitor::detect::Alarm> {
        Some(sorft::rft::monitor::detect::Alarm::new(r.step, Vec::new()))
    }
}

#[test]
fn the_scorer_rewards_a_real_detector_and_exposes_one_that_flags_everything() {
    let clean = record(None, 4, &[1e-3; 8]);
    let faulty = record(
        Some(FaultType::LrTooHigh),
        4,
        &[1e-3, 1e-3, 1e-3, 0.3, 0.3, 0.3, 0.3, 0.3],
    );
    let runs = vec![&clean, &faulty];
    let good = score(&runs, &|| {
        Box::new(RobustDetector::new(RobustConfig::default()))
    });
    assert_eq!(good.overall.f1, 1.0);
    assert_eq!(good.false_alarms_per_1000, 0.0);
    assert_eq!(good.mean_delay, 0.0);
    assert_eq!(good.type_accuracy, 1.0);
    // The planted fault: a detector that alarms on every step. Its alarm before the onset is a
    // false alarm, so it detects nothing and its false-alarm rate is 1000 per 1000.
    let bad = score(&runs, &|| Box::new(AlwaysAlarm));
    assert_eq!(bad.overall.r, 0.0);
    assert_eq!(bad.overall.p, 0.0);
    assert_eq!(bad.false_alarms_per_1000, 1000.0);
}

#[test]
fn sorft_monitor_reads_an_external_log_and_rejects_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("train.jsonl");
    let mut text = String::new();
    for s in 1..=10 {
        let ent = if s < 7 {
            2.0 + 0.01 * (s % 3) as f64
        } else {
            0.05
        };
        text.push_str(&format!(
            "{{\"global_step\": {s}, \"reward\": 0.5, \"policy_entropy\": {ent}, \"actor_lr\": 1e-6}}\n"
        ));
    }
    std::fs::write(&log, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["monitor", "--log"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("step 7: entropy_collapse [OD]"), "{stdout}");
    std::fs::write(&log, "{\"step\": 1}\nnot json\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["monitor", "--log"])
        .arg(&log)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2: not JSON") && err.lines().count() == 1,
        "{err}"
    );
}
