//! `sorft data graph` (G* of every instance, for inspection) and `sorft data compare` (two
//! `repro` runs, paired).

use anyhow::{bail, Context, Result};
use sorft::pipeline::scores;
use sorft::rft::p2t;
use sorft::rft::teacher::TeacherItem;
use sorft::swe::instance;
use sorft::swe::repo::RepoStore;
use sorft::swe::subtask::RecordOptions;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Prints G* of every instance of `instances`; with `out`, also writes them as JSONL.
pub fn graph_cmd(instances: &Path, repos: &Path, out: Option<&Path>) -> Result<()> {
    let list = instance::read_jsonl(instances)?;
    if !repos.is_dir() {
        bail!("--repos {}: not a folder", repos.display());
    }
    let store = RepoStore::new(repos);
    let mut lines = String::new();
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    for inst in &list {
        let recs = super::records_for(inst, &store, &RecordOptions::default())?;
        if recs.is_empty() {
            writeln!(w, "G* of {}: no ground truth, skipped", inst.instance_id)?;
            continue;
        }
        let items: Vec<TeacherItem> = recs
            .iter()
            .map(|r| TeacherItem {
                record: r,
                problem: &inst.problem_statement,
            })
            .collect();
        let failing = BTreeMap::from([(inst.instance_id.clone(), inst.fail_to_pass.clone())]);
        for g in p2t::graphs(&items, &failing) {
            write!(w, "{}", g.describe())?;
            lines.push_str(&serde_json::to_string(&g)?);
            lines.push('\n');
        }
    }
    if let Some(o) = out {
        std::fs::write(o, lines).with_context(|| format!("writing {}", o.display()))?;
        writeln!(w, "wrote {}", o.display())?;
    }
    Ok(())
}

/// Prints (and with `out` writes) the paired comparison of each run against the first, per
/// checkpoint: from the runs' saved scores (`scores_<stage>.json`) when every run has them,
/// else, for two runs made before those files, from their predictions (pipeline rewards,
/// %Resolved and answer length only).
pub fn compare_cmd(
    runs: &[std::path::PathBuf],
    stage: Option<&str>,
    seed: u64,
    out: Option<&Path>,
) -> Result<()> {
    let stages: Vec<&str> = match stage {
        Some(s) => vec![s],
        None => vec!["initial", "sft", "sft+rl"],
    };
    let mut md = String::new();
    for (k, r) in runs.iter().enumerate() {
        md.push_str(&format!("run {k}: {}\n", r.display()));
    }
    for st in stages {
        md.push_str(&format!("\n## {st}\n\n"));
        // Runs made before score files fall back to predictions; a present but broken score
        // file is an error, never a silent fallback.
        let saved: Option<Vec<(String, scores::SavedScores)>> =
            if runs.iter().all(|r| scores::scores_path(r, st).exists()) {
                let mut v = Vec::new();
                for r in runs {
                    v.push((run_name(r), scores::load(r, st)?));
                }
                Some(v)
            } else {
                None
            };
        match (saved, runs) {
            (Some(saved), _) => md.push_str(&scores::compare_runs(&saved, seed)?),
            (None, [a, b]) => {
                md.push_str(p2t::compare::HEADER);
                md.push('\n');
                md.push_str(&p2t::compare::compare(a, b, st, seed)?);
                md.push('\n');
            }
            (None, _) => bail!(
                "{st}: a run has no saved scores (scores_<stage>.json); compare more than two runs only once each was evaluated with this version"
            ),
        }
    }
    if let Some(o) = out {
        std::fs::write(o, &md).with_context(|| format!("writing {}", o.display()))?;
    }
    crate::cli::print_out(&md)
}

/// A run's name in the tables: its folder's name.
fn run_name(r: &Path) -> String {
    r.file_name().map_or_else(
        || r.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
