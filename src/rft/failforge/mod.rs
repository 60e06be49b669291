//! FailForge: rejection sampling throws away the prompts whose samples all fail, which are the
//! hardest ones. This stage diagnoses each such failure from its feedback (the reward breakdown),
//! distils the diagnosis into a short skill kept in a library, checks the skill carries no ground
//! truth, retries the prompt with the skill in front, and folds the passing answers back into the
//! corpus with the skill removed from the prompt. A plain second attempt on the same budget runs
//! beside it as the control.

pub mod diagnose;
pub mod feedback;
pub mod leakage;
pub mod report;
pub mod retry;
pub mod skills;

use serde::{Deserialize, Serialize};

use crate::engine::rng::random_u64;
use crate::model::chat::Message;
use crate::rft::teacher::{Teacher, TeacherItem};
use crate::swe::subtask::EditReward;

use diagnose::{Case, Diagnoser, Diagnosis};
use feedback::{collect_failures, Failure};
use report::FailForgeReport;
use retry::{retry, unguided_example, RetryPlan};
use skills::{applies_text, Skill, SkillLibrary};

/// Knobs of the stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailForgeConfig {
    /// Teacher samples per guided retry (0 = as many as the rejection-sampling stage drew).
    pub retry_samples: usize,
    /// Most words of a skill.
    pub max_skill_words: usize,
    /// A library skill is reused when its BM25 score against the failure's issue and feedback is at
    /// least this fraction of the failure's score against itself.
    pub reuse_ratio: f64,
    /// Also run the plain second attempt (the control) and keep its examples.
    pub control: bool,
}

impl Default for FailForgeConfig {
    fn default() -> Self {
        Self {
            retry_samples: 0,
            max_skill_words: 24,
            reuse_ratio: 0.6,
            control: true,
        }
    }
}

/// An example added by the stage: the item it came from and the conversation.
pub type Example = (usize, Vec<Message>);

/// What the stage produced.
#[derive(Clone, Debug, Default)]
pub struct StageOutput {
    /// Guided successes with the skill removed (what goes into the corpus).
    pub recovered: Vec<Example>,
    /// The same successes with the skill kept in the prompt (the ablation).
    pub skill_kept: Vec<Example>,
    /// Successes of the plain second attempt (the control).
    pub plain_retry: Vec<Example>,
    /// The counts.
    pub report: FailForgeReport,
}

/// A skill chosen for one failure, or why there is none.
enum Choice {
    Reused(usize),
    New(Diagnosis),
    Leaked(leakage::LeakKind),
    Nothing,
}

/// Chooses a skill for every failure: a clean library skill when one applies, else the
/// diagnoser's; leaking skills are dropped and counted.
fn choose_skills(
    diagnoser: &mut dyn Diagnoser,
    items: &[TeacherItem<'_>],
    failures: &[Failure],
    library: &SkillLibrary,
    cfg: &FailForgeConfig,
    seed: u64,
) -> anyhow::Result<(Vec<Choice>, Vec<usize>)> {
    let mut choices: Vec<Option<Choice>> = Vec::with_capacity(failures.len());
    let mut to_diagnose = Vec::new();
    for (fi, f) in failures.iter().enumerate() {
        let item = &items[f.item];
        let query = applies_text(item.problem, &f.feedback_text());
        match library.find(f.subtask, &query, cfg.reuse_ratio, &|_| false) {
            Some(s) => match leakage::find_leak(&library.skills()[s].text, &item.record.truth) {
                None => choices.push(Some(Choice::Reused(s))),
                Some(l) => choices.push(Some(Choice::Leaked(l.kind))),
            },
            None => {
                to_diagnose.push(fi);
                choices.push(None);
            }
        }
    }
    let cases: Vec<Case<'_>> = to_diagnose
        .iter()
        .map(|&fi| Case {
            failure: &failures[fi],
            item: items[failures[fi].item],
        })
        .collect();
    let diagnoses = diagnoser.diagnose(&cases, cfg.max_skill_words, seed)?;
    for (&fi, d) in to_diagnose.iter().zip(diagnoses) {
        let truth = &items[failures[fi].item].record.truth;
        choices[fi] = Some(match d {
            None => Choice::Nothing,
            Some(d) => match leakage::find_leak(&d.skill, truth) {
                Some(l) => Choice::Leaked(l.kind),
                None => Choice::New(d),
            },
        });
    }
    Ok((
        choices
            .into_iter()
            .map(|c| c.unwrap_or(Choice::Nothing))
            .collect(),
        to_diagnose,
    ))
}

/// A finished rejection-sampling round: `samples[i]` are the teacher's answers to `items[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    /// The prompts.
    pub items: &'a [TeacherItem<'a>],
    /// The teacher's answers per prompt.
    pub samples: &'a [Vec<String>],
    /// The edit reward of the ground-truth filter.
    pub edit_reward: EditReward,
    /// The run's seed.
    pub seed: u64,
}

