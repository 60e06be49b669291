//! Stage 1 of `sorft repro` with `stage1.curation = "outcome" | "p2t"`: runs the curation of
//! `rft::p2t`, writes G* of every training instance to `OUT/g_star.jsonl` and the curation totals
//! to `OUT/stage1_curation.json`, and returns the kept examples and a report section.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;

use crate::pipeline::config::ReproConfig;
use crate::rft::p2t::{curate_stage1, Curation};
use crate::rft::teacher::{Acceptance, TeacherItem};
use crate::swe::instance::Instance;

/// Kept examples with their item index, per-subtask counts, and the report section.
pub type Stage1Data = (
    Vec<(usize, Vec<crate::model::chat::Message>)>,
    BTreeMap<String, Acceptance>,
    String,
);

/// Curates stage-1 data of `items` (records of the `train` instances) by `mode`.
pub fn curate(
    out: &Path,
    items: &[TeacherItem<'_>],
    train: &[Instance],
    mode: Curation,
    cfg: &ReproConfig,
) -> anyhow::Result<Stage1Data> {
    let failing: BTreeMap<String, Vec<String>> = train
        .iter()
        .map(|i| (i.instance_id.clone(), i.fail_to_pass.clone()))
        .collect();
    let ((kept, acc), stats, graphs) = curate_stage1(
        items,
        &failing,
        mode,
        &cfg.stage1.p2t,
        cfg.stage1.samples_per_prompt,
        cfg.seed,
        cfg.stage2.edit_reward,
    );
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
