//! `sorft sft`: supervised fine-tuning on chat JSONL, with a progress bar, metrics JSONL,
//! checkpoints, resume, and a clean save on Ctrl-C.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::train::optim::OptimConfig;
use sorft::train::sft::{run_sft, Resume, SftConfig, SftEvent};

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft sft`.
#[derive(Args, Debug)]
pub struct SftArgs {
    /// Base model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Training data: chat JSONL, one {"messages":[{"role":..,"content":..},..]} per line.
    #[arg(long)]
    pub data: PathBuf,
    /// Held-out data (chat JSONL); default: --eval-fraction of --data.
    #[arg(long)]
    pub eval_data: Option<PathBuf>,
    /// Output directory (checkpoints/, final/, adapter/, metrics.jsonl, sft_config.json).
    #[arg(long)]
    pub out: PathBuf,
    /// Train LoRA adapters of this rank instead of all weights (0 = full fine-tuning).
    #[arg(long, default_value_t = 0)]
    pub lora: usize,
    /// LoRA alpha (the update is scaled by alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    pub lora_alpha: f32,
    /// LoRA target projections, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    pub lora_targets: Vec<String>,
    /// Passes over the training data.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f32,
    /// Final learning rate as a fraction of the peak (cosine schedule).
    #[arg(long, default_value_t = 0.1)]
    pub min_lr_ratio: f32,
    /// Warmup as a fraction of all steps.
    #[arg(long, default_value_t = 0.03)]
    pub warmup_ratio: f64,
    /// Decoupled weight decay (matrices only).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f32,
    /// Clip the global gradient norm (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f32,
    /// Adam beta2.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f32,
    /// Tokens per packed micro-batch.
    #[arg(long, default_value_t = 2048)]
    pub batch_tokens: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Longest sequence (longer conversations are cut).
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// Fraction of --data held out when --eval-data is not given.
    #[arg(long, default_value_t = 0.05)]
    pub eval_fraction: f64,
    /// Evaluate every N steps (0 = at the end only).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Save a checkpoint every N steps (0 = at the end only).
    #[arg(long, default_value_t = 100)]
    pub save_every: u64,
    /// Checkpoints to keep.
    #[arg(long, default_value_t = 3)]
    pub keep_last: usize,
    /// Random seed (data order, held-out split, LoRA init).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Recompute each block in backward (less memory, about a third more compute).
    #[arg(long)]
    pub recompute: bool,
    /// Stop after this many optimizer steps, saving a checkpoint (0 = run to the end).
    #[arg(long, default_value_t = 0)]
    pub max_steps: u64,
    /// End early, exporting the final model, once an evaluation's loss falls under this.
    #[arg(long)]
    pub stop_below_eval: Option<f64>,
    /// Resume from the newest checkpoint in --out (a fresh run when there is none).
    #[arg(long)]
    pub resume: bool,
    /// With --resume: skip a corrupt newest checkpoint and use the previous good one.
    #[arg(long)]
    pub resume_fallback: bool,
    /// Resume from this checkpoint directory.
    #[arg(long, conflicts_with = "resume")]
    pub resume_from: Option<PathBuf>,
    /// No progress bar (log lines instead).
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Runs `sorft sft`.
pub fn run(a: SftArgs) -> Result<()> {
    run_on(a.device, a)
}

impl Job for SftArgs {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        sft_on(be, dev, self)
    }
}

fn sft_on<B: Backend>(be: &B, dev: &DeviceInfo, a: SftArgs) -> Result<()> {
    let cfg = SftConfig {
        model: a.model.clone(),
        data: a.data.clone(),
        eval_data: a.eval_data.clone(),
        out: a.out.clone(),
        epochs: a.epochs,
        batch_tokens: a.batch_tokens,
        grad_accum: a.grad_accum,
        max_len: a.max_len,
        eval_fraction: a.eval_fraction,
        eval_every: a.eval_every,
        save_every: a.save_every,
        keep_last: a.keep_last,
        seed: a.seed,
        optim: OptimConfig {
            lr: a.lr,
            beta2: a.beta2,
            weight_decay: a.weight_decay,
            max_grad_norm: a.max_grad_norm,
            min_lr_ratio: a.min_lr_ratio,
            ..OptimConfig::default()
        },
        warmup_ratio: a.warmup_ratio,
        lora_rank: a.lora,
        lora_alpha: a.lora_alpha,
        lora_targets: a.lora_targets.clone(),
        recompute: a.recompute,
        chunk_rows: 256,
        max_steps: a.max_steps,
        stop_below_eval: a.stop_below_eval,
    };
    let resume = match (&a.resume_from, a.resume) {
        (Some(d), _) => Resume::From(d.clone()),
        (None, true) => Resume::Latest {
            fallback: a.resume_fallback,
        },
        (None, false) => Resume::No,
    };
    eprintln!(
        "sft: effective config {}",
        serde_json::to_string(&cfg).unwrap_or_default()
    );
    eprintln!("sft: on {}", dev.summary());
    std::fs::create_dir_all(&a.out).with_context(|| a.out.display().to_string())?;
    let dev_path = a.out.join("device.json");
    std::fs::write(&dev_path, serde_json::to_string_pretty(dev)?)
        .with_context(|| dev_path.display().to_string())?;
    super::interrupt::install();
    let bar = if a.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let quiet = a.no_progress;
    let mut on = |ev: SftEvent| match ev {
        SftEvent::Start {
            total_steps,
            start_step,
            train_examples,
            eval_examples,
            dropped,
        } => {
            bar.set_length(total_steps);
            bar.set_position(start_step);
            bar.reset_eta();
            bar.println(format!(
                "sft: {train_examples} training and {eval_examples} held-out conversations ({dropped} dropped), {total_steps} steps, starting at step {start_step}"
            ));
        }
        SftEvent::Step(m) => {
            bar.set_position(m.step);
            bar.set_message(format!(
                "loss {:.4}  lr {:.2e}  {:.0} tok/s",
                m.loss, m.lr, m.tokens_per_s
            ));
            if quiet {
                eprintln!(
                    "step {} loss {:.4} lr {:.3e} grad_norm {:.3} {:.0} tok/s",
                    m.step, m.loss, m.lr, m.grad_norm, m.tokens_per_s
                );
            }
        }
        SftEvent::Eval { step, loss } => {
            bar.println(format!("step {step}: held-out loss {loss:.4}"));
        }
        SftEvent::Saved { step, dir } => {
            bar.println(format!("step {step}: checkpoint {}", dir.display()));
        }
        SftEvent::Message(s) => bar.println(format!("sft: {s}")),
    };
    let out = run_sft(be, &cfg, resume, &super::interrupt::STOP, &mut on)
        .with_context(|| format!("sft on {}", a.data.display()))?;
    bar.finish_and_clear();
    if out.interrupted {
        eprintln!(
            "sft: interrupted at step {}/{}; resume with --resume (checkpoint {})",
            out.steps_done,
            out.total_steps,
            out.last_checkpoint
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    } else if let Some(d) = &out.final_dir {
        eprintln!(
            "sft: done, {} steps; model in {}{}",
            out.steps_done,
            d.display(),
            out.eval_loss
                .map(|l| format!(", held-out loss {l:.4}"))
                .unwrap_or_default()
        );
    } else {
        eprintln!(
            "sft: stopped after step {}/{} (--max-steps); resume with --resume",
            out.steps_done, out.total_steps
        );
    }
    Ok(())
}
