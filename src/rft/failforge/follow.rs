//! A **simulated** skill-following teacher. The built-in teacher reads only the issue text and the
//! shown views, so a skill in its prompt changes none of its choices and FailForge's guided retry
//! cannot differ from a plain second attempt. This teacher stands in for a model that reads its
//! prompt: it parses the skill section of the prompt, maps the skill to directives through a fixed,
//! documented vocabulary ([`VOCABULARY`]: the phrases the rule diagnoser writes), and lets those
//! directives re-weight its choices. It uses only what the prompt shows (the issue text, the
//! listed files and definitions, the code windows), never the record's ground truth or gold patch.
//! Without a skill (the plain second attempt) it answers exactly as it does with a skill that has
//! no directive, so a difference between the two arms is the skill's alone. It is not a language
//! model: a gain measured with it shows that the skills carry usable direction, not that a model
//! would follow them.

use crate::engine::rng::{random_u64, SplitMix};
use crate::rft::failforge::evidence::IssueEvidence;
use crate::rft::failforge::retry::{SKILL_FOOTER, SKILL_HEADER};
use crate::rft::teacher::{file_stem, identifiers, mutations_of, Teacher, TeacherItem, CANNOT_FIX};
use crate::swe::codemap::{is_test_path, DefKind};
use crate::swe::subtask::{Subtask, SubtaskRecord};
use std::collections::BTreeSet;

/// What a skill tells the teacher to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Directive {
    /// Prefer the file, definition or line the issue's traceback's deepest repository frame names.
    TracebackFrame,
    /// Prefer the modules (and their definitions) the issue's `from pkg import mod` lines import.
    ImportedModule,
    /// Prefer the definitions (and the lines inside them) the issue's snippet calls.
    CalledDefinition,
    /// Never answer a test file.
    NoTests,
    /// Never answer a class when a method or function is listed.
    MethodNotClass,
    /// Prefer lines with a comparison, bound or arithmetic operator; avoid the others.
    OperatorLine,
    /// Edits: apply the single-operator change that alters the fewest characters.
    SmallestChange,
    /// Weigh the issue's own words twice as much.
    IssueWords,
    /// Reconsider: sample with twice the temperature instead of taking the first match.
    Explore,
    /// Copy targets verbatim (the simulated teacher always does: no change).
    Verbatim,
}

/// The vocabulary: a skill containing the phrase (case-insensitive) carries the directive. The
/// rule diagnoser's skills are written from these phrases.
pub const VOCABULARY: &[(&str, Directive)] = &[
    (
        "the traceback's last frame names",
        Directive::TracebackFrame,
    ),
    ("the issue's snippet imports", Directive::ImportedModule),
    ("the issue's snippet calls", Directive::CalledDefinition),
    ("the failing test calls", Directive::CalledDefinition),
    ("leave test files out", Directive::NoTests),
    ("not its enclosing class", Directive::MethodNotClass),
    ("comparison, bound or arithmetic", Directive::OperatorLine),
    ("statement that computes a value", Directive::OperatorLine),
    ("smallest change", Directive::SmallestChange),
    ("the issue's own words", Directive::IssueWords),
    ("expected and actual behaviour", Directive::Explore),
    ("verbatim", Directive::Verbatim),
];

/// The directives a skill carries, in vocabulary order, without repeats.
pub fn directives(skill: &str) -> BTreeSet<Directive> {
    let lower = skill.to_lowercase();
    VOCABULARY
        .iter()
        .filter(|(p, _)| lower.contains(p))
        .map(|(_, d)| *d)
        .collect()
}

/// The skill of a guided prompt (`None` for an unguided one).
pub fn prompt_skill(prompt: &str) -> Option<&str> {
    let rest = prompt.strip_prefix(SKILL_HEADER)?;
    rest.split_once(SKILL_FOOTER).map(|(s, _)| s.trim())
}

/// Comparison and arithmetic operators (what [`Directive::OperatorLine`] looks for).
const OPERATORS: &[&str] = &[
    " < ", " <= ", " > ", " >= ", " == ", " != ", " + ", " - ", " * ", " / ", " // ", " % ",
];

/// How many characters a change alters: the longer of the two middles left after the common
/// prefix and suffix.
fn change_size(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[pre..], &b[pre..]);
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    (a.len() - suf).max(b.len() - suf)
}

