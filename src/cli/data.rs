//! `sorft data`: generate synthetic instances, build subtask records, summarise files.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use sorft::swe::instance::{self, Instance};
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::{self, Subtask, SubtaskRecord};
use sorft::swe::synth::{self, SynthConfig};
use sorft::swe::truth;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod p2t;

/// Arguments of `sorft data`.
#[derive(Args, Debug)]
pub struct DataArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// The `data` subcommands.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Generate SWE-style instances offline: OUT/instances.jsonl and git mirrors in OUT/repos.
    Synth {
        /// Number of instances.
        #[arg(long, default_value_t = 100)]
        n: usize,
        /// Seed of every random choice (same seed, same bytes).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// Instances per generated repository.
        #[arg(long, default_value_t = 3)]
        per_repo: usize,
        /// Seconds allowed for one test-suite run.
        #[arg(long, default_value_t = 20)]
        test_timeout: u64,
        /// Skip re-checking every instance from its mirror and patches after generation.
        #[arg(long)]
        skip_validate: bool,
    },
    /// Write one JSONL record per (instance, subtask): prompt, what it showed, ground truth.
    Subtasks {
        /// Instance JSONL file.
        #[arg(long)]
        instances: PathBuf,
        /// Folder of git mirrors (`owner__name`).
        #[arg(long)]
        repos: PathBuf,
        /// Output JSONL file.
        #[arg(long)]
        out: PathBuf,
        /// Non-target files (BM25 matches of the issue) added to function-localization prompts.
        #[arg(long, default_value_t = 0)]
        distractors: usize,
    },
    /// Print G*, the P2T process graph of every instance (typed nodes, prerequisites, pruned nodes).
    Graph {
        /// Instance JSONL file.
        #[arg(long)]
        instances: PathBuf,
        /// Folder of git mirrors (`owner__name`).
        #[arg(long)]
        repos: PathBuf,
        /// Also write the graphs as JSONL here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Compare finished `sorft repro` runs on their test instances, paired (each against the
    /// first): subtask rewards, hit rates, %Resolved and answer length per checkpoint.
    Compare {
        /// Output folders of the runs, the baseline first (same seed and data settings).
        #[arg(required = true, num_args = 2..)]
        runs: Vec<PathBuf>,
        /// Only this checkpoint (`initial`, `sft` or `sft+rl`; default: all three).
        #[arg(long)]
        stage: Option<String>,
        /// Seed of the bootstrap.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write the markdown here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Summarise an instance file or a subtask file.
    Stats {
        /// The JSONL file.
        file: PathBuf,
    },
}

fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}

/// Runs one `data` subcommand.
pub fn run(args: DataArgs) -> Result<()> {
    match args.command {
        DataCommand::Synth {
            n,
            seed,
            out,
            per_repo,
            test_timeout,
            skip_validate,
        } => synth_cmd(n, seed, &out, per_repo, test_timeout, skip_validate),
        DataCommand::Subtasks {
            instances,
            repos,
            out,
            distractors,
        } => subtasks_cmd(&instances, &repos, &out, distractors),
        DataCommand::Graph {
            instances,
            repos,
            out,
        } => p2t::graph_cmd(&instances, &repos, out.as_deref()),
        DataCommand::Compare {
            runs,
            stage,
            seed,
            out,
        } => p2t::compare_cmd(&runs, stage.as_deref(), seed, out.as_deref()),
        DataCommand::Stats { file } => stats_cmd(&file),
    }
}

fn synth_cmd(
    n: usize,
    seed: u64,
    out: &Path,
    per_repo: usize,
    timeout: u64,
    skip_validate: bool,
) -> Result<()> {
    if n == 0 {
        bail!("--n must be at least 1");
    }
    let cfg = SynthConfig {
        n,
        seed,
        per_repo,
        test_timeout: Duration::from_secs(timeout.max(1)),
        ..Default::default()
    };
    let pb = bar(n, "generate");
    let report = synth::generate(&cfg, out, &|done| pb.set_position(done.min(n) as u64))
        .with_context(|| format!("generating instances into {}", out.display()))?;
    pb.finish_and_clear();
    if !skip_validate {
        let store = RepoStore::new(out.join("repos"));
        let pb = bar(report.instances.len(), "validate");
        let failures: Vec<String> = report
            .instances
            .par_iter()
            .filter_map(|inst| {
                let r = synth::validate_instance(inst, &store, cfg.test_timeout);
                pb.inc(1);
                r.err().map(|e| format!("{}: {e}", inst.instance_id))
            })
            .collect();
        pb.finish_and_clear();
        if let Some(first) = failures.first() {
            bail!(
                "{} of {} instances failed validation; first: {first}",
                failures.len(),
                report.instances.len()
            );
        }
    }
    let ops: Vec<String> = report
        .operators
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "wrote {} instances to {} (repos in {}); operators: {}; rejected candidates: {}{}",
        report.instances.len(),
        out.join("instances.jsonl").display(),
        out.join("repos").display(),
        ops.join(" "),
        report.rejected,
        if skip_validate {
            ""
        } else {
            "; all validated with python3"
        }
    );
    Ok(())
}

