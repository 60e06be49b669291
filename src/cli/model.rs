//! `sorft model init|info|render`: create the embedded default model, describe a model directory,
//! render a conversation in its chat template.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use sorft::model::config::ModelConfig;
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::weights::WeightFiles;
use sorft::model::Tokenizer;

/// Arguments of `sorft model`.
#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub command: ModelCommand,
}

/// Subcommands of `sorft model`.
#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Create a randomly initialised Qwen2-architecture model and its BPE tokenizer.
    Init {
        /// Size preset.
        #[arg(long, value_enum, default_value_t = Preset::Small)]
        preset: Preset,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Random seed of the weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Train the tokenizer on these text files instead of the embedded corpus.
        #[arg(long)]
        corpus: Vec<PathBuf>,
    },
    /// Describe a model directory.
    Info {
        /// Model directory.
        dir: PathBuf,
    },
    /// Print the exact prompt text (or ids) of a conversation in the model's chat template.
    Render(crate::cli::render::RenderArgs),
}

/// Runs `sorft model`.
pub fn run(a: ModelArgs) -> Result<()> {
    match a.command {
        ModelCommand::Init {
            preset,
            out,
            seed,
            corpus,
        } => {
            let texts: Vec<String> = if corpus.is_empty() {
                vec![EMBEDDED_CORPUS.to_string()]
            } else {
                corpus
                    .iter()
                    .map(|p| std::fs::read_to_string(p).with_context(|| format!("{}", p.display())))
                    .collect::<Result<_>>()?
            };
            let s = init_model(preset, &out, seed, &texts)?;
            super::print_out(&format!(
                "created {} ({:?} preset): {} parameters, {} layers, hidden {}, vocab {} (tokenizer {})\n",
                out.display(),
                preset,
                s.params,
                s.config.num_layers,
                s.config.hidden_size,
                s.config.vocab_size,
                s.tokenizer_vocab
            ))?;
            Ok(())
        }
        ModelCommand::Info { dir } => info(&dir),
        ModelCommand::Render(r) => crate::cli::render::run(r),
    }
}

/// Appends one formatted line to a `String`.
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {{
        $out.push_str(&format!($($arg)*));
        $out.push('\n');
    }};
}

fn info(dir: &std::path::Path) -> Result<()> {
    let mut out = String::new();
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let files = WeightFiles::open(dir)?;
    let mut dtypes: Vec<String> = files
        .dtype_summary()
        .into_iter()
        .map(|(d, n)| format!("{d}: {n}"))
        .collect();
    dtypes.sort();
    let stored: usize = files
        .tensors
        .values()
        .map(|e| e.shape.iter().product::<usize>())
        .sum();
    outln!(out, "model:        {}", dir.display());
    outln!(out, "architecture: {:?}", cfg.family);
    outln!(
        out,
        "shape:        {} layers, hidden {}, heads {} (kv {}), head_dim {}, mlp {}",
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size
    );
    outln!(
        out,
        "vocab:        {} ({} embeddings), max positions {}, rope theta {}",
        cfg.vocab_size,
        if cfg.tie_word_embeddings {
            "tied"
        } else {
            "untied"
        },
        cfg.max_position_embeddings,
        cfg.rope_theta
    );
    outln!(out, "parameters:   {} (stored: {stored})", cfg.num_params());
    outln!(out, "dtypes:       {}", dtypes.join(", "));
    outln!(out, "shards:       {}", files.shards.len());
    for s in &files.shards {
        outln!(out, "  {} ({} bytes)", s.path.display(), s.map.len());
    }
    let tp = dir.join("tokenizer.json");
    if tp.exists() {
        let t = Tokenizer::from_file(&tp)?;
        t.check_fits(cfg.vocab_size)?;
        outln!(
            out,
            "tokenizer:    {} tokens, stop ids {:?}",
            t.vocab_size(),
            t.stop_ids()
        );
        match t.chat_template() {
            Ok(c) => println!("chat template: {}", c.origin().display()),
            Err(_) => println!("chat template: none"),
        }
    } else {
        outln!(out, "tokenizer:    none");
    }
    // Written at once; a closed pipe (`| head`) is an error main treats as a quiet exit.
    super::print_out(&out)?;
    Ok(())
}
