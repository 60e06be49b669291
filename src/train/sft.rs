//! Supervised fine-tuning on chat JSONL: loss on assistant tokens only, packed batches, gradient
//! accumulation, AdamW with clipping and a cosine schedule, held-out evaluation, metrics JSONL,
//! checkpoints every N steps with exact resume, a clean stop on request (Ctrl-C), and the final
//! export (an HF model directory, plus a PEFT adapter for LoRA runs).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::engine::Backend;
use crate::model::chat::{encode, Message};
use crate::model::generate::{generate, GenOptions, GenRequest};
use crate::model::st_writer::write_safetensors;
use crate::model::transformer::Model;
use crate::model::weights::write_atomic;
use crate::model::weights::write_atomic_with;
use crate::model::Tokenizer;
use crate::train::backward::backward;
use crate::train::checkpoint::{self, side_files, stream_tensors, CheckpointWriter};
use crate::train::data::{
    encode_examples, epoch_batches, read_chat_jsonl, split_held_out, ChatExample,
};
use crate::train::error::{Result, TrainError};
use crate::train::forward::{forward, Batch, ForwardOptions, Sequence};
use crate::train::lora::{Lora, LoraConfig, LoraTarget};
use crate::train::loss::cross_entropy;
use crate::train::memory::{self, StepMemory};
use crate::train::optim::{AdamW, OptimConfig};
use crate::train::params::{model_params, model_params_mut, Grads};

/// Every knob of a supervised fine-tuning run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SftConfig {
    /// Base model directory (config.json, safetensors, tokenizer.json).
    pub model: PathBuf,
    /// Training data (chat JSONL).
    pub data: PathBuf,
    /// Held-out data; when absent, `eval_fraction` of `data` is held out.
    pub eval_data: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// Passes over the training data.
    pub epochs: u64,
    /// Tokens per packed micro-batch.
    pub batch_tokens: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Longest sequence in tokens (longer conversations are cut).
    pub max_len: usize,
    /// Fraction of `data` held out for evaluation when there is no `eval_data`.
    pub eval_fraction: f64,
    /// Evaluate every N optimizer steps (0: only at the end).
    pub eval_every: u64,
    /// Save a checkpoint every N optimizer steps (0: only at the end).
    pub save_every: u64,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// Seed of the data order, held-out split and LoRA initialisation.
    pub seed: u64,
    /// Optimizer and schedule (`total_steps` is set from the data).
    pub optim: OptimConfig,
    /// Warmup as a fraction of all steps (used when `optim.warmup_steps` is 0).
    pub warmup_ratio: f64,
    /// LoRA rank (0: full fine-tuning).
    pub lora_rank: usize,
    /// LoRA alpha.
    pub lora_alpha: f32,
    /// LoRA targets (`q,k,v,o,gate,up,down`).
    pub lora_targets: Vec<String>,
    /// Recompute each block in backward instead of keeping its activations.
    pub recompute: bool,
    /// Rows of logits computed at once by the loss.
    pub chunk_rows: usize,
    /// Stop (with a checkpoint) after this optimizer step; 0 runs to the end.
    pub max_steps: u64,
    /// End training early, exporting the final model, once an evaluation's loss falls under
    /// this (a curriculum that has taught what it measures); `None`: run every step.
    #[serde(default)]
    pub stop_below_eval: Option<f64>,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::new(),
            data: PathBuf::new(),
            eval_data: None,
            out: PathBuf::new(),
            epochs: 1,
            batch_tokens: 2048,
            grad_accum: 1,
            max_len: 1024,
            eval_fraction: 0.05,
            eval_every: 0,
            save_every: 100,
            keep_last: 3,
            seed: 0,
            optim: OptimConfig {
                lr: 1e-4,
                weight_decay: 0.0,
                ..OptimConfig::default()
            },
            warmup_ratio: 0.03,
            lora_rank: 0,
            lora_alpha: 16.0,
            lora_targets: ["q", "k", "v", "o", "gate", "up", "down"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            recompute: false,
            chunk_rows: 256,
            max_steps: 0,
            stop_below_eval: None,
        }
    }
}

