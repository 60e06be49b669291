//! Multi-step trajectories across the Agentless chain (file -> function -> line -> edit): steps of
//! reasoning and one answer per stage; what each stage observed; and the conversion of a
//! trajectory into stage-1 chat examples (one per answered stage).

use serde::{Deserialize, Serialize};

use crate::swe::reward::Window;
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// Reasoning or the stage's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// A sentence of reasoning (part of the stage's thought).
    Reason,
    /// The stage's final answer (a fenced block); it moves the trajectory to the next stage.
    Answer,
}

/// One step of a trajectory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The stage it belongs to.
    pub stage: Subtask,
    /// Reasoning or answer.
    pub kind: StepKind,
    /// Its text.
    pub text: String,
    /// For reasoning: the answer the teacher had in mind when writing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

impl Step {
    /// A reasoning step.
    pub fn reason(stage: Subtask, text: &str) -> Self {
        Self {
            stage,
            kind: StepKind::Reason,
            text: text.to_string(),
            plan: None,
        }
    }

    /// An answer step.
    pub fn answer(stage: Subtask, text: &str) -> Self {
        Self {
            stage,
            kind: StepKind::Answer,
            text: text.to_string(),
            plan: None,
        }
    }
}

/// What one stage of the chain showed: its prompt, the paths and definitions it listed, its code
/// windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageView {
    /// The stage.
    pub stage: Subtask,
    /// Everything shown as text (prompt, listed paths, qualified names of shown definitions).
    pub text: String,
    /// Code windows shown.
    pub windows: Vec<Window>,
}

/// The stages of one instance's chain, in order (stages without ground truth are absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observations {
    /// One view per stage, in chain order.
    pub stages: Vec<StageView>,
}

/// What a trajectory has observed up to and including some stage.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// All observed text.
    pub text: String,
    /// All observed windows.
    pub windows: Vec<Window>,
}

impl Observations {
    /// Views of an instance's records (any order; sorted into chain order).
    pub fn of(records: &[&SubtaskRecord]) -> Self {
        let mut stages: Vec<StageView> = records
            .iter()
            .map(|r| {
                let mut text = crate::swe::grounding::ground_of(r);
                for f in &r.shown.files {
                    text.push('\n');
                    text.push_str(f);
                }
                StageView {
                    stage: r.subtask,
                    text,
                    windows: r.shown.windows.clone(),
                }
            })
            .collect();
        stages.sort_by_key(|s| s.stage);
        Self { stages }
    }

    /// The chain's stages, in order.
    pub fn chain(&self) -> Vec<Subtask> {
        self.stages.iter().map(|s| s.stage).collect()
    }

    /// Everything observed once `stage` is reached.
    pub fn seen(&self, stage: Subtask) -> Seen {
        let mut s = Seen::default();
        for v in self.stages.iter().filter(|v| v.stage <= stage) {
            s.text.push_str(&v.text);
            s.text.push('\n');
            s.windows.extend(v.windows.iter().cloned());
        }
        s
    }
}

/// The stage a trajectory is in after `steps`: the first stage of `chain` not yet answered
/// (`None` once every stage is answered).
pub fn current_stage(chain: &[Subtask], steps: &[Step]) -> Option<Subtask> {
    let answered = steps.iter().filter(|s| s.kind == StepKind::Answer).count();
    chain.get(answered).copied()
}

/// The chat response of one stage: its reasoning steps as the thought, then its answer (`None`
/// when the stage has no answer).
pub fn stage_response(steps: &[Step], stage: Subtask) -> Option<String> {
    let answer = steps
        .iter()
        .find(|s| s.stage == stage && s.kind == StepKind::Answer)?;
    let thought: Vec<&str> = steps
        .iter()
        .filter(|s| s.stage == stage && s.kind == StepKind::Reason)
        .map(|s| s.text.trim())
        .collect();
    Some(format!(
        "<think>{}</think>\n{}",
        thought.join(" "),
        answer.text.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_response_joins_its_reasoning_before_its_answer() {
        let steps = vec![
            Step::reason(Subtask::File, "First."),
            Step::reason(Subtask::File, "Second."),
            Step::answer(Subtask::File, "```\na.py\n```"),
            Step::reason(Subtask::Function, "Third."),
        ];
        assert_eq!(
            stage_response(&steps, Subtask::File).unwrap(),
            "<think>First. Second.</think>\n```\na.py\n```"
        );
        assert_eq!(stage_response(&steps, Subtask::Function), None);
        let chain = [Subtask::File, Subtask::Function];
        assert_eq!(current_stage(&chain, &steps), Some(Subtask::Function));
        assert_eq!(current_stage(&chain[..1], &steps), None);
    }
}
