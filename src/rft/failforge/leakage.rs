//! The leakage check: a skill is a general lesson, so it may not carry the ground-truth answer of
//! the instance it is used on (a modified file's path, a modified definition's name, a modified
//! line's number, or the text the gold edit writes). Leaking skills are counted and dropped.

use serde::Serialize;

use crate::swe::truth::GroundTruth;

/// Which part of the ground truth a skill leaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakKind {
    /// A modified file (its path, file name, dotted module or import line).
    Path,
    /// A modified definition (qualified name or its last part).
    Function,
    /// A modified line number, written as `line N`, `line: N`, `:N` or `#LN`.
    Line,
    /// A line the gold edit writes.
    Replacement,
}

impl LeakKind {
    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            LeakKind::Path => "path",
            LeakKind::Function => "function",
            LeakKind::Line => "line",
            LeakKind::Replacement => "replacement",
        }
    }
}

/// A leak found in a skill: its kind and the ground-truth text it matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leak {
    /// What leaked.
    pub kind: LeakKind,
    /// The ground-truth text found in the skill.
    pub needle: String,
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `needle` occurs in `hay` with no identifier character right before or after it.
fn contains_word(hay: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let mut from = 0;
    while let Some(pos) = hay[from..].find(needle) {
        let at = from + pos;
        let end = at + needle.len();
        let before = hay[..at].chars().next_back().is_some_and(is_word_char);
        let after = hay[end..].chars().next().is_some_and(is_word_char);
        if !before && !after {
            return true;
        }
        from = at + needle.len().max(1);
        while !hay.is_char_boundary(from) {
            from += 1;
        }
    }
    false
}

/// The ways a skill could name a file: full path, file name, path without extension, dotted
/// module, and the `from pkg import mod` line that imports it (all lower-case).
fn path_needles(path: &str) -> Vec<String> {
    let p = path.to_lowercase();
    let mut out = vec![p.clone()];
    let name = p.rsplit('/').next().unwrap_or(&p).to_string();
    out.push(name.clone());
    if let Some((stem_path, _ext)) = p.rsplit_once('.') {
        out.push(stem_path.to_string());
        let dotted = stem_path.replace('/', ".");
        out.push(dotted.clone());
        if let Some((pkg, module)) = dotted.rsplit_once('.') {
            out.push(format!("from {pkg} import {module}"));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Numbers written as line references in `text`: `line 12`, `lines 12`, `line: 12`, `:12`, `#L12`.
fn line_refs(text: &str) -> Vec<usize> {
    let lower = text.to_lowercase();
    let bytes = lower.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let before = lower[..start].trim_end();
        let is_ref = before.ends_with("line")
            || before.ends_with("lines")
            || before.ends_with("line:")
            || lower[..start].ends_with(':')
            || lower[..start].ends_with("#l");
        if is_ref {
            if let Ok(n) = lower[start..i].parse::<usize>() {
                out.push(n);
            }
        }
    }
    out
}

/// Shortest written line that counts as replacement text (shorter ones are too common to be evidence).
pub const MIN_REPLACEMENT_CHARS: usize = 6;

/// The first ground-truth item `skill` contains, if any (paths, names and line references compare
/// case-insensitively; replacement text verbatim after trimming).
pub fn find_leak(skill: &str, truth: &GroundTruth) -> Option<Leak> {
    let lower = skill.to_lowercase();
    for f in truth.files.iter().chain(&truth.module_level) {
        for needle in path_needles(f) {
            if contains_word(&lower, &needle) {
                return Some(Leak {
                    kind: LeakKind::Path,
                    needle,
                });
            }
        }
    }
    for f in &truth.functions {
        let q = f.name.to_lowercase();
        let last = q.rsplit('.').next().unwrap_or(&q).to_string();
        for needle in [q.clone(), last] {
            if needle.chars().count() >= 4 && contains_word(&lower, &needle) {
                return Some(Leak {
                    kind: LeakKind::Function,
                    needle,
                });
            }
        }
    }
    let refs = line_refs(skill);
    if let Some(l) = truth.lines.iter().find(|l| refs.contains(&l.line)) {
        return Some(Leak {
            kind: LeakKind::Line,
            needle: format!("line {}", l.line),
        });
    }
    for e in &truth.edits {
        let old: Vec<&str> = e.search.lines().map(str::trim).collect();
        for new in e.replace.lines().map(str::trim) {
            if new.chars().count() >= MIN_REPLACEMENT_CHARS
                && !old.contains(&new)
                && skill.contains(new)
            {
                return Some(Leak {
                    kind: LeakKind::Replacement,
                    needle: new.to_string(),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::codemap::DefKind;
    use crate::swe::edit::EditBlock;
    use crate::swe::truth::{FuncTarget, LineTarget};

    fn truth() -> GroundTruth {
        GroundTruth {
            files: vec!["geomkit/shapes/area.py".into()],
            functions: vec![FuncTarget {
                path: "geomkit/shapes/area.py".into(),
                kind: DefKind::Method,
                name: "Circle.scaled_radius".into(),
            }],
            module_level: vec![],
            lines: vec![LineTarget {
                path: "geomkit/shapes/area.py".into(),
                line: 42,
            }],
            edits: vec![EditBlock {
                path: "geomkit/shapes/area.py".into(),
                search: "    return r * 2\n".into(),
                replace: "    return r * factor\n".into(),
            }],
        }
    }

    #[test]
    fn each_kind_of_ground_truth_is_caught() {
        let t = truth();
        let cases = [
            ("Open geomkit/shapes/area.py first.", LeakKind::Path),
            ("The bug is in area.py, look there.", LeakKind::Path),
            ("Follow `from geomkit.shapes import area`.", LeakKind::Path),
            (
                "Inspect geomkit.shapes.area before the rest.",
                LeakKind::Path,
            ),
            ("Start from Circle.scaled_radius.", LeakKind::Function),
            ("Check SCALED_RADIUS and its callers.", LeakKind::Function),
            ("The fault sits at line 42.", LeakKind::Line),
            ("Answer with path:42 next time.", LeakKind::Line),
            ("Write `return r * factor` instead.", LeakKind::Replacement),
        ];
        for (skill, kind) in cases {
            let leak = find_leak(skill, &t);
            assert_eq!(leak.map(|l| l.kind), Some(kind), "{skill}");
        }
    }

    #[test]
    fn general_skills_and_near_misses_pass() {
        let t = truth();
        for skill in [
            "Follow the traceback: its deepest frame inside the repository names the module to open first.",
            "Return at most 5 files; the fix needs 42 percent fewer guesses.",
            "Open the module that defines the area computation (areas.py is a different file).",
            "Name the method, not the class: radius alone is not enough.",
            "Keep `return r * 2` unchanged only if the issue agrees.",
        ] {
            assert_eq!(find_leak(skill, &t), None, "{skill}");
        }
    }

    #[test]
    fn word_boundaries_are_respected() {
        assert!(contains_word("see area.py now", "area.py"));
        assert!(!contains_word("see subarea.py now", "area.py"));
        assert!(!contains_word("areas", "area"));
        assert!(contains_word("ünïcode area", "area"));
        assert!(!contains_word("", "x"));
    }
}
