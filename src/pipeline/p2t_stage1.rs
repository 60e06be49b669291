//! Stage 1 of `sorft repro` with `stage1.curation = "outcome" | "p2t"`: runs the curation of
//! `rft::p2t`, writes G* of every training instance to `OUT/g_star.jsonl` and the curation totals
//! to `OUT/stage1_curation.json`, and returns the kept examples and a report section. With
//! `stage1.edit_acceptance = "execution"` a chain whose edit does not resolve its instance in the
//! sandbox is dropped (`rft::accept::execution_passes`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;

use crate::pipeline::config::ReproConfig;
use crate::rft::accept::{execution_passes, EditAcceptance};
use crate::rft::p2t::{curate_stage1, Curation, ExecutionCheck, Stage1Run};
use crate::rft::teacher::{Acceptance, TeacherItem};
use crate::swe::instance::Instance;
use crate::swe::subtask::SubtaskRecord;

/// Kept examples with their item index, per-subtask counts, and the report section.
pub type Stage1Data = (
    Vec<(usize, Vec<crate::model::chat::Message>)>,
    BTreeMap<String, Acceptance>,
    String,
);

/// Curates stage-1 data of `items` (records of the `train` instances, whose mirrors are in
/// `repos`) by `mode`.
pub fn curate(
    out: &Path,
    items: &[TeacherItem<'_>],
    train: &[Instance],
    repos: &Path,
    mode: Curation,
    cfg: &ReproConfig,
) -> anyhow::Result<Stage1Data> {
    let failing: BTreeMap<String, Vec<String>> = train
        .iter()
        .map(|i| (i.instance_id.clone(), i.fail_to_pass.clone()))
        .collect();
    let sb = match cfg.stage1.edit_acceptance {
        EditAcceptance::Execution => Some(
            crate::rft::eval::sandbox_config(cfg.data.test_timeout)
                .context("stage1.edit_acceptance = \"execution\" needs the sandbox")?,
        ),
        EditAcceptance::Overlap => None,
    };
    let run_check = |recs: &[&SubtaskRecord], answers: &[Vec<String>]| match &sb {
        Some(sb) => execution_passes(recs, answers, train, repos, sb, cfg.eval.workers),
        None => Ok(answers.iter().map(|a| vec![true; a.len()]).collect()),
    };
    let run = Stage1Run {
        mode,
        cfg: &cfg.stage1.p2t,
        samples_per_prompt: cfg.stage1.samples_per_prompt,
        seed: cfg.seed,
        edit_reward: cfg.stage2.edit_reward,
        check: sb.is_some().then_some(&run_check as &ExecutionCheck),
    };
    let ((kept, acc), stats, graphs) = curate_stage1(items, &failing, &run)?;
    let path = out.join("g_star.jsonl");
    let mut text = String::new();
    for g in &graphs {
        text.push_str(&serde_json::to_string(g)?);
        text.push('\n');
    }
    std::fs::write(&path, text).with_context(|| path.display().to_string())?;
    let path = out.join("stage1_curation.json");
    std::fs::write(&path, serde_json::to_string_pretty(&stats)?)
        .with_context(|| path.display().to_string())?;
    Ok((kept, acc, stats.markdown(&cfg.stage1.p2t)))
}

/// Appends a report section (nothing when empty).
pub fn append(report: &Path, section: &str) -> anyhow::Result<()> {
    if section.is_empty() {
        return Ok(());
    }
    let mut md = std::fs::read_to_string(report).with_context(|| report.display().to_string())?;
    md.push_str(section);
    std::fs::write(report, md).with_context(|| report.display().to_string())
}
