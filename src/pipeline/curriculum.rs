//! The copy / induction curriculum of a model trained from scratch: short, task-shaped chat
//! exercises whose answers can only be written by copying a fresh name from the prompt (repeat a
//! span, find the file that defines a function, name the file an issue points at). Every answer
//! the real subtasks want names a path under a package the model has never seen, so it must copy;
//! the warm-up's code alone does not teach a few-million-parameter model to copy within the
//! default run's budget (notes/learn.md: greedy outputs degenerate into "module module module").
//! Short exercises train at several times the tokens per second of the real prompts and put most
//! of their tokens under the loss.
//!
//! The **induction probe** is a held-out set of repeat exercises: its loss (the loss on the second
//! copy of a random span) is logged during the curriculum and measured for every stage's model,
//! so the report shows when the model acquired copying.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;

use crate::engine::rng::SplitMix;
use crate::model::chat::Message;
use crate::pipeline::augment::fresh_name;
use crate::pipeline::plot::{line_chart, Series};

/// Probe loss below which the model is said to copy (a random 4-8 letter name costs ~3 nats a
/// token when guessed; copied, well under 1).
pub const COPY_THRESHOLD: f64 = 1.0;

/// Module and function names to build exercises from (taken from the training repositories, so
/// the exercises speak the vocabulary of the real tasks).
#[derive(Clone, Debug)]
pub struct Names {
    modules: Vec<String>,
    functions: Vec<String>,
}

/// Fallbacks when the repositories give too few names.
const MODULES: [&str; 8] = [
    "cache", "money", "parser", "config", "storage", "graph", "units", "text",
];
const FUNCTIONS: [&str; 8] = [
    "load", "save", "parse", "split", "total", "merge", "resolve", "render",
];

impl Names {
    /// Names from `(path, source)` pairs: file stems of `*.py` paths (not `__init__`, not tests)
    /// and `def` names (not dunder).
    pub fn from_code<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut modules = BTreeSet::new();
        let mut functions = BTreeSet::new();
        for (path, text) in files {
            let stem = path.rsplit('/').next().unwrap_or(path);
            if let Some(m) = stem.strip_suffix(".py") {
                if is_name(m) && !m.starts_with("__") && !m.starts_with("test") {
                    modules.insert(m.to_string());
                }
            }
            for line in text.lines() {
                let Some(rest) = line.trim_start().strip_prefix("def ") else {
                    continue;
                };
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if is_name(&name) && !name.starts_with("__") && !name.starts_with("test") {
                    functions.insert(name);
                }
            }
        }
        let fill = |set: BTreeSet<String>, fallback: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = set.into_iter().collect();
            for f in fallback {
                if v.len() >= fallback.len() {
                    break;
                }
                if !v.iter().any(|x| x == f) {
                    v.push(f.to_string());
                }
            }
            v
        };
        Self {
            modules: fill(modules, &MODULES),
            functions: fill(functions, &FUNCTIONS),
        }
    }

    /// `modules` and `functions` invented snake_case words (one or two parts of 3-7 random
    /// letters each), fixed by `seed` and distinct. A tokenizer trained on the repositories has
    /// no single token for them, so an answer copies several tokens from the prompt: with the
    /// repositories' own names (one token each) the default run's curriculum stalled before the
    /// copy phase transition, with invented ones it crossed (notes/learn.md, session 37).
    pub fn invented(modules: usize, functions: usize, seed: u64) -> Self {
        let mut rng = SplitMix::new(seed);
        let mut seen = BTreeSet::new();
        let mut draw = |n: usize| -> Vec<String> {
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                let parts = 1 + rng.below(2) as usize;
                let word: Vec<String> = (0..parts)
                    .map(|_| {
                        let len = 3 + rng.below(5) as usize;
                        (0..len)
                            .map(|_| char::from(b'a' + rng.below(26) as u8))
                            .collect()
                    })
                    .collect();
                let word = word.join("_");
                if seen.insert(word.clone()) {
                    v.push(word);
                }
            }
            v
        };
        let modules = draw(modules.max(1));
        let functions = draw(functions.max(1));
        Self { modules, functions }
    }

    /// How many module and function names there are.
    pub fn counts(&self) -> (usize, usize) {
        (self.modules.len(), self.functions.len())
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// One kind of exercise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Repeat a span of fresh names and dotted identifiers verbatim (pure induction).
    Repeat,
    /// Repeat 12-26 distinct letters: every letter occurs once, so matching one token finds
    /// the place to copy from (the easiest induction, learnt first; see notes/learn.md).
    Letters,
    /// Find the file that defines a function in a listing (a look-up: the key is a function,
    /// the value a path under a fresh package), answered as function localization is.
    Lookup,
    /// Name the file an issue points at (an import, a traceback path or a dotted name), with the
    /// repository's structure shown, answered as file localization is.
    Issue,
}