/// Where to start from.
#[derive(Clone, Debug, PartialEq)]
pub enum Resume {
    /// A fresh run.
    No,
    /// The newest good checkpoint under `OUT/checkpoints` (a fresh run when there is none);
    /// `fallback` skips corrupt newer ones instead of failing.
    Latest {
        /// Fall back to the previous good checkpoint when the newest is corrupt.
        fallback: bool,
    },
    /// A given checkpoint directory.
    From(PathBuf),
}

/// Metrics of one optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// 1-based optimizer step.
    pub step: u64,
    /// Epoch of its first micro-batch (0-based).
    pub epoch: u64,
    /// Training loss (weighted mean over the step's assistant tokens).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens processed (all rows).
    pub tokens: usize,
    /// Tokens with a loss.
    pub trained_tokens: usize,
    /// Throughput of this step.
    pub tokens_per_s: f64,
    /// Peak resident memory of the process so far, in MiB (0 where unknown).
    pub peak_rss_mib: f64,
}

/// Progress of a run, for a progress bar or a log.
#[derive(Clone, Debug)]
pub enum SftEvent {
    /// The run starts at `start_step` of `total_steps`.
    Start {
        /// Optimizer steps of the whole run.
        total_steps: u64,
        /// First step of this process (non-zero when resuming).
        start_step: u64,
        /// Training sequences.
        train_examples: usize,
        /// Held-out sequences.
        eval_examples: usize,
        /// Conversations dropped (no assistant token within `max_len`).
        dropped: usize,
    },
    /// An optimizer step finished.
    Step(StepMetrics),
    /// A held-out evaluation finished.
    Eval {
        /// After this optimizer step.
        step: u64,
        /// Mean cross-entropy of the held-out assistant tokens.
        loss: f64,
    },
    /// A checkpoint was written.
    Saved {
        /// Its step.
        step: u64,
        /// Its directory.
        dir: PathBuf,
    },
    /// Something worth telling the user.
    Message(String),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct SftOutcome {
    /// Optimizer steps done in total.
    pub steps_done: u64,
    /// Optimizer steps of the whole run.
    pub total_steps: u64,
    /// Whether it stopped on request before the end.
    pub interrupted: bool,
    /// The last held-out loss.
    pub eval_loss: Option<f64>,
    /// The exported model directory (at the end of the run).
    pub final_dir: Option<PathBuf>,
    /// The last checkpoint written.
    pub last_checkpoint: Option<PathBuf>,
}

/// The training-state file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Format tag.
    pub format: String,
    /// Optimizer steps done.
    pub step: u64,
    /// Micro-batches consumed (the data cursor).
    pub micro_batches_done: u64,
    /// Steps of the whole run (the schedule's length).
    pub total_steps: u64,
    /// The run's configuration.
    pub config: SftConfig,
}

const STATE_FORMAT: &str = "sorft-sft-state-1";

