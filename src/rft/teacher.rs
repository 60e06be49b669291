//! Teachers write chains of thought with answers for subtask prompts; stage 1 keeps the samples
//! whose answers agree with ground truth. Four kinds sit behind one trait: the built-in heuristic
//! teacher (BM25 and issue-text evidence — imports, traceback frames, calls — ranked against the
//! shown files, definitions and lines, reasoning that quotes that evidence, plus inverse-mutation
//! edits: right sometimes and wrong sometimes), a local model run by sorft (the
//! policy itself or another directory), and an OpenAI-compatible endpoint.

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::rng::SplitMix;
use crate::engine::{Backend, SamplingParams};
use crate::model::chat::{self, Message};
use crate::model::generate::{generate, GenOptions, GenRequest};
use crate::model::{Model, Tokenizer};
use crate::rft::openai::{ChatClient, ChatRequest};
use crate::swe::bm25::Bm25Index;
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// One prompt for a teacher: the subtask record and the issue text it was built from.
#[derive(Clone, Copy, Debug)]
pub struct TeacherItem<'a> {
    /// The record (prompt, shown views, ground truth).
    pub record: &'a SubtaskRecord,
    /// The issue text.
    pub problem: &'a str,
}

/// Something that answers subtask prompts with a chain of thought and a final answer.
pub trait Teacher {
    /// A short name for reports.
    fn name(&self) -> String;
    /// `k` samples for every item, deterministic for a given `seed` where the teacher allows.
    fn sample(
        &mut self,
        items: &[TeacherItem<'_>],
        k: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Vec<String>>>;
}

/// Identifier-like words of a text (lower-cased), with dotted names also split into parts.
pub fn identifiers(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for raw in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')) {
        for part in raw.split('.') {
            if part.len() >= 3
                && part
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
            {
                out.insert(part.to_lowercase());
            }
        }
    }
    out
}

fn pick(rng: &mut SplitMix, scores: &[f64], temperature: f64) -> usize {
    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
    let w: Vec<f64> = scores
        .iter()
        .map(|s| ((s - m) / temperature.max(1e-6)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut u = rng.next_f64() * total;
    for (i, x) in w.iter().enumerate() {
        u -= x;
        if u <= 0.0 {
            return i;
        }
    }
    w.len().saturating_sub(1)
}

/// The built-in teacher's answer to an edit prompt where no shown line has a change it can
/// justify: it says so, with no edit block (a refusal scores zero and is never SFT data).
pub const CANNOT_FIX: &str =
    "<think>No line shown here has a change I can justify from the issue; I cannot fix it.</think>";

/// The single-operator changes the teacher knows for `line` (each differs from it).
pub(crate) fn mutations_of(line: &str) -> Vec<String> {
    INVERSE_MUTATIONS
        .iter()
        .filter(|(a, _)| line.contains(a))
        .map(|(a, b)| line.replacen(a, b, 1))
        .filter(|n| n != line)
        .collect()
}

/// The built-in teacher for the embedded default.
#[derive(Clone, Debug)]
pub struct BuiltinTeacher {
    /// Softness of its choices: higher is more often wrong.
    pub temperature: f64,
}

impl Default for BuiltinTeacher {
    fn default() -> Self {
        Self { temperature: 0.7 }
    }
}

/// What an issue text says about where its code lives: `from pkg import mod` lines of its
/// snippets, file paths of its traceback, and `name(` calls.
struct Evidence {
    /// (import line, `pkg/mod.py` path it implies).
    imports: Vec<(String, String)>,
    /// Paths named by traceback frames.
    traceback: Vec<String>,
    /// Calls written in the issue (`module.func(...)` up to the opening parenthesis).
    calls: Vec<String>,
}

impl Evidence {
    fn of(problem: &str) -> Self {
        let mut imports = Vec::new();
        let mut traceback = Vec::new();
        let mut calls = Vec::new();
        for line in problem.lines() {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("from ") {
                if let Some((pkg, names)) = rest.split_once(" import ") {
                    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        let path = format!("{}/{}.py", pkg.replace('.', "/"), name);
                        imports.push((t.to_string(), path));
                    }
                }
            }
            if let Some(rest) = t.strip_prefix("File \"") {
                if let Some((path, _)) = rest.split_once('"') {
                    traceback.push(path.to_string());
                }
            }
        }
        let bytes = problem.as_bytes();
        let mut start = None;
        for (i, &b) in bytes.iter().enumerate() {
            let ident = b.is_ascii_alphanumeric() || b == b'_' || b == b'.';
            match (ident, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    if b == b'(' && i > s + 1 {
                        calls.push(problem[s..i].to_string());
                    }
                    start = None;
                }
                _ => {}
            }
        }
        Self {
            imports,
            traceback,
            calls,
        }
    }

    /// The import line that names `path` as a module, if any.
    fn module_path(&self, path: &str) -> Option<&str> {
        self.imports
            .iter()
            .find(|(_, p)| path == p || path.ends_with(&format!("/{p}")))
            .map(|(line, _)| line.as_str())
    }

    /// The traceback path that ends with `path`, if any.
    fn traceback_hit(&self, path: &str) -> Option<&str> {
        self.traceback
            .iter()
            .find(|t| t.ends_with(&format!("/{path}")) || t.as_str() == path)
            .map(String::as_str)
    }

    /// A call in the issue whose last name is the last part of the definition `name`.
    fn call_of(&self, name: &str) -> Option<&str> {
        let last = name.rsplit('.').next().unwrap_or(name);
        self.calls
            .iter()
            .find(|c| c.rsplit('.').next() == Some(last))
            .map(String::as_str)
    }
}

/// A path's file name without extensions, lower-cased (`pkg/Core.py` -> `core`).
pub(crate) fn file_stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name).to_lowercase()
}

