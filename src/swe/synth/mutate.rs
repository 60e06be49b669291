//! Bug injection: mutation operators over the function bodies of a Python module.
//!
//! Every candidate replaces a range of lines. Operators: boundary and comparison flips, arithmetic
//! operator swaps, off-by-one, wrong constant, wrong return value, swapped arguments, missing
//! condition (dropped clause or guard), dropped statement, wrong variable, dropped negation, min/max.

use crate::swe::codemap::{self, Lang};
use regex::Regex;
use std::sync::OnceLock;

/// One candidate bug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// Module path in the project.
    pub path: String,
    /// First replaced line, 0-based.
    pub start: usize,
    /// Number of replaced lines.
    pub len: usize,
    /// Replacement lines (without newlines).
    pub replacement: Vec<String>,
    /// Operator name.
    pub operator: &'static str,
    /// Qualified name of the function holding the bug.
    pub function: String,
}

impl Mutation {
    /// Applies the mutation to the module text.
    pub fn apply(&self, text: &str) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let mut out = String::with_capacity(text.len() + 32);
        for l in &lines[..self.start.min(lines.len())] {
            out.push_str(l);
            out.push('\n');
        }
        for l in &self.replacement {
            out.push_str(l);
            out.push('\n');
        }
        for l in lines.iter().skip(self.start + self.len) {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// Byte positions of `line` inside string literals (simple scan, escapes honoured).
fn string_mask(line: &str) -> Vec<bool> {
    let mut mask = vec![false; line.len()];
    let mut quote: Option<u8> = None;
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match quote {
            Some(q) => {
                mask[i] = true;
                if b[i] == b'\\' && i + 1 < b.len() {
                    mask[i + 1] = true;
                    i += 1;
                } else if b[i] == q {
                    quote = None;
                }
            }
            None => {
                if b[i] == b'#' {
                    for m in mask.iter_mut().skip(i) {
                        *m = true;
                    }
                    break;
                }
                if b[i] == b'"' || b[i] == b'\'' {
                    quote = Some(b[i]);
                    mask[i] = true;
                }
            }
        }
        i += 1;
    }
    mask
}

fn re(cell: &'static OnceLock<Regex>, pat: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pat).expect("constant regex is valid"))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Token swaps applied one occurrence at a time: (operator, from, to).
const SWAPS: [(&str, &str, &str); 16] = [
    ("boundary", " <= ", " < "),
    ("boundary", " < ", " <= "),
    ("boundary", " >= ", " > "),
    ("boundary", " > ", " >= "),
    ("comparison", " == ", " != "),
    ("comparison", " != ", " == "),
    ("arithmetic", " + ", " - "),
    ("arithmetic", " - ", " + "),
    ("arithmetic", " * ", " + "),
    ("arithmetic", " // ", " / "),
    ("arithmetic", " / ", " // "),
    ("off_by_one", " - 1", ""),
    ("off_by_one", " + 1", ""),
    ("min_max", "min(", "max("),
    ("min_max", "max(", "min("),
    ("negation", "not ", ""),
];

struct Ctx<'a> {
    path: &'a str,
    function: &'a str,
    names: &'a [String],
}

fn push(
    out: &mut Vec<Mutation>,
    ctx: &Ctx<'_>,
    i: usize,
    len: usize,
    rep: Vec<String>,
    op: &'static str,
) {
    out.push(Mutation {
        path: ctx.path.to_string(),
        start: i,
        len,
        replacement: rep,
        operator: op,
        function: ctx.function.to_string(),
    });
}

fn line_candidates(lines: &[&str], i: usize, ctx: &Ctx<'_>, out: &mut Vec<Mutation>) {
    let line = lines[i];
    let mask = string_mask(line);
    let free = |pos: usize| !mask.get(pos).copied().unwrap_or(true);
    let trimmed = line.trim_start();
    // Token swaps (first free occurrence of each).
    for (op, from, to) in SWAPS {
        if let Some(pos) = line.match_indices(from).map(|(p, _)| p).find(|&p| free(p)) {
            let after = &line[pos + from.len()..];
            if op == "off_by_one" && after.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                continue;
            }
            if from == "not " {
                let before_ok = pos == 0 || !line.as_bytes()[pos - 1].is_ascii_alphanumeric();
                if !before_ok || after.starts_with("in ") || line[..pos].ends_with("is ") {
                    continue;
                }
            }
            if from == " - " && line[..pos].trim_end().ends_with(['(', ',', '=']) {
                continue;
            }
            let new = format!("{}{}{}", &line[..pos], to, after);
            push(out, ctx, i, 1, vec![new], op);
        }
    }
    // off-by-one on len(...)
    static LEN: OnceLock<Regex> = OnceLock::new();
    if let Some(m) = re(&LEN, r"len\([A-Za-z_][\w.]*\)").find(line) {
        if free(m.start()) {
            let new = format!("{} - 1{}", &line[..m.end()], &line[m.end()..]);
            push(out, ctx, i, 1, vec![new], "off_by_one");
        }
    }
    // Wrong constant: an integer literal.
    static INT: OnceLock<Regex> = OnceLock::new();
    for m in re(&INT, r"\b\d+\b").find_iter(line) {
        let (s, e) = (m.start(), m.end());
        let prev = line[..s].chars().last();
        let next = line[e..].chars().next();
        if !free(s)
            || prev == Some('.')
            || next == Some('.')
            || prev.is_some_and(|c| c.is_alphabetic() || c == '_')
        {
            continue;
        }
        let Ok(v) = m.as_str().parse::<u64>() else {
            continue;
        };
        let nv = if v == 0 { 1 } else { v + 1 };
        let new = format!("{}{}{}", &line[..s], nv, &line[e..]);
        push(out, ctx, i, 1, vec![new], "wrong_constant");
        break;
    }
    // Wrong return value.
    if let Some(expr) = trimmed.strip_prefix("return ") {
        let pad = &line[..indent(line)];
        let new_expr = match expr.trim() {
            "True" => Some("False".to_string()),
            "False" => Some("True".to_string()),
            "None" => None,
            "0.0" => Some("1.0".to_string()),
            "[]" => Some("None".to_string()),
            e if e.starts_with('-') => Some(e.trim_start_matches('-').to_string()),
            e if e.starts_with("not ") => Some(e[4..].to_string()),
            e if !e.contains(" if ") => Some(format!("not {e}")),
            _ => None,
        };
        if let Some(ne) = new_expr {
            push(
                out,
                ctx,
                i,
                1,
                vec![format!("{pad}return {ne}")],
                "wrong_return",
            );
        }
    }
    // Swapped arguments of a two-argument call.
    static CALL: OnceLock<Regex> = OnceLock::new();
    if let Some(c) = re(
        &CALL,
        r"([A-Za-z_][\w.]*)\(([^(),\[\]=]+), ([^(),\[\]=]+)\)",
    )
    .captures(line)
    {
        if let (Some(all), Some(a), Some(b)) = (c.get(0), c.get(2), c.get(3)) {
            if free(all.start())
                && a.as_str().trim() != b.as_str().trim()
                && !line[all.start()..].contains('"')
            {
                let new = format!(
                    "{}{}, {}{}",
                    &line[..a.start()],
                    b.as_str(),
                    a.as_str(),
                    &line[b.end()..]
                );
                push(out, ctx, i, 1, vec![new], "swapped_args");
            }
        }
    }
    // Missing condition: drop the second clause of `and` / `or` in a condition.
    if (trimmed.starts_with("if ")
        || trimmed.starts_with("return ")
        || trimmed.starts_with("elif "))
        && line.matches(" and ").count() + line.matches(" or ").count() == 1
    {
        let pos = line.find(" and ").or_else(|| line.find(" or "));
        if let Some(pos) = pos.filter(|&p| free(p)) {
            let tail = if line.trim_end().ends_with(':') {
                ":"
            } else {
                ""
            };
            let new = format!("{}{}", &line[..pos], tail);
            push(out, ctx, i, 1, vec![new], "missing_condition");
        }
    }
    // Missing guard: an `if` whose one-line body raises/returns/continues.
    if trimmed.starts_with("if ") && line.trim_end().ends_with(':') && i + 2 < lines.len() {
        let body = lines[i + 1].trim_start();
        let after = lines[i + 2];
        let body_simple =
            body.starts_with("raise ") || body.starts_with("return") || body == "continue";
        let prev_opens = i > 0 && lines[i - 1].trim_end().ends_with(':');
        let after_continues = !after.trim().is_empty() && indent(after) == indent(line);
        if body_simple && indent(lines[i + 1]) > indent(line) && !(prev_opens && !after_continues) {
            let after_is_else =
                after.trim_start().starts_with("else") || after.trim_start().starts_with("elif");
            if !after_is_else {
                push(out, ctx, i, 2, Vec::new(), "missing_condition");
            }
        }
    }
    // Dropped statement: augmented assignments and mutating calls that are not alone in their block.
    let droppable = trimmed.contains(" += ")
        || trimmed.contains(" -= ")
        || trimmed.contains(".append(")
        || trimmed.contains(".remove(")
        || (trimmed.starts_with("self.") && trimmed.contains(" = "));
    if droppable && !trimmed.starts_with("return") {
        let prev_opens = i > 0 && lines[i - 1].trim_end().ends_with(':');
        let next_same = lines
            .get(i + 1)
            .is_some_and(|n| !n.trim().is_empty() && indent(n) == indent(line));
        if !prev_opens || next_same {
            push(out, ctx, i, 0, Vec::new(), "dropped_statement");
            if let Some(last) = out.last_mut() {
                last.len = 1;
            }
        }
    }
    // Wrong variable: one use of a local name replaced by another local name.
    if !trimmed.starts_with("def ") && ctx.names.len() >= 2 {
        static WORD: OnceLock<Regex> = OnceLock::new();
        let assign_end = match trimmed.split_once(" = ") {
            Some((lhs, _))
                if lhs
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == ',' || c == ' ') =>
            {
                indent(line) + lhs.len() + 3
            }
            _ => 0,
        };
        for m in re(&WORD, r"\b[A-Za-z_]\w*\b").find_iter(line) {
            if m.start() < assign_end || !free(m.start()) {
                continue;
            }
            let w = m.as_str();
            let prev = line[..m.start()].chars().last();
            let next = line[m.end()..].chars().next();
            if prev == Some('.') || next == Some('=') || next == Some('(') {
                continue;
            }
            if !ctx.names.iter().any(|n| n == w) {
                continue;
            }
            if let Some(other) = ctx.names.iter().find(|n| n.as_str() != w) {
                let new = format!("{}{}{}", &line[..m.start()], other, &line[m.end()..]);
                push(out, ctx, i, 1, vec![new], "wrong_variable");
                break;
            }
        }
    }
}

