//! A whole stage-2 run on disk: policy and reference from a model directory, steps with metrics
//! appended to `OUT/metrics.jsonl` (every rollout's response and reward to `OUT/rollouts.jsonl`), checkpoints under `OUT/checkpoints/` every `save_every` steps
//! (and when stopped), exact resume from the newest good one, and the final policy exported to
//! `OUT/final/` as a model directory. With `lora > 0` the model directory is loaded once: the
//! policy is it plus adapters and the reference is it with the adapters off; the adapter is also
//! exported to `OUT/adapter/` (PEFT).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

use crate::engine::device::DeviceInfo;
use crate::engine::Backend;
use crate::model::load_dir;
use crate::rft::rl::{export_policy, RlConfig, RlItem, RlMetrics, RlTrainer};
use crate::train::checkpoint;

/// Where a run reads and writes.
#[derive(Clone, Debug, Default)]
pub struct RlRun {
    /// The starting policy (the stage-1 model), which is also the frozen reference.
    pub model: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Resume from the newest good checkpoint in `out/checkpoints` (a fresh run when there is none).
    pub resume: bool,
    /// What the run runs on: written as an `{"event": "start", ...}` line to `metrics.jsonl` at
    /// every (re)start.
    pub device: Option<DeviceInfo>,
    /// The supervised data of the ptx term (chat JSONL, stage 1's training data); needed when
    /// `stage2.ptx_coef` is set.
    pub ptx_data: Option<PathBuf>,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RlOutcome {
    /// Metrics of every step (those before a resume are read back from `metrics.jsonl`).
    pub metrics: Vec<RlMetrics>,
    /// The exported policy, when the run reached its last step.
    pub final_dir: Option<PathBuf>,
    /// The step the run resumed from (0 for a fresh run).
    pub resumed_from: usize,
    /// Bytes of the weights the run held: policy and reference (a second copy) for full
    /// fine-tuning; one base model plus the adapters for LoRA.
    pub weight_bytes: u64,
}

/// Metrics lines of steps up to `step`, parsed back (lines of a run killed later are dropped).
fn read_metrics(path: &Path, step: usize) -> Vec<(String, RlMetrics)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            if v.get("event").is_some() {
                // A start line (device): kept by [`start_line`]'s caller only for its own start.
                return None;
            }
            let m: RlMetrics = serde_json::from_value(v).ok()?;
            (m.step <= step).then(|| (l.to_string(), m))
        })
        .collect()
}

/// Runs (or resumes) stage 2 to `cfg.steps` steps, or until `stop` is set (a checkpoint is saved
/// then). `on_step` sees every new step's metrics.
pub fn run_rl<B: Backend>(
    be: &B,
    run: &RlRun,
    cfg: &RlConfig,
    items: &[RlItem],
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&RlMetrics),
) -> anyhow::Result<RlOutcome> {
    run_rl_with_fault(be, run, cfg, items, stop, on_step, None)
}

/// [`run_rl`] with edit answers scored by execution (`stage2.edit_exec`, see
/// [`crate::rft::exec_reward`]).
pub fn run_rl_exec<B: Backend>(
    be: &B,
    run: &RlRun,
    cfg: &RlConfig,
    items: &[RlItem],
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&RlMetrics),
    exec: Option<std::sync::Arc<crate::rft::exec_reward::ExecReward>>,
) -> anyhow::Result<RlOutcome> {
    run_rl_inner(be, run, cfg, items, stop, on_step, None, exec)
}

/// [`run_rl`] with a planted fault (`sorft faultbench`, tests); a resume takes the fault's state
/// from the checkpoint.
pub fn run_rl_with_fault<B: Backend>(
    be: &B,
    run: &RlRun,
    cfg: &RlConfig,
    items: &[RlItem],
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&RlMetrics),
    fault: Option<crate::rft::monitor::inject::Injection>,
) -> anyhow::Result<RlOutcome> {
    run_rl_inner(be, run, cfg, items, stop, on_step, fault, None)
}

