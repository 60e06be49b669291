//! `sorft generate`: text from a model, with per-sequence sampling.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use sorft::engine::device::DeviceInfo;
use sorft::engine::{Backend, SamplingParams};
use sorft::model::chat::{self, Message};
use sorft::model::generate::{generate, GenOptions, GenRequest};
use sorft::model::{load_dir, Tokenizer};

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// One prompt.
    #[arg(long, conflicts_with = "prompts", required_unless_present = "prompts")]
    pub prompt: Option<String>,
    /// JSONL prompts: {"prompt": "..."} or {"messages": [...]}, with optional per-line
    /// temperature, top_k, top_p, seed, max_new_tokens. Output is JSONL.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Wrap prompts in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// Most new tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed; sequence i uses seed + i unless its line sets one.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Print JSONL with ids and log-probs also for a single prompt.
    #[arg(long)]
    pub jsonl: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
}

#[derive(Deserialize)]
struct PromptLine {
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    seed: Option<u64>,
    max_new_tokens: Option<usize>,
}

fn encode_prompt(
    tok: &Tokenizer,
    text: Option<&str>,
    messages: Option<&[Message]>,
    as_chat: bool,
) -> Result<Vec<u32>> {
    Ok(match (messages, text) {
        (Some(m), _) => chat::encode(tok, m, true)?.0,
        (None, Some(t)) if as_chat => chat::encode(tok, &[Message::new("user", t)], true)?.0,
        (None, Some(t)) => tok.encode(t)?,
        (None, None) => bail!("a prompt line needs \"prompt\" or \"messages\""),
    })
}

/// Runs `sorft generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    run_on(a.device, a)
}

impl Job for GenerateArgs {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        generate_on(be, dev, self)
    }
}

fn generate_on<B: Backend>(backend: &B, dev: &DeviceInfo, a: GenerateArgs) -> Result<()> {
    tracing::info!("generate on {}", dev.summary());
    let (model, tok) = load_dir(backend, &a.model)?;
    let tok = tok.with_context(|| {
        format!(
            "{}: tokenizer.json is needed to generate text",
            a.model.display()
        )
    })?;
    let base = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    base.validate().map_err(anyhow::Error::msg)?;
    let mut stop_ids = tok.stop_ids();
    stop_ids.extend(model.config.eos_token_ids.iter().copied());
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let mut reqs = Vec::new();
    let jsonl = a.jsonl || a.prompts.is_some();
    if let Some(p) = &a.prompt {
        reqs.push(GenRequest {
            prompt: encode_prompt(&tok, Some(p), None, a.chat)?,
            params: base,
            max_new_tokens: a.max_new_tokens,
            stop_ids: stop_ids.clone(),
            stop_strings: a.stop.clone(),
            constraint: None,
            min_allowed_mass: 0.0,
        });
    } else if let Some(path) = &a.prompts {
        let f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
        for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line.with_context(|| format!("{}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let l: PromptLine = serde_json::from_str(&line)
                .with_context(|| format!("{}: line {}", path.display(), n + 1))?;
            let params = SamplingParams {
                temperature: l.temperature.unwrap_or(base.temperature),
                top_k: l.top_k.unwrap_or(base.top_k),
                top_p: l.top_p.unwrap_or(base.top_p),
                seed: l.seed.unwrap_or(base.seed.wrapping_add(reqs.len() as u64)),
            };
            params
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: line {}: {e}", path.display(), n + 1))?;
            let prompt = encode_prompt(&tok, l.prompt.as_deref(), l.messages.as_deref(), a.chat)
                .with_context(|| format!("{}: line {}", path.display(), n + 1))?;
            reqs.push(GenRequest {
                prompt,
                params,
                max_new_tokens: l.max_new_tokens.unwrap_or(a.max_new_tokens),
                stop_ids: stop_ids.clone(),
                stop_strings: a.stop.clone(),
                constraint: None,
                min_allowed_mass: 0.0,
            });
        }
    }
    let opts = GenOptions {
        max_batch: a.batch,
        progress: reqs.len() > 1,
    };
    let outs = generate(&model, Some(&tok), &reqs, &opts)?;
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for (i, o) in outs.iter().enumerate() {
        if jsonl {
            let v = serde_json::json!({
                "index": i,
                "text": o.text,
                "ids": o.ids,
                "logprobs": o.logprobs,
                "finish_reason": o.finish,
            });
            writeln!(w, "{v}")?;
        } else {
            writeln!(w, "{}", o.text)?;
        }
    }
    Ok(())
}
