//! A built-in teacher of multi-step trajectories with realistic flaws: besides reasoning that
//! quotes the issue (the built-in teacher's thoughts) and answers, it takes detours into other
//! shown files, definitions and lines, repeats itself, and peeks ahead: it cites facts of later
//! stages (a definition before the file is chosen, the faulty code before the function, a fix
//! before the line) that a real teacher would have guessed or leaked, sometimes inside an answer;
//! and it sometimes commits to a wrong target. It builds on its own earlier answers (`anchor`):
//! the function stage looks in the files it chose, the line stage in those files, and the edit
//! changes the line it located, so a chain that got the line right can reach the fix. It is
//! blinded: the records it reads have their ground truth and gold patch removed.

use crate::engine::rng::{random_u64, SplitMix};
use crate::rft::teacher::{BuiltinTeacher, Teacher, TeacherItem};
use crate::swe::subtask::{Subtask, SubtaskRecord};
use crate::swe::truth::GroundTruth;

use super::trajectory::{current_stage, Step, StepKind};

/// One instance as the teacher sees it: its stage records without ground truth, and the issue.
#[derive(Clone, Debug)]
pub struct BlindInstance {
    /// Records in chain order, blinded.
    pub records: Vec<SubtaskRecord>,
    /// The issue text.
    pub problem: String,
}

impl BlindInstance {
    /// Copies `records` (any order) without their ground truth and gold patch.
    pub fn new(records: &[&SubtaskRecord], problem: &str) -> Self {
        let mut records: Vec<SubtaskRecord> = records
            .iter()
            .map(|r| SubtaskRecord {
                truth: GroundTruth::default(),
                gold_patch: String::new(),
                ..(*r).clone()
            })
            .collect();
        records.sort_by_key(|r| r.subtask);
        Self {
            records,
            problem: problem.to_string(),
        }
    }

    /// The chain's stages.
    pub fn chain(&self) -> Vec<Subtask> {
        self.records.iter().map(|r| r.subtask).collect()
    }

    fn record(&self, stage: Subtask) -> Option<&SubtaskRecord> {
        self.records.iter().find(|r| r.subtask == stage)
    }
}

/// Probabilities of the flawed teacher's moves (each a per-step rate; the flaws are tried in
/// the order repeat, detour, peek, wrong answer, leak, then a cited failure, then the plan).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlawedTeacher {
    /// Softness of the underlying built-in teacher's choices.
    pub temperature: f64,
    /// A detour: reasoning about another shown file, definition or line.
    pub detour: f64,
    /// Repeating the previous step.
    pub repeat: f64,
    /// Reasoning that cites a fact of a later stage.
    pub peek: f64,
    /// An answer that commits to another shown target (a wrong file, definition or line).
    pub wrong: f64,
    /// An answer whose prose cites a fact of a later stage before its block.
    pub leak: f64,
    /// At the line and edit stages, reasoning that quotes the failure the issue reports.
    pub cite: f64,
    /// Answering the plan of its last reasoning step (else it reasons again).
    pub follow: f64,
    /// Building on its own earlier answers (the chosen files, the located line).
    pub anchor: f64,
}

impl Default for FlawedTeacher {
    fn default() -> Self {
        Self {
            temperature: 0.7,
            detour: 0.15,
            repeat: 0.1,
            peek: 0.1,
            wrong: 0.05,
            leak: 0.05,
            cite: 0.15,
            follow: 0.6,
            anchor: 0.8,
        }
    }
}

/// The built-in teacher's thought and answer for a record.
fn builtin_sample(
    temperature: f64,
    rec: &SubtaskRecord,
    problem: &str,
    seed: u64,
) -> (String, String) {
    let mut t = BuiltinTeacher { temperature };
    let item = TeacherItem {
        record: rec,
        problem,
    };
    let text = t
        .sample(&[item], 1, seed)
        .ok()
        .and_then(|mut v| v.pop())
        .and_then(|mut v| v.pop())
        .unwrap_or_default();
    match text.split_once("</think>") {
        Some((th, ans)) => (
            th.trim_start_matches("<think>").trim().to_string(),
            ans.trim().to_string(),
        ),
        None => (String::new(), text.trim().to_string()),
    }
}

