//! FailForge: rejection sampling throws away the prompts whose samples all fail, which are the
//! hardest ones. This stage diagnoses each such failure from its feedback (the reward breakdown,
//! and for edits the sandbox's failing tests and traceback),
//! distils the diagnosis into a short skill kept in a library, checks the skill carries no ground
//! truth, retries the prompt with the skill in front, and folds the passing answers back into the
//! corpus with the skill removed from the prompt. A plain second attempt on the same budget runs
//! beside it as the control.

pub mod diagnose;
pub mod evidence;
pub mod exec;
pub mod feedback;
#[cfg(test)]
mod fixtures;
pub mod follow;
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
use exec::EditExecutor;
use feedback::{attach_execution, collect_failures, Failure};
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
    /// Who answers the retries in `sorft repro`: `follow` (the simulated skill-following teacher)
    /// or `builtin` (the stage-1 teacher, which ignores skills).
    pub retry_teacher: RetryTeacher,
}

/// The teacher of the guided retry and its control in `sorft repro`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RetryTeacher {
    /// [`follow::SkillFollowingTeacher`]: simulated, reads the skill section of its prompt.
    #[default]
    Follow,
    /// The built-in stage-1 teacher (reads only the issue text and the views).
    Builtin,
}

impl Default for FailForgeConfig {
    fn default() -> Self {
        Self {
            retry_samples: 0,
            max_skill_words: 24,
            reuse_ratio: 0.6,
            control: true,
            retry_teacher: RetryTeacher::Follow,
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
    /// A library skill learned on an earlier failure.
    Reused(usize),
    /// A skill the diagnoser just wrote (now in the library).
    Fresh(usize),
    /// The skill found or written leaked the ground truth; `true` when it was freshly diagnosed.
    Leaked(leakage::LeakKind, bool),
    /// The diagnoser had nothing.
    Nothing,
}

/// Chooses a skill for every failure, in order: a library skill when one applies (skills written
/// for earlier failures of this round included), else the diagnoser's, added to the library when
/// clean. Leaking skills are dropped and counted. Returns the choices and the diagnoser calls.
fn choose_skills(
    diagnoser: &mut dyn Diagnoser,
    items: &[TeacherItem<'_>],
    failures: &[Failure],
    library: &mut SkillLibrary,
    cfg: &FailForgeConfig,
    seed: u64,
) -> anyhow::Result<(Vec<Choice>, usize)> {
    let mut choices = Vec::with_capacity(failures.len());
    let mut calls = 0;
    for (fi, f) in failures.iter().enumerate() {
        let item = &items[f.item];
        let truth = &item.record.truth;
        let query = applies_text(item.problem, &f.feedback_text());
        if let Some(s) = library.find(f.subtask, &query, cfg.reuse_ratio, &|_| false) {
            choices.push(match leakage::find_leak(&library.skills()[s].text, truth) {
                None => Choice::Reused(s),
                Some(l) => Choice::Leaked(l.kind, false),
            });
            continue;
        }
        let case = Case {
            failure: f,
            item: *item,
        };
        calls += 1;
        let d: Option<Diagnosis> = diagnoser
            .diagnose(
                &[case],
                cfg.max_skill_words,
                random_u64(seed, 0xd1a, fi as u64),
            )?
            .pop()
            .flatten();
        choices.push(match d {
            None => Choice::Nothing,
            Some(d) => match leakage::find_leak(&d.skill, truth) {
                Some(l) => Choice::Leaked(l.kind, true),
                None => Choice::Fresh(library.add(Skill {
                    id: String::new(),
                    subtask: f.subtask,
                    rule: d.rule,
                    text: d.skill,
                    diagnosis: d.summary,
                    applies_to: query,
                    source: f.instance_id.clone(),
                    reused: 0,
                    recovered: 0,
                })),
            },
        });
    }
    Ok((choices, calls))
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
    /// Which samples passed execution (`executed[i][k]`, stage-1 execution acceptance), if run.
    pub executed: Option<&'a [Vec<bool>]>,
}

/// Keeps, of each edit retry's passing answers, those whose patch resolves the instance when
/// `executor` runs it. Returns (runs, answers refused).
fn execution_acceptance(
    results: &mut [retry::RetryResult],
    plans: &[RetryPlan],
    items: &[TeacherItem<'_>],
    executor: &mut dyn EditExecutor,
) -> anyhow::Result<(usize, usize)> {
    let mut slots = Vec::new();
    let mut jobs = Vec::new();
    for (pi, (p, r)) in plans.iter().zip(results.iter()).enumerate() {
        let rec = items[p.item].record;
        if rec.subtask != crate::swe::subtask::Subtask::Edit {
            continue;
        }
        for a in &r.passed {
            slots.push(pi);
            jobs.push((rec, a.as_str()));
        }
    }
    let fbs = executor.execute(&jobs)?;
    let mut keep: Vec<Vec<bool>> = results.iter().map(|r| vec![true; r.passed.len()]).collect();
    let mut next = vec![0usize; results.len()];
    let (mut runs, mut refused) = (0, 0);
    for (pi, fb) in slots.into_iter().zip(fbs) {
        runs += usize::from(fb.is_some());
        let ok = fb.is_some_and(|f| f.resolved);
        keep[pi][next[pi]] = ok;
        next[pi] += 1;
        refused += usize::from(!ok);
    }
    for (r, k) in results.iter_mut().zip(keep) {
        let mut it = k.into_iter();
        r.passed.retain(|_| it.next().unwrap_or(true));
    }
    Ok((runs, refused))
}

/// Runs the stage over a finished rejection-sampling round. New clean skills go into `library`.
/// With an `executor`, failed edits are run for their execution feedback and a recovered edit
/// must resolve its instance (guided retry and control alike).
pub fn run_stage(
    teacher: &mut dyn Teacher,
    diagnoser: &mut dyn Diagnoser,
    round: &Round<'_>,
    library: &mut SkillLibrary,
    cfg: &FailForgeConfig,
    mut executor: Option<&mut dyn EditExecutor>,
) -> anyhow::Result<StageOutput> {
    let Round {
        items,
        samples,
        edit_reward,
        seed,
        executed,
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
    let mut failures = collect_failures(items, samples, edit_reward, executed);
    if let Some(ex) = executor.as_deref_mut() {
        rep.exec_runs += attach_execution(&mut failures, items, ex)?;
    }
    let k = if cfg.retry_samples > 0 {
        cfg.retry_samples
    } else {
        samples.iter().map(Vec::len).max().unwrap_or(1).max(1)
    };
    let (choices, calls) = choose_skills(diagnoser, items, &failures, library, cfg, seed)?;
    rep.diagnoser_calls = calls;
    // The library skill of every failure that has one.
    let mut plans: Vec<(usize, usize)> = Vec::new(); // (failure, library index)
    for (fi, (f, c)) in failures.iter().zip(choices).enumerate() {
        let st = rep.subtasks.entry(f.subtask.name().into()).or_default();
        st.failed += 1;
        match c {
            Choice::Reused(s) => {
                st.reused += 1;
                if let Some(sk) = library.get_mut(s) {
                    sk.reused += 1;
                }
                plans.push((fi, s));
            }
            Choice::Fresh(s) => {
                st.diagnosed += 1;
                plans.push((fi, s));
            }
            Choice::Leaked(kind, fresh) => {
                if fresh {
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
    let mut g = retry(teacher, items, &guided, k, retry_seed, edit_reward)?;
    if let Some(ex) = executor.as_deref_mut() {
        let (runs, refused) = execution_acceptance(&mut g, &guided, items, ex)?;
        rep.exec_runs += runs;
        rep.exec_refused += refused;
    }
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
        let mut p = retry(teacher, items, &plain_plans, k, retry_seed, edit_reward)?;
        if let Some(ex) = executor {
            let (runs, refused) = execution_acceptance(&mut p, &plain_plans, items, ex)?;
            rep.exec_runs += runs;
            rep.exec_refused_plain += refused;
        }
        p
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
        let ok = !res.passed.is_empty();
        after.push(ok);
        if ok {
            st.recovered += 1;
            *rep.rules
                .entry(library.skills()[s].rule.clone())
                .or_default() += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rft::failforge::fixtures::{edit_answer, line_answer, record};
    use crate::rft::failforge::retry::SKILL_HEADER;
    use crate::swe::subtask::{Subtask, SubtaskRecord};

    /// A teacher that answers line 3 (right) only when its prompt carries a skill that mentions
    /// an expression, else line 2 (wrong); counts its samples.
    #[derive(Default)]
    struct SkillReader {
        samples: usize,
    }

    impl Teacher for SkillReader {
        fn name(&self) -> String {
            "skill-reader".into()
        }
        fn sample(
            &mut self,
            items: &[TeacherItem<'_>],
            k: usize,
            _seed: u64,
        ) -> anyhow::Result<Vec<Vec<String>>> {
            self.samples += items.len() * k;
            Ok(items
                .iter()
                .map(|it| {
                    let p = &it.record.prompt;
                    let right = p.starts_with(SKILL_HEADER) && p.contains("expression");
                    vec![line_answer(if right { 3 } else { 2 }); k]
                })
                .collect())
        }
    }

    /// A diagnoser that writes the ground-truth location for instance `leaky` and a general skill
    /// otherwise; counts its calls.
    #[derive(Default)]
    struct Planted {
        calls: usize,
    }

    impl Diagnoser for Planted {
        fn name(&self) -> String {
            "planted".into()
        }
        fn diagnose(
            &mut self,
            cases: &[Case<'_>],
            _max_words: usize,
            _seed: u64,
        ) -> anyhow::Result<Vec<Option<Diagnosis>>> {
            self.calls += cases.len();
            Ok(cases
                .iter()
                .map(|c| {
                    let skill = if c.failure.instance_id == "leaky" {
                        "The bug is at pkg/core.py line 3."
                    } else {
                        "Pick the line whose expression computes the wrong value."
                    };
                    Some(Diagnosis {
                        rule: "planted".into(),
                        summary: "s".into(),
                        skill: skill.into(),
                    })
                })
                .collect())
        }
    }

    fn run(
        recs: &[SubtaskRecord],
        problems: &[&str],
        library: &mut SkillLibrary,
    ) -> (StageOutput, usize, usize) {
        let items: Vec<TeacherItem<'_>> = recs
            .iter()
            .zip(problems)
            .map(|(r, p)| TeacherItem {
                record: r,
                problem: p,
            })
            .collect();
        let samples = vec![vec![line_answer(2), line_answer(1)]; recs.len()];
        let mut teacher = SkillReader::default();
        let mut diag = Planted::default();
        let round = Round {
            items: &items,
            samples: &samples,
            edit_reward: EditReward::LineFbeta,
            seed: 7,
            executed: None,
        };
        let out = run_stage(
            &mut teacher,
            &mut diag,
            &round,
            library,
            &FailForgeConfig::default(),
            None,
        )
        .unwrap();
        (out, teacher.samples, diag.calls)
    }

    #[test]
    fn a_planted_leaking_skill_is_dropped_and_guided_successes_are_stored_without_the_skill() {
        let recs = vec![
            record(Subtask::Line, "leaky"),
            record(Subtask::Line, "clean"),
        ];
        let mut lib = SkillLibrary::new();
        let (out, samples, calls) = run(
            &recs,
            &["Totals are off by one.", "Scores come out negative."],
            &mut lib,
        );
        let r = &out.report;
        let line = &r.subtasks["line"];
        assert_eq!((line.failed, line.diagnosed, line.leaked), (2, 2, 1));
        assert_eq!(r.leak_kinds.get("path"), Some(&1));
        assert!((r.leakage_rate() - 0.5).abs() < 1e-12);
        assert_eq!(calls, 2);
        // The leaking skill never reaches the library or a prompt.
        assert_eq!(lib.len(), 1);
        assert!(lib.skills().iter().all(|s| !s.text.contains("pkg/core.py")));
        // Only the clean failure is retried: 2 guided samples + 2 control samples.
        assert_eq!(
            (line.retried, line.recovered, line.recovered_plain),
            (1, 1, 0)
        );
        assert_eq!((r.retry_samples, r.control_samples, samples), (2, 2, 4));
        // Stored without the skill: the prompt is the unguided one, byte for byte.
        assert_eq!(out.recovered.len(), 1);
        let (i, conv) = &out.recovered[0];
        assert_eq!(conv[0].content.as_bytes(), recs[*i].prompt.as_bytes());
        assert!(!conv[0].content.contains(SKILL_HEADER));
        // The ablation keeps it; the control recovered nothing.
        assert!(out.skill_kept[0].1[0].content.starts_with(SKILL_HEADER));
        assert!(out.plain_retry.is_empty());
        assert_eq!(r.mcnemar.map(|m| m.gained), Some(1));
    }

    #[test]
    fn a_similar_failure_reuses_the_library_skill_without_a_diagnoser_call() {
        let recs = vec![record(Subtask::Line, "a"), record(Subtask::Line, "b")];
        let issue = "Scores come out negative when the scale factor is applied twice in a row.";
        let mut lib = SkillLibrary::new();
        let (out, _, calls) = run(&recs, &[issue, issue], &mut lib);
        assert_eq!(calls, 1);
        let line = &out.report.subtasks["line"];
        assert_eq!((line.diagnosed, line.reused, line.recovered), (1, 1, 2));
        assert_eq!(lib.skills()[0].reused, 1);
        assert_eq!(lib.skills()[0].recovered, 2);
        // A later run starts from the library: no call at all.
        let (out, _, calls) = run(&recs[..1], &[issue], &mut lib);
        assert_eq!((calls, out.report.subtasks["line"].reused), (0, 1));
    }

    /// Answers edits on line 3: `y * 3` (resolves) when guided, `y * 4` (overlaps, does not
    /// resolve) otherwise.
    struct EditTeacher;

    impl Teacher for EditTeacher {
        fn name(&self) -> String {
            "edit".into()
        }
        fn sample(
            &mut self,
            items: &[TeacherItem<'_>],
            k: usize,
            _seed: u64,
        ) -> anyhow::Result<Vec<Vec<String>>> {
            Ok(items
                .iter()
                .map(|it| {
                    let to = if it.record.prompt.starts_with(SKILL_HEADER) {
                        3
                    } else {
                        4
                    };
                    vec![
                        edit_answer(
                            "pkg/core.py",
                            "    return y * 2",
                            &format!("    return y * {to}")
                        );
                        k
                    ]
                })
                .collect())
        }
    }

    /// A planted sandbox: an edit resolves only when it writes `y * 3`; records what it ran.
    #[derive(Default)]
    struct FakeSandbox {
        ran: Vec<String>,
    }

    impl EditExecutor for FakeSandbox {
        fn execute(
            &mut self,
            jobs: &[(&SubtaskRecord, &str)],
        ) -> anyhow::Result<Vec<Option<exec::ExecFeedback>>> {
            Ok(jobs
                .iter()
                .map(|(_, a)| {
                    self.ran.push(a.to_string());
                    let ok = a.contains("y * 3");
                    Some(exec::ExecFeedback {
                        resolved: ok,
                        status: if ok { "resolved" } else { "unresolved" }.into(),
                        still_failing: if ok {
                            vec![]
                        } else {
                            vec!["test_scale".into()]
                        },
                        exception: (!ok).then(|| "AssertionError: 8 != 6".into()),
                        ..exec::ExecFeedback::default()
                    })
                })
                .collect())
        }
    }

    /// Records the feedback it was shown.
    #[derive(Default)]
    struct Recorder {
        seen: Vec<String>,
    }

    impl Diagnoser for Recorder {
        fn name(&self) -> String {
            "recorder".into()
        }
        fn diagnose(
            &mut self,
            cases: &[Case<'_>],
            max_words: usize,
            seed: u64,
        ) -> anyhow::Result<Vec<Option<Diagnosis>>> {
            self.seen
                .extend(cases.iter().map(|c| c.failure.feedback_text()));
            diagnose::RuleDiagnoser.diagnose(cases, max_words, seed)
        }
    }

    #[test]
    fn execution_feeds_the_diagnoser_and_refuses_recovered_edits_that_do_not_resolve() {
        let recs = [record(Subtask::Edit, "e")];
        let items: Vec<TeacherItem<'_>> = recs
            .iter()
            .map(|r| TeacherItem {
                record: r,
                problem: "Totals are off.",
            })
            .collect();
        // Stage 1: an edit on the right line that overlaps but failed execution.
        let samples = vec![vec![edit_answer(
            "pkg/core.py",
            "    return y * 2",
            "    return y * 4",
        )]];
        let executed = vec![vec![false]];
        let round = Round {
            items: &items,
            samples: &samples,
            edit_reward: EditReward::LineFbeta,
            seed: 1,
            executed: Some(&executed),
        };
        let (mut sandbox, mut diag) = (FakeSandbox::default(), Recorder::default());
        let mut lib = SkillLibrary::new();
        let out = run_stage(
            &mut EditTeacher,
            &mut diag,
            &round,
            &mut lib,
            &FailForgeConfig::default(),
            Some(&mut sandbox),
        )
        .unwrap();
        let r = &out.report;
        let e = &r.subtasks["edit"];
        assert_eq!(e.failed, 1);
        assert!(
            diag.seen[0].contains("failed_execution")
                && diag.seen[0].contains("AssertionError: 8 != 6"),
            "{:?}",
            diag.seen
        );
        // The plain retry's `y * 4` overlaps the right line but is refused by execution.
        assert_eq!((e.recovered, e.recovered_plain), (1, 0));
        assert_eq!((r.exec_refused, r.exec_refused_plain), (0, 1));
        assert!(out.plain_retry.is_empty());
        assert_eq!(r.exec_runs, 3);
        assert_eq!(sandbox.ran.len(), 3);
        // Without the sandbox the same round keeps the overlapping edit, and counts no failure.
        let round = Round {
            executed: None,
            ..round
        };
        let out = run_stage(
            &mut EditTeacher,
            &mut Recorder::default(),
            &round,
            &mut SkillLibrary::new(),
            &FailForgeConfig::default(),
            None,
        )
        .unwrap();
        assert_eq!(out.report.subtasks["edit"].failed, 0);
    }
}