#[allow(clippy::too_many_arguments)]
fn run_rl_inner<B: Backend>(
    be: &B,
    run: &RlRun,
    cfg: &RlConfig,
    items: &[RlItem],
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&RlMetrics),
    fault: Option<crate::rft::monitor::inject::Injection>,
    exec: Option<std::sync::Arc<crate::rft::exec_reward::ExecReward>>,
) -> anyhow::Result<RlOutcome> {
    let root = run.out.join("checkpoints");
    let metrics_path = run.out.join("metrics.jsonl");
    let (mut policy, tok) = load_dir(be, &run.model)?;
    let tok = tok.with_context(|| format!("{}: no tokenizer.json", run.model.display()))?;
    crate::rft::rl_lora::check(cfg, &policy.config)?;
    // Full fine-tuning: the policy is trained in place (its weights become owned memory, their
    // map's pages released) and the reference is a read-only map of the same file. LoRA: the
    // base stays frozen and is its own reference with the adapters off.
    let reference = if cfg.lora > 0 {
        None
    } else {
        crate::train::sft::own_weights(&mut policy)?;
        Some(load_dir(be, &run.model)?.0)
    };
    let mut trainer = RlTrainer::new(&policy, &tok, items, cfg.clone())?;
    trainer.fault = fault;
    trainer.exec = exec;
    if cfg.ptx_coef > 0.0 {
        let Some(path) = &run.ptx_data else {
            anyhow::bail!(
                "stage2.ptx_coef is set but no ptx data was given (stage 1's training data)"
            );
        };
        trainer.ptx =
            crate::rft::ptx::load(path, &tok, cfg.max_prompt_tokens + cfg.max_new_tokens)?;
    }
    let weight_bytes = held_weight_bytes(&policy, reference.as_ref(), &trainer);
    let existing = checkpoint::list(&root)?;
    let mut history = Vec::new();
    let mut resumed_dir = None;
    if run.resume {
        if let (Some(dir), _) = checkpoint::latest_good(&root, false)? {
            if let Some(p) = trainer.resume(&dir, &run.model, be)? {
                policy = p;
                crate::train::sft::own_weights(&mut policy)?;
            }
            history = read_metrics(&metrics_path, trainer.step);
            resumed_dir = Some(dir);
        }
    } else if !existing.is_empty() {
        anyhow::bail!(
            "{} holds checkpoints of an earlier run; pass --resume to continue it or choose another output directory",
            root.display()
        );
    }
    let resumed_from = trainer.step;
    std::fs::create_dir_all(&run.out).with_context(|| run.out.display().to_string())?;
    let kept: String = history.iter().map(|(l, _)| format!("{l}\n")).collect();
    crate::model::weights::write_atomic(&metrics_path, kept.as_bytes())?;
    let mut metrics: Vec<RlMetrics> = history.into_iter().map(|(_, m)| m).collect();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&metrics_path)
        .with_context(|| metrics_path.display().to_string())?;
    if let Some(dev) = &run.device {
        writeln!(log, "{}", start_line(dev, trainer.step)?)?;
    }
    let mut saved_at = trainer.step;
    let mut monitor = crate::rft::monitor::Supervisor::new(cfg.monitor, cfg);
    match &resumed_dir {
        // The monitor's overrides, quarantine and state come back with the checkpoint.
        Some(dir) => monitor.resume(dir, &mut trainer, &policy)?,
        None => monitor.start(&trainer, &policy)?,
    }
    // Every rollout's response and reward, for reading what the policy writes.
    let rollouts_path = run.out.join("rollouts.jsonl");
    let mut rollouts = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&rollouts_path)
        .with_context(|| rollouts_path.display().to_string())?;
    // A run the monitor stopped stays stopped when resumed.
    while trainer.step < cfg.steps && monitor.stopped().is_none() {
        let mut m = match &reference {
            Some(r) => trainer.step(&mut policy, r, &tok, items)?,
            None => trainer.step_adapters_off(&mut policy, &tok, items)?,
        };
        let verdict = monitor.after_step(&mut trainer, &mut policy, &mut m)?;
        for r in &trainer.last_rollouts {
            writeln!(rollouts, "{}", serde_json::to_string(r)?)?;
        }
        writeln!(log, "{}", serde_json::to_string(&m)?)?;
        log.flush()?;
        on_step(&m);
        metrics.push(m);
        if verdict != crate::rft::monitor::supervisor::Verdict::Continue {
            break; // The monitor stopped the run at its last healthy weights (see metrics).
        }
        let stopping = stop.load(Ordering::Relaxed);
        if stopping || (cfg.save_every > 0 && trainer.step % cfg.save_every == 0) {
            let extra = monitor.checkpoint_files(&trainer, &policy)?;
            trainer.save_checkpoint_with(&policy, &run.model, &run.model, &root, extra)?;
            saved_at = trainer.step;
        }
        if stopping {
            return Ok(RlOutcome {
                metrics,
                final_dir: None,
                resumed_from,
                weight_bytes,
            });
        }
    }
    if saved_at != trainer.step {
        let extra = monitor.checkpoint_files(&trainer, &policy)?;
        trainer.save_checkpoint_with(&policy, &run.model, &run.model, &root, extra)?;
    }
    let final_dir = run.out.join("final");
    match &trainer.lora {
        Some(l) => crate::rft::rl_lora::export(
            &mut policy,
            l,
            &run.model,
            &run.out.join("adapter"),
            &final_dir,
        )?,
        None => export_policy(&policy, &run.model, &final_dir)?,
    }
    Ok(RlOutcome {
        metrics,
        final_dir: Some(final_dir),
        resumed_from,
        weight_bytes,
    })
}

/// Bytes of the weights a run holds: the policy, the reference when it is a second model, and
/// the LoRA adapters.
fn held_weight_bytes<B: Backend>(
    policy: &crate::model::Model<B>,
    reference: Option<&crate::model::Model<B>>,
    trainer: &RlTrainer<B>,
) -> u64 {
    use crate::rft::rl_lora::tensor_bytes;
    use crate::train::params::model_params;
    tensor_bytes(&model_params(policy))
        + reference.map_or(0, |r| tensor_bytes(&model_params(r)))
        + trainer
            .lora
            .as_ref()
            .map_or(0, |l| tensor_bytes(&l.params()))
}

/// The `metrics.jsonl` line that opens a (resumed) run: the step it starts from and its device.
pub fn start_line(dev: &DeviceInfo, step: usize) -> anyhow::Result<String> {
    let mut v = serde_json::json!({ "event": "start", "step": step });
    v["device"] = serde_json::to_value(dev)?;
    Ok(v.to_string())
}

/// The stage-2 prompts of `instances` (one per subtask with ground truth), from the mirrors in
/// `repos`.
pub fn load_items(
    instances: &[crate::swe::instance::Instance],
    repos: &Path,
) -> anyhow::Result<Vec<RlItem>> {
    let store = crate::swe::repo::RepoStore::new(repos);
    let mut out = Vec::new();
    for inst in instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit)?;
        let gt = crate::swe::truth::ground_truth(&inst.patch, &snap)
            .with_context(|| format!("{}: ground truth", inst.instance_id))?;
        for r in crate::swe::subtask::training_records(inst, &snap, &gt) {
            out.push(RlItem {
                record: r,
                problem: inst.problem_statement.clone(),
            });
        }
    }
    Ok(out)
}
