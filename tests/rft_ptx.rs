//! PPO-ptx: the supervised term of stage 2 lowers the loss of its data, and a run that asks for it
//! without data stops with a clear error.

mod train_util;

use sorft::engine::Cpu;
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::{load_dir, Model};
use sorft::rft::rl::{Algorithm, RlConfig, RlTrainer};
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::loss::cross_entropy;

fn nll(policy: &Model<Cpu>, seqs: &[Sequence]) -> f64 {
    let batch = Batch::pack(seqs).unwrap();
    let fwd = forward(policy, None, &batch, ForwardOptions::default()).unwrap();
    cross_entropy(&Cpu, &fwd, &batch.weights, batch.trained_tokens() as f64)
        .unwrap()
        .loss
}

fn config(ptx_coef: f32) -> RlConfig {
    RlConfig {
        algorithm: Algorithm::Grpo,
        steps: 2,
        prompts_per_step: 2,
        group_size: 2,
        ppo_epochs: 2,
        minibatch: 2,
        lr: 1e-3,
        max_new_tokens: 8,
        // Every rollout is updated, so the ptx term runs in every minibatch; the rewards add
        // nothing (policy_coef 0), so only the ptx term (and the KL) moves the policy.
        skip_uniform_groups: false,
        policy_coef: 0.0,
        ptx_coef,
        ptx_tokens: 64,
        ..Default::default()
    }
}

#[test]
fn the_ptx_term_lowers_the_loss_of_its_data_and_the_rewards_can_be_switched_off() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 3, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let (_, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    let texts = [
        "def area(width, height):\n    return width * height\n",
        "def total(items):\n    return sum(items)\n",
        "class Box:\n    def size(self):\n        return self.n\n",
    ];
    let seqs: Vec<Sequence> = texts
        .iter()
        .map(|t| {
            let ids = tok.encode(t).unwrap();
            Sequence {
                mask: vec![1; ids.len()],
                ids,
                weight: 1.0,
            }
        })
        .collect();
    let mut change = Vec::new();
    for coef in [0.0f32, 1.0] {
        let (mut policy, _) = load_dir(&Cpu, mdir.path()).unwrap();
        sorft::train::sft::own_weights(&mut policy).unwrap();
        let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
        let before = nll(&policy, &seqs);
        let mut tr = RlTrainer::new(&policy, &tok, &items, config(coef)).unwrap();
        tr.ptx = seqs.clone();
        for _ in 0..2 {
            let m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
            assert!(m.trained_sequences > 0, "no update ran");
            if coef > 0.0 {
                assert!(
                    m.ptx_loss.is_finite() && m.ptx_loss > 0.0,
                    "ptx loss {}",
                    m.ptx_loss
                );
            } else {
                assert_eq!(m.ptx_loss, 0.0);
            }
        }
        change.push(before - nll(&policy, &seqs));
    }
    // Without rewards and without ptx the policy stays where it was; with ptx it learns its data.
    assert!(change[0].abs() < 1e-3, "moved without ptx: {change:?}");
    assert!(change[1] > 0.05, "ptx did not lower its loss: {change:?}");
}

#[test]
fn a_run_with_ptx_but_no_data_stops_with_a_clear_error() {
    use sorft::rft::rl_run::{run_rl, RlRun};
    use std::sync::atomic::AtomicBool;
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 3, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let run = RlRun {
        model: mdir.path().to_path_buf(),
        out: out.path().join("rl"),
        ..Default::default()
    };
    let never = AtomicBool::new(false);
    let e = run_rl(&Cpu, &run, &config(0.5), &items, &never, &mut |_| {})
        .expect_err("a ptx run without data must fail")
        .to_string();
    assert!(e.contains("ptx"), "{e}");
    // A file with nothing to train on is refused too, by name.
    let bad = out.path().join("empty.jsonl");
    std::fs::write(&bad, "").unwrap();
    let run = RlRun {
        ptx_data: Some(bad),
        ..run
    };
    let e = format!(
        "{:#}",
        run_rl(&Cpu, &run, &config(0.5), &items, &never, &mut |_| {})
            .expect_err("empty ptx data must fail")
    );
    assert!(e.contains("empty.jsonl"), "{e}");
}
