//! `sorft compare`: one stage of several finished runs side by side, paired instance by instance
//! on their common test split (curation modes, ablations, algorithms).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use sorft::pipeline::scores::{compare_runs, load};

/// Arguments of `sorft compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Finished `sorft repro` folders, the baseline first (same seed and data settings).
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// Which checkpoint of each run: `initial`, `sft` or `sft+rl`.
    #[arg(long, default_value = "sft")]
    pub stage: String,
    /// Seed of the bootstrap resampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the markdown here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `sorft compare`.
pub fn run(a: CompareArgs) -> Result<()> {
    let mut runs = Vec::new();
    for r in &a.runs {
        let name = r.file_name().map_or_else(
            || r.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        runs.push((name, load(r, &a.stage)?));
    }
    let md = compare_runs(&runs, a.seed)?;
    if let Some(p) = &a.out {
        std::fs::write(p, &md).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    super::print_out(&md)
}
