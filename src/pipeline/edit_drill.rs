//! Edit drills: the edit subtask's own prompt, with an explicit instruction in place of the
//! issue ("in `pkg/mod.py`, `width + len` should be `width - len`"), answered by a SEARCH/REPLACE
//! block that copies the one code line holding the fragment out of the shown segments and writes
//! it again with the change. Stage 1 keeps only a few dozen teacher edits, too few for a small
//! model to learn to copy a whole code line (indentation included) out of a long prompt: without
//! drills every free edit answer of the embedded default fails to parse (notes/learn.md, session
//! 45). A drill names the change, so it teaches the mechanics of an edit, not which line is wrong
//! (that stays the teacher's data); its code comes from the training repositories only.

use crate::engine::rng::SplitMix;
use crate::model::chat::Message;
use crate::rft::teacher::{is_code_line, INVERSE_MUTATIONS};
use crate::swe::codemap::is_test_path;
use crate::swe::prompt::{edit_prompt, raw_view};
use crate::swe::reward::Window;

/// Changes a drill asks for: (fragment, replacement), the built-in teacher's operator and
/// literal swaps without its deletions (a drill's replacement fragment names what to write).
fn changes() -> Vec<(&'static str, &'static str)> {
    INVERSE_MUTATIONS
        .iter()
        .filter(|(_, to)| !to.is_empty())
        .copied()
        .collect()
}

/// The instruction's fragment around byte `at` (where `from` starts in `line`): the change with
/// the word on each side, so that the fragment points at one line.
fn fragment(line: &str, at: usize, from: &str) -> (usize, usize) {
    let word = |c: char| c.is_ascii_alphanumeric() || "_.()[]'\"".contains(c);
    let b = line.as_bytes();
    let mut s = at;
    while s > 0 && b[s - 1] == b' ' {
        s -= 1;
    }
    while s > 0 && word(b[s - 1] as char) {
        s -= 1;
    }
    let mut e = at + from.len();
    while e < b.len() && b[e] == b' ' {
        e += 1;
    }
    while e < b.len() && word(b[e] as char) {
        e += 1;
    }
    (s, e)
}

/// The window shown around line `i` of `lines`: from the enclosing `def` (at most 12 lines up,
/// else 1-4 lines up) to 1-4 lines below, stopping before the next definition.
fn window(path: &str, lines: &[&str], i: usize, rng: &mut SplitMix) -> Window {
    let up = (i.saturating_sub(12)..i)
        .rev()
        .find(|&k| lines[k].trim_start().starts_with("def "))
        .unwrap_or(i.saturating_sub(1 + rng.below(4) as usize));
    let stop = (i + 2 + rng.below(4) as usize).min(lines.len());
    let mut end = i;
    for (k, l) in lines.iter().enumerate().take(stop).skip(i + 1) {
        let t = l.trim_start();
        if t.starts_with("def ") || t.starts_with("class ") || t.starts_with('@') {
            break;
        }
        end = k;
    }
    let text: String = lines[up..=end].iter().map(|l| format!("{l}\n")).collect();
    Window {
        path: path.to_string(),
        start_line: up + 1,
        text,
    }
}

/// A path's top-level folder (its package).
fn package(path: &str) -> &str {
    path.split('/').next().unwrap_or("")
}

