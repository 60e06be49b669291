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
/// lines, trailing whitespace and blank added or removed lines.
pub fn normalize_patch(patch: &str) -> String {
    let mut out = String::new();
    for line in patch.lines() {
        if line.starts_with("+++ ") || line.starts_with("--- ") {
            out.push_str(line.trim_end());
            out.push('\n');
        } else if let Some(rest) = line.strip_prefix('+').or_else(|| line.strip_prefix('-')) {
            if rest.trim().is_empty() {
                continue;
            }
            out.push_str(&line[..1]);
            out.push_str(rest.trim_end());
            out.push('\n');
        }
    }
    out
}

/// Whether a patch adds or removes any non-blank line.
pub fn changes_something(patch: &str) -> bool {
    normalize_patch(patch)
        .lines()
        .any(|l| !l.starts_with("+++ ") && !l.starts_with("--- "))
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
