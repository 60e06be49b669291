//! What a FailForge stage did, counted per subtask, and its markdown section: recovered fraction of
//! failed prompts, the plain second attempt on the same budget, extra teacher calls, skill reuse and
//! the leakage rate; plus the held-out comparison of training corpora when one was run.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rft::stats::{Interval, McNemar};

/// Counts of one subtask.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SubtaskCounts {
    /// Prompts of the stage.
    pub prompts: usize,
    /// Prompts whose samples all failed.
    pub failed: usize,
    /// Skills written by the diagnoser for these failures (before the leakage check).
    pub diagnosed: usize,
    /// Failures served by a skill from the library.
    pub reused: usize,
    /// Skills dropped because they contained the ground truth.
    pub leaked: usize,
    /// Failures the diagnoser had nothing for.
    pub no_skill: usize,
    /// Failures retried with a skill.
    pub retried: usize,
    /// Of those, recovered with the skill (at least one passing answer).
    pub recovered: usize,
    /// Of the same failures, recovered by a plain second attempt (control, same budget).
    pub recovered_plain: usize,
    /// Examples added to the corpus (skill removed).
    pub added: usize,
    /// Guided successes refused by the removal check (prompt not identical, answer quotes the skill).
    pub refused: usize,
}

/// The report of one FailForge stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FailForgeReport {
    /// The diagnoser's name.
    pub diagnoser: String,
    /// The teacher's name.
    pub teacher: String,
    /// Per subtask.
    pub subtasks: BTreeMap<String, SubtaskCounts>,
    /// Leaks by kind (`path`, `function`, `line`, `replacement`).
    pub leak_kinds: BTreeMap<String, usize>,
    /// Skills by rule or diagnoser (those that passed the leakage check and were used).
    pub rules: BTreeMap<String, usize>,
    /// Teacher samples of the rejection-sampling stage.
    pub stage1_samples: usize,
    /// Extra teacher samples of the guided retries.
    pub retry_samples: usize,
    /// Calls to the diagnoser (one per failure it diagnosed; reused skills cost none).
    pub diagnoser_calls: usize,
    /// Teacher samples of the control (plain second attempt), not part of FailForge's cost.
    pub control_samples: usize,
    /// McNemar's exact test, plain second attempt (before) vs guided retry (after), per retried prompt.
    pub mcnemar: Option<McNemar>,
    /// Skills in the library at the end.
    pub library_size: usize,
    /// Sandbox runs of edits (failed edits for feedback, recovered edits for acceptance).
    #[serde(default)]
    pub exec_runs: usize,
    /// Guided answers that passed the rule reward but failed execution (refused).
    #[serde(default)]
    pub exec_refused: usize,
    /// The same for the plain second attempt.
    #[serde(default)]
    pub exec_refused_plain: usize,
}

impl FailForgeReport {
    /// Sum over subtasks.
    pub fn total(&self) -> SubtaskCounts {
        let mut t = SubtaskCounts::default();
        for c in self.subtasks.values() {
            t.prompts += c.prompts;
            t.failed += c.failed;
            t.diagnosed += c.diagnosed;
            t.reused += c.reused;
            t.leaked += c.leaked;
            t.no_skill += c.no_skill;
            t.retried += c.retried;
            t.recovered += c.recovered;
            t.recovered_plain += c.recovered_plain;
            t.added += c.added;
            t.refused += c.refused;
        }
        t
    }

    /// Skills proposed (new or reused) that the leakage check dropped, as a fraction.
    pub fn leakage_rate(&self) -> f64 {
        let t = self.total();
        ratio(t.leaked, t.diagnosed + t.reused)
    }