/// One drill from `files` ((path, text) pairs; a second segment, shown half the time, comes from
/// another file of the same top-level package), or `None` when the draw found no changeable line
/// whose fragment is unique among the shown segments.
fn drill(
    files: &[(String, String)],
    changes: &[(&str, &str)],
    rng: &mut SplitMix,
) -> Option<Vec<Message>> {
    let (path, text) = &files[rng.below(files.len() as u64) as usize];
    let lines: Vec<&str> = text.lines().collect();
    let cands: Vec<(usize, usize, usize)> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| is_code_line(l))
        .flat_map(|(i, l)| {
            changes
                .iter()
                .enumerate()
                .filter_map(move |(c, (from, _))| l.find(from).map(|at| (i, c, at)))
        })
        .collect();
    if cands.is_empty() {
        return None;
    }
    let (i, c, at) = cands[rng.below(cands.len() as u64) as usize];
    let (from, to) = changes[c];
    let line = lines[i];
    let new = format!("{}{to}{}", &line[..at], &line[at + from.len()..]);
    let (s, e) = fragment(line, at, from);
    let frag = line[s..e].trim();
    let frag_new = new[s..e + to.len() - from.len()].trim();
    let mut windows = vec![window(path, &lines, i, rng)];
    let siblings: Vec<&(String, String)> = files
        .iter()
        .filter(|(p, _)| p != path && package(p) == package(path))
        .collect();
    if !siblings.is_empty() && rng.below(2) == 0 {
        let (p2, t2) = siblings[rng.below(siblings.len() as u64) as usize];
        let l2: Vec<&str> = t2.lines().collect();
        if !l2.is_empty() {
            let k = rng.below(l2.len() as u64) as usize;
            windows.push(window(p2, &l2, k, rng));
            windows.sort_by(|a, b| a.path.cmp(&b.path));
        }
    }
    let shown: String = windows.iter().map(|w| w.text.as_str()).collect();
    if frag.is_empty() || shown.matches(frag).count() != 1 {
        return None;
    }
    let func = (0..i)
        .rev()
        .find_map(|k| {
            let t = lines[k].trim_start().strip_prefix("def ")?;
            t.split('(').next()
        })
        .unwrap_or("the code");
    let ask = match rng.below(3) {
        0 => format!("In `{path}`, `{frag}` should be `{frag_new}`."),
        1 => format!("Change `{frag}` to `{frag_new}` in {path}."),
        _ => format!("`{func}` has a wrong expression: `{frag}` must read `{frag_new}`."),
    };
    let answer = format!(
        "<think>Line {} of {path} holds `{frag}`; changing `{}` to `{}` does what the issue asks.</think>\n```python\n### {path}\n<<<<<<< SEARCH\n{line}\n=======\n{new}\n>>>>>>> REPLACE\n```",
        i + 1,
        line.trim(),
        new.trim()
    );
    Some(vec![
        Message::new("user", &edit_prompt(&ask, &raw_view(&windows))),
        Message::new("assistant", &answer),
    ])
}

/// `n` edit drills from `files` ((repository-relative path, text) of the training
/// repositories' Python files; test files are left out), fixed by `seed`; fewer when the files
/// hold too few changeable lines (at most `20 n` draws).
pub fn edit_drills(n: usize, files: &[(String, String)], seed: u64) -> Vec<Vec<Message>> {
    let mut rng = SplitMix::new(seed);
    let mut out = Vec::with_capacity(n);
    // The package's code, as the real edits change it, not its tests.
    let files: Vec<(String, String)> = files
        .iter()
        .filter(|(p, _)| !is_test_path(p))
        .cloned()
        .collect();
    let changes = changes();
    if files.is_empty() {
        return out;
    }
    for _ in 0..20 * n {
        if out.len() == n {
            break;
        }
        if let Some(d) = drill(&files, &changes, &mut rng) {
            out.push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::answer::parse_edit;
    use crate::swe::edit::apply_block;

    fn files() -> Vec<(String, String)> {
        vec![
            (
                "pkg/text.py".into(),
                "def truncate(text, width, suffix=\"...\"):\n    \"\"\"Cut text.\"\"\"\n    if len(text) <= width:\n        return text\n    return text[: width - len(suffix)] + suffix\n".into(),
            ),
            (
                "pkg/num.py".into(),
                "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\ndef same(a, b):\n    return a == b\n".into(),
            ),
        ]
    }

    #[test]
    fn a_drill_copies_the_named_line_and_changes_only_the_fragment() {
        let files = files();
        let drills = edit_drills(40, &files, 7);
        assert_eq!(drills.len(), 40);
        for d in &drills {
            let (user, answer) = (&d[0].content, &d[1].content);
            let blocks = parse_edit(answer);
            assert_eq!(blocks.len(), 1, "{answer}");
            let b = &blocks[0];
            let search = b.search.trim_end_matches('\n');
            let issue = user
                .split("### GitHub Problem Description ###\n")
                .nth(1)
                .and_then(|r| r.split("\n\n###").next())
                .unwrap_or("");
            // The instruction names a fragment, never the whole line ...
            assert!(!issue.contains(search.trim()), "{issue} / {search}");
            // ... which the segments show verbatim, indentation included, exactly once.
            assert_eq!(user.matches(&format!("{search}\n")).count(), 1, "{user}");
            let text = &files
                .iter()
                .find(|f| f.0 == b.path)
                .expect("a shown file")
                .1;
            let edited = apply_block(text, b).expect("the SEARCH part matches the file");
            let changed = text
                .lines()
                .zip(edited.lines())
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(changed, 1, "one line changes");
        }
        assert_eq!(drills, edit_drills(40, &files, 7), "fixed by the seed");
        assert_ne!(drills, edit_drills(40, &files, 8));
    }

    #[test]
    fn files_without_changeable_lines_give_no_drills() {
        let none = vec![
            (
                "pkg/a.py".to_string(),
                "def f(x):\n    return x\n".to_string(),
            ),
            (
                "tests/test_a.py".to_string(),
                "    assert f(1) == 1\n".to_string(),
            ),
        ];
        assert!(edit_drills(5, &none, 1).is_empty());
        assert!(edit_drills(5, &[], 1).is_empty());
    }
}
