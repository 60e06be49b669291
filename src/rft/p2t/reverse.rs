//! The reverse phase: distils the gold patch, the repository's shown views and the issue into G*.
//! A proposer adds the nodes the fix needs (evidence in the issue, module, file, definition,
//! what the faulty line computes, the faulty line, the failing test and its message, the fix) with
//! their dependencies; a critic prunes every node that depends on a fact the chain never shows by
//! its stage (its dependents inherit its prerequisites). Only curation sees the patch.

use std::collections::BTreeMap;

use crate::swe::subtask::Subtask;
use crate::swe::truth::GroundTruth;

use super::graph::{NodeKind, ProcessGraph};
use super::trajectory::Observations;

/// What the reverse phase reads.
#[derive(Clone, Copy, Debug)]
pub struct ReverseInput<'a> {
    /// The instance.
    pub instance_id: &'a str,
    /// The issue text.
    pub problem: &'a str,
    /// Ground truth from the gold patch (privileged).
    pub truth: &'a GroundTruth,
    /// Tests that fail before the fix (privileged; names only).
    pub failing_tests: &'a [String],
    /// What each stage of the chain shows.
    pub observations: &'a Observations,
}

fn stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split('.').next().unwrap_or(name).to_string()
}

/// Whether `w` occurs in `text` as a whole identifier.
pub fn has_word(text: &str, w: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|x| x == w)
}

/// Lines of the issue that state the failure (an exception line, an `expected` remark).
pub fn failure_messages(problem: &str) -> Vec<String> {
    problem
        .lines()
        .map(str::trim)
        .filter(|l| {
            let exc = l
                .split_once(": ")
                .is_some_and(|(k, _)| k.ends_with("Error") || k.ends_with("Exception"));
            exc || l.contains("expected")
        })
        .map(|l| match l.find("# expected") {
            Some(i) => l[i + 2..].trim().to_string(),
            None => l.to_string(),
        })
        .filter(|l| l.len() >= 6)
        .collect()
}

/// The proposer: every node the fix needs, with dependency edges.
pub fn propose(input: &ReverseInput<'_>) -> ProcessGraph {
    let mut g = ProcessGraph {
        instance_id: input.instance_id.to_string(),
        ..ProcessGraph::default()
    };
    let t = input.truth;
    let mut file_ids: BTreeMap<&str, usize> = BTreeMap::new();
    for path in &t.files {
        let s = stem(path);
        // The strongest evidence only (an import line, else a traceback frame): any one of
        // them leads to the module, so the others are not necessary.
        let lines: Vec<&str> = input.problem.lines().map(str::trim).collect();
        let import = lines
            .iter()
            .find(|l| l.starts_with("from ") && l.contains(" import ") && has_word(l, &s))
            .map(|l| l.to_string());
        let frame = lines
            .iter()
            .find(|l| l.starts_with("File \"") && l.contains(path.as_str()))
            .and_then(|l| l.split('"').nth(1))
            .map(str::to_string);
        let evidence: Vec<usize> = import
            .or(frame)
            .map(|surface| {
                g.add(
                    NodeKind::IssueEvidence,
                    Subtask::File,
                    &surface,
                    vec![surface.clone()],
                    &[],
                )
            })
            .into_iter()
            .collect();
        let module = g.add(
            NodeKind::Module,
            Subtask::File,
            &s,
            vec![s.clone()],
            &evidence,
        );
        let file = g.add(
            NodeKind::File,
            Subtask::File,
            path,
            vec![path.clone()],
            &[module],
        );
        file_ids.insert(path, file);
    }
    let mut def_ids: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for f in &t.functions {
        let last = f.name.rsplit('.').next().unwrap_or(&f.name).to_string();
        let mut pre: Vec<usize> = file_ids.get(f.path.as_str()).copied().into_iter().collect();
        if has_word(input.problem, &last) {
            pre.push(g.add(
                NodeKind::IssueEvidence,
                Subtask::Function,
                &last,
                vec![last.clone()],
                &[],
            ));
        }
        let d = g.add(
            NodeKind::Definition,
            Subtask::Function,
            &f.name,
            vec![f.name.clone()],
            &pre,
        );
        def_ids.entry(f.path.as_str()).or_default().push(d);
    }
    {
        let mut surface: Vec<String> = input
            .failing_tests
            .iter()
            .filter_map(|t| t.split([' ', '(']).next())
            .map(str::to_string)
            .collect();
        surface.extend(failure_messages(input.problem));
        surface.dedup();
        if !surface.is_empty() {
            let label = input.failing_tests.first().cloned().unwrap_or_default();
            g.add(NodeKind::FailingTest, Subtask::Line, &label, surface, &[]);
        }
    }
    let view_of = |path: &str, line: usize| -> Option<String> {
        let v = input
            .observations
            .stages
            .iter()
            .find(|v| v.stage == Subtask::Line)?;
        v.windows
            .iter()
            .filter(|w| w.path == path && line >= w.start_line && line < w.start_line + w.len())
            .find_map(|w| w.text.lines().nth(line - w.start_line))
            .map(|l| l.trim().to_string())
    };
    let mut line_ids: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for l in &t.lines {
        let pre: Vec<usize> = match def_ids.get(l.path.as_str()) {
            Some(d) => d.clone(),
            None => file_ids.get(l.path.as_str()).copied().into_iter().collect(),
        };
        let code = view_of(&l.path, l.line).unwrap_or_default();
        let mut fl_pre = pre.clone();
        if !code.is_empty() {
            fl_pre.push(g.add(
                NodeKind::Computes,
                Subtask::Line,
                &code,
                vec![code.clone()],
                &pre,
            ));
        }
        let id = g.add(
            NodeKind::FaultyLine,
            Subtask::Line,
            &format!("{}:{}", l.path, l.line),
            vec![format!("line: {}", l.line)],
            &fl_pre,
        );
        g.nodes[id].line = Some((l.path.clone(), l.line));
        line_ids.entry(l.path.as_str()).or_default().push(id);
    }
    for e in &t.edits {
        let old: Vec<&str> = e.search.lines().map(str::trim).collect();
        let new: Vec<String> = e
            .replace
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !old.contains(l))
            .map(str::to_string)
            .collect();
        // The failing test's message is context the fix may cite, not a prerequisite: a
        // teacher that never quotes it still reaches the fix through the faulty line.
        let pre = line_ids.get(e.path.as_str()).cloned().unwrap_or_default();
        let label = new
            .first()
            .cloned()
            .unwrap_or_else(|| format!("delete in {}", e.path));
        g.add(NodeKind::Fix, Subtask::Edit, &label, new, &pre);
    }
    g
}