fn parse_targets(names: &[String]) -> Result<Vec<LoraTarget>> {
    let mut out = Vec::new();
    for n in names {
        let t = LoraTarget::parse(n).ok_or_else(|| {
            TrainError::Input(format!(
                "--lora-targets: {n:?} is not one of q, k, v, o, gate, up, down"
            ))
        })?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out.sort();
    Ok(out)
}

/// Mean cross-entropy of the trained tokens of `seqs` (weights ignored), in packed batches.
pub fn eval_loss<B: Backend>(
    model: &Model<B>,
    lora: Option<&Lora<B>>,
    seqs: &[Sequence],
    batch_tokens: usize,
    chunk_rows: usize,
) -> Result<(f64, usize)> {
    let mut sum = 0.0f64;
    let mut n = 0usize;
    let mut start = 0;
    while start < seqs.len() {
        let mut end = start + 1;
        let mut tokens = seqs[start].ids.len();
        while end < seqs.len() && tokens + seqs[end].ids.len() <= batch_tokens {
            tokens += seqs[end].ids.len();
            end += 1;
        }
        let batch = Batch::pack(&seqs[start..end])?;
        let opts = ForwardOptions {
            recompute: true,
            chunk_rows,
            temperature: 1.0,
        };
        let fwd = forward(model, lora, &batch, opts)?;
        let lp = model.backend.to_host_f32(&fwd.logp)?;
        for (i, &t) in batch.targets.iter().enumerate() {
            if t != crate::engine::backend::IGNORE_TARGET {
                sum -= lp[i] as f64;
                n += 1;
            }
        }
        start = end;
    }
    Ok((if n > 0 { sum / n as f64 } else { 0.0 }, n))
}

/// Fraction of conversations whose last assistant message the model reproduces exactly with
/// greedy decoding from the preceding messages.
pub fn greedy_exact_match<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    examples: &[ChatExample],
    max_new_tokens: usize,
) -> Result<f64> {
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for ex in examples {
        let Some(last) = ex.messages.iter().rposition(|m| m.role == "assistant") else {
            continue;
        };
        let prompt: Vec<Message> = ex.messages[..last].to_vec();
        let (ids, _) = encode(tok, &prompt, true)?;
        reqs.push(GenRequest {
            prompt: ids,
            max_new_tokens,
            stop_ids: tok.stop_ids(),
            ..Default::default()
        });
        want.push(ex.messages[last].content.trim().to_string());
    }
    if reqs.is_empty() {
        return Ok(0.0);
    }
    let outs = generate(model, Some(tok), &reqs, &GenOptions::default())?;
    let hits = outs
        .iter()
        .zip(&want)
        .filter(|(o, w)| o.text.trim() == w.as_str())
        .count();
    Ok(hits as f64 / reqs.len() as f64)
}

struct Run<B: Backend> {
    be: B,
    cfg: SftConfig,
    model: Model<B>,
    lora: Option<Lora<B>>,
    opt: AdamW<B>,
    total_steps: u64,
}

impl<B: Backend> Run<B> {
    /// Writes the checkpoint of `step`; returns its directory and the bytes written.
    fn save_checkpoint(&self, step: u64, micro_done: u64) -> Result<(PathBuf, u64)> {
        let root = self.cfg.out.join("checkpoints");
        let mut w = CheckpointWriter::begin(&root, step)?;
        for (f, bytes) in side_files(&self.cfg.model)? {
            w.add_bytes(&f, &bytes)?;
        }
        match &self.lora {
            Some(l) => {
                let tmp = tempdir_in(&self.cfg.out)?;
                l.save_peft(&self.be, &tmp, &self.cfg.model.to_string_lossy())?;
                for f in ["adapter_model.safetensors", "adapter_config.json"] {
                    let p = tmp.join(f);
                    w.add_bytes(f, &std::fs::read(&p).map_err(|e| TrainError::io(&p, e))?)?;
                }
                let _ = std::fs::remove_dir_all(&tmp);
            }
            None => w.add_safetensors(
                "model.safetensors",
                stream_tensors(&self.be, model_params(&self.model), ""),
            )?,
        }
        w.add_safetensors("optimizer.safetensors", self.opt.state_stream(&self.be))?;
        let state = TrainState {
            format: STATE_FORMAT.into(),
            step,
            micro_batches_done: micro_done,
            total_steps: self.total_steps,
            config: self.cfg.clone(),
        };
        let text = serde_json::to_string_pretty(&state).unwrap_or_default();
        w.add_bytes("train_state.json", text.as_bytes())?;
        let written = w.bytes_written();
        let dir = w.commit()?;
        let manifest = std::fs::metadata(dir.join(checkpoint::MANIFEST)).map_or(0, |m| m.len());
        let bytes = written + manifest;
        checkpoint::prune(&root, self.cfg.keep_last)?;
        Ok((dir, bytes))
    }

