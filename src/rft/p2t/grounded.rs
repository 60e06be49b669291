//! The groundedness gate: every entity a step names (a quoted name or line of code, a path, and in
//! answers the named files, definitions, lines and SEARCH text, and what the prose around the
//! answer's block quotes) must already have appeared in
//! what the trajectory observed. A step that names an unseen entity is ungrounded: it leaks a fact
//! the teacher could not have known at that point.

use crate::swe::answer;
use crate::swe::grounding::quotes;
use crate::swe::subtask::Subtask;

use super::trajectory::{Seen, Step, StepKind};

/// Something a step names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entity {
    /// A text that must occur in the observations.
    Text(String),
    /// A line of a file that an observed window must contain.
    Line(String, usize),
}

/// Path-like words of a text (`pkg/mod.py`).
fn paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '`' | ',' | ';' | '(' | ')' | '"'))
        .map(|w| w.trim_end_matches(['.', ':']))
        .filter(|w| w.contains('/') && w.rsplit('/').next().is_some_and(|n| n.contains('.')))
        .map(str::to_string)
        .collect()
}

/// The quotes of a reasoning step that refer to something (at the edit stage, code proposed
/// after "to" or "read", as in "changing `a` to `b`", is new code, not a reference).
fn quoted_references(step: &Step) -> Vec<&str> {
    if step.stage != Subtask::Edit {
        return quotes(&step.text);
    }
    let parts: Vec<&str> = step.text.split('`').collect();
    (1..parts.len())
        .step_by(2)
        .filter(|&i| {
            let before = parts[i - 1].trim_end();
            !(before.ends_with(" to") || before.ends_with(" read") || parts[i].trim().is_empty())
        })
        .map(|i| parts[i])
        .collect()
}

/// The text of an answer outside its fenced blocks.
fn prose(text: &str) -> String {
    text.split("```").step_by(2).collect::<Vec<_>>().join(" ")
}

/// The entities a step names.
pub fn entities(step: &Step) -> Vec<Entity> {
    let mut out: Vec<Entity> = Vec::new();
    let mut push = |e: Entity| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    match step.kind {
        StepKind::Reason => {
            for q in quoted_references(step) {
                push(Entity::Text(q.trim().to_string()));
            }
            for p in paths(&step.text) {
                push(Entity::Text(p));
            }
        }
        StepKind::Answer => {
            for q in quotes(&prose(&step.text)) {
                push(Entity::Text(q.trim().to_string()));
            }
            match step.stage {
                Subtask::File => {
                    for p in answer::parse_files(&step.text) {
                        push(Entity::Text(p));
                    }
                }
                Subtask::Function => {
                    for f in answer::parse_functions(&step.text) {
                        push(Entity::Text(f.path));
                        push(Entity::Text(f.name));
                    }
                }
                Subtask::Line => {
                    for l in answer::parse_lines(&step.text) {
                        push(Entity::Line(l.path, l.line));
                    }
                }
                Subtask::Edit => {
                    for b in answer::parse_edit(&step.text) {
                        push(Entity::Text(b.path.clone()));
                        for l in b.search.lines().map(str::trim).filter(|l| !l.is_empty()) {
                            push(Entity::Text(l.to_string()));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether `seen` shows an entity.
pub fn shows(seen: &Seen, e: &Entity) -> bool {
    match e {
        Entity::Text(t) => {
            seen.text.contains(t.as_str())
                || seen.windows.iter().any(|w| w.text.contains(t.as_str()))
        }
        Entity::Line(path, n) => seen
            .windows
            .iter()
            .any(|w| &w.path == path && *n >= w.start_line && *n < w.start_line + w.len()),
    }
}

/// The entities of `step` that `seen` does not show (empty: the step is grounded).
pub fn unseen(step: &Step, seen: &Seen) -> Vec<Entity> {
    entities(step)
        .into_iter()
        .filter(|e| !shows(seen, e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::reward::Window;

    fn seen() -> Seen {
        Seen {
            text:
                "from pkg import money\nprint(money.Money(1).split(3))\npkg/money.py\nMoney.split"
                    .into(),
            windows: vec![Window {
                path: "pkg/money.py".into(),
                start_line: 10,
                text: "    def split(self, n):\n        return [self] * n\n".into(),
            }],
        }
    }

    #[test]
    fn a_step_naming_an_unseen_entity_is_rejected() {
        let ok = Step::reason(
            Subtask::File,
            "The snippet runs `from pkg import money`, so the code lives in pkg/money.py.",
        );
        assert!(unseen(&ok, &seen()).is_empty());
        let leak = Step::reason(
            Subtask::File,
            "The bug is `return [self] * (n + 1)` in pkg/money.py.",
        );
        assert_eq!(
            unseen(&leak, &seen()),
            vec![Entity::Text("return [self] * (n + 1)".into())]
        );
        let wrong_path = Step::reason(Subtask::File, "Look at pkg/cash.py first.");
        assert_eq!(unseen(&wrong_path, &seen()).len(), 1);
        // Answers: a line outside every observed window is unseen; one inside is seen.
        let line = Step::answer(Subtask::Line, "```\npkg/money.py\nline: 11\n```");
        assert!(unseen(&line, &seen()).is_empty());
        let far = Step::answer(Subtask::Line, "```\npkg/money.py\nline: 40\n```");
        assert_eq!(
            unseen(&far, &seen()),
            vec![Entity::Line("pkg/money.py".into(), 40)]
        );
        // At the edit stage a proposed replacement is new code; at earlier stages it is a leak.
        let propose = "Changing `return [self] * n` to `return [self] * (n + 1)` fixes it.";
        assert!(unseen(&Step::reason(Subtask::Edit, propose), &seen()).is_empty());
        assert_eq!(
            unseen(&Step::reason(Subtask::Line, propose), &seen()).len(),
            1
        );
        let func = Step::answer(
            Subtask::Function,
            "```\npkg/money.py\nmethod: Money.format\n```",
        );
        assert_eq!(
            unseen(&func, &seen()),
            vec![Entity::Text("Money.format".into())]
        );
        // An answer whose prose cites code not yet seen leaks it, although its block is grounded.
        let leaky = Step::answer(
            Subtask::File,
            "The culprit is `return [self] * (n + 1)`.\n```\npkg/money.py\n```",
        );
        assert_eq!(
            unseen(&leaky, &seen()),
            vec![Entity::Text("return [self] * (n + 1)".into())]
        );
        let plain = Step::answer(Subtask::File, "```\npkg/money.py\n```");
        assert!(unseen(&plain, &seen()).is_empty());
    }
}