/// Shown lines of code of a record's windows, `(path, number, code)`, blank lines left out.
fn shown_lines(rec: &SubtaskRecord) -> Vec<(String, usize, String)> {
    rec.shown
        .windows
        .iter()
        .flat_map(|w| {
            w.text
                .lines()
                .enumerate()
                .filter(|(_, l)| l.trim().len() > 3)
                .map(|(k, l)| (w.path.clone(), w.start_line + k, l.trim().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn choose<'a, T>(rng: &mut SplitMix, v: &'a [T]) -> Option<&'a T> {
    (!v.is_empty()).then(|| &v[rng.below(v.len() as u64) as usize])
}

/// The answer a trajectory gave at `stage`, if any.
fn answered(prefix: &[Step], stage: Subtask) -> Option<&str> {
    prefix
        .iter()
        .find(|s| s.stage == stage && s.kind == StepKind::Answer)
        .map(|s| s.text.as_str())
}

/// `rec` narrowed to the files the trajectory chose at the file stage (the function stage's
/// definitions, the line stage's windows); `None` when the answer names none of them.
fn narrowed(rec: &SubtaskRecord, prefix: &[Step]) -> Option<SubtaskRecord> {
    let files = crate::swe::answer::parse_files(answered(prefix, Subtask::File)?);
    let mut r = rec.clone();
    r.shown.functions.retain(|f| files.contains(&f.path));
    r.shown.windows.retain(|w| files.contains(&w.path));
    let any = match rec.subtask {
        Subtask::Function => !r.shown.functions.is_empty(),
        Subtask::Line => !r.shown.windows.is_empty(),
        _ => false,
    };
    any.then_some(r)
}

/// An edit of the line the trajectory located at the line stage, as `(thought, answer)`:
/// one of the teacher's known changes of that line, as shown in `rec`'s windows.
fn anchored_edit(
    rec: &SubtaskRecord,
    prefix: &[Step],
    rng: &mut SplitMix,
) -> Option<(String, String)> {
    let lines = crate::swe::answer::parse_lines(answered(prefix, Subtask::Line)?);
    let l = lines.first()?;
    let code = rec.shown.windows.iter().find_map(|w| {
        (w.path == l.path && l.line >= w.start_line)
            .then(|| w.text.lines().nth(l.line - w.start_line))
            .flatten()
    })?;
    let options = crate::rft::teacher::mutations_of(code);
    let new = choose(rng, &options)?;
    Some((
        format!(
            "Line {} of {} is where the value goes wrong; changing `{}` to `{}` gives the expected behaviour.",
            l.line,
            l.path,
            code.trim(),
            new.trim()
        ),
        format!(
            "```python\n### {}\n<<<<<<< SEARCH\n{code}\n=======\n{new}\n>>>>>>> REPLACE\n```",
            l.path
        ),
    ))
}

impl FlawedTeacher {
    /// A detour: another shown target of the stage, named without reason to.
    fn detour_step(&self, rec: &SubtaskRecord, rng: &mut SplitMix) -> Option<Step> {
        let text = match rec.subtask {
            Subtask::File => {
                let f = choose(rng, &rec.shown.files)?;
                format!("Let me also look at {f}; it might be involved.")
            }
            Subtask::Function => {
                let f = choose(rng, &rec.shown.functions)?;
                format!(
                    "`{}` in {} could also be responsible, let me check it.",
                    f.name, f.path
                )
            }
            Subtask::Line | Subtask::Edit => {
                let (p, n, code) = choose(rng, &shown_lines(rec))?.clone();
                format!("Line {n} of {p}, `{code}`, looks suspicious too.")
            }
        };
        Some(Step::reason(rec.subtask, &text))
    }

    /// A wrong answer: another shown target of the stage, committed to.
    fn wrong_answer(&self, rec: &SubtaskRecord, rng: &mut SplitMix) -> Option<Step> {
        let text = match rec.subtask {
            Subtask::File => format!("```\n{}\n```", choose(rng, &rec.shown.files)?),
            Subtask::Function => {
                let f = choose(rng, &rec.shown.functions)?;
                format!("```\n{}\n{}: {}\n```", f.path, f.kind.word(), f.name)
            }
            Subtask::Line => {
                let (p, n, _) = choose(rng, &shown_lines(rec))?.clone();
                format!("```\n{p}\nline: {n}\n```")
            }
            Subtask::Edit => return None,
        };
        Some(Step::answer(rec.subtask, &text))
    }

    /// A peek: a fact of a later stage, cited before it was shown.
    fn peek_step(&self, inst: &BlindInstance, stage: Subtask, rng: &mut SplitMix) -> Option<Step> {
        let later: Vec<&SubtaskRecord> =
            inst.records.iter().filter(|r| r.subtask > stage).collect();
        let rec = *choose(rng, &later)?;
        let text = match rec.subtask {
            Subtask::File => return None,
            Subtask::Function => {
                let f = choose(rng, &rec.shown.functions)?;
                format!("The problem must be inside `{}`.", f.name)
            }
            Subtask::Line => {
                let (_, _, code) = choose(rng, &shown_lines(rec))?.clone();
                format!("The culprit is `{code}`.")
            }
            Subtask::Edit => {
                let (_, _, code) = choose(rng, &shown_lines(rec))?.clone();
                let (_, ans) = builtin_sample(self.temperature, rec, &inst.problem, rng.next_u64());
                let new = crate::swe::answer::parse_edit(&ans)
                    .first()
                    .map(|b| b.replace.trim().to_string())
                    .unwrap_or(code);
                format!("It should read `{new}`.")
            }
        };
        Some(Step::reason(stage, &text))
    }

    /// The next step after `prefix`, or `None` once every stage is answered.
    pub fn next_step(
        &self,
        inst: &BlindInstance,
        prefix: &[Step],
        rng: &mut SplitMix,
    ) -> Option<Step> {
        let stage = current_stage(&inst.chain(), prefix)?;
        let rec = inst.record(stage)?;
        let in_stage: Vec<&Step> = prefix.iter().filter(|s| s.stage == stage).collect();
        let plan = in_stage.iter().rev().find_map(|s| s.plan.clone());
        let last = prefix.last().filter(|s| s.kind == StepKind::Reason);
        let u = rng.next_f64();
        let mut acc = 0.0;
        let mut hit = |p: f64| {
            acc += p;
            u < acc
        };
        if hit(self.repeat) {
            if let Some(l) = last {
                return Some(Step::reason(stage, &l.text));
            }
        }
        if hit(self.detour) {
            if let Some(s) = self.detour_step(rec, rng) {
                return Some(s);
            }
        }
        if hit(self.peek) {
            if let Some(s) = self.peek_step(inst, stage, rng) {
                return Some(s);
            }
        }
        if hit(self.wrong) {
            if let Some(s) = self.wrong_answer(rec, rng) {
                return Some(s);
            }
        }
        if let Some(p) = &plan {
            if hit(self.leak) {
                if let Some(s) = self.peek_step(inst, stage, rng) {
                    return Some(Step::answer(stage, &format!("{}\n{p}", s.text)));
                }
            }
        }
        if matches!(stage, Subtask::Line | Subtask::Edit) && hit(self.cite) {
            let msgs = super::reverse::failure_messages(&inst.problem);
            if let Some(m) = choose(rng, &msgs) {
                return Some(Step::reason(stage, &format!("The issue reports `{m}`.")));
            }
        }
        if let Some(p) = plan {
            if hit(self.follow) {
                return Some(Step::answer(stage, &p));
            }
        }
        let (thought, answer) = self.think(inst, rec, prefix, rng);
        let mut s = Step::reason(stage, &thought);
        s.plan = Some(answer);
        Some(s)
    }

    /// A fresh thought and the answer it plans: anchored on the trajectory's earlier answers
    /// with probability `anchor`, else the built-in teacher's on the whole record.
    fn think(
        &self,
        inst: &BlindInstance,
        rec: &SubtaskRecord,
        prefix: &[Step],
        rng: &mut SplitMix,
    ) -> (String, String) {
        if rng.next_f64() < self.anchor {
            let anchored = match rec.subtask {
                Subtask::Edit => anchored_edit(rec, prefix, rng),
                Subtask::Function | Subtask::Line => narrowed(rec, prefix)
                    .map(|r| builtin_sample(self.temperature, &r, &inst.problem, rng.next_u64())),
                Subtask::File => None,
            };
            if let Some(t) = anchored {
                return t;
            }
        }
        builtin_sample(self.temperature, rec, &inst.problem, rng.next_u64())
    }

    /// Up to `n` steps continuing `prefix`, deterministic in `seed`.
    pub fn continue_from(
        &self,
        inst: &BlindInstance,
        prefix: &[Step],
        n: usize,
        seed: u64,
    ) -> Vec<Step> {
        let mut rng = SplitMix::new(random_u64(seed, 0xf1a3, prefix.len() as u64));
        let mut all = prefix.to_vec();
        let mut out = Vec::new();
        while out.len() < n {
            let Some(s) = self.next_step(inst, &all, &mut rng) else {
                break;
            };
            all.push(s.clone());
            out.push(s);
        }
        out
    }
}