fn mention_list(words: &[&String]) -> String {
    words
        .iter()
        .take(4)
        .map(|w| format!("`{w}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a line is code a fix may change: not blank, a comment, a definition, a decorator or
/// a docstring opener.
pub(crate) fn is_code_line(line: &str) -> bool {
    let t = line.trim();
    !(t.is_empty()
        || t.starts_with('#')
        || t.starts_with("def ")
        || t.starts_with("class ")
        || t.starts_with('@')
        || t.starts_with("\"\"\""))
}

/// Rewrites that undo common bugs, tried on a suspicious line.
pub(crate) const INVERSE_MUTATIONS: &[(&str, &str)] = &[
    (" == ", " != "),
    (" != ", " == "),
    (" < ", " <= "),
    (" <= ", " < "),
    (" > ", " >= "),
    (" >= ", " > "),
    (" + ", " - "),
    (" - ", " + "),
    (" * ", " / "),
    (" and ", " or "),
    (" or ", " and "),
    ("min(", "max("),
    ("max(", "min("),
    (" + 1", ""),
    (" - 1", ""),
    ("True", "False"),
    ("False", "True"),
    ("not ", ""),
];

impl BuiltinTeacher {
    fn answer(&self, item: &TeacherItem<'_>, rng: &mut SplitMix) -> String {
        let words = identifiers(item.problem);
        let r = item.record;
        match r.subtask {
            Subtask::File => {
                let files = &r.shown.files;
                if files.is_empty() {
                    return "<think>Nothing to choose from.</think>\n```\n```".into();
                }
                let ev = Evidence::of(item.problem);
                let bm = Bm25Index::new(
                    files
                        .iter()
                        .map(|f| (f.clone(), f.replace(['/', '.'], " "))),
                );
                let bm_scores: BTreeMap<String, f64> =
                    bm.search(item.problem, files.len()).into_iter().collect();
                let scores: Vec<f64> = files
                    .iter()
                    .map(|f| {
                        let stem = file_stem(f);
                        let mut s = if words.contains(&stem) { 3.0 } else { 0.0 };
                        s += bm_scores.get(f).copied().unwrap_or(0.0).min(4.0) * 0.5;
                        if ev.module_path(f).is_some() {
                            s += 2.0;
                        }
                        if crate::swe::codemap::is_test_path(f) {
                            s -= 2.0;
                        }
                        s
                    })
                    .collect();
                let first = pick(rng, &scores, self.temperature);
                let mut chosen = vec![files[first].clone()];
                if rng.next_f64() < 0.3 && files.len() > 1 {
                    let second = pick(rng, &scores, self.temperature * 2.0);
                    if second != first {
                        chosen.push(files[second].clone());
                    }
                }
                // The reasoning quotes the issue's own words that point at the chosen file.
                let why = match (ev.module_path(&chosen[0]), ev.traceback_hit(&chosen[0])) {
                    (Some(import), _) => format!(
                        "The snippet in the issue runs `{import}`, so the code it exercises lives in {}.",
                        chosen[0]
                    ),
                    (None, Some(tb)) => format!(
                        "The traceback passes through `{tb}`, which is {} in the repository.",
                        chosen[0]
                    ),
                    (None, None) => {
                        let hits: Vec<&String> = words
                            .iter()
                            .filter(|w| files.iter().any(|f| file_stem(f) == **w))
                            .collect();
                        format!(
                            "The issue mentions {}. The module that matches best is {}, so the fix most likely belongs there.",
                            if hits.is_empty() { "no file by name".to_string() } else { mention_list(&hits) },
                            chosen[0]
                        )
                    }
                };
                format!("<think>{why}</think>\n```\n{}\n```", chosen.join("\n"))
            }
            Subtask::Function => {
                let fs = &r.shown.functions;
                if fs.is_empty() {
                    return "<think>No definitions shown.</think>\n```\n```".into();
                }
                let ev = Evidence::of(item.problem);
                let bm = Bm25Index::new(
                    fs.iter()
                        .enumerate()
                        .map(|(i, f)| (i.to_string(), format!("{} {}", f.path, f.name))),
                );
                let mut bm_scores = vec![0.0; fs.len()];
                for (id, sc) in bm.search(item.problem, fs.len()) {
                    if let Ok(i) = id.parse::<usize>() {
                        bm_scores[i] = sc;
                    }
                }
                let scores: Vec<f64> = fs
                    .iter()
                    .enumerate()
                    .map(|(i, f)| {
                        let parts: Vec<String> =
                            f.name.split('.').map(|p| p.to_lowercase()).collect();
                        let mut s =
                            parts.iter().filter(|p| words.contains(*p)).count() as f64 * 2.0;
                        s += bm_scores[i].min(4.0) * 0.25;
                        if ev.call_of(&f.name).is_some() {
                            s += 1.0;
                        }
                        if words.contains(&file_stem(&f.path)) {
                            s += 0.5;
                        }
                        if f.kind == crate::swe::codemap::DefKind::Class {
                            s -= 0.5;
                        }
                        s
                    })
                    .collect();
                let i = pick(rng, &scores, self.temperature);
                let f = &fs[i];
                let why = match ev.call_of(&f.name) {
                    Some(call) => format!(
                        "The issue calls `{call}`; `{}` is defined in {}, so that is the place to inspect.",
                        f.name, f.path
                    ),
                    None => format!(
                        "The failing call in the issue goes through `{}`; its definition in {} is the place to inspect.",
                        f.name, f.path
                    ),
                };
                format!(
                    "<think>{why}</think>\n```\n{}\n{}: {}\n```",
                    f.path,
                    f.kind.word(),
                    f.name
                )
            }
            Subtask::Line | Subtask::Edit => {
                let mut cands: Vec<(String, usize, String, f64)> = Vec::new();
                for w in &r.shown.windows {
                    for (k, line) in w.text.lines().enumerate() {
                        if !is_code_line(line) {
                            continue;
                        }
                        let t = line.trim();
                        let ids = identifiers(t);
                        let mut s = ids.iter().filter(|x| words.contains(*x)).count() as f64;
                        if INVERSE_MUTATIONS.iter().any(|(a, _)| line.contains(a)) {
                            s += 1.0;
                        }
                        if t.starts_with("return") || t.starts_with("if ") {
                            s += 0.5;
                        }
                        cands.push((w.path.clone(), w.start_line + k, line.to_string(), s));
                    }
                }
                if r.subtask == Subtask::Edit {
                    // Only lines the teacher knows a change for: it never proposes an edit that
                    // changes nothing (or only a comment).
                    cands.retain(|c| !mutations_of(&c.2).is_empty());
                    if cands.is_empty() {
                        return CANNOT_FIX.into();
                    }
                }
                if cands.is_empty() {
                    return "<think>No code shown.</think>\n```\n```".into();
                }
                let scores: Vec<f64> = cands.iter().map(|c| c.3).collect();
                let (path, line_no, line, _) = cands[pick(rng, &scores, self.temperature)].clone();
                if r.subtask == Subtask::Line {
                    return format!(
                        "<think>The wrong result comes from the expression on line {line_no} of {path}: `{}`.</think>\n```\n{path}\nline: {line_no}\n```",
                        line.trim()
                    );
                }
                let options = mutations_of(&line);
                let Some(new) = options.get(rng.below(options.len().max(1) as u64) as usize) else {
                    return CANNOT_FIX.into();
                };
                format!(
                    "<think>Line {line_no} of {path} computes the value the issue complains about; changing `{}` to `{}` gives the expected behaviour.</think>\n```python\n### {path}\n<<<<<<< SEARCH\n{line}\n=======\n{new}\n>>>>>>> REPLACE\n```",
                    line.trim(),
                    new.trim()
                )
            }
        }
    }
}

impl Teacher for BuiltinTeacher {
    fn name(&self) -> String {
        "builtin".into()
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
                let mut rng = SplitMix::new(crate::engine::rng::random_u64(seed, 0x7eac, i as u64));
                (0..k).map(|_| self.answer(item, &mut rng)).collect()
            })
            .collect())
    }
}