fn pick(rng: &mut SplitMix, scores: &[f64], temperature: f64) -> usize {
    let m = scores
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .fold(f64::MIN, f64::max);
    let w: Vec<f64> = scores
        .iter()
        .map(|s| {
            if s.is_finite() {
                ((s - m) / temperature.max(1e-6)).exp()
            } else {
                0.0
            }
        })
        .collect();
    let mut u = rng.next_f64() * w.iter().sum::<f64>();
    for (i, x) in w.iter().enumerate() {
        u -= x;
        if u <= 0.0 && *x > 0.0 {
            return i;
        }
    }
    w.iter().rposition(|x| *x > 0.0).unwrap_or(0)
}

/// Excludes the candidates `drop` marks, unless that would exclude them all.
fn exclude(scores: &mut [f64], drop: &dyn Fn(usize) -> bool) {
    if (0..scores.len()).any(|i| !drop(i)) {
        for (i, s) in scores.iter_mut().enumerate() {
            if drop(i) {
                *s = f64::NEG_INFINITY;
            }
        }
    }
}

/// What the teacher reads from one prompt.
struct View<'a> {
    record: &'a SubtaskRecord,
    words: BTreeSet<String>,
    ev: IssueEvidence,
    ds: BTreeSet<Directive>,
}

impl View<'_> {
    fn has(&self, d: Directive) -> bool {
        self.ds.contains(&d)
    }

    /// Whether `path` is the file of the issue traceback's deepest repository frame.
    fn frame_file(&self, path: &str) -> bool {
        self.ev
            .deepest_repo_frame()
            .is_some_and(|f| IssueEvidence::same_file(path, &f.path))
    }

    fn file(&self, rng: &mut SplitMix, temp: f64) -> String {
        let files = &self.record.shown.files;
        if files.is_empty() {
            return "<think>Nothing to choose from.</think>\n```\n```".into();
        }
        let mut scores: Vec<f64> = files
            .iter()
            .map(|f| {
                let stem_hit = self.words.contains(&file_stem(f));
                let mut s = if stem_hit { 3.0 } else { 0.0 };
                if self.ev.imports_path(f) {
                    s += if self.has(Directive::ImportedModule) {
                        6.0
                    } else {
                        2.0
                    };
                }
                if is_test_path(f) {
                    s -= 2.0;
                }
                if self.has(Directive::TracebackFrame) && self.frame_file(f) {
                    s += 4.0;
                }
                if self.has(Directive::IssueWords) && stem_hit {
                    s += 3.0;
                }
                s
            })
            .collect();
        if self.has(Directive::NoTests) {
            exclude(&mut scores, &|i| is_test_path(&files[i]));
        }
        let f = &files[pick(rng, &scores, temp)];
        let why = if self.frame_file(f) {
            "the issue's traceback passes through it"
        } else if self.ev.imports_path(f) {
            "the issue's snippet imports it"
        } else {
            "its name matches the issue best"
        };
        format!("<think>The fix belongs in {f}: {why}.</think>\n```\n{f}\n```")
    }

    fn function(&self, rng: &mut SplitMix, temp: f64) -> String {
        let fs = &self.record.shown.functions;
        if fs.is_empty() {
            return "<think>No definitions shown.</think>\n```\n```".into();
        }
        let frame = self.ev.deepest_repo_frame();
        let mut scores: Vec<f64> = fs
            .iter()
            .map(|f| {
                let hits = f
                    .name
                    .split('.')
                    .filter(|p| self.words.contains(&p.to_lowercase()))
                    .count() as f64;
                let mut s = hits
                    * if self.has(Directive::IssueWords) {
                        4.0
                    } else {
                        2.0
                    };
                if self.ev.calls_name(&f.name) {
                    s += if self.has(Directive::CalledDefinition) {
                        5.0
                    } else {
                        1.0
                    };
                }
                if self.words.contains(&file_stem(&f.path)) {
                    s += 0.5;
                }
                if f.kind == DefKind::Class {
                    s -= 0.5;
                }
                if self.has(Directive::TracebackFrame) && self.frame_file(&f.path) {
                    let last = f.name.rsplit('.').next().unwrap_or(&f.name);
                    s += if frame.is_some_and(|fr| fr.func == last) {
                        5.0
                    } else {
                        2.0
                    };
                }
                if self.has(Directive::ImportedModule) && self.ev.imports_path(&f.path) {
                    s += 3.0;
                }
                s
            })
            .collect();
        if self.has(Directive::MethodNotClass) {
            exclude(&mut scores, &|i| fs[i].kind == DefKind::Class);
        }
        let f = &fs[pick(rng, &scores, temp)];
        format!(
            "<think>`{}` in {} is where the behaviour the issue describes is computed.</think>\n```\n{}\n{}: {}\n```",
            f.name,
            f.path,
            f.path,
            f.kind.word(),
            f.name
        )
    }

    /// Code lines of the shown windows: (path, line number, text, enclosing `def` name).
    fn code_lines(&self) -> Vec<(String, usize, String, String)> {
        let mut out = Vec::new();
        for w in &self.record.shown.windows {
            let mut def = String::new();
            for (k, line) in w.text.lines().enumerate() {
                let t = line.trim();
                if let Some(rest) = t.strip_prefix("def ") {
                    def = rest.split('(').next().unwrap_or("").trim().to_string();
                }
                let skip = t.is_empty()
                    || t.starts_with('#')
                    || t.starts_with("def ")
                    || t.starts_with("class ")
                    || t.starts_with('@')
                    || t.starts_with("\"\"\"");
                if !skip {
                    out.push((
                        w.path.clone(),
                        w.start_line + k,
                        line.to_string(),
                        def.clone(),
                    ));
                }
            }
        }
        out
    }

    fn line_score(&self, path: &str, no: usize, text: &str, def: &str) -> f64 {
        let overlap = identifiers(text)
            .iter()
            .filter(|x| self.words.contains(*x))
            .count() as f64;
        let mut s = overlap
            * if self.has(Directive::IssueWords) {
                2.0
            } else {
                1.0
            };
        if !mutations_of(text).is_empty() {
            s += 1.0;
        }
        let t = text.trim();
        if t.starts_with("return") || t.starts_with("if ") {
            s += 0.5;
        }
        if self.has(Directive::OperatorLine) {
            s += if OPERATORS.iter().any(|o| text.contains(o)) {
                2.0
            } else {
                -2.0
            };
        }
        if self.has(Directive::TracebackFrame) && self.frame_file(path) {
            let at = self.ev.deepest_repo_frame().is_some_and(|f| f.line == no);
            s += if at { 4.0 } else { 1.5 };
        }
        if self.has(Directive::CalledDefinition) && !def.is_empty() && self.ev.calls_name(def) {
            s += 2.5;
        }
        s
    }

    fn line_or_edit(&self, rng: &mut SplitMix, temp: f64) -> String {
        let edit = self.record.subtask == Subtask::Edit;
        let mut cands = self.code_lines();
        if edit {
            cands.retain(|c| !mutations_of(&c.2).is_empty());
            if cands.is_empty() {
                return CANNOT_FIX.into();
            }
        }
        if cands.is_empty() {
            return "<think>No code shown.</think>\n```\n```".into();
        }
        let scores: Vec<f64> = cands
            .iter()
            .map(|(p, n, t, d)| self.line_score(p, *n, t, d))
            .collect();
        let (path, no, line, _) = &cands[pick(rng, &scores, temp)];
        if !edit {
            return format!(
                "<think>The wrong value comes from line {no} of {path}: `{}`.</think>\n```\n{path}\nline: {no}\n```",
                line.trim()
            );
        }
        let mut options = mutations_of(line);
        let new = if self.has(Directive::SmallestChange) {
            options.sort_by_key(|o| (change_size(line, o), o.clone()));
            options.swap_remove(0)
        } else {
            let i = rng.below(options.len().max(1) as u64) as usize;
            options.swap_remove(i.min(options.len() - 1))
        };
        format!(
            "<think>Line {no} of {path} computes the value the issue complains about; changing `{}` to `{}` gives the expected behaviour.</think>\n```python\n### {path}\n<<<<<<< SEARCH\n{line}\n=======\n{new}\n>>>>>>> REPLACE\n```",
            line.trim(),
            new.trim()
        )
    }
}

