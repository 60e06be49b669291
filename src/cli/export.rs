//! `sorft export`: subtask prompts with ground truth in veRL's or OpenRLHF's dataset layout.

use anyhow::{Context, Result};
use clap::Args;
use sorft::pipeline::export::{self, ExportOptions, Format};
use sorft::swe::subtask::Subtask;
use std::path::PathBuf;

/// Arguments of `sorft export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Dataset layout: `verl` (OUT/SPLIT.parquet) or `openrlhf` (OUT/SPLIT.jsonl).
    #[arg(long, value_parser = ["verl", "openrlhf"])]
    pub format: String,
    /// Instance JSONL file.
    #[arg(long)]
    pub instances: PathBuf,
    /// Folder of git mirrors (`owner__name`).
    #[arg(long)]
    pub repos: PathBuf,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
    /// Subtasks to export, comma-separated.
    #[arg(long, default_value = "file,function,line,edit", value_delimiter = ',',
          value_parser = ["file", "function", "line", "edit"])]
    pub subtasks: Vec<String>,
    /// Split name: the file name and `extra_info.split`.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// veRL `data_source` of every row.
    #[arg(long, default_value = "sorft")]
    pub data_source: String,
    /// OpenRLHF prompt key (pass the same to its `--input_key`).
    #[arg(long, default_value = "input")]
    pub input_key: String,
    /// OpenRLHF label key (pass the same to its `--label_key`).
    #[arg(long, default_value = "label")]
    pub label_key: String,
    /// Non-target files (BM25 matches of the issue) added to function-localization prompts.
    #[arg(long, default_value_t = 0)]
    pub distractors: usize,
}

fn subtask(name: &str) -> Option<Subtask> {
    Subtask::ALL.into_iter().find(|s| s.name() == name)
}

/// Runs `sorft export`.
pub fn run(a: ExportArgs) -> Result<()> {
    let opts = ExportOptions {
        format: Format::parse(&a.format)?,
        subtasks: Subtask::ALL
            .into_iter()
            .filter(|s| a.subtasks.iter().any(|n| subtask(n) == Some(*s)))
            .collect(),
        distractors: a.distractors,
        split: a.split,
        data_source: a.data_source,
        input_key: a.input_key,
        label_key: a.label_key,
    };
    let s = export::export(&a.instances, &a.repos, &a.out, &opts)
        .with_context(|| format!("exporting {}", a.instances.display()))?;
    let counts: Vec<String> = s.rows.iter().map(|(k, v)| format!("{k}={v}")).collect();
    super::print_out(&format!(
        "wrote {} rows to {} ({}); {} of {} instances skipped{}\n",
        s.rows.values().sum::<usize>(),
        s.path.display(),
        counts.join(" "),
        s.skipped.len(),
        s.instances,
        s.skipped
            .first()
            .map(|x| format!(" (first: {x})"))
            .unwrap_or_default()
    ))
}
