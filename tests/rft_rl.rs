//! A three-step RL smoke test per algorithm on the tiny model and generated instances: rewards,
//! KL and losses are finite and logged, the policy changes, the reference does not.

mod train_util;

use sorft::engine::{Backend, Cpu};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::load_dir;
use sorft::rft::rl::{Algorithm, RlConfig, RlItem, RlTrainer};

#[test]
fn three_rl_steps_per_algorithm_are_finite_and_move_the_policy() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
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

fn weights(dir: &std::path::Path) -> Vec<Vec<f32>> {
    let (m, _) = load_dir(&Cpu, dir).unwrap();
    sorft::train::params::model_params(&m)
        .into_iter()
        .map(|(_, t)| Cpu.to_host_f32(t).unwrap())
        .collect()
}

#[test]
fn an_rl_run_stopped_and_resumed_reaches_the_same_weights_as_an_uninterrupted_one() {
    use sorft::rft::rl_run::{run_rl, RlRun};
    use std::sync::atomic::{AtomicBool, Ordering};
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 2, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let cfg = RlConfig {
        algorithm: Algorithm::Ppo,
        steps: 3,
        prompts_per_step: 2,
        group_size: 2,
        minibatch: 2,
        lr: 1e-3,
        max_new_tokens: 8,
        entropy_coef: 0.01,
        save_every: 0,
        seed: 4,
        ..Default::default()
    };
    let out = tempfile::tempdir().unwrap();
    let run = |name: &str, resume: bool| RlRun {
        model: mdir.path().to_path_buf(),
        out: out.path().join(name),
        resume,
        device: Some(sorft::engine::device::DeviceInfo::cpu(&Cpu, None)),
        ptx_data: None,
    };
    let never = AtomicBool::new(false);
    let a = run_rl(&Cpu, &run("a", false), &cfg, &items, &never, &mut |_| {}).unwrap();
    let a_dir = a.final_dir.unwrap();
    // Stopped (as by Ctrl-C) after step 1: a checkpoint and no export.
    let stop = AtomicBool::new(false);
    let b1 = run_rl(&Cpu, &run("b", false), &cfg, &items, &stop, &mut |m| {
        if m.step == 1 {
            stop.store(true, Ordering::SeqCst)
        }
    })
    .unwrap();
    assert!(b1.final_dir.is_none() && b1.metrics.len() == 1);
    // A fresh run over those checkpoints is refused; a resume with other settings too.
    let e = run_rl(&Cpu, &run("b", false), &cfg, &items, &never, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("--resume"), "{e}");
    let other = RlConfig {
        lr: 5e-4,
        ..cfg.clone()
    };
    let e = run_rl(&Cpu, &run("b", true), &other, &items, &never, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("other RL settings"), "{e}");
    // Another reference model is refused; the same model moved elsewhere is accepted.
    let other_model = tempfile::tempdir().unwrap();
    init_model(
        Preset::Tiny,
        other_model.path(),
        3,
        &[EMBEDDED_CORPUS.to_string()],
    )
    .unwrap();
    let mut elsewhere = run("b", true);
    elsewhere.model = other_model.path().to_path_buf();
    let e = run_rl(&Cpu, &elsewhere, &cfg, &items, &never, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("another reference"), "{e}");
    let moved = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(mdir.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, moved.path().join(f.file_name().unwrap())).unwrap();
    }
    elsewhere.model = moved.path().to_path_buf();
    let b = run_rl(&Cpu, &elsewhere, &cfg, &items, &never, &mut |_| {}).unwrap();
    assert_eq!(b.resumed_from, 1);
    assert_eq!(b.metrics.len(), 3, "metrics before the resume are kept");
    // Each (re)start names its device in metrics.jsonl; resuming keeps the step lines exact.
    let log = std::fs::read_to_string(out.path().join("b").join("metrics.jsonl")).unwrap();
    let starts: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "start")
        .collect();
    assert_eq!(starts.last().unwrap()["step"], 1);
    assert_eq!(starts.last().unwrap()["device"]["device"], "cpu");
    assert_eq!(log.lines().count() - starts.len(), 3);
    for (x, y) in a.metrics.iter().zip(&b.metrics) {
        assert_eq!((x.step, x.reward_mean, x.kl), (y.step, y.reward_mean, y.kl));
        assert_eq!(x.value_loss, y.value_loss);
    }
    let wa = weights(&a_dir);
    assert!(wa == weights(&b.final_dir.unwrap()), "resumed run diverged");
    assert!(wa != weights(mdir.path()), "the policy did not move");
}