    /// The markdown section.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "## FailForge (failed prompts -> diagnosed skills -> guided retry)\n\nTeacher: {}; diagnoser: {}. \
A prompt is failed when all its rejection-sampling samples failed the ground-truth filter; it is recovered when a \
retry has at least one passing answer. The plain second attempt is the control: the same prompts, the same \
number of samples and seeds, without the skill.\n\n\
| subtask | prompts | failed | skills diagnosed / reused | leaked | retried | recovered (skill) | recovered (plain retry) | added | refused |\n\
|---|---|---|---|---|---|---|---|---|---|\n",
            self.teacher, self.diagnoser
        );
        let mut rows: Vec<(String, SubtaskCounts)> = self
            .subtasks
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        rows.push(("all".into(), self.total()));
        for (k, c) in rows {
            md.push_str(&format!(
                "| {k} | {} | {} | {} / {} | {} | {} | {} ({:.1}% of failed) | {} ({:.1}%) | {} | {} |\n",
                c.prompts,
                c.failed,
                c.diagnosed,
                c.reused,
                c.leaked,
                c.retried,
                c.recovered,
                100.0 * ratio(c.recovered, c.failed),
                c.recovered_plain,
                100.0 * ratio(c.recovered_plain, c.failed),
                c.added,
                c.refused
            ));
        }
        let t = self.total();
        md.push_str(&format!(
            "\nLeakage: {} of {} proposed skills contained ground truth and were dropped ({:.1}%){}.\n",
            t.leaked,
            t.diagnosed + t.reused,
            100.0 * self.leakage_rate(),
            if self.leak_kinds.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    self.leak_kinds
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        md.push_str(&format!(
            "Cost: {} extra teacher samples on top of {} ({:.1}%), {} diagnoser calls; library: {} skills.\n",
            self.retry_samples,
            self.stage1_samples,
            100.0 * ratio(self.retry_samples, self.stage1_samples),
            self.diagnoser_calls,
            self.library_size
        ));
        if self.exec_runs > 0 {
            md.push_str(&format!(
                "Execution: {} sandbox runs of edits (feedback for failed edits, acceptance of recovered ones); \
refused after passing the rule reward: {} guided, {} plain retry.\n",
                self.exec_runs, self.exec_refused, self.exec_refused_plain
            ));
        }
        if !self.rules.is_empty() {
            md.push_str(&format!(
                "Skills used, by rule: {}.\n",
                self.rules
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(m) = &self.mcnemar {
            md.push_str(&format!(
                "Skill vs plain retry on the same prompts (McNemar, exact): skill only {}, plain only {}, p = {:.3}.\n",
                m.gained, m.lost, m.p_value
            ));
        }
        md
    }
}

/// `a / b`, 0 when `b` is 0.
pub fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// One corpus arm of the held-out comparison against plain rejection sampling.
#[derive(Clone, Debug, Serialize)]
pub struct ArmResult {
    /// The arm's name.
    pub name: String,
    /// Training examples.
    pub examples: usize,
    /// Mean held-out reward over all subtask prompts.
    pub mean: f64,
    /// Paired cluster-bootstrap interval of (arm - plain), over instances.
    pub delta: Option<Interval>,
    /// The same per difficulty bin (bin name -> (instances, interval)).
    pub by_difficulty: BTreeMap<String, (usize, Option<Interval>)>,
}

/// Held-out effect of the corpora, against the plain rejection-sampling corpus.
#[derive(Clone, Debug, Serialize)]
pub struct HeldoutComparison {
    /// Held-out instances.
    pub instances: usize,
    /// How instances were binned by difficulty.
    pub difficulty: String,
    /// Instances per difficulty bin.
    pub bins: BTreeMap<String, usize>,
    /// The arms, plain first.
    pub arms: Vec<ArmResult>,
    /// Bootstrap resamples and level.
    pub resamples: usize,
    /// Interval level.
    pub level: f64,
}

impl HeldoutComparison {
    /// The markdown section.
    pub fn markdown(&self) -> String {
        let bins: Vec<&String> = self.bins.keys().collect();
        let mut md = format!(
            "\n### Held-out effect of the training corpus\n\nThe same initial checkpoint fine-tuned on each corpus, \
greedy answers to the held-out ground-truth prompts of {} instances; delta = arm - plain rejection sampling, \
paired cluster bootstrap over instances ({} resamples, {:.0}% interval). Difficulty: {}.\n\n\
| corpus | examples | mean reward | delta vs plain |{}\n|---|---|---|---|{}\n",
            self.instances,
            self.resamples,
            100.0 * self.level,
            self.difficulty,
            bins.iter()
                .map(|b| format!(" {b} ({}) |", self.bins[*b]))
                .collect::<String>(),
            "---|".repeat(bins.len())
        );
        let show = |i: &Option<Interval>| i.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        for a in &self.arms {
            md.push_str(&format!(
                "| {} | {} | {:.3} | {} |{}\n",
                a.name,
                a.examples,
                a.mean,
                show(&a.delta),
                bins.iter()
                    .map(|b| format!(
                        " {} |",
                        a.by_difficulty
                            .get(*b)
                            .map(|x| show(&x.1))
                            .unwrap_or("-".into())
                    ))
                    .collect::<String>()
            ));
        }
        md
    }
}
