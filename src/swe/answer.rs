//! Tolerant parsers for the four answer formats. They find the final answer in free text (after a
//! closing `</think>`, preferring fenced blocks), ignore junk, and never panic.

use crate::swe::edit::{self, EditBlock};

/// The part of a model output that holds the final answer: the text after the last `</think>`.
pub fn final_part(text: &str) -> &str {
    match text.rfind("</think>") {
        Some(i) => &text[i + "</think>".len()..],
        None => text,
    }
}

/// The contents of all fenced (```) blocks of `text`, joined; the whole text when there is none.
/// An unclosed last fence runs to the end.
pub fn fenced_or_all(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    let mut found = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            found = true;
            continue;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    if found {
        out
    } else {
        text.to_string()
    }
}

fn clean_line(line: &str) -> &str {
    let mut l = line.trim();
    // List markers: "- ", "* ", "1. ", "2) ".
    for p in ["- ", "* ", "+ "] {
        if let Some(r) = l.strip_prefix(p) {
            l = r.trim_start();
        }
    }
    let digits = l.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits > 0 && digits < 4 {
        let rest = &l[digits..];
        if let Some(r) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            l = r.trim_start();
        }
    }
    l.trim_matches(|c| c == '`' || c == '"' || c == '\'' || c == '*')
        .trim()
}

/// Whether a token looks like a repository path (`a/b.py`, `setup.cfg`).
pub fn looks_like_path(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 300
        && !s.contains(char::is_whitespace)
        && !s.contains(':')
        && (s.contains('/') || s.contains('.'))
        && s.chars().any(|c| c.is_alphanumeric())
        && !s.ends_with('.')
}

fn norm_path(s: &str) -> String {
    s.trim_start_matches("./")
        .trim_start_matches('/')
        .to_string()
}

/// File-localization answer: paths, one per line, in order, deduplicated.
pub fn parse_files(text: &str) -> Vec<String> {
    let body = fenced_or_all(final_part(text));
    let mut out: Vec<String> = Vec::new();
    for line in body.lines() {
        let l = clean_line(line);
        if looks_like_path(l) {
            let p = norm_path(l);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// One named location in a function-localization answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct NamedLocation {
    /// The file the name is grouped under.
    pub path: String,
    /// `function`, `class` or `method` as written.
    pub kind: String,
    /// The (qualified) name.
    pub name: String,
}

fn split_key(line: &str) -> Option<(String, &str)> {
    let (k, v) = line.split_once(':')?;
    let k = k
        .trim()
        .trim_matches(|c| c == '`' || c == '*')
        .to_ascii_lowercase();
    Some((k, v.trim()))
}

fn clean_name(v: &str) -> String {
    let v = v
        .trim()
        .trim_matches(|c| c == '`' || c == '"' || c == '\'' || c == '*');
    // "name(args)" -> "name"; "Class::method" -> "Class.method"
    let v = v.split('(').next().unwrap_or("").trim();
    v.replace("::", ".")
}

/// Function-localization answer: `function:` / `class:` / `method:` lines grouped under file paths.
pub fn parse_functions(text: &str) -> Vec<NamedLocation> {
    let body = fenced_or_all(final_part(text));
    let mut path: Option<String> = None;
    let mut out: Vec<NamedLocation> = Vec::new();
    for line in body.lines() {
        let l = clean_line(line);
        if let Some((k, v)) = split_key(l) {
            if matches!(k.as_str(), "function" | "class" | "method" | "def") {
                let name = clean_name(v);
                if let (Some(p), false) = (&path, name.is_empty()) {
                    let loc = NamedLocation {
                        path: p.clone(),
                        kind: if k == "def" { "function".into() } else { k },
                        name,
                    };
                    if !out.contains(&loc) {
                        out.push(loc);
                    }
                }
                continue;
            }
        }
        if looks_like_path(l) {
            path = Some(norm_path(l));
        }
    }
    out
}

/// One line in a line-localization answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct LineLocation {
    /// The file.
    pub path: String,
    /// The function it was grouped under, if any.
    pub function: Option<String>,
    /// 1-based line number.
    pub line: usize,
}

fn parse_numbers(v: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in v.split([',', ' ', ';']) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if let Some((a, b)) = part.split_once('-') {
            if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                if a <= b && b - a <= 200 {
                    out.extend(a..=b);
                }
            }
        } else if let Ok(n) = part.parse::<usize>() {
            out.push(n);
        }
    }
    out
}

/// Line-localization answer: `line: N` lines (also `line: 3, 5` or `lines: 3-7`) grouped under a
/// file path and optionally a `function:` / `method:` / `class:` line.
pub fn parse_lines(text: &str) -> Vec<LineLocation> {
    let body = fenced_or_all(final_part(text));
    let mut path: Option<String> = None;
    let mut func: Option<String> = None;
    let mut out: Vec<LineLocation> = Vec::new();
    for line in body.lines() {
        let l = clean_line(line);
        if let Some((k, v)) = split_key(l) {
            match k.as_str() {
                "line" | "lines" => {
                    if let Some(p) = &path {
                        for n in parse_numbers(v) {
                            let loc = LineLocation {
                                path: p.clone(),
                                function: func.clone(),
                                line: n,
                            };
                            if n > 0 && !out.contains(&loc) {
                                out.push(loc);
                            }
                        }
                    }
                    continue;
                }
                "function" | "class" | "method" => {
                    func = Some(clean_name(v)).filter(|s| !s.is_empty());
                    continue;
                }
                _ => {}
            }
        }
        if looks_like_path(l) {
            path = Some(norm_path(l));
            func = None;
        }
    }
    out
}

/// Edit answer: the SEARCH/REPLACE blocks of the final part.
pub fn parse_edit(text: &str) -> Vec<EditBlock> {
    edit::parse_blocks(final_part(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_from_a_chatty_answer() {
        let a = "<think>maybe src/x.py?</think>\nThe files are:\n```\n1. pkg/core.py\n- `pkg/util.py`\npkg/core.py\nnot a path\n```\n";
        assert_eq!(parse_files(a), vec!["pkg/core.py", "pkg/util.py"]);
        assert_eq!(
            parse_files("pkg/a.py\n./pkg/b.py"),
            vec!["pkg/a.py", "pkg/b.py"]
        );
    }

    #[test]
    fn functions_and_lines_grouped_by_file() {
        let a = "```\npkg/core.py\nfunction: clamp\nmethod: Shape.name\nclass: `Meta`\n\npkg/util.py\nfunction: helper(a)\n```";
        let f = parse_functions(a);
        assert_eq!(f.len(), 4);
        assert_eq!(f[3].path, "pkg/util.py");
        assert_eq!(f[3].name, "helper");
        let l = parse_lines(
            "```\npkg/core.py\nfunction: clamp\nline: 8\nlines: 10-12\nline: 3, 4\n```",
        );
        let nums: Vec<usize> = l.iter().map(|x| x.line).collect();
        assert_eq!(nums, vec![8, 10, 11, 12, 3, 4]);
        assert_eq!(l[0].function.as_deref(), Some("clamp"));
    }
}
