//! A three-step RL smoke test per algorithm on the tiny model and generated instances: rewards,
//! KL and losses are finite and logged, the policy changes, the reference does not.

use sorft::engine::{Backend, Cpu};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::load_dir;
use sorft::rft::rl::{Algorithm, RlConfig, RlItem, RlTrainer};
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::training_records;
use sorft::swe::synth::{generate, SynthConfig};
use sorft::swe::truth::ground_truth;

fn items(dir: &std::path::Path) -> Vec<RlItem> {
    let report = generate(
        &SynthConfig {
            n: 2,
            seed: 5,
            ..Default::default()
        },
        dir,
        &|_| {},
    )
    .unwrap();
    let store = RepoStore::new(dir.join("repos"));
    let mut out = Vec::new();
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = ground_truth(&inst.patch, &snap).unwrap();
        for r in training_records(inst, &snap, &gt) {
            out.push(RlItem {
                record: r,
                problem: inst.problem_statement.clone(),
            });
        }
    }
    out
}

#[test]
fn three_rl_steps_per_algorithm_are_finite_and_move_the_policy() {
    let data = tempfile::tempdir().unwrap();
    let items = items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 1, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    for alg in [Algorithm::Grpo, Algorithm::Ppo, Algorithm::Rloo] {
        let (mut policy, tok) = load_dir(&Cpu, mdir.path()).unwrap();
        let tok = tok.unwrap();
        let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
        let cfg = RlConfig {
            algorithm: alg,
            steps: 3,
            prompts_per_step: 2,
            group_size: 3,
            ppo_epochs: 2,
            minibatch: 3,
            lr: 1e-3,
            max_new_tokens: 12,
            entropy_coef: 0.01,
            ..Default::default()
        };
        let mut tr = RlTrainer::new(&policy, &tok, &items, cfg).unwrap();
        let before = Cpu.to_host_f32(&policy.embed).unwrap();
        for step in 1..=3 {
            let m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
            assert_eq!(m.step, step);
            for (name, v) in [
                ("reward", m.reward_mean),
                ("kl", m.kl),
                ("entropy", m.entropy),
                ("approx_kl", m.approx_kl),
                ("grad_norm", m.grad_norm),
                ("value_loss", m.value_loss),
            ] {
                assert!(v.is_finite(), "{alg:?} step {step}: {name} = {v}");
            }
            assert!(m.entropy > 0.0 && m.response_len > 0.0);
            assert!(serde_json::to_string(&m)
                .unwrap()
                .contains("reward_by_subtask"));
            if step == 1 {
                // The first rollout comes from the reference itself.
                assert!(m.kl.abs() < 1e-4, "{alg:?}: kl {}", m.kl);
            }
        }
        let after = Cpu.to_host_f32(&policy.embed).unwrap();
        assert!(
            before.iter().zip(&after).any(|(a, b)| a != b),
            "{alg:?}: policy unchanged"
        );
        let refw = Cpu.to_host_f32(&reference.embed).unwrap();
        assert_eq!(before, refw, "reference changed");
    }
}
