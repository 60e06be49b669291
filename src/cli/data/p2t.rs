//! `sorft data graph` (G* of every instance, for inspection) and `sorft data compare` (two
//! `repro` runs, paired).

use anyhow::{bail, Context, Result};
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

/// Prints a paired comparison of run `b` against run `a` at each checkpoint.
pub fn compare_cmd(a: &Path, b: &Path, seed: u64) -> Result<()> {
    println!(
        "a = {}\nb = {}\n\n{}",
        a.display(),
        b.display(),
        p2t::compare::HEADER
    );
    for stage in ["initial", "sft", "sft+rl"] {
        println!("{}", p2t::compare::compare(a, b, stage, seed)?);
    }
    Ok(())
}