/// Runs the stage over a finished rejection-sampling round. New clean skills go into `library`.
pub fn run_stage(
    teacher: &mut dyn Teacher,
    diagnoser: &mut dyn Diagnoser,
    round: &Round<'_>,
    library: &mut SkillLibrary,
    cfg: &FailForgeConfig,
) -> anyhow::Result<StageOutput> {
    let Round {
        items,
        samples,
        edit_reward,
        seed,
    } = *round;
    let mut rep = FailForgeReport {
        diagnoser: diagnoser.name(),
        teacher: teacher.name(),
        stage1_samples: samples.iter().map(Vec::len).sum(),
        ..FailForgeReport::default()
    };
    for it in items {
        rep.subtasks
            .entry(it.record.subtask.name().into())
            .or_default()
            .prompts += 1;
    }
    let failures = collect_failures(items, samples, edit_reward);
    let k = if cfg.retry_samples > 0 {
        cfg.retry_samples
    } else {
        samples.iter().map(Vec::len).max().unwrap_or(1).max(1)
    };
    let (choices, diagnosed) =
        choose_skills(diagnoser, items, &failures, library, cfg, random_u64(seed, 0xf41, 0))?;
    rep.diagnoser_calls = diagnosed.len();
    // The skill of every failure that has one, registering new skills in the library.
    let mut plans: Vec<(usize, usize)> = Vec::new(); // (failure, library index)
    for (fi, (f, c)) in failures.iter().zip(choices).enumerate() {
        let item = &items[f.item];
        let st = rep.subtasks.entry(f.subtask.name().into()).or_default();
        st.failed += 1;
        match c {
            Choice::Reused(s) => {
                st.reused += 1;
                plans.push((fi, s));
            }
            Choice::New(d) => {
                st.diagnosed += 1;
                let s = library.add(Skill {
                    id: String::new(),
                    subtask: f.subtask,
                    rule: d.rule,
                    text: d.skill,
                    diagnosis: d.summary,
                    applies_to: applies_text(item.problem, &f.feedback_text()),
                    source: f.instance_id.clone(),
                    reused: 0,
                    recovered: 0,
                });
                plans.push((fi, s));
            }
            Choice::Leaked(kind) => {
                if diagnosed.contains(&fi) {
                    st.diagnosed += 1;
                } else {
                    st.reused += 1;
                }
                st.leaked += 1;
                *rep.leak_kinds.entry(kind.name().into()).or_default() += 1;
            }
            Choice::Nothing => st.no_skill += 1,
        }
    }
    let guided: Vec<RetryPlan> = plans
        .iter()
        .map(|&(fi, s)| RetryPlan {
            item: failures[fi].item,
            skill: Some(library.skills()[s].text.clone()),
        })
        .collect();
    let retry_seed = random_u64(seed, 0xf41, 1);
    let g = retry(teacher, items, &guided, k, retry_seed, edit_reward)?;
    rep.retry_samples = guided.len() * k;
    let plain = if cfg.control {
        let plain_plans: Vec<RetryPlan> = guided
            .iter()
            .map(|p| RetryPlan {
                item: p.item,
                skill: None,
            })
            .collect();
        rep.control_samples = plain_plans.len() * k;
        retry(teacher, items, &plain_plans, k, retry_seed, edit_reward)?
    } else {
        Vec::new()
    };
    let mut out = StageOutput::default();
    let mut before = Vec::new();
    let mut after = Vec::new();
    for (pi, (&(fi, s), res)) in plans.iter().zip(&g).enumerate() {
        let f = &failures[fi];
        let rec = items[f.item].record;
        let skill_text = library.skills()[s].text.clone();
        let st = rep.subtasks.entry(f.subtask.name().into()).or_default();
        st.retried += 1;
        if library.skills()[s].source != f.instance_id && !diagnosed.contains(&fi) {
            if let Some(sk) = library.get_mut(s) {
                sk.reused += 1;
            }
        }
        let ok = !res.passed.is_empty();
        after.push(ok);
        if ok {
            st.recovered += 1;
            *rep.rules.entry(library.skills()[s].rule.clone()).or_default() += 1;
            if let Some(sk) = library.get_mut(s) {
                sk.recovered += 1;
            }
        }
        for ans in &res.passed {
            match unguided_example(&res.prompt, &rec.prompt, &skill_text, ans) {
                Ok(conv) => {
                    st.added += 1;
                    out.recovered.push((f.item, conv));
                    out.skill_kept.push((
                        f.item,
                        vec![
                            Message::new("user", &res.prompt),
                            Message::new("assistant", ans),
                        ],
                    ));
                }
                Err(_) => st.refused += 1,
            }
        }
        if let Some(p) = plain.get(pi) {
            let ok = !p.passed.is_empty();
            before.push(ok);
            if ok {
                st.recovered_plain += 1;
            }
            for ans in &p.passed {
                out.plain_retry.push((
                    f.item,
                    vec![
                        Message::new("user", &rec.prompt),
                        Message::new("assistant", ans),
                    ],
                ));
            }
        }
    }
    if cfg.control && !after.is_empty() {
        rep.mcnemar = crate::rft::stats::mcnemar(&before, &after).ok();
    }
    rep.library_size = library.len();
    out.report = rep;
    Ok(out)
}
