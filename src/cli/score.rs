//! `sorft score`: per-token log-probabilities of a text under a model.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::model::kv_cache::KvCache;
use sorft::model::transformer::Step;
use sorft::model::{load_dir, Model};

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// Model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// A text file to tokenize and score.
    #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
    pub text: Option<PathBuf>,
    /// Token ids, comma-separated.
    #[arg(long)]
    pub ids: Option<String>,
    /// Also list the K most likely tokens at each position, and after the last one (`next`:
    /// with one token, the next-token distribution).
    #[arg(long, default_value_t = 0)]
    pub top: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Parses `1,2,3`.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|x| x.trim())
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<u32>()
                .with_context(|| format!("--ids: {x:?} is not a token id"))
        })
        .collect()
}

/// Runs `sorft score`.
pub fn run(a: ScoreArgs) -> Result<()> {
    run_on(a.device, a)
}

impl Job for ScoreArgs {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        score_on(be, dev, self)
    }
}

fn score_on<B: Backend>(backend: &B, dev: &DeviceInfo, a: ScoreArgs) -> Result<()> {
    tracing::info!("score on {}", dev.summary());
    let (model, tok) = load_dir(backend, &a.model)?;
    let ids = match (&a.ids, &a.text) {
        (Some(s), _) => parse_ids(s)?,
        (None, Some(path)) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            let tok = tok.as_ref().with_context(|| {
                format!(
                    "{}: tokenizer.json is needed to score text",
                    a.model.display()
                )
            })?;
            tok.encode(&text)?
        }
        (None, None) => bail!("give --text or --ids"),
    };
    let (lps, rows) = score_rows(&model, &ids)?;
    let v = model.config.vocab_size;
    let mut logprobs: Vec<serde_json::Value> = vec![serde_json::Value::Null];
    logprobs.extend(lps.iter().map(|&x| serde_json::json!(x)));
    let mut out = serde_json::json!({ "tokens": ids, "logprobs": logprobs });
    if let Some(t) = &tok {
        let strings: Vec<String> = ids
            .iter()
            .map(|&i| t.id_to_token(i).unwrap_or_default())
            .collect();
        out["strings"] = serde_json::json!(strings);
    }
    if a.top > 0 {
        let top_of = |row: &[f32]| -> serde_json::Value {
            let mut idx: Vec<usize> = (0..v).collect();
            idx.sort_by(|&x, &y| row[y].total_cmp(&row[x]).then(x.cmp(&y)));
            let entries: Vec<serde_json::Value> = idx
                .iter()
                .take(a.top)
                .map(|&i| {
                    let mut e = serde_json::json!({ "id": i, "logprob": row[i] });
                    if let Some(t) = &tok {
                        e["token"] = serde_json::json!(t.id_to_token(i as u32).unwrap_or_default());
                    }
                    e
                })
                .collect();
            serde_json::Value::Array(entries)
        };
        // Row i predicts token i + 1; the last row is the distribution after the whole input.
        let mut top = vec![serde_json::Value::Null];
        let n = ids.len();
        for row in rows.chunks(v).take(n - 1) {
            top.push(top_of(row));
        }
        out["top"] = serde_json::Value::Array(top);
        out["next"] = top_of(&rows[(n - 1) * v..]);
    }
    super::print_out(&format!("{out}\n"))?;
    Ok(())
}

/// Log-probabilities of tokens 1.. of `ids` and the log-softmax rows after every token (the
/// last row is the next-token distribution), from one prefill.
fn score_rows<B: Backend>(model: &Model<B>, ids: &[u32]) -> Result<(Vec<f32>, Vec<f32>)> {
    let n = ids.len();
    if n == 0 {
        bail!("nothing to score: give at least one token");
    }
    if n > model.config.max_position_embeddings {
        bail!(
            "{n} tokens exceed max_position_embeddings {}",
            model.config.max_position_embeddings
        );
    }
    let be = &model.backend;
    let mut cache = KvCache::new(be, &model.config, 1, n)?;
    let slots = vec![0u32; n];
    let positions: Vec<u32> = (0..n as u32).collect();
    let logits = model.forward(
        &mut cache,
        &Step {
            ids,
            slots: &slots,
            positions: &positions,
            logit_rows: &positions,
        },
    )?;
    let rows = be.to_host_f32(&be.log_softmax(&logits)?)?;
    let v = model.config.vocab_size;
    let lps = (1..n)
        .map(|i| rows[(i - 1) * v + ids[i] as usize])
        .collect();
    Ok((lps, rows))
}