/// A model run by sorft as the teacher (the policy itself, or another local model directory).
pub struct ModelTeacher<'m, B: Backend> {
    /// The model.
    pub model: &'m Model<B>,
    /// Its tokenizer.
    pub tokenizer: &'m Tokenizer,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most new tokens per sample.
    pub max_new_tokens: usize,
    /// Sequences decoded together.
    pub batch: usize,
}

impl<B: Backend> Teacher for ModelTeacher<'_, B> {
    fn name(&self) -> String {
        "model".into()
    }

    fn sample(
        &mut self,
        items: &[TeacherItem<'_>],
        k: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let mut reqs = Vec::with_capacity(items.len() * k);
        for (i, item) in items.iter().enumerate() {
            let (ids, _) = chat::encode(
                self.tokenizer,
                &[Message::new("user", &item.record.prompt)],
                true,
            )?;
            for j in 0..k {
                reqs.push(GenRequest {
                    prompt: ids.clone(),
                    params: SamplingParams {
                        temperature: self.temperature,
                        top_k: 0,
                        top_p: 1.0,
                        seed: crate::engine::rng::random_u64(seed, i as u64, j as u64),
                    },
                    max_new_tokens: self.max_new_tokens,
                    stop_ids: self.tokenizer.stop_ids(),
                    stop_strings: Vec::new(),
                    constraint: None,
                    min_allowed_mass: 0.0,
                });
            }
        }
        let outs = generate(
            self.model,
            Some(self.tokenizer),
            &reqs,
            &GenOptions {
                max_batch: self.batch,
                progress: true,
            },
        )?;
        Ok(outs
            .chunks(k.max(1))
            .map(|c| c.iter().map(|o| o.text.clone()).collect())
            .collect())
    }
}

