//! Diagnosers turn a failure's feedback into a short diagnosis and a skill: an imperative of at most
//! a few words that would have avoided the failure. Three kinds sit behind one trait: built-in rules
//! over the feedback ([`RuleDiagnoser`]), and any [`Teacher`] asked to diagnose in words
//! ([`TeacherDiagnoser`]: a local model run by sorft or an OpenAI-compatible endpoint).

use serde::{Deserialize, Serialize};

use crate::rft::failforge::evidence::IssueEvidence;
use crate::rft::failforge::feedback::Failure;
use crate::rft::teacher::{Teacher, TeacherItem};
use crate::swe::answer;
use crate::swe::codemap::{is_test_path, DefKind};
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// A diagnosis of one failure and the skill distilled from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The rule that fired (built-in) or the diagnoser's name.
    pub rule: String,
    /// What went wrong, in a sentence.
    pub summary: String,
    /// The skill: an imperative of at most `max_words` words.
    pub skill: String,
}

/// One failure to diagnose, with the prompt it failed on.
#[derive(Clone, Copy, Debug)]
pub struct Case<'a> {
    /// The failure and its feedback.
    pub failure: &'a Failure,
    /// The prompt (record and issue text).
    pub item: TeacherItem<'a>,
}

/// Something that diagnoses failures.
pub trait Diagnoser {
    /// A short name for reports.
    fn name(&self) -> String;
    /// A diagnosis per case (`None` when it has nothing to say), deterministic in `seed` where the
    /// diagnoser allows; skills are cut to `max_words` words.
    fn diagnose(
        &mut self,
        cases: &[Case<'_>],
        max_words: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Option<Diagnosis>>>;
}

/// `text` cut to its first `max_words` whitespace-separated words.
pub fn clip_words(text: &str, max_words: usize) -> String {
    text.split_whitespace()
        .take(max_words.max(1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The built-in diagnoser: named rules over the zero reasons, the answers, their execution feedback
/// and the issue's evidence, tried in order; the first that applies writes the diagnosis. Every
/// skill it writes uses the fixed vocabulary of [`crate::rft::failforge::follow::VOCABULARY`] and
/// quotes nothing from the issue (so it can name no ground truth).
#[derive(Clone, Debug, Default)]
pub struct RuleDiagnoser;

/// The names of the built-in rules, in the order they are tried.
pub const RULES: &[&str] = &[
    "format",
    "invented_target",
    "unknown_file",
    "search_not_found",
    "no_op_edit",
    "test_file",
    "class_not_method",
    "non_code_line",
    "exec_crash",
    "exec_broke_passing",
    "exec_still_failing",
    "traceback",
    "import",
    "call",
    "wrong_expression",
    "reread_issue",
];

fn line_text<'r>(rec: &'r SubtaskRecord, path: &str, line: usize) -> Option<&'r str> {
    let w = rec.shown.windows.iter().find(|w| w.contains(path, line))?;
    w.text.lines().nth(line - w.start_line)
}

fn is_non_code(line: &str) -> bool {
    let t = line.trim();
    t.is_empty()
        || t.starts_with('#')
        || t.starts_with("def ")
        || t.starts_with("class ")
        || t.starts_with('@')
        || t.starts_with("\"\"\"")
}

/// Whether every failed edit only adds comments (or changes nothing but whitespace).
fn cosmetic_edits(f: &Failure) -> bool {
    let strip = |s: &str| -> String {
        s.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let blocks: Vec<_> = f
        .answers
        .iter()
        .flat_map(|a| answer::parse_edit(&a.text))
        .collect();
    !blocks.is_empty() && blocks.iter().all(|b| strip(&b.search) == strip(&b.replace))
}

fn rule(name: &str, summary: String, skill: String) -> Option<Diagnosis> {
    Some(Diagnosis {
        rule: name.to_string(),
        summary,
        skill,
    })
}

impl RuleDiagnoser {
    /// The diagnosis of one case (every failure gets one: the last rule always applies).
    pub fn diagnose_one(&self, case: &Case<'_>) -> Diagnosis {
        let f = case.failure;
        let reason = f.dominant_reason();
        let n = f.answers.len();
        let d = apply_rules(
            f,
            case.item.record,
            reason,
            &IssueEvidence::of(case.item.problem),
        );
        d.unwrap_or_else(|| Diagnosis {
            rule: "reread_issue".into(),
            summary: format!("{n} answers missed the target ({reason})"),
            skill: "Compare the issue's expected and actual behaviour and choose the target that produces the actual one.".into(),
        })
    }
}

/// The rules about the answer's form and its apply errors (`format` .. `non_code_line`).
fn form_rules(f: &Failure, rec: &SubtaskRecord, reason: &str) -> Option<Diagnosis> {
    let n = f.answers.len();
    let all = |p: &dyn Fn(&str) -> bool| f.answers.iter().all(|a| p(&a.text));
    match (f.subtask, reason) {
        (_, "empty_answer" | "format_error") => rule(
            "format",
            format!("{n} answers could not be parsed"),
            "End with the final answer in the exact fenced format the prompt shows, copying each target verbatim.".into(),
        ),
        (_, "invented_target") => rule(
            "invented_target",
            format!("{n} answers named targets the prompt did not show"),
            "Copy every answer target verbatim from the prompt's listing; never name a path, definition or line it did not show.".into(),
        ),
        (Subtask::Edit, "unknown_file") => rule(
            "unknown_file",
            "the edits named files whose code was not shown".into(),
            "Edit only files whose code the prompt shows, copying their paths verbatim.".into(),
        ),
        (Subtask::Edit, "search_not_found") => rule(
            "search_not_found",
            "SEARCH texts did not match the shown code".into(),
            "Copy SEARCH lines verbatim from the shown code, indentation included, and keep them short.".into(),
        ),
        (Subtask::Edit, _) if reason == "no_change" || cosmetic_edits(f) => rule(
            "no_op_edit",
            "the edits changed no logic (no change, or comments only)".into(),
            "Change the operator of a comparison, bound or arithmetic; an edit that only adds a comment fixes nothing.".into(),
        ),
        (Subtask::File, _)
            if all(&|t| {
                let fs = answer::parse_files(t);
                !fs.is_empty() && fs.iter().all(|p| is_test_path(p))
            }) =>
        {
            rule(
                "test_file",
                "every answer named only test files".into(),
                "Fix library code, not tests: leave test files out of the answer.".into(),
            )
        }
        (Subtask::Function, _)
            if all(&|t| {
                let fs = answer::parse_functions(t);
                !fs.is_empty()
                    && fs.iter().all(|l| {
                        rec.shown.functions.iter().any(|s| {
                            s.path == l.path && s.name == l.name && s.kind == DefKind::Class
                        })
                    })
            }) =>
        {
            rule(
                "class_not_method",
                "every answer named a class rather than a method".into(),
                "Name the method that computes the wrong value, not its enclosing class.".into(),
            )
        }
        (Subtask::Line, _)
            if all(&|t| {
                let ls = answer::parse_lines(t);
                !ls.is_empty()
                    && ls
                        .iter()
                        .all(|l| line_text(rec, &l.path, l.line).is_none_or(is_non_code))
            }) =>
        {
            rule(
                "non_code_line",
                "every answer pointed at a header, decorator, comment or blank line".into(),
                "Point at a statement that computes a value, not at a definition header, decorator or comment.".into(),
            )
        }
        _ => None,
    }
}

/// The rules over the sandbox's execution feedback of failed edits.
fn exec_rules(f: &Failure, ev: &IssueEvidence) -> Option<Diagnosis> {
    if f.subtask != Subtask::Edit {
        return None;
    }
    let crash = f.exec().find_map(|e| {
        e.exception_type().filter(|t| {
            *t != "AssertionError" && (t.ends_with("Error") || t.ends_with("Exception"))
        })
    });
    if let Some(t) = crash {
        return rule(
            "exec_crash",
            format!("the edited code raised {t} when the tests ran"),
            "Make the smallest change: alter one operator and keep the line's names and types so the code still runs.".into(),
        );
    }
    if let Some(e) = f.exec().find(|e| !e.broken.is_empty()) {
        return rule(
            "exec_broke_passing",
            format!("the edit broke {} tests that passed before", e.broken.len()),
            "Make the smallest change: alter one operator so the behaviour passing tests rely on stays.".into(),
        );
    }
    let e = f.exec().find(|e| !e.still_failing.is_empty())?;
    let summary = format!(
        "the edit ran but {} failing tests still fail ({})",
        e.still_failing.len(),
        e.exception.as_deref().unwrap_or("no exception line")
    );
    let skill = if ev.deepest_repo_frame().is_some() {
        "The failing tests still fail: edit the line the traceback's last frame names, at its comparison, bound or arithmetic."
    } else if !ev.calls.is_empty() {
        "The failing tests still fail: edit inside the definition the issue's snippet calls, at its comparison, bound or arithmetic."
    } else {
        "The failing tests still fail: change the comparison, bound or arithmetic of the line using the issue's own words."
    };
    rule("exec_still_failing", summary, skill.into())
}

/// The rules over the issue's evidence (`traceback` .. `wrong_expression`).
fn evidence_rules(f: &Failure, ev: &IssueEvidence) -> Option<Diagnosis> {
    match f.subtask {
        Subtask::File | Subtask::Function | Subtask::Line if ev.deepest_repo_frame().is_some() => {
            rule(
                "traceback",
                "the answers missed the code the issue's traceback points at".into(),
                "Open the code the traceback's last frame names first; the error surfaces there.".into(),
            )
        }
        Subtask::File | Subtask::Function if !ev.imports.is_empty() => rule(
            "import",
            format!("the answers ignored the module the issue's snippet imports ({})", ev.imports[0]),
            "Open the module the issue's snippet imports before any module that merely looks similar.".into(),
        ),
        Subtask::Function if !ev.calls.is_empty() => rule(
            "call",
            format!(
                "the answers missed the definition behind the issue's call {}(",
                ev.calls[ev.calls.len() - 1]
            ),
            "Choose the definition the issue's snippet calls, not a helper with a similar name.".into(),
        ),
        Subtask::Line | Subtask::Edit => rule(
            "wrong_expression",
            "the answers targeted lines that do not produce the reported value".into(),
            "Pick the line whose comparison, bound or arithmetic yields the value the issue reports as wrong.".into(),
        ),
        _ => None,
    }
}

/// The first rule that applies, in the order of [`RULES`] (without the fallback).
fn apply_rules(
    f: &Failure,
    rec: &SubtaskRecord,
    reason: &str,
    ev: &IssueEvidence,
) -> Option<Diagnosis> {
    form_rules(f, rec, reason)
        .or_else(|| exec_rules(f, ev))
        .or_else(|| evidence_rules(f, ev))
}

impl Diagnoser for RuleDiagnoser {
    fn name(&self) -> String {
        "rules".into()
    }

    fn diagnose(
        &mut self,
        cases: &[Case<'_>],
        max_words: usize,
        _seed: u64,
    ) -> anyhow::Result<Vec<Option<Diagnosis>>> {
        Ok(cases
            .iter()
            .map(|c| {
                let mut d = self.diagnose_one(c);
                d.skill = clip_words(&d.skill, max_words);
                Some(d)
            })
            .collect())
    }
}

/// The prompt a [`TeacherDiagnoser`] sends: the issue, the subtask, the failed answers and why
/// they failed, and the answer format (`Diagnosis:` and `Skill:` lines).
pub fn diagnosis_prompt(case: &Case<'_>, max_words: usize) -> String {
    format!(
        "Earlier attempts at one step of fixing a GitHub issue failed. Explain why, and write a lesson \
for similar issues.\n\n### GitHub Problem Description ###\n{}\n\n### Step ###\n{} localization or editing ({})\n\n\
### Failed answers and why they were rejected ###\n{}\n\n###\n\nReply with exactly two lines:\nDiagnosis: <what went wrong, one sentence>\n\
Skill: <an imperative of at most {max_words} words that avoids this kind of failure on similar issues; \
do not name the correct file, function, line or code>\n",
        case.item.problem.trim_end(),
        case.failure.subtask.name(),
        case.failure.dominant_reason(),
        case.failure.feedback_text(),
    )
}

/// The `Diagnosis:` and `Skill:` lines of a reply (`None` without a non-empty skill).
pub fn parse_reply(reply: &str, name: &str, max_words: usize) -> Option<Diagnosis> {
    let field = |key: &str| {
        reply.lines().find_map(|l| {
            let t = l.trim().trim_start_matches(['*', '-', ' ']);
            let (k, v) = t.split_once(':')?;
            (k.trim().trim_matches('*').eq_ignore_ascii_case(key))
                .then(|| v.trim().trim_start_matches(['*', ' ']).to_string())
        })
    };
    let skill = clip_words(&field("skill")?, max_words);
    if skill.is_empty() {
        return None;
    }
    Some(Diagnosis {
        rule: name.to_string(),
        summary: field("diagnosis").unwrap_or_default(),
        skill,
    })
}

/// Any teacher (a local model, an OpenAI-compatible endpoint) asked to diagnose in words: it
/// receives [`diagnosis_prompt`] as the prompt and its reply is read by [`parse_reply`].
pub struct TeacherDiagnoser<'t> {
    /// The teacher that writes the diagnosis.
    pub teacher: &'t mut dyn Teacher,
}

impl Diagnoser for TeacherDiagnoser<'_> {
    fn name(&self) -> String {
        format!("teacher:{}", self.teacher.name())
    }

    fn diagnose(
        &mut self,
        cases: &[Case<'_>],
        max_words: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Option<Diagnosis>>> {
        let records: Vec<SubtaskRecord> = cases
            .iter()
            .map(|c| SubtaskRecord {
                prompt: diagnosis_prompt(c, max_words),
                ..c.item.record.clone()
            })
            .collect();
        let items: Vec<TeacherItem<'_>> = records
            .iter()
            .zip(cases)
            .map(|(r, c)| TeacherItem {
                record: r,
                problem: c.item.problem,
            })
            .collect();
        let replies = self.teacher.sample(&items, 1, seed)?;
        let name = self.name();
        Ok(replies
            .iter()
            .map(|r| r.first().and_then(|t| parse_reply(t, &name, max_words)))
            .chain(std::iter::repeat(None))
            .take(cases.len())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rft::failforge::exec::ExecFeedback;
    use crate::rft::failforge::fixtures::{edit_answer, failure, line_answer, record, truth};
    use crate::rft::failforge::follow::directives;
    use crate::rft::failforge::leakage::{find_leak, LeakKind};

    const PLAIN: &str = "Scaling gives the wrong number.\nExpected 9, got 6.";

    fn diagnose_with(
        subtask: Subtask,
        problem: &str,
        answers: &[&str],
        exec: Option<ExecFeedback>,
    ) -> Diagnosis {
        let rec = record(subtask, "i1");
        let mut f = failure(&rec, problem, answers);
        for a in &mut f.answers {
            a.exec = exec.clone();
        }
        let case = Case {
            failure: &f,
            item: TeacherItem {
                record: &rec,
                problem,
            },
        };
        let mut d = RuleDiagnoser.diagnose(&[case], 24, 0).unwrap();
        d.remove(0).unwrap()
    }

    fn diagnose(subtask: Subtask, problem: &str, answers: &[&str]) -> Diagnosis {
        diagnose_with(subtask, problem, answers, None)
    }

    fn ran(exception: &str, still: &[&str], broken: &[&str]) -> Option<ExecFeedback> {
        Some(ExecFeedback {
            status: "unresolved".into(),
            still_failing: still.iter().map(|s| s.to_string()).collect(),
            broken: broken.iter().map(|s| s.to_string()).collect(),
            exception: Some(exception.into()),
            frames: vec!["pkg/core.py:3 in scale".into()],
            ..ExecFeedback::default()
        })
    }

    #[test]
    fn each_rule_fires_on_its_failure_and_writes_a_followable_clean_skill() {
        let file = |p: &str| format!("<think>t</think>\n```\n{p}\n```");
        let tb = "Crash:\nTraceback (most recent call last):\n  File \"/usr/lib/python3.11/runpy.py\", line 1, in run\n  File \"/home/u/acme/pkg/core.py\", line 3, in scale\nValueError";
        let imp = "Wrong result:\n```python\nfrom pkg import core\ncore.scale(4)\n```";
        let calls = "Calling helper2(3) gives the wrong number.";
        let e = |s: &str, r: &str| edit_answer("pkg/core.py", s, r);
        let wrong_edit = e("    y = x + 1", "    y = x - 1");
        type Case4 = (
            Subtask,
            &'static str,
            Vec<String>,
            Option<ExecFeedback>,
            &'static str,
        );
        let cases: Vec<Case4> = vec![
            (
                Subtask::File,
                PLAIN,
                vec!["I have no idea.".into()],
                None,
                "format",
            ),
            (
                Subtask::File,
                PLAIN,
                vec![file("pkg/nothere.py")],
                None,
                "invented_target",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![edit_answer("pkg/other.py", "    y = x + 1", "    y = x")],
                None,
                "unknown_file",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![e("    return z", "    return y")],
                None,
                "search_not_found",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![e("    y = x + 1", "    y = x + 1  # reviewed")],
                None,
                "no_op_edit",
            ),
            (
                Subtask::File,
                tb,
                vec![file("tests/test_core.py")],
                None,
                "test_file",
            ),
            (
                Subtask::Function,
                imp,
                vec!["```\npkg/core.py\nclass: Parser\n```".into()],
                None,
                "class_not_method",
            ),
            (
                Subtask::Line,
                PLAIN,
                vec![line_answer(1)],
                None,
                "non_code_line",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![wrong_edit.clone()],
                ran("TypeError: unsupported operand", &["test_scale"], &[]),
                "exec_crash",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![wrong_edit.clone()],
                ran("AssertionError: 6 != 9", &["test_scale"], &["test_other"]),
                "exec_broke_passing",
            ),
            (
                Subtask::Edit,
                calls,
                vec![wrong_edit.clone()],
                ran("AssertionError: 6 != 9", &["test_scale"], &[]),
                "exec_still_failing",
            ),
            (
                Subtask::File,
                tb,
                vec![file("pkg/util.py")],
                None,
                "traceback",
            ),
            (
                Subtask::File,
                imp,
                vec![file("pkg/util.py")],
                None,
                "import",
            ),
            (
                Subtask::Function,
                calls,
                vec!["```\npkg/core.py\nfunction: helper\n```".into()],
                None,
                "call",
            ),
            (
                Subtask::Line,
                PLAIN,
                vec![line_answer(2)],
                None,
                "wrong_expression",
            ),
            (
                Subtask::Edit,
                PLAIN,
                vec![wrong_edit.clone()],
                None,
                "wrong_expression",
            ),
            (
                Subtask::File,
                PLAIN,
                vec![file("pkg/util.py")],
                None,
                "reread_issue",
            ),
        ];
        let mut fired = std::collections::BTreeSet::new();
        for (st, problem, answers, exec, want) in cases {
            let refs: Vec<&str> = answers.iter().map(String::as_str).collect();
            let d = diagnose_with(st, problem, &refs, exec);
            assert_eq!(d.rule, want, "{st:?} {answers:?}: {d:?}");
            assert!(d.skill.split_whitespace().count() <= 24, "{d:?}");
            assert!(!d.summary.is_empty());
            assert!(
                !directives(&d.skill).is_empty(),
                "not in the vocabulary: {d:?}"
            );
            assert_eq!(find_leak(&d.skill, &truth()), None, "{d:?}");
            fired.insert(d.rule);
        }
        assert_eq!(fired.len(), RULES.len(), "every rule has a case");
        assert!(RULES.len() >= 16);
    }

    #[test]
    fn execution_feedback_reaches_the_feedback_text() {
        let rec = record(Subtask::Edit, "i1");
        let mut f = failure(
            &rec,
            PLAIN,
            &[&edit_answer(
                "pkg/core.py",
                "    y = x + 1",
                "    y = x - 1",
            )],
        );
        f.answers[0].exec = ran("AssertionError: 6 != 9", &["test_scale"], &[]);
        let t = f.feedback_text();
        assert!(
            t.contains("still failing test_scale")
                && t.contains("AssertionError: 6 != 9")
                && t.contains("pkg/core.py:3 in scale"),
            "{t}"
        );
    }

    #[test]
    fn a_diagnoser_that_quotes_the_traceback_leaks_and_the_check_sees_it() {
        // Planted: the old traceback skill quoted the frame's path.
        let leaky = "Follow the traceback: its deepest repository frame, /home/u/acme/pkg/core.py, names the file to open first.";
        assert_eq!(
            find_leak(leaky, &truth()).map(|l| l.kind),
            Some(LeakKind::Path)
        );
        let tb = "Crash:\n  File \"/home/u/acme/pkg/core.py\", line 3, in scale\nValueError";
        let d = diagnose(Subtask::File, tb, &["```\npkg/util.py\n```"]);
        assert_eq!(d.rule, "traceback");
        assert_eq!(find_leak(&d.skill, &truth()), None);
    }

    #[test]
    fn replies_of_model_diagnosers_are_parsed_and_clipped() {
        let d = parse_reply(
            "Some preamble.\n**Diagnosis:** picked a helper.\nSkill: Open the function the issue calls before any helper it uses, always, every time, no exceptions at all",
            "teacher:x",
            8,
        )
        .unwrap();
        assert_eq!(d.summary, "picked a helper.");
        assert_eq!(d.skill, "Open the function the issue calls before any");
        assert_eq!(parse_reply("Diagnosis: no idea", "x", 8), None);
        assert_eq!(parse_reply("Skill:   ", "x", 8), None);
    }
}
