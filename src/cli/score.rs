//! `sorft score`: per-token log-probabilities of a text under a model.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use sorft::engine::{Backend, Cpu};
use sorft::model::load_dir;

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
    /// Also list the K most likely next tokens at each position.
    #[arg(long, default_value_t = 0)]
    pub top: usize,
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
    let backend = Cpu;
    let (model, tok) = load_dir(&backend, &a.model)?;
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
    let (lps, lsm) = model.score(&ids)?;
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
        let host = backend.to_host_f32(&lsm)?;
        let v = model.config.vocab_size;
        let mut top = vec![serde_json::Value::Null];
        for row in host.chunks(v) {
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
            top.push(serde_json::Value::Array(entries));
        }
        out["top"] = serde_json::Value::Array(top);
    }
    println!("{out}");
    Ok(())
}
