//! Failures with their feedback: every subtask prompt whose teacher samples all failed the
//! ground-truth filter, with each failed answer and why it scored zero (the reward breakdown).
//! For edits run in the sandbox it also carries the execution feedback (tests still failing, the
//! exception line, the last traceback frames). The feedback names what the answers did wrong,
//! never what the ground truth is, so a diagnoser may read it.

use std::collections::BTreeMap;

use crate::rft::failforge::exec::{EditExecutor, ExecFeedback};
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
    /// It passed the rule reward but its patch did not resolve the instance in the sandbox.
    pub failed_execution: bool,
    /// What running it in the sandbox said (edits only, when an executor ran it).
    pub exec: Option<ExecFeedback>,
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

/// The reason name of an answer (`failed_execution` when only the sandbox rejected it).
fn reason(a: &FailedAnswer) -> &'static str {
    if a.failed_execution {
        return "failed_execution";
    }
    a.breakdown
        .zero_reason
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
            *out.entry(reason(a)).or_default() += 1;
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
                let exec = a
                    .exec
                    .as_ref()
                    .map(|e| format!(" | {}", e.line()))
                    .unwrap_or_default();
                format!(
                    "- {}: {}{exec}",
                    reason(a),
                    answer_summary(self.subtask, &a.text)
                )
            })
            .collect();
        lines.dedup();
        lines.join("\n")
    }

    /// The execution feedback of its answers that ran.
    pub fn exec(&self) -> impl Iterator<Item = &ExecFeedback> {
        self.answers.iter().filter_map(|a| a.exec.as_ref())
    }
}

/// The prompts whose `samples` all scored zero or less or, where `executed[i][k]` is given, whose
/// positive edits all failed execution, with their answers and breakdowns.
pub fn collect_failures(
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    edit_reward: EditReward,
    executed: Option<&[Vec<bool>]>,
) -> Vec<Failure> {
    let mut out = Vec::new();
    for (i, (item, outs)) in items.iter().zip(samples).enumerate() {
        if outs.is_empty() {
            continue;
        }
        let answers: Vec<FailedAnswer> = outs
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let breakdown = item.record.reward(t, edit_reward);
                let ran = executed.and_then(|e| e.get(i)).and_then(|e| e.get(k));
                FailedAnswer {
                    text: t.clone(),
                    failed_execution: breakdown.reward > 0.0 && ran == Some(&false),
                    breakdown,
                    exec: None,
                }
            })
            .collect();
        if answers
            .iter()
            .all(|a| a.breakdown.reward <= 0.0 || a.failed_execution)
        {
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

/// Runs the failed edits of `failures` with `executor` and attaches what each run said.
pub fn attach_execution(
    failures: &mut [Failure],
    items: &[TeacherItem<'_>],
    executor: &mut dyn EditExecutor,
) -> anyhow::Result<usize> {
    let mut slots = Vec::new();
    let mut jobs = Vec::new();
    for (fi, f) in failures.iter().enumerate() {
        if f.subtask != Subtask::Edit {
            continue;
        }
        for (ai, a) in f.answers.iter().enumerate() {
            slots.push((fi, ai));
            jobs.push((items[f.item].record, a.text.as_str()));
        }
    }
    let fbs = executor.execute(&jobs)?;
    let mut ran = 0;
    for ((fi, ai), fb) in slots.into_iter().zip(fbs) {
        ran += usize::from(fb.is_some());
        failures[fi].answers[ai].exec = fb;
    }
    Ok(ran)
}