/// The simulated skill-following teacher (see the module documentation).
#[derive(Clone, Debug)]
pub struct SkillFollowingTeacher {
    /// Softness of its choices: higher is more often wrong.
    pub temperature: f64,
}

impl SkillFollowingTeacher {
    /// One answer to `item`.
    pub fn answer(&self, item: &TeacherItem<'_>, rng: &mut SplitMix) -> String {
        let skill = prompt_skill(&item.record.prompt);
        // The retry appends the skill to the issue text too; the teacher reads it from the
        // prompt's skill section only, so the issue it weighs is the unguided one.
        let problem = skill
            .and_then(|s| item.problem.strip_suffix(&format!("\n\nSkill: {s}\n")))
            .unwrap_or(item.problem)
            .trim_end();
        let view = View {
            record: item.record,
            words: identifiers(problem),
            ev: IssueEvidence::of(problem),
            ds: skill.map(directives).unwrap_or_default(),
        };
        let temp = if view.has(Directive::Explore) {
            self.temperature * 2.0
        } else {
            self.temperature
        };
        match item.record.subtask {
            Subtask::File => view.file(rng, temp),
            Subtask::Function => view.function(rng, temp),
            Subtask::Line | Subtask::Edit => view.line_or_edit(rng, temp),
        }
    }
}