/// `k` distinct picks from `pool` (all of it when it is smaller).
fn pick<'a>(pool: &'a [String], k: usize, rng: &mut SplitMix) -> Vec<&'a str> {
    let mut idx: Vec<usize> = (0..pool.len()).collect();
    let k = k.min(idx.len());
    for i in 0..k {
        let j = i + rng.below((idx.len() - i) as u64) as usize;
        idx.swap(i, j);
    }
    idx[..k].iter().map(|&i| pool[i].as_str()).collect()
}

fn one<'a>(pool: &'a [String], rng: &mut SplitMix) -> &'a str {
    pool[rng.below(pool.len() as u64) as usize].as_str()
}

fn chat(user: String, answer: String) -> Vec<Message> {
    vec![
        Message::new("user", &user),
        Message::new("assistant", &answer),
    ]
}

fn repeat(names: &Names, rng: &mut SplitMix) -> Vec<Message> {
    repeat_span(names, rng, 3)
}

/// A repeat exercise whose items are fresh names with probability `fresh`/5, else dotted
/// `module.function` identifiers from the repositories.
fn repeat_span(names: &Names, rng: &mut SplitMix, fresh: u64) -> Vec<Message> {
    let n = 2 + rng.below(5) as usize;
    let span: Vec<String> = (0..n)
        .map(|_| {
            if rng.below(5) < fresh {
                fresh_name(rng)
            } else {
                format!(
                    "{}.{}",
                    one(&names.modules, rng),
                    one(&names.functions, rng)
                )
            }
        })
        .collect();
    let span = span.join(" ");
    chat(format!("Repeat exactly:\n{span}"), span)
}

fn letters(rng: &mut SplitMix) -> Vec<Message> {
    let mut abc: Vec<u8> = (b'a'..=b'z').collect();
    let n = 12 + rng.below(15) as usize;
    for i in 0..n {
        let j = i + rng.below((abc.len() - i) as u64) as usize;
        abc.swap(i, j);
    }
    let span = String::from_utf8_lossy(&abc[..n]).into_owned();
    chat(format!("Repeat exactly:\n{span}"), span)
}

fn lookup(names: &Names, rng: &mut SplitMix) -> Vec<Message> {
    let pkg = fresh_name(rng);
    let k = 3 + rng.below(4) as usize;
    let mods = pick(&names.modules, k, rng);
    let funcs = pick(&names.functions, mods.len(), rng);
    let listing: String = mods
        .iter()
        .zip(&funcs)
        .map(|(m, f)| format!("{pkg}/{m}.py defines {f}\n"))
        .collect();
    let at = rng.below(mods.len().min(funcs.len()) as u64) as usize;
    chat(
        format!("{listing}Which function must change for `{}`?", funcs[at]),
        format!("```\n{pkg}/{}.py\nfunction: {}\n```", mods[at], funcs[at]),
    )
}

fn issue(names: &Names, rng: &mut SplitMix) -> Vec<Message> {
    let pkg = fresh_name(rng);
    let k = 3 + rng.below(4) as usize;
    let mut mods = pick(&names.modules, k, rng);
    let m = mods[rng.below(mods.len() as u64) as usize];
    let f = one(&names.functions, rng);
    let body = match rng.below(3) {
        0 => format!("from {pkg} import {m}\n{m}.{f}(3) fails"),
        1 => format!(
            "Traceback (most recent call last):\n  File \"/home/user/{pkg}/{pkg}/{m}.py\", line {}, in {f}\nValueError",
            3 + rng.below(90)
        ),
        _ => format!("`{m}.{f}` in {pkg} returns the wrong value"),
    };
    mods.sort_unstable();
    let tree: String = mods.iter().map(|x| format!("        {x}.py\n")).collect();
    chat(
        format!("Issue:\n{body}\nRepository:\n{pkg}/\n    {pkg}/\n{tree}Which file must change?"),
        format!("```\n{pkg}/{m}.py\n```"),
    )
}

/// One exercise of `kind`.
pub fn exercise(kind: Kind, names: &Names, rng: &mut SplitMix) -> Vec<Message> {
    match kind {
        Kind::Repeat => repeat(names, rng),
        Kind::Letters => letters(rng),
        Kind::Lookup => lookup(names, rng),
        Kind::Issue => issue(names, rng),
    }
}