/// Why a node is not discoverable by its stage, if it is not.
fn undiscoverable(g: &ProcessGraph, id: usize, obs: &Observations) -> Option<String> {
    let n = &g.nodes[id];
    if !obs.chain().contains(&n.stage) {
        return Some(format!("the chain has no {} stage", n.stage.name()));
    }
    let seen = obs.seen(n.stage);
    match n.kind {
        NodeKind::Fix => None,
        NodeKind::FaultyLine => {
            let (path, line) = n.line.clone()?;
            let shown = seen
                .windows
                .iter()
                .any(|w| w.path == path && line >= w.start_line && line < w.start_line + w.len());
            (!shown).then(|| format!("line {line} of {path} is in no shown window"))
        }
        NodeKind::Module => n
            .surface
            .iter()
            .all(|s| !has_word(&seen.text, s))
            .then(|| format!("no view by the {} stage names {}", n.stage.name(), n.label)),
        NodeKind::IssueEvidence if n.stage == Subtask::Function => {
            (!has_word(&seen.text, &n.label)).then(|| format!("{} is never shown", n.label))
        }
        _ => n
            .surface
            .iter()
            .all(|s| !seen.text.contains(s.as_str()))
            .then(|| format!("no view by the {} stage shows it", n.stage.name())),
    }
}

/// The critic: prunes nodes no view shows by their stage (until none is left to prune).
pub fn critique(g: &mut ProcessGraph, obs: &Observations) {
    while let Some((id, why)) =
        (0..g.nodes.len()).find_map(|i| undiscoverable(g, i, obs).map(|w| (i, w)))
    {
        g.remove(id, &why);
    }
    // A failing test known only by its name is kept only through surfaces a view shows.
    for n in &mut g.nodes {
        if n.kind == NodeKind::FailingTest {
            let seen = obs.seen(n.stage);
            n.surface.retain(|s| seen.text.contains(s.as_str()));
        }
    }
}

/// G* of an instance: proposer, then critic.
pub fn build(input: &ReverseInput<'_>) -> ProcessGraph {
    let mut g = propose(input);
    critique(&mut g, input.observations);
    g
}
