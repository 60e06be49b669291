//! Merging several localization samples into one answer, as Agentless does with its sampled
//! localizations: every target (file, function or line) named by a sample gets one vote per
//! sample; targets named by at least half the samples are kept, most votes first (ties: the
//! best position in any sample, then the earliest sample), at most as many as the longest
//! single answer named. The merged answer is rendered in the answer format the next stage reads.

use std::collections::BTreeMap;

use crate::swe::answer;
use crate::swe::subtask::Subtask;

/// One target: the file it is grouped under and the line rendered under that file (empty for
/// file localization).
type Target = (String, String);

/// The targets an answer names, in its order, without repeats.
fn targets(subtask: Subtask, text: &str) -> Vec<Target> {
    let mut out: Vec<Target> = match subtask {
        Subtask::File => answer::parse_files(text)
            .into_iter()
            .map(|p| (p, String::new()))
            .collect(),
        Subtask::Function => answer::parse_functions(text)
            .into_iter()
            .map(|f| (f.path, format!("{}: {}", f.kind, f.name)))
            .collect(),
        Subtask::Line => answer::parse_lines(text)
            .into_iter()
            .map(|l| (l.path, format!("line: {}", l.line)))
            .collect(),
        Subtask::Edit => Vec::new(),
    };
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|t| seen.insert(t.clone()));
    out
}

/// The merged answer of `answers` (sample 0 first, usually the greedy one). One answer, an
/// edit subtask, or samples that name nothing give the first answer unchanged.
pub fn merge(subtask: Subtask, answers: &[String]) -> String {
    let Some(first) = answers.first() else {
        return String::new();
    };
    if answers.len() == 1 || subtask == Subtask::Edit {
        return first.clone();
    }
    // target -> (votes, best position, first sample)
    let mut score: BTreeMap<Target, (usize, usize, usize)> = BTreeMap::new();
    let mut longest = 0;
    for (s, a) in answers.iter().enumerate() {
        let ts = targets(subtask, a);
        longest = longest.max(ts.len());
        for (pos, t) in ts.into_iter().enumerate() {
            let e = score.entry(t).or_insert((0, pos, s));
            e.0 += 1;
            e.1 = e.1.min(pos);
        }
    }
    if score.is_empty() {
        return first.clone();
    }
    let mut ranked: Vec<(Target, (usize, usize, usize))> = score.into_iter().collect();
    ranked.sort_by(|a, b| {
        (b.1 .0, a.1 .1, a.1 .2)
            .cmp(&(a.1 .0, b.1 .1, b.1 .2))
            .then_with(|| a.0.cmp(&b.0))
    });
    let need = answers.len().div_ceil(2);
    let top_votes = ranked[0].1 .0;
    let kept: Vec<Target> = ranked
        .into_iter()
        .filter(|(_, (v, _, _))| *v >= need.min(top_votes))
        .take(longest.max(1))
        .map(|(t, _)| t)
        .collect();
    render(&kept)
}

/// Targets as a fenced answer: files one per line; functions and lines grouped under their
/// file, in first-seen order of the files.
fn render(kept: &[Target]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut under: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (path, line) in kept {
        if !under.contains_key(path.as_str()) {
            order.push(path);
        }
        let v = under.entry(path).or_default();
        if !line.is_empty() {
            v.push(line);
        }
    }
    let mut s = String::from("```\n");
    for p in order {
        s.push_str(p);
        s.push('\n');
        for l in &under[p] {
            s.push_str(l);
            s.push('\n');
        }
    }
    s.push_str("```");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> String {
        format!("```\n{}\n```", paths.join("\n"))
    }

    #[test]
    fn majority_files_are_kept_in_vote_order() {
        let a = vec![
            files(&["pkg/a.py", "pkg/b.py"]),
            files(&["pkg/c.py", "pkg/a.py"]),
            files(&["pkg/c.py"]),
            files(&["pkg/a.py", "pkg/d.py"]),
        ];
        let m = merge(Subtask::File, &a);
        assert_eq!(answer::parse_files(&m), vec!["pkg/a.py", "pkg/c.py"], "{m}");
    }

    #[test]
    fn one_sample_or_nothing_parsed_gives_the_first_answer() {
        let one = vec!["free text pkg/a.py".to_string()];
        assert_eq!(merge(Subtask::File, &one), one[0]);
        let none = vec!["no idea".to_string(), "none".to_string()];
        assert_eq!(merge(Subtask::File, &none), "no idea");
    }

    #[test]
    fn functions_and_lines_merge_under_their_files() {
        let f = |name: &str| format!("```\npkg/a.py\nfunction: {name}\n```");
        let m = merge(Subtask::Function, &[f("g"), f("h"), f("g")]);
        let got = answer::parse_functions(&m);
        assert_eq!(got.len(), 1, "{m}");
        assert_eq!(
            (got[0].path.as_str(), got[0].name.as_str()),
            ("pkg/a.py", "g")
        );
        let l = |n: usize| format!("```\npkg/a.py\nline: {n}\n```");
        let m = merge(Subtask::Line, &[l(3), l(7), l(7), l(3)]);
        let lines: Vec<usize> = answer::parse_lines(&m).iter().map(|x| x.line).collect();
        // A tie in votes goes to the earliest sample; both are kept (each has half the votes)
        // but no more than the longest answer named (one).
        assert_eq!(lines, vec![3], "{m}");
    }

    #[test]
    fn no_majority_keeps_the_best_ranked_targets() {
        let a = vec![
            files(&["x.py"]),
            files(&["y.py"]),
            files(&["z.py"]),
            files(&["w.py"]),
            files(&["v.py"]),
        ];
        assert_eq!(answer::parse_files(&merge(Subtask::File, &a)), vec!["x.py"]);
    }
}