/// Parameter and local names of a function, from its header and assignments (no `self`).
fn local_names(lines: &[&str], header: usize, end: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let h = lines[header];
    if let (Some(a), Some(b)) = (h.find('('), h.rfind(')')) {
        for p in h[a + 1..b].split(',') {
            let n = p
                .split(['=', ':'])
                .next()
                .unwrap_or("")
                .trim()
                .trim_start_matches('*');
            if !n.is_empty()
                && n != "self"
                && n.chars().all(|c| c.is_alphanumeric() || c == '_')
                && !names.iter().any(|x| x == n)
            {
                names.push(n.to_string());
            }
        }
    }
    for l in &lines[header + 1..=end.min(lines.len() - 1)] {
        if let Some((lhs, _)) = l.trim_start().split_once(" = ") {
            let n = lhs.trim();
            if n.chars().all(|c| c.is_alphanumeric() || c == '_') && !names.iter().any(|x| x == n) {
                names.push(n.to_string());
            }
        }
    }
    names
}

/// All mutation candidates of a module, in source order.
pub fn candidates(path: &str, source: &str) -> Vec<Mutation> {
    let lines: Vec<&str> = source.lines().collect();
    let defs = codemap::definitions(Lang::Python, source);
    let mut out = Vec::new();
    let mut seen_lines = std::collections::BTreeSet::new();
    // Innermost definitions first so each line is attributed to the function that holds it.
    let mut funcs: Vec<&codemap::Definition> = defs
        .iter()
        .filter(|d| d.kind != codemap::DefKind::Class)
        .collect();
    funcs.sort_by_key(|d| d.end_line - d.start_line);
    for d in funcs {
        // Header line: the `def` line (decorators come before it).
        let mut header = d.start_line - 1;
        while header < lines.len() && !lines[header].trim_start().starts_with("def ") {
            header += 1;
        }
        let end = (d.end_line - 1).min(lines.len().saturating_sub(1));
        if header >= end {
            continue;
        }
        let mut body_start = header + 1;
        // Skip a docstring.
        if lines[body_start].trim_start().starts_with("\"\"\"") {
            let first = lines[body_start].trim();
            if !(first.len() > 6 && first.ends_with("\"\"\"")) {
                body_start += 1;
                while body_start <= end && !lines[body_start].contains("\"\"\"") {
                    body_start += 1;
                }
            }
            body_start += 1;
        }
        let names = local_names(&lines, header, end);
        let ctx = Ctx {
            path,
            function: &d.name,
            names: &names,
        };
        for i in body_start..=end {
            if i >= lines.len() || lines[i].trim().is_empty() || !seen_lines.insert(i) {
                continue;
            }
            line_candidates(&lines, i, &ctx, &mut out);
        }
    }
    out.sort_by(|a, b| {
        (a.start, a.operator, &a.replacement).cmp(&(b.start, b.operator, &b.replacement))
    });
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_varied_operators_and_never_touches_docstrings() {
        let mut ops = std::collections::BTreeSet::new();
        for t in crate::swe::synth::templates::TEMPLATES {
            let c = candidates(&format!("p/{}.py", t.name), t.module);
            let lines: Vec<&str> = t.module.lines().collect();
            for m in &c {
                ops.insert(m.operator);
                assert!(!lines[m.start].contains("\"\"\""), "{m:?}");
                assert_ne!(m.apply(t.module), t.module, "{m:?}");
            }
        }
        for op in [
            "boundary",
            "comparison",
            "arithmetic",
            "off_by_one",
            "wrong_constant",
            "wrong_return",
            "swapped_args",
            "missing_condition",
            "dropped_statement",
            "wrong_variable",
            "negation",
            "min_max",
        ] {
            assert!(ops.contains(op), "{op} missing from {ops:?}");
        }
    }
}
