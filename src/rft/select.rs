//! Choosing one patch among sampled candidates, as Agentless does: drop empty or unappliable
//! patches, keep those that fail the fewest existing (regression) tests, then take the majority
//! among normalised patches (ties go to the earliest sample).

use std::collections::BTreeMap;

/// One candidate patch and what is known about it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidate {
    /// The unified diff.
    pub patch: String,
    /// Whether it applied to the repository.
    pub applied: bool,
    /// Existing tests it breaks, when they were run.
    pub failing_regression: Option<usize>,
}

/// A form of the patch that ignores what does not change behaviour: hunk positions, context
/// lines, Python comments, runs of whitespace inside a line (indentation is kept), and blank (or
/// comment-only) added or removed lines.
pub fn normalize_patch(patch: &str) -> String {
    let mut out = String::new();
    for line in patch.lines() {
        if line.starts_with("+++ ") || line.starts_with("--- ") {
            out.push_str(line.trim_end());
            out.push('\n');
        } else if let Some(rest) = line.strip_prefix('+').or_else(|| line.strip_prefix('-')) {
            let code = strip_comment(rest);
            if code.trim().is_empty() {
                continue;
            }
            let indent = &code[..code.len() - code.trim_start().len()];
            out.push_str(&line[..1]);
            out.push_str(indent);
            out.push_str(&code.split_whitespace().collect::<Vec<_>>().join(" "));
            out.push('\n');
        }
    }
    out
}

/// A Python line without its comment (a `#` outside string quotes starts one).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Whether a patch adds or removes any line of code (blank and comment-only lines do not count).
pub fn changes_something(patch: &str) -> bool {
    // Per file, the normalised removed lines against the added ones: an edit that only reflows
    // whitespace or adds a comment removes and adds the same code.
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let mut changed = false;
    for l in normalize_patch(patch).lines() {
        if l.starts_with("+++ ") {
            continue;
        }
        if l.starts_with("--- ") {
            changed |= removed != added;
            removed.clear();
            added.clear();
        } else if let Some(r) = l.strip_prefix('-') {
            removed.push(r.to_string());
        } else if let Some(a) = l.strip_prefix('+') {
            added.push(a.to_string());
        }
    }
    changed || removed != added
}

/// The index of the chosen candidate, or `None` when no candidate applied with a change.
pub fn select(cands: &[Candidate]) -> Option<usize> {
    let usable: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].applied && changes_something(&cands[i].patch))
        .collect();
    let fewest = usable
        .iter()
        .map(|&i| cands[i].failing_regression.unwrap_or(usize::MAX))
        .min()?;
    let mut votes: BTreeMap<String, (usize, usize)> = BTreeMap::new(); // norm -> (count, first)
    for &i in &usable {
        if cands[i].failing_regression.unwrap_or(usize::MAX) != fewest {
            continue;
        }
        let e = votes
            .entry(normalize_patch(&cands[i].patch))
            .or_insert((0, i));
        e.0 += 1;
    }
    votes
        .values()
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|&(_, first)| first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_spacing_do_not_split_the_vote() {
        let a = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    return a+b\n+    return a - b\n";
        let b =
            "--- a/m.py\n+++ b/m.py\n@@ -3 +3 @@\n-    return a+b\n+    return a  -  b   # fixed\n";
        assert_eq!(normalize_patch(a), normalize_patch(b));
        // A '#' inside a string is code, not a comment.
        let c = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    s = '#'\n+    s = '# x'\n";
        assert!(
            normalize_patch(c).contains("'# x'"),
            "{}",
            normalize_patch(c)
        );
        // Indentation still counts.
        let d = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    return a+b\n+return a - b\n";
        assert_ne!(normalize_patch(a), normalize_patch(d));
        // An edit that only adds a comment changes nothing.
        let e = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    x = 1\n+    x = 1  # reviewed\n";
        assert!(!changes_something(e));
        assert!(changes_something(a));
    }

    fn cand(patch: &str, applied: bool, failing: Option<usize>) -> Candidate {
        Candidate {
            patch: patch.to_string(),
            applied,
            failing_regression: failing,
        }
    }

    const A: &str =
        "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x\n+    return x + 1\n";
    const A2: &str = "--- a/m.py\n+++ b/m.py\n@@ -10,3 +10,4 @@\n context\n-    return x\n+    return x + 1   \n+\n";
    const B: &str =
        "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x\n+    return x - 1\n";

    #[test]
    fn normalisation_ignores_positions_context_and_whitespace() {
        assert_eq!(normalize_patch(A), normalize_patch(A2));
        assert_ne!(normalize_patch(A), normalize_patch(B));
    }

    #[test]
    fn majority_wins_among_the_fewest_regressions() {
        let c = vec![
            cand(B, true, Some(0)),
            cand(A, true, Some(0)),
            cand(A2, true, Some(0)),
        ];
        assert_eq!(select(&c), Some(1));
    }

    #[test]
    fn fewer_regressions_beat_more_votes() {
        let c = vec![
            cand(A, true, Some(2)),
            cand(A2, true, Some(2)),
            cand(B, true, Some(1)),
        ];
        assert_eq!(select(&c), Some(2));
    }

    #[test]
    fn unapplied_and_empty_candidates_are_never_chosen() {
        let c = vec![
            cand(A, false, Some(0)),
            cand("", true, Some(0)),
            cand("--- a/x\n+++ b/x\n", true, Some(0)),
        ];
        assert_eq!(select(&c), None);
        let c = vec![cand(A, false, Some(0)), cand(B, true, None)];
        assert_eq!(select(&c), Some(1));
    }

    #[test]
    fn ties_go_to_the_earliest_sample() {
        let c = vec![cand(B, true, Some(0)), cand(A, true, Some(0))];
        assert_eq!(select(&c), Some(0));
    }
}
