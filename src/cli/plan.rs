//! `sorft plan`: the memory budget of one RL step on a GPU, per component, from a model's
//! `config.json` alone (nothing is loaded), and whether it fits.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::Cuda;
use sorft::model::config::ModelConfig;
use sorft::model::plan::{Plan, PlanInput, GIB};

use super::device::{pick_with, DTypeChoice, DeviceChoice, Picked};

/// Arguments of `sorft plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model directory (only config.json is read).
    #[arg(long)]
    pub model: PathBuf,
    /// LoRA rank on all seven projections (0: full fine-tuning with a reference copy).
    #[arg(long, default_value_t = 0)]
    pub lora: usize,
    /// Tokens per sequence (prompt + response).
    #[arg(long, default_value_t = 4096)]
    pub seq: usize,
    /// Sequences per group: decoded together and trained together.
    #[arg(long, default_value_t = 8)]
    pub group: usize,
    /// GPU memory in GiB (default: the GPU's, else 80).
    #[arg(long)]
    pub gpu_mem: Option<f64>,
    /// Compute dtype.
    #[arg(long, value_enum, default_value_t = DTypeChoice::Bf16)]
    pub dtype: DTypeChoice,
    /// Recompute blocks in backward (keep only block inputs).
    #[arg(long)]
    pub recompute: bool,
}

/// Runs `sorft plan`: prints the table; a step that does not fit is an error (exit 1).
pub fn run(a: PlanArgs) -> Result<()> {
    let gpu_bytes = match a.gpu_mem {
        Some(g) if g.is_finite() && g > 0.0 => (g * GIB) as u64,
        Some(g) => bail!("--gpu-mem {g}: expected a positive number of GiB"),
        // The visible GPU's memory, without the note `auto` prints when there is none.
        None => match pick_with(DeviceChoice::Auto, a.dtype.dtype(), |d| Cuda::new(0, d))? {
            Picked::Cuda(c) => DeviceInfo::cuda(&c).memory.unwrap_or(80 << 30),
            Picked::Cpu(_) => 80 << 30,
        },
    };
    if a.seq == 0 || a.group == 0 {
        bail!("--seq and --group must be positive");
    }
    let input = PlanInput {
        lora_rank: a.lora,
        seq: a.seq,
        rollout_seqs: a.group,
        train_seqs: a.group,
        dtype_bytes: a.dtype.dtype().size(),
        chunk_rows: 256,
        recompute: a.recompute,
        gpu_bytes,
    };
    let cfg = ModelConfig::from_file(&a.model.join("config.json"))?;
    let plan = Plan::new(&cfg, &input);
    super::print_out(&plan.table())?;
    verdict(&a.model, &plan)
}

/// A one-line error when `plan` does not fit.
fn verdict(dir: &Path, plan: &Plan) -> Result<()> {
    if !plan.fits() {
        bail!(
            "{}: one RL step needs {:.2} GiB, more than the {:.2} GiB usable; shorten the sequences, shrink the group, recompute blocks or use LoRA",
            dir.display(),
            plan.peak as f64 / GIB,
            plan.usable as f64 / GIB,
        );
    }
    Ok(())
}

/// Checks, before loading anything, that the RL step `input` describes fits for the model in
/// `dir`; when it does not, prints the plan's table on stderr and returns a one-line error.
pub fn check(dir: &Path, input: &PlanInput) -> Result<Plan> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let plan = Plan::new(&cfg, input);
    if !plan.fits() {
        eprint!("{}", plan.table());
    }
    verdict(dir, &plan)?;
    Ok(plan)
}