    fn export(&self) -> Result<PathBuf> {
        let dir = self.cfg.out.join("final");
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
        for (f, bytes) in side_files(&self.cfg.model)? {
            write_atomic(&dir.join(f), &bytes)?;
        }
        let merged = match &self.lora {
            Some(l) => {
                l.save_peft(
                    &self.be,
                    &self.cfg.out.join("adapter"),
                    &self.cfg.model.to_string_lossy(),
                )?;
                let mut merged = Model::load(&self.be, &self.cfg.model)?;
                l.merge_into(&mut merged)?;
                Some(merged)
            }
            None => None,
        };
        let model = merged.as_ref().unwrap_or(&self.model);
        let views = stream_tensors(&self.be, model_params(model), "");
        write_atomic_with(&dir.join("model.safetensors"), |w| {
            write_safetensors(w, views).map(|_| ())
        })?;
        Ok(dir)
    }
}

/// Makes every weight of a model that is trained in place owned memory, releasing the pages of
/// mapped ones, so that the map and the trained copy are not both resident.
pub fn own_weights<B: Backend>(m: &mut Model<B>) -> Result<()> {
    let be = m.backend.clone();
    for (_, t) in model_params_mut(m) {
        be.own_weight(t)?;
    }
    Ok(())
}

fn owned_model<B: Backend>(mut m: Model<B>) -> Result<Model<B>> {
    own_weights(&mut m)?;
    Ok(m)
}

fn tempdir_in(out: &Path) -> Result<PathBuf> {
    let p = out.join(format!(".adapter.tmp{}", std::process::id()));
    std::fs::create_dir_all(&p).map_err(|e| TrainError::io(&p, e))?;
    Ok(p)
}

fn check_same(ckpt: &Path, what: &str, old: String, new: String) -> Result<()> {
    if old != new {
        return Err(TrainError::invalid(
            ckpt.join("train_state.json"),
            format!("config.{what}"),
            format!("the checkpoint was made with {old}, this run asks for {new}; resume with the same setting"),
        ));
    }
    Ok(())
}

fn load_state(dir: &Path) -> Result<TrainState> {
    let p = dir.join("train_state.json");
    let text = std::fs::read_to_string(&p).map_err(|e| TrainError::io(&p, e))?;
    let st: TrainState =
        serde_json::from_str(&text).map_err(|e| TrainError::invalid(&p, "json", e.to_string()))?;
    if st.format != STATE_FORMAT {
        return Err(TrainError::invalid(
            &p,
            "format",
            format!("{:?}, expected {STATE_FORMAT:?}", st.format),
        ));
    }
    Ok(st)
}

/// Keeps the metrics lines of steps up to `step` (drops those of a run killed after it).
fn truncate_metrics(path: &Path, step: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                .is_some_and(|s| s <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())?;
    Ok(())
}