/// `n` exercises drawn from `seed`: two fifths distinct letters (where induction is learnt
/// first), a fifth each of name repeats, look-ups and issues.
pub fn exercises(n: usize, names: &Names, seed: u64) -> Vec<Vec<Message>> {
    let mut rng = SplitMix::new(seed);
    (0..n)
        .map(|_| {
            let kind = match rng.below(5) {
                0 | 1 => Kind::Letters,
                2 => Kind::Repeat,
                3 => Kind::Lookup,
                _ => Kind::Issue,
            };
            exercise(kind, names, &mut rng)
        })
        .collect()
}

/// The induction probe: `n` repeat exercises of fresh names only (nothing a model could have
/// memorised), from `seed` (use a seed the training exercises do not).
pub fn induction_probe(n: usize, names: &Names, seed: u64) -> Vec<Vec<Message>> {
    let mut rng = SplitMix::new(seed);
    (0..n).map(|_| repeat_span(names, &mut rng, 5)).collect()
}

/// The first step at which a probe-loss series `(step, loss)` fell below [`COPY_THRESHOLD`].
pub fn acquired_at(series: &[(u64, f64)]) -> Option<u64> {
    series
        .iter()
        .find(|(_, l)| *l < COPY_THRESHOLD)
        .map(|(s, _)| *s)
}

/// The probe-loss series of a curriculum run: `(step, eval_loss)` from its `metrics.jsonl`
/// (empty when the file is missing: no curriculum ran).
pub fn probe_series(metrics: &Path) -> Vec<(u64, f64)> {
    let Ok(text) = std::fs::read_to_string(metrics) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v.get("step")?.as_u64()?, v.get("eval_loss")?.as_f64()?)))
        .collect()
}

