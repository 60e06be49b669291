//! Prompt builders of the four subtasks: issue text + that stage's repository view + a
//! chain-of-thought instruction + the exact answer format (after Agentless and SoRFT).

use crate::swe::answer::NamedLocation;
use crate::swe::codemap::{self, Lang, TreeView};
use crate::swe::repo::Snapshot;
use crate::swe::reward::Window;
use crate::swe::truth::{FuncTarget, LineTarget};
use std::collections::BTreeMap;

/// The chain-of-thought instruction shared by all subtasks.
pub const THINK: &str =
    "First think step by step inside <think> </think> tags about where the problem comes from; \
then write the final answer after </think>, exactly in the format below and nothing else.";

fn issue_block(problem: &str) -> String {
    format!(
        "### GitHub Problem Description ###\n{}\n\n###\n\n",
        problem.trim_end()
    )
}

/// File localization: issue + repository tree; answer = paths in a fenced block.
pub fn file_prompt(problem: &str, tree: &TreeView) -> String {
    format!(
        "Please look through the following GitHub problem description and repository structure and provide \
a list of files that one would need to edit to fix the problem.\n\n{}### Repository Structure ###\n{}\n###\n\n\
{THINK}\nReturn at most 5 files, most important first, one full path per line, wrapped in triple backticks. \
For example:\n```\npath/to/file1.py\npath/to/file2.py\n```\n",
        issue_block(problem),
        tree.text.trim_end()
    )
}

/// Skeletons of `files` (only those with a grammar in `snap`) and the definitions they show.
pub fn skeleton_view(snap: &Snapshot, files: &[String]) -> (String, Vec<FuncTarget>) {
    let mut text = String::new();
    let mut shown = Vec::new();
    for f in files {
        let (Some(lang), Some(src)) = (Lang::from_path(f), snap.text(f)) else {
            continue;
        };
        text.push_str(&format!(
            "### File: {f} ###\n```{}\n{}```\n\n",
            crate::swe::edit::fence_lang(f),
            codemap::skeleton(lang, src)
        ));
        for d in codemap::units(&codemap::definitions(lang, src)) {
            shown.push(FuncTarget {
                path: f.clone(),
                kind: d.kind,
                name: d.name.clone(),
            });
        }
    }
    (text, shown)
}

/// Function localization: issue + file skeletons; answer = `function:`/`class:`/`method:` lines
/// grouped under file paths.
pub fn function_prompt(problem: &str, skeletons: &str) -> String {
    format!(
        "Please look through the following GitHub problem description and the skeletons of relevant files. \
Identify all locations that need inspection or editing to fix the problem: functions, classes and \
methods.\n\n{}### Skeleton of Relevant Files ###\n{}###\n\n{THINK}\nList the locations grouped by file, \
wrapped in triple backticks; use `function: name` for a function, `class: Name` for a class and \
`method: Class.name` for a method. For example:\n```\npath/to/file1.py\nfunction: my_function\n\
class: MyClass\nmethod: MyClass.my_method\n\npath/to/file2.py\nfunction: other_function\n```\n",
        issue_block(problem),
        skeletons
    )
}

/// Windows rendered with line numbers, one section per window.
pub fn numbered_view(snap: &Snapshot, windows: &[Window]) -> String {
    let mut s = String::new();
    for w in windows {
        let src = snap.text(&w.path).unwrap_or("");
        s.push_str(&format!(
            "### {} ###\n{}\n",
            w.path,
            codemap::code_window(src, w.start_line, w.start_line + w.len().saturating_sub(1))
        ));
    }
    s
}

/// Line localization: issue + numbered code windows; answer = `line: N` grouped by file and function.
pub fn line_prompt(problem: &str, numbered: &str) -> String {
    format!(
        "Please review the following GitHub problem description and the relevant code, and give the exact \
lines that need to be edited to fix the problem. Line numbers are shown at the start of each line.\n\n{}\
### Relevant Code ###\n{}###\n\n{THINK}\nList the lines grouped by file and function, wrapped in triple \
backticks. For example:\n```\npath/to/file1.py\nfunction: MyClass.my_method\nline: 12\nline: 15\n\n\
path/to/file2.py\nfunction: my_function\nline: 40\n```\n",
        issue_block(problem),
        numbered
    )
}

/// Windows rendered verbatim (what SEARCH blocks must match), one section per window.
pub fn raw_view(windows: &[Window]) -> String {
    let mut s = String::new();
    for w in windows {
        s.push_str(&format!(
            "### {}\n```{}\n{}```\n\n",
            w.path,
            crate::swe::edit::fence_lang(&w.path),
            w.text
        ));
    }
    s
}