#[test]
fn renamed_prompts_rename_everything_and_keep_their_rewards() {
    use sorft::pipeline::augment::{package_of, rename_item, renamed_items};
    use sorft::swe::subtask::Subtask;
    let dir = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(dir.path());
    let word = |text: &str, w: &str| {
        regex::Regex::new(&format!(r"\b{w}\b"))
            .unwrap()
            .is_match(text)
    };
    let mut files = 0;
    for it in &items {
        let old = package_of(&it.record.repo).to_string();
        let r = rename_item(it, "qozv7").unwrap();
        assert_eq!(package_of(&r.record.repo), "qozv7");
        let all = serde_json::to_string(&r.record).unwrap() + &r.problem;
        assert!(!word(&all, &old), "{old} survived the rename");
        assert!(word(&r.record.prompt, "qozv7"));
        assert_eq!(r.record.truth.lines.len(), it.record.truth.lines.len());
        if it.record.subtask == Subtask::File {
            let answer =
                |files: &[String]| format!("<think>x</think>\n```\n{}\n```", files.join("\n"));
            let before = it
                .record
                .reward(&answer(&it.record.truth.files), Default::default());
            let after = r
                .record
                .reward(&answer(&r.record.truth.files), Default::default());
            assert!(before.reward > 0.99, "{before:?}");
            assert_eq!(before.reward, after.reward);
            // The old answer names files the renamed prompt never showed.
            let stale = r
                .record
                .reward(&answer(&it.record.truth.files), Default::default());
            assert_eq!(stale.reward, 0.0);
            files += 1;
        }
    }
    assert!(files > 0);
    let a = renamed_items(&items, 2, 9).unwrap();
    assert_eq!(a.len(), 2 * items.len());
    assert_ne!(
        a[0].record.prompt, a[1].record.prompt,
        "each copy has its own name"
    );
    let b = renamed_items(&items, 2, 9).unwrap();
    assert!(a
        .iter()
        .zip(&b)
        .all(|(x, y)| x.record.prompt == y.record.prompt));
    assert_eq!(renamed_items(&items, 0, 9).unwrap().len(), items.len());
}

/// Mean reward of `n` sampled answers per item at `temperature` (a fixed sampling seed).
fn sampled_reward(
    policy: &sorft::model::Model<Cpu>,
    tok: &sorft::model::Tokenizer,
    items: &[RlItem],
    cfg: &RlConfig,
    n: usize,
) -> f64 {
    use sorft::engine::SamplingParams;
    use sorft::model::chat::{encode, Message};
    use sorft::model::generate::{generate, GenOptions, GenRequest};
    let mut reqs = Vec::new();
    for it in items {
        let (prompt, _) = encode(tok, &[Message::new("user", &it.record.prompt)], true).unwrap();
        let constraint = sorft::swe::grammar::constraint_for(
            &it.record,
            cfg.max_new_tokens,
            true,
            cfg.ground,
            cfg.faithful,
        );
        for k in 0..n {
            reqs.push(GenRequest {
                prompt: prompt.clone(),
                params: SamplingParams {
                    temperature: cfg.temperature,
                    top_k: 0,
                    top_p: 1.0,
                    seed: 1000 + k as u64,
                },
                max_new_tokens: cfg.max_new_tokens,
                stop_ids: tok.stop_ids(),
                stop_strings: Vec::new(),
                constraint: constraint.clone(),
                min_allowed_mass: 0.0,
            });
        }
    }
    let outs = generate(policy, Some(tok), &reqs, &GenOptions::default()).unwrap();
    let total: f64 = outs
        .iter()
        .enumerate()
        .map(|(j, o)| items[j / n].record.reward(&o.text, cfg.edit_reward).reward)
        .sum();
    total / outs.len() as f64
}