/// Runs supervised fine-tuning. `stop` is polled after every optimizer step: when set, a
/// checkpoint is saved and the run returns with `interrupted`.
pub fn run_sft<B: Backend>(
    be: &B,
    cfg: &SftConfig,
    resume: Resume,
    stop: &AtomicBool,
    on: &mut dyn FnMut(SftEvent),
) -> Result<SftOutcome> {
    if cfg.batch_tokens < 2 || cfg.grad_accum == 0 || cfg.epochs == 0 || cfg.max_len < 2 {
        return Err(TrainError::Input(
            "--batch-tokens and --max-len must be at least 2, --grad-accum and --epochs at least 1"
                .into(),
        ));
    }
    if !(cfg.optim.lr > 0.0 && cfg.optim.lr.is_finite()) {
        return Err(TrainError::Input(format!(
            "--lr {} is not a positive number",
            cfg.optim.lr
        )));
    }
    let tok_path = cfg.model.join("tokenizer.json");
    let tok = Tokenizer::from_file(&tok_path)?;
    let examples = read_chat_jsonl(&cfg.data)?;
    let (train_ex, eval_ex) = match &cfg.eval_data {
        Some(p) => (examples, read_chat_jsonl(p)?),
        None => split_held_out(&examples, cfg.eval_fraction, cfg.seed),
    };
    let max_len = cfg.max_len.min(cfg.batch_tokens);
    let (train, dropped) = encode_examples(&tok, &train_ex, max_len)?;
    let (held, _) = encode_examples(&tok, &eval_ex, max_len)?;
    if train.is_empty() {
        return Err(TrainError::invalid(
            &cfg.data,
            "messages",
            "no example has an assistant token within --max-len",
        ));
    }
    let lens: Vec<usize> = train.iter().map(|s| s.ids.len()).collect();
    let micro: Vec<(u64, Vec<usize>)> = (0..cfg.epochs)
        .flat_map(|e| {
            epoch_batches(&lens, cfg.batch_tokens, cfg.seed, e)
                .into_iter()
                .map(move |b| (e, b))
        })
        .collect();
    let total_steps = micro.len().div_ceil(cfg.grad_accum) as u64;
    let mut ocfg = cfg.optim.clone();
    ocfg.total_steps = total_steps;
    if ocfg.warmup_steps == 0 {
        ocfg.warmup_steps = (cfg.warmup_ratio * total_steps as f64).round() as u64;
    }

    // Where to start.
    let resume_is_fresh = resume == Resume::No;
    let ckpt = match resume {
        Resume::No => None,
        Resume::From(d) => {
            checkpoint::verify(&d)?;
            Some(d)
        }
        Resume::Latest { fallback } => {
            let (d, skipped) = checkpoint::latest_good(&cfg.out.join("checkpoints"), fallback)?;
            for e in skipped {
                on(SftEvent::Message(format!("skipping {e}")));
            }
            d
        }
    };
    if resume_is_fresh && !checkpoint::list(&cfg.out.join("checkpoints"))?.is_empty() {
        return Err(TrainError::invalid(
            cfg.out.join("checkpoints"),
            "checkpoints",
            "a previous run left checkpoints here; pass --resume to continue it or choose another --out",
        ));
    }
    let state = ckpt.as_deref().map(load_state).transpose()?;
    if let (Some(d), Some(st)) = (&ckpt, &state) {
        let c = &st.config;
        check_same(
            d,
            "batch_tokens",
            c.batch_tokens.to_string(),
            cfg.batch_tokens.to_string(),
        )?;
        check_same(
            d,
            "grad_accum",
            c.grad_accum.to_string(),
            cfg.grad_accum.to_string(),
        )?;
        check_same(d, "epochs", c.epochs.to_string(), cfg.epochs.to_string())?;
        check_same(d, "seed", c.seed.to_string(), cfg.seed.to_string())?;
        check_same(d, "max_len", c.max_len.to_string(), cfg.max_len.to_string())?;
        check_same(
            d,
            "lora_rank",
            c.lora_rank.to_string(),
            cfg.lora_rank.to_string(),
        )?;
        check_same(
            d,
            "total_steps",
            st.total_steps.to_string(),
            total_steps.to_string(),
        )?;
    }

    let lora_cfg = (cfg.lora_rank > 0)
        .then(|| -> Result<LoraConfig> {
            Ok(LoraConfig {
                rank: cfg.lora_rank,
                alpha: cfg.lora_alpha,
                targets: parse_targets(&cfg.lora_targets)?,
            })
        })
        .transpose()?;
    let (model, lora) = match (&ckpt, &lora_cfg) {
        (Some(d), None) => (owned_model(Model::load(be, d)?)?, None),
        (Some(d), Some(_)) => {
            let m = Model::load(be, &cfg.model)?;
            let l = Lora::load_peft(be, d, &m.config)?;
            (m, Some(l))
        }
        (None, None) => (owned_model(Model::load(be, &cfg.model)?)?, None),
        (None, Some(lc)) => {
            let m = Model::load(be, &cfg.model)?;
            let l = Lora::new(be, &m.config, lc.clone(), cfg.seed)?;
            (m, Some(l))
        }
    };
    tok.check_fits(model.config.vocab_size)?;
    let mut opt = {
        let params: Vec<(String, &crate::engine::Tensor<B>)> = match &lora {
            Some(l) => l.params(),
            None => model_params(&model),
        };
        AdamW::new(be, ocfg, &params)?
    };
    let mut start_step = 0u64;
    if let (Some(d), Some(st)) = (&ckpt, &state) {
        opt.load_state(be, &d.join("optimizer.safetensors"))?;
        opt.step = st.step;
        start_step = st.step;
    }

    std::fs::create_dir_all(&cfg.out).map_err(|e| TrainError::io(&cfg.out, e))?;
    let cfg_text = serde_json::to_string_pretty(cfg).unwrap_or_default();
    write_atomic(&cfg.out.join("sft_config.json"), cfg_text.as_bytes())?;
    let metrics_path = cfg.out.join("metrics.jsonl");
    if ckpt.is_some() {
        truncate_metrics(&metrics_path, start_step)?;
    } else if metrics_path.exists() {
        write_atomic(&metrics_path, b"")?;
    }
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .map_err(|e| TrainError::io(&metrics_path, e))?;
    let mut log = |v: serde_json::Value| -> Result<()> {
        writeln!(metrics, "{v}").map_err(|e| TrainError::io(&metrics_path, e))
    };

    on(SftEvent::Start {
        total_steps,
        start_step,
        train_examples: train.len(),
        eval_examples: held.len(),
        dropped,
    });
    let mut run = Run {
        be: be.clone(),
        cfg: cfg.clone(),
        model,
        lora,
        opt,
        total_steps,
    };
    let mut grads = Grads::new(&run.model, run.lora.as_ref())?;
    let state_mem = StepMemory {
        weights: memory::tensor_bytes(&model_params(&run.model)),
        adapters: run
            .lora
            .as_ref()
            .map_or(0, |l| memory::tensor_bytes(&l.params())),
        grads: memory::tensor_bytes(&grads.named()),
        moments: memory::tensor_bytes(
            &run.opt
                .names
                .iter()
                .cloned()
                .zip(run.opt.m.iter())
                .collect::<Vec<_>>(),
        ) * 2,
        ..StepMemory::default()
    };
    let fopts = ForwardOptions {
        recompute: cfg.recompute,
        chunk_rows: cfg.chunk_rows.max(1),
        temperature: 1.0,
    };
    let mut eval_loss_last = None;
    let mut last_ckpt = None;
    let mut interrupted = false;
    let mut step = start_step;
    let mut stopped_early = false;
    let eval_step = |s: u64| cfg.eval_every > 0 && s % cfg.eval_every == 0;
    let held_out = |run: &Run<B>| {
        eval_loss(
            &run.model,
            run.lora.as_ref(),
            &held,
            cfg.batch_tokens,
            fopts.chunk_rows,
        )
    };
    if let Some(limit) = cfg
        .stop_below_eval
        .filter(|_| start_step > 0 && !held.is_empty())
    {
        // A run resumed from the checkpoint its early stop saved ends here too, so that
        // resuming gives the uninterrupted run's model.
        if eval_step(start_step) {
            let (l, _) = held_out(&run)?;
            eval_loss_last = Some(l);
            stopped_early = l < limit;
        }
    }
    while step < total_steps && !stopped_early {
        let t0 = Instant::now();
        let lo = step as usize * cfg.grad_accum;
        let hi = (lo + cfg.grad_accum).min(micro.len());
        let batches: Vec<Batch> = micro[lo..hi]
            .iter()
            .map(|(_, idx)| {
                let seqs: Vec<Sequence> = idx.iter().map(|&i| train[i].clone()).collect();
                Batch::pack(&seqs)
            })
            .collect::<Result<_>>()?;
        let trained: usize = batches.iter().map(|b| b.trained_tokens()).sum();
        let tokens: usize = batches.iter().map(|b| b.len()).sum();
        grads.zero(be)?;
        let mut loss = 0.0;
        let mut saved = 0u64;
        for b in &batches {
            if b.trained_tokens() == 0 {
                continue;
            }
            let fwd = forward(&run.model, run.lora.as_ref(), b, fopts)?;
            saved = saved.max(fwd.saved_bytes() as u64);
            let lg = cross_entropy(be, &fwd, &b.weights, trained.max(1) as f64)?;
            loss += lg.loss;
            backward(
                &run.model,
                run.lora.as_ref(),
                fwd,
                &lg.g_logp,
                &lg.g_entropy,
                &mut grads,
            )?;
        }
        let params = match run.lora.as_mut() {
            Some(l) => l.params_mut(),
            None => model_params_mut(&mut run.model),
        };
        let stats = run.opt.step(be, params, &mut grads)?;
        step += 1;
        let dt = t0.elapsed().as_secs_f64();
        let m = StepMetrics {
            step,
            epoch: micro[lo].0,
            loss,
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            tokens,
            trained_tokens: trained,
            tokens_per_s: tokens as f64 / dt.max(1e-9),
            peak_rss_mib: memory::peak_rss_mib(),
        };
        let mem = StepMemory {
            activations: saved,
            logits_chunk: (fopts.chunk_rows.min(tokens) * run.model.config.vocab_size * 8) as u64,
            ..state_mem
        };
        log(json!({
            "step": m.step, "epoch": m.epoch, "loss": m.loss, "lr": m.lr,
            "grad_norm": m.grad_norm, "clipped": stats.clipped, "tokens": m.tokens,
            "trained_tokens": m.trained_tokens, "tokens_per_s": m.tokens_per_s,
            "peak_rss_mib": m.peak_rss_mib, "mem_mib": mem.to_json_mib(),
        }))?;
        on(SftEvent::Step(m));
        let mut last = step == total_steps;
        if !held.is_empty() && (last || eval_step(step)) {
            let (l, n) = held_out(&run)?;
            log(json!({ "step": step, "eval_loss": l, "eval_tokens": n }))?;
            on(SftEvent::Eval { step, loss: l });
            eval_loss_last = Some(l);
            if cfg.stop_below_eval.is_some_and(|limit| l < limit) {
                log(json!({ "step": step, "stopped_below_eval": l }))?;
                last = true;
            }
        }
        let stop_now = stop.load(Ordering::SeqCst);
        let budget = cfg.max_steps > 0 && step >= cfg.max_steps;
        if last || stop_now || budget || (cfg.save_every > 0 && step % cfg.save_every == 0) {
            let t_save = Instant::now();
            let (dir, bytes) = run.save_checkpoint(step, hi as u64)?;
            log(json!({
                "step": step, "checkpoint_bytes": bytes,
                "checkpoint_s": t_save.elapsed().as_secs_f64(),
                "peak_rss_mib": memory::peak_rss_mib(),
            }))?;
            on(SftEvent::Saved {
                step,
                dir: dir.clone(),
            });
            last_ckpt = Some(dir);
        }
        if last {
            break;
        }
        if stop_now || budget {
            interrupted = stop_now;
            return Ok(SftOutcome {
                steps_done: step,
                total_steps,
                interrupted,
                eval_loss: eval_loss_last,
                final_dir: None,
                last_checkpoint: last_ckpt,
            });
        }
    }
    let final_dir = Some(run.export()?);
    Ok(SftOutcome {
        steps_done: step,
        total_steps,
        interrupted,
        eval_loss: eval_loss_last,
        final_dir,
        last_checkpoint: last_ckpt,
    })
}
