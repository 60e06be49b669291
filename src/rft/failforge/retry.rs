//! The guided retry: the skill goes in front of the prompt (and after the issue text the teacher
//! reads), the teacher samples again, and the answers that pass the ground-truth filter become
//! training examples whose prompt is the unguided one, byte for byte.

use std::collections::BTreeSet;

use crate::model::chat::Message;
use crate::rft::teacher::{Teacher, TeacherItem};
use crate::swe::subtask::{EditReward, SubtaskRecord};

/// The header that introduces a skill in a guided prompt.
pub const SKILL_HEADER: &str = "### Skill learned from an earlier failed attempt ###\n";
/// The line that closes the skill section.
pub const SKILL_FOOTER: &str = "\n###\n\n";

/// Why a guided example could not be turned back into an unguided one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemovalError {
    /// The guided prompt does not start with this skill's section.
    #[error("the guided prompt does not carry the skill section")]
    NoSkillSection,
    /// After removal the prompt differs from the unguided prompt.
    #[error("the prompt without the skill differs from the unguided prompt at byte {0}")]
    NotIdentical(usize),
    /// The answer quotes the skill, so training on it would still teach the hint.
    #[error("the answer quotes the skill")]
    AnswerQuotesSkill,
}

/// The prompt with the skill section in front.
pub fn guided_prompt(prompt: &str, skill: &str) -> String {
    format!("{SKILL_HEADER}{}{SKILL_FOOTER}{prompt}", skill.trim())
}

/// The issue text a teacher reads for a guided attempt: the issue, then the skill.
pub fn guided_problem(problem: &str, skill: &str) -> String {
    format!("{}\n\nSkill: {}\n", problem.trim_end(), skill.trim())
}

/// The guided prompt with the skill section removed.
pub fn remove_skill(guided: &str, skill: &str) -> Result<String, RemovalError> {
    let section = format!("{SKILL_HEADER}{}{SKILL_FOOTER}", skill.trim());
    guided
        .strip_prefix(&section)
        .map(str::to_string)
        .ok_or(RemovalError::NoSkillSection)
}

/// The training conversation of a guided success with the skill removed: checks that the prompt
/// left is byte-identical to the unguided `prompt` and that the answer does not quote the skill.
pub fn unguided_example(
    guided: &str,
    prompt: &str,
    skill: &str,
    answer: &str,
) -> Result<Vec<Message>, RemovalError> {
    let stripped = remove_skill(guided, skill)?;
    if stripped.as_bytes() != prompt.as_bytes() {
        let at = stripped
            .bytes()
            .zip(prompt.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(stripped.len().min(prompt.len()));
        return Err(RemovalError::NotIdentical(at));
    }
    if answer.contains(skill.trim()) {
        return Err(RemovalError::AnswerQuotesSkill);
    }
    Ok(vec![
        Message::new("user", &stripped),
        Message::new("assistant", answer),
    ])
}

/// One retried prompt: which item, and the skill it gets (`None`: the control, a plain second attempt).
#[derive(Clone, Debug)]
pub struct RetryPlan {
    /// Index of the item.
    pub item: usize,
    /// The skill text, if guided.
    pub skill: Option<String>,
}

/// The answers of one retried prompt that pass the ground-truth filter, duplicates removed, and
/// the prompt they were sampled with.
#[derive(Clone, Debug)]
pub struct RetryResult {
    /// The prompt the teacher saw (guided or not).
    pub prompt: String,
    /// Passing answers.
    pub passed: Vec<String>,
}

/// Samples `k` answers per plan (guided plans see the skill in the prompt and the issue text) and
/// keeps those with a positive reward against the original record's ground truth.
pub fn retry(
    teacher: &mut dyn Teacher,
    items: &[TeacherItem<'_>],
    plans: &[RetryPlan],
    k: usize,
    seed: u64,
    edit_reward: EditReward,
) -> anyhow::Result<Vec<RetryResult>> {
    let records: Vec<SubtaskRecord> = plans
        .iter()
        .map(|p| {
            let rec = items[p.item].record;
            match &p.skill {
                Some(s) => SubtaskRecord {
                    prompt: guided_prompt(&rec.prompt, s),
                    ..rec.clone()
                },
                None => rec.clone(),
            }
        })
        .collect();
    let problems: Vec<String> = plans
        .iter()
        .map(|p| match &p.skill {
            Some(s) => guided_problem(items[p.item].problem, s),
            None => items[p.item].problem.to_string(),
        })
        .collect();
    let asked: Vec<TeacherItem<'_>> = records
        .iter()
        .zip(&problems)
        .map(|(r, p)| TeacherItem {
            record: r,
            problem: p,
        })
        .collect();
    let samples = teacher.sample(&asked, k, seed)?;
    Ok(plans
        .iter()
        .zip(records)
        .zip(samples.into_iter().chain(std::iter::repeat(Vec::new())))
        .map(|((p, rec), outs)| {
            let original = items[p.item].record;
            let mut seen = BTreeSet::new();
            let passed = outs
                .into_iter()
                .filter(|t| original.reward(t, edit_reward).reward > 0.0)
                .filter(|t| seen.insert(t.trim().to_string()))
                .collect();
            RetryResult {
                prompt: rec.prompt,
                passed,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str =
        "Please look through the following GitHub problem description...\n```\na.py\n```\n";

    #[test]
    fn removing_the_skill_gives_the_unguided_prompt_byte_for_byte() {
        let skill = "Follow the traceback's deepest repository frame.";
        let g = guided_prompt(PROMPT, skill);
        assert_ne!(g, PROMPT);
        assert!(g.contains(skill));
        let conv = unguided_example(&g, PROMPT, skill, "<think>x</think>\n```\na.py\n```").unwrap();
        assert_eq!(conv[0].content.as_bytes(), PROMPT.as_bytes());
        assert_eq!(conv[0].role, "user");
    }

    #[test]
    fn a_left_over_or_foreign_skill_is_refused() {
        let skill = "Copy SEARCH lines verbatim.";
        let g = guided_prompt(PROMPT, skill);
        // A prompt with one byte more than the unguided one.
        let tampered = g.replacen("GitHub", "GitHub ", 1);
        assert_eq!(
            unguided_example(&tampered, PROMPT, skill, "a"),
            Err(RemovalError::NotIdentical(41))
        );
        assert_eq!(
            unguided_example(&g, PROMPT, "another skill", "a"),
            Err(RemovalError::NoSkillSection)
        );
        assert_eq!(
            unguided_example(&g, PROMPT, skill, &format!("<think>{skill}</think>")),
            Err(RemovalError::AnswerQuotesSkill)
        );
    }
}