/// The whole loop learns: GRPO on two file-localization prompts, rolled out at temperature 0.8
/// under the answer grammar, raises the reward of answers sampled at that temperature (fresh
/// seeds) well above the random initial model's. A sign error in the advantages, a mismatch
/// between the sampler's log-probabilities and the training forward's, or leaving the decisions
/// the grammar mostly made out of the loss (`min_allowed_mass` 0.5: 0.25 -> 0.33) would not.
#[test]
fn grpo_raises_the_sampled_reward_on_file_localization() {
    let FileSetup {
        items,
        mut policy,
        reference,
        tok,
        ..
    } = file_setup();
    let cfg = file_config(24);
    let before = sampled_reward(&policy, &tok, &items, &cfg, 24);
    let mut tr = RlTrainer::new(&policy, &tok, &items, cfg.clone()).unwrap();
    for step in 1..=cfg.steps {
        let m = tr.step(&mut policy, &reference, &tok, &items).unwrap();
        eprintln!(
            "step {step}: reward {:.3} kl {:.3} seqs {}",
            m.reward_mean, m.kl, m.trained_sequences
        );
        if step == 1 {
            // Sampled at 0.8 under the grammar and re-scored by the training forward (tempered,
            // renormalised on the allowed sets): the same numbers.
            assert!(m.kl.abs() < 1e-4, "kl {}", m.kl);
        }
    }
    let after = sampled_reward(&policy, &tok, &items, &cfg, 24);
    eprintln!("sampled file reward: {before:.3} -> {after:.3}");
    assert!(after > before + 0.15, "{before:.3} -> {after:.3}");
}

/// GRPO's settings of the file-localization tests.
fn file_config(steps: usize) -> RlConfig {
    RlConfig {
        algorithm: Algorithm::Grpo,
        steps,
        prompts_per_step: 4,
        group_size: 8,
        ppo_epochs: 1,
        minibatch: 32,
        lr: 3e-3,
        temperature: 0.8,
        max_new_tokens: 40,
        ground: false,
        faithful: false,
        kl_coef: 0.0,
        ..Default::default()
    }
}

/// Grammar distillation teaches the unconstrained policy the grammar: with the term on, the
/// share of the policy's probability that the grammar had to ban falls below the same run's
/// without it (same seeds, same prompts), and the logged `-log pi(A)` is positive at the start.
/// Dropping the term's gradient (or its full-distribution half) would not.
#[test]
fn grammar_distillation_moves_the_policys_mass_onto_what_the_grammar_allows() {
    let (off, on) = off_and_on(RlConfig {
        grammar_distill: 5.0,
        ..file_config(6)
    });
    assert!(on[0].distill_loss > 0.1, "{}", on[0].distill_loss);
    // The term trains the rows where the grammar left a choice (`-log pi(A)` there), and the
    // banned share over every constrained step (forced ones too) follows.
    let (off, on) = (&off[5], &on[5]);
    assert!(
        on.distill_loss < 0.75 * off.distill_loss,
        "-log pi(A) {:.3} without the term, {:.3} with it",
        off.distill_loss,
        on.distill_loss
    );
    assert!(
        cut(on) < cut(off) - 0.03,
        "override mass {:.3} without the term, {:.3} with it",
        cut(off),
        cut(on)
    );
}

/// The share of probability the grammar banned in a step's file-localization rollouts.
fn cut(m: &sorft::rft::rl::RlMetrics) -> f64 {
    m.override_mass.get("file").copied().unwrap_or(0.0)
}

/// The step metrics of a run without and with a variant.
type Runs = (
    Vec<sorft::rft::rl::RlMetrics>,
    Vec<sorft::rft::rl::RlMetrics>,
);

/// [`file_run`] of [`file_config`]`(6)` and of `variant`, printed side by side; their first
/// rollouts (same policy, same seeds) must agree.
fn off_and_on(variant: RlConfig) -> Runs {
    let (off, on) = (file_run(file_config(6)), file_run(variant));
    for (a, b) in off.iter().zip(&on) {
        eprintln!(
            "step {}: override off {:.3} on {:.3}, -log pi(A) off {:.3} on {:.3}, reward off {:.3} on {:.3}",
            a.step,
            cut(a),
            cut(b),
            a.distill_loss,
            b.distill_loss,
            a.reward_mean,
            b.reward_mean
        );
    }
    assert_eq!(cut(&off[0]), cut(&on[0]), "the first rollouts differ");
    (off, on)
}

/// The tiny model of seed 7 (policy, reference, tokenizer) and [`file_items`], with the
/// temporary folders they live in.
struct FileSetup {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    items: Vec<RlItem>,
    policy: sorft::model::Model<Cpu>,
    reference: sorft::model::Model<Cpu>,
    tok: sorft::model::Tokenizer,
}

