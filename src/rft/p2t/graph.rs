//! G*: the process graph of one instance. Typed nodes (issue evidence, module, file, definition,
//! what the faulty line computes, the faulty line, the failing test, the fix) joined by dependency
//! edges; a node is reachable once every prerequisite is established. Milestones (file,
//! definition, faulty line, fix) are established only by an answer that names them; context nodes
//! by any step that mentions them.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::swe::subtask::Subtask;

/// What a node of G* stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// A fragment of the issue text that points at the code (import line, traceback frame, call).
    IssueEvidence,
    /// The module a target file implements (its stem as a word).
    Module,
    /// A file the fix modifies.
    File,
    /// A definition the fix modifies.
    Definition,
    /// The code of a faulty line: what it computes.
    Computes,
    /// A faulty line (path and number).
    FaultyLine,
    /// A test that fails before the fix, named in what the chain shows.
    FailingTest,
    /// The fix: the new code of a changed line.
    Fix,
}

impl NodeKind {
    /// Whether only an answer establishes it.
    pub fn is_milestone(self) -> bool {
        matches!(
            self,
            NodeKind::File | NodeKind::Definition | NodeKind::FaultyLine | NodeKind::Fix
        )
    }

    /// Short name for printing.
    pub fn word(self) -> &'static str {
        match self {
            NodeKind::IssueEvidence => "evidence",
            NodeKind::Module => "module",
            NodeKind::File => "file",
            NodeKind::Definition => "definition",
            NodeKind::Computes => "computes",
            NodeKind::FaultyLine => "faulty_line",
            NodeKind::FailingTest => "failing_test",
            NodeKind::Fix => "fix",
        }
    }
}

/// One node of G*.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Index in [`ProcessGraph::nodes`].
    pub id: usize,
    /// What it stands for.
    pub kind: NodeKind,
    /// The Agentless stage that establishes it.
    pub stage: Subtask,
    /// Human-readable label (a path, a name, a line of code).
    pub label: String,
    /// Texts whose mention establishes it (for milestones: matched against answers; see
    /// `progress`). `Module` surfaces are words, matched as whole identifiers.
    pub surface: Vec<String>,
    /// For `FaultyLine`: the file and line number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<(String, usize)>,
}

/// G* of one instance: nodes in a topological order and `(prerequisite, dependent)` edges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessGraph {
    /// The instance.
    pub instance_id: String,
    /// Nodes; every edge points from a lower to a higher index.
    pub nodes: Vec<Node>,
    /// `(prerequisite, dependent)` pairs.
    pub edges: Vec<(usize, usize)>,
    /// Nodes the critic pruned: `(kind, label, why)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pruned: Vec<(NodeKind, String, String)>,
}

impl ProcessGraph {
    /// Adds a node (after its prerequisites, which must already be in the graph) and returns its id.
    pub fn add(
        &mut self,
        kind: NodeKind,
        stage: Subtask,
        label: &str,
        surface: Vec<String>,
        prereqs: &[usize],
    ) -> usize {
        let id = self.nodes.len();
        self.nodes.push(Node {
            id,
            kind,
            stage,
            label: label.to_string(),
            surface,
            line: None,
        });
        for &p in prereqs {
            if p < id && !self.edges.contains(&(p, id)) {
                self.edges.push((p, id));
            }
        }
        id
    }

    /// The direct prerequisites of a node.
    pub fn prereqs(&self, id: usize) -> Vec<usize> {
        self.edges
            .iter()
            .filter(|&&(_, d)| d == id)
            .map(|&(p, _)| p)
            .collect()
    }

    /// Whether `id` is reachable: every prerequisite is in `established`.
    pub fn reachable(&self, id: usize, established: &BTreeSet<usize>) -> bool {
        self.prereqs(id).iter().all(|p| established.contains(p))
    }

    /// Nodes not yet established whose prerequisites all are.
    pub fn frontier(&self, established: &BTreeSet<usize>) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| !established.contains(i) && self.reachable(*i, established))
            .collect()
    }

    /// Nodes of one kind.
    pub fn of_kind(&self, kind: NodeKind) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(move |n| n.kind == kind)
    }

    /// Removes node `id`; its dependents inherit its prerequisites, ids are renumbered.
    pub fn remove(&mut self, id: usize, why: &str) {
        let Some(node) = self.nodes.get(id).cloned() else {
            return;
        };
        let pre = self.prereqs(id);
        let deps: Vec<usize> = self
            .edges
            .iter()
            .filter(|&&(p, _)| p == id)
            .map(|&(_, d)| d)
            .collect();
        let mut edges: Vec<(usize, usize)> = self
            .edges
            .iter()
            .copied()
            .filter(|&(p, d)| p != id && d != id)
            .collect();
        for &d in &deps {
            for &p in &pre {
                if !edges.contains(&(p, d)) {
                    edges.push((p, d));
                }
            }
        }
        let renum = |i: usize| if i > id { i - 1 } else { i };
        self.edges = edges
            .into_iter()
            .map(|(p, d)| (renum(p), renum(d)))
            .collect();
        self.edges.sort();
        self.nodes.remove(id);
        for (i, n) in self.nodes.iter_mut().enumerate() {
            n.id = i;
        }
        self.pruned.push((node.kind, node.label, why.to_string()));
    }

    /// A few indented lines for people: one per node with its prerequisites.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "G* of {}: {} nodes, {} edges\n",
            self.instance_id,
            self.nodes.len(),
            self.edges.len()
        );
        for n in &self.nodes {
            let pre: Vec<String> = self.prereqs(n.id).iter().map(|p| p.to_string()).collect();
            s.push_str(&format!(
                "  [{}] {} ({}) {:?}{}\n",
                n.id,
                n.kind.word(),
                n.stage.name(),
                n.label,
                if pre.is_empty() {
                    String::new()
                } else {
                    format!(" <- {}", pre.join(", "))
                }
            ));
        }
        for (k, l, why) in &self.pruned {
            s.push_str(&format!("  pruned {} {l:?}: {why}\n", k.word()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachability_follows_prerequisites_and_removal_rewires_them() {
        let mut g = ProcessGraph::default();
        let a = g.add(NodeKind::IssueEvidence, Subtask::File, "a", vec![], &[]);
        let b = g.add(NodeKind::Module, Subtask::File, "b", vec![], &[a]);
        let c = g.add(NodeKind::File, Subtask::File, "c", vec![], &[b]);
        let mut est = BTreeSet::new();
        assert_eq!(g.frontier(&est), vec![a]);
        assert!(!g.reachable(c, &est));
        est.insert(a);
        assert_eq!(g.frontier(&est), vec![b]);
        g.remove(b, "test");
        assert_eq!(g.nodes.len(), 2);
        assert_eq!(g.edges, vec![(0, 1)]);
        assert_eq!(g.pruned.len(), 1);
        let text = serde_json::to_string(&g).unwrap();
        let back: ProcessGraph = serde_json::from_str(&text).unwrap();
        assert_eq!(back, g);
    }
}
