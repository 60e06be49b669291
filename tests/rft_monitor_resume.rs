//! `--resume` after a remediation: a run with a planted fault that the monitor remediates, killed
//! right after the remediation and resumed, ends exactly where the uninterrupted run ends (the
//! monitor's overrides of the settings, its quarantine and its state come back with the
//! checkpoint).

mod train_util;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use sorft::engine::{Backend, Cpu};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::load_dir;
use sorft::rft::monitor::inject::{Injection, Strength};
use sorft::rft::monitor::overrides::{MonitorState, MONITOR_FILE, SNAPSHOT_FILE};
use sorft::rft::monitor::remediate::Action;
use sorft::rft::monitor::taxonomy::FaultType;
use sorft::rft::monitor::MonitorMode;
use sorft::rft::rl::{Algorithm, RlConfig, RlItem, RlMetrics};
use sorft::rft::rl_run::{run_rl_with_fault, RlOutcome, RlRun};
use sorft::train::checkpoint::step_dir_name;
use sorft::train::params::model_params;

fn weights(dir: &Path) -> Vec<Vec<f32>> {
    let (m, _) = load_dir(&Cpu, dir).unwrap();
    model_params(&m)
        .into_iter()
        .map(|(_, t)| Cpu.to_host_f32(t).unwrap())
        .collect()
}

/// What must match between two runs: every number of every step but the timings, and the
/// monitor's events.
fn trajectory(ms: &[RlMetrics]) -> Vec<String> {
    ms.iter()
        .map(|m| {
            let m = RlMetrics {
                rollout_tokens_per_s: 0.0,
                time_rollout: 0.0,
                time_reward: 0.0,
                time_train: 0.0,
                peak_rss_mib: 0.0,
                ..m.clone()
            };
            serde_json::to_string(&m).unwrap()
        })
        .collect()
}

struct Case<'a> {
    model: &'a Path,
    out: &'a Path,
    items: &'a [RlItem],
    cfg: RlConfig,
    fault: Injection,
}

impl Case<'_> {
    fn run(&self, name: &str, resume: bool, kill_at: Option<usize>) -> RlOutcome {
        let run = RlRun {
            model: self.model.to_path_buf(),
            out: self.out.join(name),
            resume,
            device: None,
            ptx_data: None,
        };
        let stop = AtomicBool::new(false);
        run_rl_with_fault(
            &Cpu,
            &run,
            &self.cfg,
            self.items,
            &stop,
            &mut |m| {
                if Some(m.step) == kill_at {
                    stop.store(true, Ordering::SeqCst)
                }
            },
            Some(self.fault.clone()),
        )
        .unwrap()
    }

    /// Uninterrupted vs killed after step `kill_at` and resumed: the same metrics and weights.
    /// Returns the uninterrupted run and the checkpoint the kill left.
    fn check(&self, kill_at: usize) -> (RlOutcome, std::path::PathBuf) {
        let a = self.run("a", false, None);
        let b1 = self.run("b", false, Some(kill_at));
        assert!(b1.final_dir.is_none());
        assert_eq!(b1.metrics.len(), kill_at);
        // Kept aside: the resumed run prunes it.
        let ck = self
            .out
            .join("b/checkpoints")
            .join(step_dir_name(kill_at as u64));
        let keep = self.out.join("killed");
        std::fs::create_dir_all(&keep).unwrap();
        for f in std::fs::read_dir(&ck).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, keep.join(f.file_name().unwrap())).unwrap();
        }
        let b = self.run("b", true, None);
        assert_eq!(b.resumed_from, kill_at);
        assert_eq!(b.metrics.len(), a.metrics.len());
        // Steps before the kill ran live in both; those after it ran live in the resumed run.
        assert_eq!(trajectory(&a.metrics[..kill_at]), trajectory(&b1.metrics));
        assert_eq!(
            trajectory(&a.metrics[kill_at..]),
            trajectory(&b.metrics[kill_at..])
        );
        let (fa, fb) = (a.final_dir.clone().unwrap(), b.final_dir.unwrap());
        assert!(weights(&fa) == weights(&fb), "the resumed run diverged");
        (a, keep)
    }
}

fn base_cfg() -> RlConfig {
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
        save_every: 0,
        seed: 5,
        monitor: MonitorMode::Remediate,
        ..Default::default()
    }
}

#[test]
fn a_run_killed_after_a_rollback_resumes_with_the_lowered_learning_rate() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 1, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let case = Case {
        model: mdir.path(),
        out: out.path(),
        items: &items,
        cfg: base_cfg(),
        // The learning rate x300 from step 3: rolled back with the healthy rate halved.
        fault: Injection::new(FaultType::LrTooHigh, Strength::Easy, 3, 7),
    };
    let (a, ck) = case.check(3);
    let ev = &a.metrics[2].monitor;
    assert_eq!(
        ev.first().and_then(|e| e.action.clone()),
        Some(Action::Rollback { lr_factor: 0.5 }),
        "{ev:?}"
    );
    // The halved rate holds after the remediation in both runs (the resumed one re-applied it).
    for m in &a.metrics[3..] {
        assert!((m.health.lr - 5e-4).abs() < 1e-9, "{}", m.health.lr);
    }
    // The checkpoint keeps the configured settings and the monitor's override apart.
    let st = MonitorState::load(&ck).unwrap().unwrap();
    assert_eq!(st.overrides.0["lr"].as_f64().map(|x| x as f32), Some(5e-4));
    let rl_state = std::fs::read_to_string(ck.join("rl_state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&rl_state).unwrap();
    assert_eq!(v["config"]["lr"].as_f64().map(|x| x as f32), Some(1e-3));
    assert!(ck.join(MONITOR_FILE).exists());
    // Rolled back: the healthy weights are the checkpoint's own, not saved twice.
    assert!(!ck.join(SNAPSHOT_FILE).exists());
}

#[test]
fn a_run_killed_after_a_quarantine_resumes_with_its_quarantine_and_healthy_snapshot() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 1, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let case = Case {
        model: mdir.path(),
        out: out.path(),
        items: &items,
        cfg: RlConfig {
            prompts_per_step: 4,
            group_size: 1,
            ..base_cfg()
        },
        // One prompt fills every batch from step 2; two such batches of 4 from this pool are
        // too unlikely for chance (under 1/1000): quarantined at step 3, the run trains on.
        fault: Injection::new(FaultType::DuplicatedPrompts, Strength::Easy, 2, 7),
    };
    let (a, ck) = case.check(3);
    let st = MonitorState::load(&ck).unwrap().unwrap();
    assert!(
        a.metrics[1].monitor.is_empty(),
        "{:?}",
        a.metrics[1].monitor
    );
    let Some(Action::QuarantinePrompts { prompts }) =
        a.metrics[2].monitor.first().and_then(|e| e.action.clone())
    else {
        panic!("{:?}", a.metrics[2].monitor)
    };
    assert_eq!(st.quarantined, prompts.iter().copied().collect());
    // No rollback: the last healthy weights (after step 1) differ from the policy and are saved.
    assert!(ck.join(SNAPSHOT_FILE).exists());
    assert!(st.supervisor.pending == Some(3));
}