fn file_setup() -> FileSetup {
    let data = tempfile::tempdir().unwrap();
    let items = file_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, mdir.path(), 7, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let (policy, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
    FileSetup {
        _dirs: (data, mdir),
        items,
        policy,
        reference,
        tok: tok.unwrap(),
    }
}

/// The step metrics of a run of `cfg` on [`file_items`] from the tiny model of seed 7.
fn file_run(cfg: RlConfig) -> Vec<sorft::rft::rl::RlMetrics> {
    let mut s = file_setup();
    let mut tr = RlTrainer::new(&s.policy, &s.tok, &s.items, cfg.clone()).unwrap();
    (1..=cfg.steps)
        .map(|_| {
            tr.step(&mut s.policy, &s.reference, &s.tok, &s.items)
                .unwrap()
        })
        .collect()
}

/// Rollouts that beat their group scored under the full distribution: the policy's mass moves
/// onto the rewarded (grammatical) answers from every other token, so the share the grammar had
/// to ban falls below the same run's with every rollout renormalised.
#[test]
fn positive_rollouts_under_the_full_distribution_teach_the_unconstrained_policy() {
    banned_share_falls(RlConfig {
        positive_full: true,
        ..file_config(6)
    });
}

/// After six steps of `variant`, the share of probability the grammar had to ban is below the
/// same run's without it (every rollout renormalised, no bonus).
fn banned_share_falls(variant: RlConfig) {
    let (off, on) = off_and_on(variant);
    assert!(
        cut(&on[5]) < cut(&off[5]) - 0.03,
        "override mass {:.3} without the variant, {:.3} with it",
        cut(&off[5]),
        cut(&on[5])
    );
}

/// The success bonus trains the full-reward rollouts under the full distribution: the share
/// the grammar had to ban falls below the same run's without it.
#[test]
fn the_success_bonus_teaches_the_unconstrained_policy() {
    banned_share_falls(RlConfig {
        success_bonus: 1.0,
        ..file_config(6)
    });
}

/// Two short file-localization prompts over the same four files, each with its own answer.
fn file_items(dir: &std::path::Path) -> Vec<RlItem> {
    use sorft::swe::subtask::Subtask;
    let base = train_util::rl_items(dir)
        .into_iter()
        .find(|it| it.record.subtask == Subtask::File)
        .unwrap();
    let files: Vec<String> = ["a.py", "b.py", "c.py", "d.py"].map(String::from).into();
    [
        ("the total is wrong", "c.py"),
        ("the cache is stale", "a.py"),
    ]
    .iter()
    .map(|(issue, gold)| {
        let mut it = base.clone();
        it.record.prompt = format!(
            "Issue: {issue}.\nFiles:\n{}\nWhich file needs the fix?",
            files.join("\n")
        );
        it.record.shown.files = files.clone();
        it.record.truth.files = vec![gold.to_string()];
        it
    })
    .collect()
}

/// `free_per_group`: the first members of each group decode without the answer grammar, the
/// others with it. The tiny model's free answers are mostly unparsable or invented; the
/// grammar's never are.
#[test]
fn the_first_members_of_each_group_decode_without_the_grammar() {
    use sorft::swe::reward::ZeroReason;
    use sorft::swe::subtask::EditReward;
    let mut s = file_setup();
    let cfg = RlConfig {
        free_per_group: 4,
        ..file_config(1)
    };
    let mut tr = RlTrainer::new(&s.policy, &s.tok, &s.items, cfg.clone()).unwrap();
    tr.step(&mut s.policy, &s.reference, &s.tok, &s.items)
        .unwrap();
    assert_eq!(
        tr.last_rollouts.len(),
        cfg.prompts_per_step * cfg.group_size
    );
    let (mut free_bad, mut constrained_bad) = (0, 0);
    for (j, r) in tr.last_rollouts.iter().enumerate() {
        let why = s.items[0]
            .record
            .reward(&r.response, EditReward::LineFbeta)
            .zero_reason;
        let bad = matches!(
            why,
            Some(ZeroReason::EmptyAnswer | ZeroReason::InventedTarget { .. })
        );
        if j % cfg.group_size < cfg.free_per_group {
            free_bad += usize::from(bad);
        } else {
            constrained_bad += usize::from(bad);
        }
    }
    assert_eq!(constrained_bad, 0, "a constrained answer left the grammar");
    assert!(
        free_bad >= 4,
        "only {free_bad} of 16 free answers left the grammar"
    );
}
