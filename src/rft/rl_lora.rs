//! LoRA RL: the stage-2 policy is the base model plus fp32 LoRA adapters on every projection, and
//! the KL reference is the same base weights with the adapters switched off — one copy of the
//! base model, never a second. Rollouts decode through the adapted forward
//! ([`crate::model::adapter`]), no merge into the base weights. Checkpoints hold the adapters
//! (PEFT layout) and their optimizer moments; the run exports the PEFT adapter and the merged
//! model.

use std::path::Path;

use crate::engine::Backend;
use crate::model::config::ModelConfig;
use crate::model::Model;
use crate::rft::monitor::MonitorMode;
use crate::rft::rl::RlConfig;
use crate::train::lora::{Lora, LoraConfig, LoraTarget};

/// Checks the LoRA settings of `cfg` against the model: a rank of 1 to `hidden_size`, a positive
/// finite alpha, and no option that cannot work with adapters. One-line errors.
pub fn check(cfg: &RlConfig, mc: &ModelConfig) -> anyhow::Result<()> {
    if cfg.lora == 0 {
        return Ok(());
    }
    anyhow::ensure!(
        cfg.lora <= mc.hidden_size,
        "LoRA rank {} exceeds the model's hidden size {}",
        cfg.lora,
        mc.hidden_size
    );
    anyhow::ensure!(
        cfg.lora_alpha.is_finite() && cfg.lora_alpha > 0.0,
        "LoRA alpha must be positive and finite, got {}",
        cfg.lora_alpha
    );
    anyhow::ensure!(
        cfg.monitor != MonitorMode::Remediate,
        "LoRA RL cannot run with monitor = remediate (its rollback restores base weights, not adapters); use detect or off"
    );
    Ok(())
}

/// The adapter settings of a LoRA run (every projection adapted), or `None` for full
/// fine-tuning (`lora = 0`).
pub fn lora_config(cfg: &RlConfig) -> Option<LoraConfig> {
    (cfg.lora > 0).then(|| LoraConfig {
        rank: cfg.lora,
        alpha: cfg.lora_alpha,
        targets: LoraTarget::ALL.to_vec(),
    })
}

/// Fresh adapters for `policy` (deterministic in `cfg.seed`), or `None` without LoRA.
pub fn new_adapters<B: Backend>(
    policy: &Model<B>,
    cfg: &RlConfig,
) -> anyhow::Result<Option<Lora<B>>> {
    check(cfg, &policy.config)?;
    Ok(match lora_config(cfg) {
        Some(lc) => Some(Lora::new(&policy.backend, &policy.config, lc, cfg.seed)?),
        None => None,
    })
}

/// Bytes of the tensors `params` lists.
pub fn tensor_bytes<B: Backend>(params: &[(String, &crate::engine::Tensor<B>)]) -> u64 {
    params
        .iter()
        .map(|(_, t)| (t.numel() * t.dtype().size()) as u64)
        .sum()
}

/// Writes the adapters into a checkpoint being written: `adapter_model.safetensors` and
/// `adapter_config.json`, as PEFT lays them out (`base` names the base model).
pub fn add_to_checkpoint<B: Backend>(
    w: &mut crate::train::checkpoint::CheckpointWriter,
    be: &B,
    lora: &Lora<B>,
    scratch: &Path,
    base: &str,
) -> anyhow::Result<()> {
    let tmp = scratch.join(format!(".adapter.tmp{}", std::process::id()));
    lora.save_peft(be, &tmp, base)?;
    let result = (|| -> anyhow::Result<()> {
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            let p = tmp.join(f);
            let bytes = std::fs::read(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            w.add_bytes(f, &bytes)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Exports a finished LoRA run: the PEFT adapter to `adapter_dir`, and the merged model (the
/// base weights plus the adapters, merged in place now that training is over) to `final_dir`
/// as a model directory.
pub fn export<B: Backend>(
    policy: &mut Model<B>,
    lora: &Lora<B>,
    src_dir: &Path,
    adapter_dir: &Path,
    final_dir: &Path,
) -> anyhow::Result<()> {
    lora.save_peft(&policy.backend, adapter_dir, &src_dir.to_string_lossy())?;
    crate::train::sft::own_weights(policy)?;
    lora.merge_into(policy)?;
    crate::rft::rl::export_policy(policy, src_dir, final_dir)
}