/// Code edit: issue + verbatim code windows; answer = SEARCH/REPLACE blocks.
pub fn edit_prompt(problem: &str, raw: &str) -> String {
    format!(
        "We are currently solving the following issue within our repository. Here is the issue text:\n\n{}\
Below are some code segments from relevant files. One or more of these segments contain the bug.\n\n\
### Code Segments ###\n{}###\n\n{THINK}\nThen fix the issue with *SEARCH/REPLACE* edits. Each edit names \
the file path, then a SEARCH part that matches lines of the segments above exactly (indentation included), \
then the REPLACE part. For example:\n\n```python\n### mathweb/flask/app.py\n<<<<<<< SEARCH\nfrom flask \
import Flask\n=======\nimport math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n\nWrap each edit in \
triple backticks; make several edits if needed.\n",
        issue_block(problem),
        raw
    )
}

/// Merges (path, start, end) line ranges (1-based, inclusive) and cuts windows from the snapshot.
pub fn windows_from_ranges(snap: &Snapshot, ranges: &[(String, usize, usize)]) -> Vec<Window> {
    let mut by_file: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
    for (p, a, b) in ranges {
        by_file.entry(p.as_str()).or_default().push((*a, *b));
    }
    let mut out = Vec::new();
    for (path, mut rs) in by_file {
        let Some(src) = snap.text(path) else { continue };
        let n = src.split_inclusive('\n').count();
        if n == 0 {
            continue;
        }
        rs.sort();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (a, b) in rs {
            let (a, b) = (a.clamp(1, n), b.clamp(1, n));
            match merged.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
                _ => merged.push((a, b.max(a))),
            }
        }
        for (a, b) in merged {
            out.push(Window {
                path: path.to_string(),
                start_line: a,
                text: codemap::raw_window(src, a, b),
            });
        }
    }
    out
}

/// Most lines shown for a whole file in line/edit views.
pub const WHOLE_FILE_MAX: usize = 300;
/// Lines of context shown around a line outside any definition.
pub const LINE_RADIUS: usize = 15;

/// Windows of the named definitions (looked up in the snapshot) plus `extra` lines with context.
/// Names that do not exist in their file are skipped.
pub fn windows_for_locations(
    snap: &Snapshot,
    locs: &[(String, String)],
    extra: &[LineTarget],
) -> Vec<Window> {
    let mut ranges = Vec::new();
    let mut defs_cache: BTreeMap<&str, Vec<codemap::Definition>> = BTreeMap::new();
    for (path, name) in locs {
        let (Some(lang), Some(src)) = (Lang::from_path(path), snap.text(path)) else {
            continue;
        };
        let defs = defs_cache
            .entry(path.as_str())
            .or_insert_with(|| codemap::definitions(lang, src));
        for d in defs.iter().filter(|d| &d.name == name) {
            ranges.push((path.clone(), d.start_line, d.end_line));
        }
    }
    for l in extra {
        ranges.push((
            l.path.clone(),
            l.line.saturating_sub(LINE_RADIUS),
            l.line + LINE_RADIUS,
        ));
    }
    windows_from_ranges(snap, &ranges)
}

/// Line/edit windows built from ground truth: the modified definitions' spans, plus context around
/// truth lines outside them (module-level changes and files without a grammar).
pub fn truth_windows(snap: &Snapshot, funcs: &[FuncTarget], lines: &[LineTarget]) -> Vec<Window> {
    let locs: Vec<(String, String)> = funcs
        .iter()
        .map(|f| (f.path.clone(), f.name.clone()))
        .collect();
    let base = windows_for_locations(snap, &locs, &[]);
    let uncovered: Vec<LineTarget> = lines
        .iter()
        .filter(|l| !base.iter().any(|w| w.contains(&l.path, l.line)))
        .cloned()
        .collect();
    windows_for_locations(snap, &locs, &uncovered)
}

/// Line windows built from a predicted function answer; for a file named without any definition,
/// the start of the file (at most [`WHOLE_FILE_MAX`] lines).
pub fn predicted_windows(snap: &Snapshot, pred: &[NamedLocation]) -> Vec<Window> {
    let locs: Vec<(String, String)> = pred
        .iter()
        .map(|l| (l.path.clone(), l.name.clone()))
        .collect();
    let mut w = windows_for_locations(snap, &locs, &[]);
    if w.is_empty() {
        let mut ranges = Vec::new();
        for l in pred {
            ranges.push((l.path.clone(), 1, WHOLE_FILE_MAX));
        }
        w = windows_from_ranges(snap, &ranges);
    }
    w
}
