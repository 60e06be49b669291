//! Prog_t: how far a step moves a trajectory through G*. A step legitimately establishes a node
//! when it names the node and the node is reachable (its prerequisites were established before,
//! or earlier in the same step); naming a node before its prerequisites is a jump, penalised; an
//! answer that names none of its stage's milestones commits to a wrong target, also penalised.
//! Reasoning that names a reachable milestone of the chain (the file it will answer, the fix it
//! proposes) earns half a node, once. Repeated steps name only established nodes and score
//! nothing.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::swe::answer;
use crate::swe::subtask::Subtask;

use super::graph::{Node, NodeKind, ProcessGraph};
use super::reverse::has_word;
use super::trajectory::{Step, StepKind};

/// Penalties of the progress score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProgressConfig {
    /// Subtracted per node named before its prerequisites.
    pub jump_penalty: f64,
    /// Subtracted for an answer that names none of its stage's milestones.
    pub off_target_penalty: f64,
}

impl Default for ProgressConfig {
    fn default() -> Self {
        Self {
            jump_penalty: 1.0,
            off_target_penalty: 1.0,
        }
    }
}

/// The score of one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepScore {
    /// Nodes it established.
    pub established: Vec<usize>,
    /// Reachable milestones its reasoning named for the first time (half credit each).
    pub approached: Vec<usize>,
    /// Nodes it named before their prerequisites.
    pub jumps: Vec<usize>,
    /// An answer naming none of its stage's milestones.
    pub off_target: bool,
    /// Prog_t.
    pub progress: f64,
}

/// Offset of the marks of approached milestones in the established set.
const APPROACHED: usize = 1 << 40;

/// Whether a node's surface is matched as a whole word (module names, definition names in the issue).
fn word_matched(n: &Node) -> bool {
    n.kind == NodeKind::Module
        || (n.kind == NodeKind::IssueEvidence && n.stage == Subtask::Function)
}

/// Whether an answer step names a milestone.
fn answer_names(step: &Step, n: &Node) -> bool {
    if step.stage != n.stage {
        return false;
    }
    match n.kind {
        NodeKind::File => answer::parse_files(&step.text).contains(&n.label),
        NodeKind::Definition => {
            let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_string();
            answer::parse_functions(&step.text)
                .iter()
                .any(|f| f.name == n.label || last(&f.name) == last(&n.label))
        }
        NodeKind::FaultyLine => n.line.as_ref().is_some_and(|(p, l)| {
            answer::parse_lines(&step.text)
                .iter()
                .any(|x| &x.path == p && x.line == *l)
        }),
        NodeKind::Fix => answer::parse_edit(&step.text).iter().any(|b| {
            let new: Vec<&str> = b.replace.lines().map(str::trim).collect();
            n.surface.iter().any(|s| new.contains(&s.as_str()))
                || (n.surface.is_empty() && b.replace.trim().is_empty())
        }),
        _ => false,
    }
}

/// Whether a step's text mentions a node's surface.
fn text_names(text: &str, n: &Node) -> bool {
    n.surface.iter().any(|s| {
        if word_matched(n) {
            has_word(text, s)
        } else {
            !s.is_empty() && text.contains(s.as_str())
        }
    })
}

/// The nodes a step names, in topological (id) order: milestones through answers, context nodes
/// through reasoning; reasoning that mentions a milestone names it too (for jumps only).
pub fn named(g: &ProcessGraph, step: &Step) -> Vec<usize> {
    g.nodes
        .iter()
        .filter(|n| match (step.kind, n.kind.is_milestone()) {
            (StepKind::Answer, true) => answer_names(step, n),
            (StepKind::Answer, false) => false,
            (StepKind::Reason, _) => text_names(&step.text, n),
        })
        .map(|n| n.id)
        .collect()
}

/// Scores `step` and adds what it established to `established`.
pub fn score_step(
    g: &ProcessGraph,
    step: &Step,
    established: &mut BTreeSet<usize>,
    cfg: &ProgressConfig,
) -> StepScore {
    let mut s = StepScore::default();
    let names = named(g, step);
    for &id in &names {
        if established.contains(&id) {
            continue;
        }
        let reachable = g.reachable(id, established);
        let milestone = g.nodes[id].kind.is_milestone();
        match (reachable, step.kind == StepKind::Answer || !milestone) {
            (true, true) => {
                established.insert(id);
                s.established.push(id);
            }
            (true, false) => {
                // Reasoning that names a reachable milestone approaches it: half credit, once.
                if established.insert(APPROACHED + id) {
                    s.approached.push(id);
                }
            }
            (false, _) => s.jumps.push(id),
        }
    }
    if step.kind == StepKind::Answer {
        let stage_milestones: Vec<usize> = g
            .nodes
            .iter()
            .filter(|n| n.stage == step.stage && n.kind.is_milestone())
            .map(|n| n.id)
            .collect();
        s.off_target =
            !stage_milestones.is_empty() && !stage_milestones.iter().any(|m| names.contains(m));
    }
    s.progress = s.established.len() as f64 + 0.5 * s.approached.len() as f64
        - cfg.jump_penalty * s.jumps.len() as f64
        - if s.off_target {
            cfg.off_target_penalty
        } else {
            0.0
        };
    s
}

/// Scores every step of a trajectory from nothing established.
pub fn score_all(g: &ProcessGraph, steps: &[Step], cfg: &ProgressConfig) -> Vec<StepScore> {
    let mut est = BTreeSet::new();
    steps
        .iter()
        .map(|st| score_step(g, st, &mut est, cfg))
        .collect()
}