impl Teacher for SkillFollowingTeacher {
    fn name(&self) -> String {
        "follow (simulated)".into()
    }

    fn sample(
        &mut self,
        items: &[TeacherItem<'_>],
        k: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let mut rng = SplitMix::new(random_u64(seed, 0xf011, i as u64));
                (0..k).map(|_| self.answer(item, &mut rng)).collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rft::failforge::fixtures::record;
    use crate::rft::failforge::retry::{guided_problem, guided_prompt};
    use crate::swe::subtask::EditReward;

    const TB: &str = "Scaling crashes.\nTraceback (most recent call last):\n  File \"/home/u/acme/pkg/util.py\", line 9, in run\n  File \"/home/u/acme/pkg/core.py\", line 3, in scale\nValueError: bad";

    fn answers(rec: &SubtaskRecord, problem: &str, skill: Option<&str>) -> Vec<String> {
        let (r, p) = match skill {
            Some(s) => (
                SubtaskRecord {
                    prompt: guided_prompt(&rec.prompt, s),
                    ..rec.clone()
                },
                guided_problem(problem, s),
            ),
            None => (rec.clone(), problem.to_string()),
        };
        let item = TeacherItem {
            record: &r,
            problem: &p,
        };
        let mut t = SkillFollowingTeacher { temperature: 1.0 };
        t.sample(&[item], 64, 5).unwrap().remove(0)
    }

    fn passes(rec: &SubtaskRecord, outs: &[String]) -> usize {
        outs.iter()
            .filter(|o| rec.reward(o, EditReward::LineFbeta).reward > 0.0)
            .count()
    }

    #[test]
    fn the_vocabulary_is_parsed_from_the_prompt_skill_section() {
        let g = guided_prompt(
            "P\n",
            "Open the code the traceback's last frame names first.",
        );
        assert_eq!(
            prompt_skill(&g),
            Some("Open the code the traceback's last frame names first.")
        );
        assert_eq!(prompt_skill("P\n"), None);
        assert_eq!(
            directives(&prompt_skill(&g).unwrap_or_default().to_uppercase()),
            BTreeSet::from([Directive::TracebackFrame])
        );
        assert!(directives("Be careful.").is_empty());
        assert_eq!(change_size("    y = x + 1", "    y = x - 1"), 1);
        assert_eq!(change_size("    y = x + 1", "    y = x"), 4);
    }

    #[test]
    fn a_skill_without_a_directive_answers_exactly_like_the_plain_attempt() {
        let rec = record(Subtask::Line, "i");
        let plain = answers(&rec, TB, None);
        assert_eq!(plain, answers(&rec, TB, Some("Be careful and thorough.")));
        assert_ne!(
            plain,
            answers(
                &rec,
                TB,
                Some("Open the code the traceback's last frame names first.")
            )
        );
    }

    #[test]
    fn following_the_traceback_skill_finds_the_file_and_line_more_often() {
        for st in [Subtask::File, Subtask::Line] {
            let rec = record(st, "i");
            let skill = "Open the code the traceback's last frame names first.";
            let (plain, guided) = (
                passes(&rec, &answers(&rec, TB, None)),
                passes(&rec, &answers(&rec, TB, Some(skill))),
            );
            assert!(guided > plain, "{st:?}: {guided} vs {plain}");
        }
    }

    #[test]
    fn exclusions_and_the_smallest_change_are_followed() {
        let rec = record(Subtask::Function, "i");
        let outs = answers(
            &rec,
            "Parser output is wrong.",
            Some("Name the method, not its enclosing class."),
        );
        assert!(
            outs.iter().all(|o| !o.contains("class: Parser\n")),
            "{outs:?}"
        );
        let rec = record(Subtask::Edit, "i");
        let outs = answers(
            &rec,
            "Totals are off.",
            Some("Make the smallest change: alter one operator."),
        );
        assert!(
            outs.iter().all(|o| o.contains("=======\n    y = x - 1\n")
                || o.contains("=======\n    return y / 2\n")),
            "{outs:?}"
        );
    }

    #[test]
    fn the_teacher_never_reads_the_ground_truth() {
        // Planted: a record whose ground truth points elsewhere gets the same answers.
        let rec = record(Subtask::File, "i");
        let mut moved = rec.clone();
        moved.truth.files = vec!["pkg/util.py".into()];
        let skill = Some("Open the code the traceback's last frame names first.");
        assert_eq!(answers(&rec, TB, skill), answers(&moved, TB, skill));
    }
}
