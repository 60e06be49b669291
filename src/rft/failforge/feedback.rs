//! Failures with their feedback: every subtask prompt whose teacher samples all failed the
//! ground-truth filter, with each failed answer and why it scored zero (the reward breakdown).
//! The feedback names what the answers did wrong, never what the ground truth is, so a diagnoser
//! may read it.

use std::collections::BTreeMap;

use crate::rft::rl::zero_reason_name;
use crate::rft::teacher::TeacherItem;
use crate::swe::answer;
use crate::swe::reward::RewardBreakdown;
use crate::swe::subtask::{EditReward, Subtask};

/// One failed answer and its reward breakdown.
#[derive(Clone, Debug)]
pub struct FailedAnswer {
    /// The teacher's text.
    pub text: String,
    /// Why it failed.
    pub breakdown: RewardBreakdown,
}

/// A prompt whose samples all failed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Index of the prompt among the stage's items.
    pub item: usize,
    /// Its subtask.
    pub subtask: Subtask,
    /// Its instance.
    pub instance_id: String,
    /// The failed answers (all samples, duplicates included).
    pub answers: Vec<FailedAnswer>,
}

/// The reason name of a breakdown (`positive` when it has none).
fn reason(b: &RewardBreakdown) -> &'static str {
    b.zero_reason
        .as_ref()
        .map(zero_reason_name)
        .unwrap_or("positive")
}

/// What an answer targeted, in one short line (the final answer only, never the thought).
pub fn answer_summary(subtask: Subtask, text: &str) -> String {
    let items: Vec<String> = match subtask {
        Subtask::File => answer::parse_files(text),
        Subtask::Function => answer::parse_functions(text)
            .into_iter()
            .map(|l| format!("{}: {}", l.path, l.name))
            .collect(),
        Subtask::Line => answer::parse_lines(text)
            .into_iter()
            .map(|l| format!("{}: line {}", l.path, l.line))
            .collect(),
        Subtask::Edit => answer::parse_edit(text)
            .into_iter()
            .map(|b| {
                let first = b.search.lines().map(str::trim).find(|l| !l.is_empty());
                format!("{}: `{}`", b.path, first.unwrap_or(""))
            })
            .collect(),
    };
    if items.is_empty() {
        "(nothing parsed)".into()
    } else {
        items.join("; ")
    }
}

impl Failure {
    /// Counts of the zero reasons of its answers.
    pub fn reasons(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for a in &self.answers {
            *out.entry(reason(&a.breakdown)).or_default() += 1;
        }
        out
    }

    /// The most frequent zero reason (ties: the alphabetically first).
    pub fn dominant_reason(&self) -> &'static str {
        let r = self.reasons();
        let best = r.values().copied().max().unwrap_or(0);
        r.into_iter()
            .find(|(_, n)| *n == best)
            .map(|(k, _)| k)
            .unwrap_or("none")
    }

    /// The feedback as text: one line per distinct failed answer, `reason: what it answered`.
    pub fn feedback_text(&self) -> String {
        let mut lines: Vec<String> = self
            .answers
            .iter()
            .map(|a| {
                format!(
                    "- {}: {}",
                    reason(&a.breakdown),
                    answer_summary(self.subtask, &a.text)
                )
            })
            .collect();
        lines.dedup();
        lines.join("\n")
    }
}

/// The prompts whose `samples` all scored zero or less, with their answers and breakdowns.
pub fn collect_failures(
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    edit_reward: EditReward,
) -> Vec<Failure> {
    let mut out = Vec::new();
    for (i, (item, outs)) in items.iter().zip(samples).enumerate() {
        if outs.is_empty() {
            continue;
        }
        let answers: Vec<FailedAnswer> = outs
            .iter()
            .map(|t| FailedAnswer {
                text: t.clone(),
                breakdown: item.record.reward(t, edit_reward),
            })
            .collect();
        if answers.iter().all(|a| a.breakdown.reward <= 0.0) {
            out.push(Failure {
                item: i,
                subtask: item.record.subtask,
                instance_id: item.record.instance_id.clone(),
                answers,
            });
        }
    }
    out
}