/// The report's section on copying: the probe loss of every evaluated stage and, when a
/// curriculum ran, when the model acquired copying (with `induction.svg`, written into `out`).
pub fn report_section(out: &Path, stages: &[(String, f64)]) -> anyhow::Result<String> {
    let mut md = String::from(
        "\n## Copying (induction probe)\n\nLoss on the second copy of held-out random spans of fresh names (`Repeat exactly:`); under ",
    );
    md.push_str(&format!(
        "{COPY_THRESHOLD:.1} the model copies from its context, around 3 it guesses.\n\n| stage | probe loss |\n|---|---|\n"
    ));
    for (stage, loss) in stages {
        md.push_str(&format!("| {stage} | {loss:.3} |\n"));
    }
    let attempts = crate::pipeline::curriculum_run::read_attempts(out)?;
    let dirs: Vec<(String, Option<(u64, f64)>)> = if attempts.is_empty() {
        vec![("curriculum".to_string(), None)]
    } else {
        attempts
            .iter()
            .map(|a| (a.dir.clone(), a.stalled))
            .collect()
    };
    for (k, (_, stall)) in dirs.iter().enumerate() {
        if let Some((step, loss)) = stall {
            md.push_str(&format!(
                "\nAttempt {} stalled: probe loss {loss:.3} at step {step}, so the curriculum started again from a new random initialisation (`curriculum_attempts.json`).\n",
                k + 1
            ));
        }
    }
    let lines: Vec<Series> = dirs
        .iter()
        .enumerate()
        .map(|(k, (dir, _))| Series {
            name: format!("attempt {}", k + 1),
            points: probe_series(&out.join(dir).join("metrics.jsonl"))
                .iter()
                .map(|&(s, l)| (s as f64, l))
                .collect(),
        })
        .collect();
    let kept = dirs.last().map(|(d, _)| d.as_str()).unwrap_or("curriculum");
    let series = probe_series(&out.join(kept).join("metrics.jsonl"));
    if !series.is_empty() {
        md.push_str(&match acquired_at(&series) {
            Some(step) => format!(
                "\nThe curriculum taught copying: the probe loss fell under {COPY_THRESHOLD:.1} at step {step} (plot: induction.svg).\n"
            ),
            None => format!(
                "\nThe probe loss never fell under {COPY_THRESHOLD:.1} during the curriculum (last {:.3}; plot: induction.svg): the model did not acquire copying.\n",
                series.last().map(|p| p.1).unwrap_or(f64::NAN)
            ),
        });
        let chart = line_chart(
            "Curriculum: induction probe loss",
            "step",
            "loss (nats/token)",
            &lines,
        );
        let path = out.join("induction.svg");
        std::fs::write(&path, chart).with_context(|| path.display().to_string())?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::from_code([
            (
                "pkg/pkg/money.py",
                "class Money:\n    def __init__(self):\n        pass\n    def split(self):\n        pass\ndef apply_discount(p):\n    pass\n",
            ),
            ("pkg/tests/test_money.py", "def test_split():\n    pass\n"),
            ("pkg/pkg/__init__.py", ""),
        ])
    }

    #[test]
    fn names_come_from_code_without_dunders_or_tests() {
        let n = names();
        assert!(n.modules.contains(&"money".to_string()));
        assert!(!n
            .modules
            .iter()
            .any(|m| m.starts_with("__") || m.starts_with("test")));
        assert!(n.functions.contains(&"split".to_string()));
        assert!(n.functions.contains(&"apply_discount".to_string()));
        assert!(!n
            .functions
            .iter()
            .any(|f| f.starts_with("__") || f.starts_with("test")));
        // Topped up with fallbacks so that a listing has several entries.
        assert!(n.modules.len() >= MODULES.len() && n.functions.len() >= FUNCTIONS.len());
    }

    #[test]
    fn invented_names_are_distinct_identifiers_fixed_by_the_seed() {
        let a = Names::invented(40, 60, 5);
        assert_eq!(a.modules, Names::invented(40, 60, 5).modules);
        assert_ne!(a.functions, Names::invented(40, 60, 6).functions);
        assert_eq!((a.modules.len(), a.functions.len()), (40, 60));
        let all: BTreeSet<&String> = a.modules.iter().chain(&a.functions).collect();
        assert_eq!(all.len(), 100, "names repeat");
        assert!(all.iter().all(|n| is_name(n) && n.len() >= 3), "{all:?}");
        // Exercises built from them still copy a name only the prompt holds.
        let conv = exercise(Kind::Lookup, &a, &mut SplitMix::new(1));
        assert!(a
            .functions
            .iter()
            .any(|f| conv[1].content.contains(f.as_str())));
    }

    #[test]
    fn answers_copy_a_name_that_only_the_prompt_holds() {
        let n = names();
        let mut rng = SplitMix::new(7);
        for kind in [Kind::Repeat, Kind::Letters, Kind::Lookup, Kind::Issue] {
            for _ in 0..50 {
                let conv = exercise(kind, &n, &mut rng);
                let (user, answer) = (&conv[0].content, &conv[1].content);
                match kind {
                    Kind::Repeat => assert!(user.ends_with(answer.as_str())),
                    Kind::Letters => {
                        assert!(user.ends_with(answer.as_str()));
                        let set: BTreeSet<char> = answer.chars().collect();
                        assert_eq!(set.len(), answer.len(), "{answer}");
                        assert!((12..=26).contains(&answer.len()));
                    }
                    _ => {
                        // The path's package is fresh and appears in the prompt.
                        let path = answer.lines().nth(1).unwrap_or_default();
                        let pkg = path.split('/').next().unwrap_or_default();
                        assert!(pkg.ends_with(|c: char| c.is_ascii_digit()), "{path}");
                        assert!(user.contains(pkg), "{user}");
                        let module = path.rsplit('/').next().unwrap_or_default();
                        assert!(user.contains(module.trim_end_matches(".py")), "{user}");
                    }
                }
            }
        }
    }

    #[test]
    fn exercises_are_deterministic_and_mixed() {
        let n = names();
        let a = exercises(200, &n, 3);
        assert_eq!(a, exercises(200, &n, 3));
        assert_ne!(a, exercises(200, &n, 4));
        // Letters and name repeats: three fifths.
        let repeats = a
            .iter()
            .filter(|c| c[0].content.starts_with("Repeat"))
            .count();
        assert!((95..=145).contains(&repeats), "{repeats}");
        // The probe holds fresh names only: no dotted identifier a model could memorise.
        assert!(induction_probe(20, &n, 9).iter().all(|c| {
            c[0].content.starts_with("Repeat exactly:") && !c[1].content.contains('.')
        }));
    }

    #[test]
    fn report_reads_the_probe_series_and_says_when_copying_came() {
        let dir = std::env::temp_dir().join(format!("sorft-curr-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("curriculum")).unwrap();
        std::fs::write(
            dir.join("curriculum/metrics.jsonl"),
            "{\"step\":1,\"loss\":3.0}\n{\"step\":100,\"eval_loss\":2.9}\nnot json\n{\"step\":200,\"eval_loss\":0.7}\n",
        )
        .unwrap();
        let md = report_section(&dir, &[("initial".into(), 0.71)]).unwrap();
        assert!(md.contains("at step 200"), "{md}");
        assert!(md.contains("| initial | 0.710 |"), "{md}");
        assert!(dir.join("induction.svg").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        // No curriculum: the table only, no claim.
        let md = report_section(Path::new("/nonexistent-sorft"), &[]).unwrap();
        assert!(!md.contains("curriculum"), "{md}");
    }

    #[test]
    fn acquisition_is_the_first_step_under_the_threshold() {
        assert_eq!(
            acquired_at(&[(100, 2.9), (200, 1.2), (300, 0.8), (400, 1.1)]),
            Some(300)
        );
        assert_eq!(acquired_at(&[(100, 2.9), (200, 1.2)]), None);
    }
}