/// An OpenAI-compatible chat endpoint as the teacher.
pub struct EndpointTeacher {
    /// The client.
    pub client: ChatClient,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most tokens per completion.
    pub max_tokens: usize,
}

impl Teacher for EndpointTeacher {
    fn name(&self) -> String {
        "endpoint".into()
    }

    fn sample(
        &mut self,
        items: &[TeacherItem<'_>],
        k: usize,
        seed: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let req = ChatRequest {
                    messages: vec![Message::new("user", &item.record.prompt)],
                    n: k,
                    temperature: self.temperature,
                    max_tokens: self.max_tokens,
                    seed: Some(seed.wrapping_add(i as u64)),
                };
                Ok(self.client.complete(&req)?)
            })
            .collect()
    }
}

/// Per-subtask counts of the rejection filter.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Acceptance {
    /// Samples seen.
    pub sampled: usize,
    /// Samples whose answer agreed with ground truth (and, where execution was checked, passed it).
    pub passed: usize,
    /// Samples that agreed with ground truth but failed execution (stage-1 edits: the patch did not
    /// resolve the instance in the sandbox).
    pub failed_execution: usize,
    /// Accepted after removing duplicates.
    pub kept: usize,
}

/// Teacher samples, `k` per prompt and `k_edit` per edit prompt (0: `k`). The built-in teacher
/// draws a prompt's samples from one stream, so its first `k` are the same whatever `k_edit` is.
pub fn sample_per_subtask(
    teacher: &mut dyn Teacher,
    items: &[TeacherItem<'_>],
    k: usize,
    k_edit: usize,
    seed: u64,
) -> anyhow::Result<Vec<Vec<String>>> {
    let k_edit = if k_edit == 0 { k } else { k_edit };
    let mut samples = teacher.sample(items, k.max(k_edit), seed)?;
    for (item, outs) in items.iter().zip(samples.iter_mut()) {
        outs.truncate(if item.record.subtask == Subtask::Edit {
            k_edit
        } else {
            k
        });
    }
    Ok(samples)
}

/// Rejection sampling: keeps the samples whose final answer passes the ground-truth filter
/// (localization: overlaps ground truth; edit: applies and touches a ground-truth line, i.e. a
/// positive reward), without duplicates; returns chat examples and per-subtask statistics.
pub fn rejection_filter(
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    edit_reward: crate::swe::subtask::EditReward,
) -> (Vec<Vec<Message>>, BTreeMap<String, Acceptance>) {
    let (kept, stats) = rejection_filter_indexed(items, samples, edit_reward);
    (kept.into_iter().map(|(_, c)| c).collect(), stats)
}

/// Kept conversations, each with the index of its item, and per-subtask statistics.
pub type IndexedKept = (Vec<(usize, Vec<Message>)>, BTreeMap<String, Acceptance>);

/// As [`rejection_filter`], each kept conversation paired with the index of its item.
pub fn rejection_filter_indexed(
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    edit_reward: crate::swe::subtask::EditReward,
) -> IndexedKept {
    rejection_filter_checked(items, samples, edit_reward, None)
}

/// As [`rejection_filter_indexed`], a sample also needing `executed[i][k]` (e.g. from
/// [`crate::rft::accept::execution_passes`]) when given.
pub fn rejection_filter_checked(
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    edit_reward: crate::swe::subtask::EditReward,
    executed: Option<&[Vec<bool>]>,
) -> IndexedKept {
    let mut kept = Vec::new();
    let mut stats: BTreeMap<String, Acceptance> = BTreeMap::new();
    for (i, (item, outs)) in items.iter().zip(samples).enumerate() {
        let st = stats
            .entry(item.record.subtask.name().to_string())
            .or_default();
        let mut seen = BTreeSet::new();
        for (k, text) in outs.iter().enumerate() {
            st.sampled += 1;
            let r = item.record.reward(text, edit_reward);
            if r.reward <= 0.0 {
                continue;
            }
            let ran =
                executed.is_none_or(|e| e.get(i).and_then(|v| v.get(k)).copied() == Some(true));
            if !ran {
                st.failed_execution += 1;
                continue;
            }
            st.passed += 1;
            if !seen.insert(text.trim().to_string()) {
                continue;
            }
            st.kept += 1;
            kept.push((
                i,
                vec![
                    Message::new("user", &item.record.prompt),
                    Message::new("assistant", text),
                ],
            ));
        }
    }
    (kept, stats)
}
