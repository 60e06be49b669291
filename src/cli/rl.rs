//! `sorft rl`: stage 2 on its own — RL with rule-based rewards from a stage-1 model over the
//! subtask prompts of a set of instances, with checkpoints, exact resume and a clean save on
//! Ctrl-C.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::pipeline::augment::renamed_items;
use sorft::rft::mismatch::Rescore;
use sorft::rft::rl::{Algorithm, RlConfig};
use sorft::rft::rl_run::{load_items, run_rl, RlRun};
use sorft::swe::instance::read_jsonl;

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft rl`.
#[derive(Args, Debug)]
pub struct RlArgs {
    /// The starting policy (a stage-1 model directory); it is also the frozen reference.
    #[arg(long)]
    pub model: PathBuf,
    /// Training instances (SWE-bench-style JSONL).
    #[arg(long)]
    pub instances: PathBuf,
    /// Repository mirrors of the instances.
    #[arg(long)]
    pub repos: PathBuf,
    /// Output directory (metrics.jsonl, checkpoints/, final/).
    #[arg(long)]
    pub out: PathBuf,
    /// ppo, grpo or rloo.
    #[arg(long, default_value = "grpo")]
    pub algorithm: String,
    /// Optimizer steps (one rollout batch each).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Prompts per rollout batch.
    #[arg(long, default_value_t = 8)]
    pub prompts_per_step: usize,
    /// Responses per prompt.
    #[arg(long, default_value_t = 4)]
    pub group_size: usize,
    /// Policy learning rate.
    #[arg(long, default_value_t = 2e-5)]
    pub lr: f32,
    /// KL coefficient.
    #[arg(long, default_value_t = 0.02)]
    pub kl_coef: f32,
    /// Most tokens per response.
    #[arg(long, default_value_t = 96)]
    pub max_new_tokens: usize,
    /// Save a checkpoint every N steps (0 = at the end only).
    #[arg(long, default_value_t = 4)]
    pub save_every: usize,
    /// Seed of prompt choice and sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Renamed copies of each prompt, each with a fresh package name (0: the originals).
    #[arg(long, default_value_t = 0)]
    pub prompt_renames: usize,
    /// Resume from the newest good checkpoint in --out (a fresh run when there is none).
    #[arg(long)]
    pub resume: bool,
    /// Train LoRA adapters of this rank instead of every weight: the reference is then the base
    /// model with the adapters off (one copy of the weights); the adapter is exported to
    /// OUT/adapter (PEFT).
    #[arg(long)]
    pub lora: Option<usize>,
    /// LoRA alpha (the update is scaled by alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    pub lora_alpha: f32,
    /// Re-score the sampler's log-probabilities with the training forward: auto (on a GPU), on
    /// or off.
    #[arg(long, default_value = "auto")]
    pub rescore: String,
    /// Cap of the truncated importance weights when re-scoring.
    #[arg(long, default_value_t = 2.0)]
    pub tis_cap: f32,
    /// Grammar distillation: coefficient of `-log pi(allowed)` on the constrained tokens of the
    /// update (teaches the unconstrained policy to stay in the grammar; 0: off).
    #[arg(long)]
    pub grammar_distill: Option<f32>,
    /// Train the rollouts that beat their group's mean under the full (unconstrained)
    /// distribution, so the unconstrained policy learns what the grammar found.
    #[arg(long)]
    pub positive_full: bool,
    /// Dual clip of the policy loss: with a negative advantage the loss is capped at this times
    /// |A| (0: off; otherwise above 1, e.g. 3).
    #[arg(long, default_value_t = 0.0)]
    pub dual_clip: f32,
    /// Members of each group sampled without the answer grammar (the rest with it; 0: all
    /// constrained).
    #[arg(long, default_value_t = 0)]
    pub free_per_group: usize,
    /// Advantage bonus of the rollouts that earned the full reward, scored under the full
    /// distribution (expert iteration inside the update; 0: off).
    #[arg(long, default_value_t = 0.0)]
    pub success_bonus: f32,
    /// PPO-ptx: coefficient of the supervised loss on --ptx-data in every update (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub ptx_coef: f32,
    /// Supervised data of the ptx term (chat JSONL, e.g. stage 1's training data).
    #[arg(long)]
    pub ptx_data: Option<PathBuf>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Runs `sorft rl`.
pub fn run(a: RlArgs) -> Result<()> {
    run_on(a.device, a)
}

impl Job for RlArgs {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        rl_on(be, dev, self)
    }
}

fn rl_on<B: Backend>(be: &B, dev: &DeviceInfo, a: RlArgs) -> Result<()> {
    let algorithm = match a.algorithm.to_ascii_lowercase().as_str() {
        "ppo" => Algorithm::Ppo,
        "grpo" => Algorithm::Grpo,
        "rloo" => Algorithm::Rloo,
        other => anyhow::bail!("--algorithm {other:?}: expected ppo, grpo or rloo"),
    };
    let cfg = RlConfig {
        algorithm,
        steps: a.steps,
        prompts_per_step: a.prompts_per_step,
        group_size: a.group_size,
        lr: a.lr,
        kl_coef: a.kl_coef,
        max_new_tokens: a.max_new_tokens,
        save_every: a.save_every,
        seed: a.seed,
        prompt_renames: a.prompt_renames,
        lora: match a.lora {
            Some(0) => anyhow::bail!(
                "--lora 0: the rank must be at least 1 (omit --lora for full fine-tuning)"
            ),
            r => r.unwrap_or(0),
        },
        lora_alpha: a.lora_alpha,
        rescore: Rescore::parse(&a.rescore).map_err(|e| anyhow::anyhow!("--{e}"))?,
        tis_cap: a.tis_cap,
        grammar_distill: a
            .grammar_distill
            .unwrap_or(RlConfig::default().grammar_distill),
        positive_full: a.positive_full,
        dual_clip: a.dual_clip,
        free_per_group: a.free_per_group,
        success_bonus: a.success_bonus,
        ptx_coef: a.ptx_coef,
        ..RlConfig::default()
    };
    if let (Some(gpu_bytes), "cuda") = (dev.memory, dev.device.as_str()) {
        // Stop before loading anything when the step cannot fit.
        let input = sorft::model::plan::PlanInput {
            lora_rank: cfg.lora,
            seq: cfg.max_prompt_tokens + cfg.max_new_tokens,
            rollout_seqs: cfg.rollout_batch,
            train_seqs: cfg.minibatch,
            dtype_bytes: if dev.dtype == "bf16" { 2 } else { 4 },
            chunk_rows: 256,
            recompute: false,
            gpu_bytes,
        };
        super::plan::check(&a.model, &input)?;
    }
    let instances = read_jsonl(&a.instances)?;
    let items = renamed_items(
        &load_items(&instances, &a.repos)?,
        a.prompt_renames,
        a.seed ^ 0xa09,
    )?;
    if items.is_empty() {
        anyhow::bail!(
            "{}: no instance gives a subtask prompt",
            a.instances.display()
        );
    }
    super::interrupt::install();
    let run = RlRun {
        model: a.model.clone(),
        out: a.out.clone(),
        resume: a.resume,
        device: Some(dev.clone()),
        ptx_data: a.ptx_data.clone(),
    };
    eprintln!("rl: on {}", dev.summary());
    let out = run_rl(be, &run, &cfg, &items, &super::interrupt::STOP, &mut |m| {
        eprintln!(
            "step {}/{}: reward {:.3} (std {:.3}) kl {:.4} entropy {:.3} clip {:.3} | rollout {:.1}s reward {:.2}s train {:.1}s",
            m.step, cfg.steps, m.reward_mean, m.reward_std, m.kl, m.entropy, m.clip_frac,
            m.time_rollout, m.time_reward, m.time_train
        )
    })
    .with_context(|| format!("rl from {}", a.model.display()))?;
    match out.final_dir {
        Some(d) => eprintln!(
            "rl: done, {} steps{}; policy in {}",
            cfg.steps,
            if out.resumed_from > 0 {
                format!(" (resumed at step {})", out.resumed_from)
            } else {
                String::new()
            },
            d.display()
        ),
        None => eprintln!(
            "rl: interrupted after step {}; resume with --resume",
            out.metrics.last().map(|m| m.step).unwrap_or(0)
        ),
    }
    Ok(())
}