fn records_for(
    inst: &Instance,
    store: &RepoStore,
    opts: &subtask::RecordOptions,
) -> Result<Vec<SubtaskRecord>> {
    let snap = store
        .snapshot(&inst.repo, &inst.base_commit)
        .with_context(|| format!("instance {}", inst.instance_id))?;
    let gt = truth::ground_truth(&inst.patch, &snap)
        .with_context(|| format!("instance {}", inst.instance_id))?;
    Ok(subtask::training_records_with(inst, &snap, &gt, opts))
}

fn subtasks_cmd(instances: &Path, repos: &Path, out: &Path, distractors: usize) -> Result<()> {
    let opts = subtask::RecordOptions {
        distractor_files: distractors,
    };
    let list = instance::read_jsonl(instances)?;
    if !repos.is_dir() {
        bail!("--repos {}: not a folder", repos.display());
    }
    let store = RepoStore::new(repos);
    let pb = bar(list.len(), "subtasks");
    let results: Vec<Result<Vec<SubtaskRecord>>> = list
        .par_iter()
        .map(|inst| {
            let r = records_for(inst, &store, &opts);
            pb.inc(1);
            r
        })
        .collect();
    pb.finish_and_clear();
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut skipped = Vec::new();
    for r in results {
        match r {
            Ok(recs) => {
                for rec in recs {
                    *counts.entry(rec.subtask.name()).or_default() += 1;
                    let line = serde_json::to_string(&rec).context("serialising a record")?;
                    writeln!(w, "{line}").with_context(|| format!("writing {}", out.display()))?;
                }
            }
            Err(e) => {
                let msg = e
                    .chain()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(": ");
                tracing::warn!("skipped {msg}");
                skipped.push(msg);
            }
        }
    }
    w.flush()
        .with_context(|| format!("writing {}", out.display()))?;
    if counts.is_empty() && !list.is_empty() {
        bail!(
            "no instance gave records; first problem: {}",
            skipped.first().map(String::as_str).unwrap_or("none")
        );
    }
    let c: Vec<String> = Subtask::ALL
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s.name(),
                counts.get(s.name()).copied().unwrap_or(0)
            )
        })
        .collect();
    println!(
        "wrote {} records to {} ({}); {} of {} instances skipped{}",
        counts.values().sum::<usize>(),
        out.display(),
        c.join(" "),
        skipped.len(),
        list.len(),
        skipped
            .first()
            .map(|s| format!(" (first: {s})"))
            .unwrap_or_default()
    );
    Ok(())
}

fn mean(v: &[usize]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<usize>() as f64 / v.len() as f64
    }
}

fn stats_cmd(file: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let is_subtask = serde_json::from_str::<serde_json::Value>(first)
        .map(|v| v.get("subtask").is_some())
        .unwrap_or(false);
    if is_subtask {
        let mut by: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        let mut ids = std::collections::BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let r: SubtaskRecord = serde_json::from_str(line)
                .with_context(|| format!("{}:{}", file.display(), i + 1))?;
            let truth = match r.subtask {
                Subtask::File => r.truth.files.len(),
                Subtask::Function => r.truth.functions.len(),
                Subtask::Line | Subtask::Edit => r.truth.lines.len(),
            };
            ids.insert(r.instance_id.clone());
            by.entry(r.subtask.name().to_string())
                .or_default()
                .push((r.prompt.len(), truth));
        }
        println!(
            "{}: subtask records of {} instances",
            file.display(),
            ids.len()
        );
        for (k, v) in &by {
            let p: Vec<usize> = v.iter().map(|x| x.0).collect();
            let t: Vec<usize> = v.iter().map(|x| x.1).collect();
            println!(
                "  {k:<9} records={:<6} mean prompt chars={:<9.0} max={:<8} mean truth items={:.2}",
                v.len(),
                mean(&p),
                p.iter().max().copied().unwrap_or(0),
                mean(&t)
            );
        }
        return Ok(());
    }
    let list = instance::parse_jsonl(&text, file)?;
    let mut repos = std::collections::BTreeSet::new();
    let (mut f2p, mut p2p, mut files, mut added, mut removed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad_patches = 0;
    for inst in &list {
        repos.insert(inst.repo.clone());
        f2p.push(inst.fail_to_pass.len());
        p2p.push(inst.pass_to_pass.len());
        match sorft::swe::diff::Patch::parse(&inst.patch) {
            Ok(p) => {
                files.push(p.files.len());
                let (a, r) = p.files.iter().fold((0, 0), |acc, f| {
                    let (x, y) = f.line_counts();
                    (acc.0 + x, acc.1 + y)
                });
                added.push(a);
                removed.push(r);
            }
            Err(_) => bad_patches += 1,
        }
        if let Some(op) = inst
            .extra
            .get("synth")
            .and_then(|s| s.get("operator"))
            .and_then(|o| o.as_str())
        {
            *ops.entry(op.to_string()).or_default() += 1;
        }
    }
    println!(
        "{}: {} instances from {} repositories",
        file.display(),
        list.len(),
        repos.len()
    );
    println!(
        "  FAIL_TO_PASS mean {:.2}, PASS_TO_PASS mean {:.2}",
        mean(&f2p),
        mean(&p2p)
    );
    println!(
        "  gold patch: files mean {:.2}, lines +{:.2} -{:.2}; unparsable patches: {bad_patches}",
        mean(&files),
        mean(&added),
        mean(&removed)
    );
    if !ops.is_empty() {
        let o: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  mutation operators: {}", o.join(" "));
    }
    Ok(())
}
