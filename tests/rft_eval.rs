//! The Agentless evaluation chain with an oracle that answers every stage from ground truth:
//! every stage hits, every gold edit applies, and the sandbox resolves every instance. A second
//! run with an answerer that says nothing useful resolves nothing.

use sorft::rft::eval::{evaluate, Answerer, EvalConfig};
use sorft::swe::edit::render_blocks;
use sorft::swe::subtask::{Subtask, SubtaskRecord};
use sorft::swe::synth::{generate, SynthConfig};

struct Oracle;

impl Answerer for Oracle {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        _t: f32,
        _s: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        Ok(recs
            .iter()
            .map(|r| {
                let t = &r.truth;
                let text = match r.subtask {
                    Subtask::File => format!("```\n{}\n```", t.files.join("\n")),
                    Subtask::Function => {
                        let mut s = String::from("```\n");
                        for f in &t.functions {
                            s.push_str(&format!("{}\n{}: {}\n", f.path, f.kind.word(), f.name));
                        }
                        s + "```"
                    }
                    Subtask::Line => {
                        let mut s = String::from("```\n");
                        for l in &t.lines {
                            s.push_str(&format!("{}\nline: {}\n", l.path, l.line));
                        }
                        s + "```"
                    }
                    Subtask::Edit => render_blocks(&t.edits),
                };
                vec![text; n]
            })
            .collect())
    }
}

struct Silent;

impl Answerer for Silent {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        _t: f32,
        _s: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        Ok(recs
            .iter()
            .map(|_| vec!["I do not know.".to_string(); n])
            .collect())
    }
}

#[test]
fn an_oracle_resolves_everything_and_silence_resolves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 3,
            seed: 21,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    let cfg = EvalConfig {
        edit_samples: 2,
        workers: 2,
        test_timeout: 60.0,
        ..Default::default()
    };
    let repos = dir.path().join("repos");
    let (outs, sum) = evaluate(&mut Oracle, &report.instances, &repos, &cfg, &mut |_| {}).unwrap();
    assert_eq!(outs.len(), 3);
    for st in ["file", "function", "line", "edit"] {
        assert_eq!(sum.hit_rate[st], 100.0, "{st}: {sum:?}");
    }
    assert_eq!(sum.applied_pct, 100.0, "{outs:?}");
    assert_eq!(sum.resolved_pct, 100.0, "{outs:?}");
    for o in &outs {
        assert!(o.patch.contains("+++ b/"), "{}", o.patch);
    }
    let (outs, sum) = evaluate(&mut Silent, &report.instances, &repos, &cfg, &mut |_| {}).unwrap();
    assert_eq!(sum.hit_rate["file"], 0.0);
    assert_eq!(sum.applied_pct, 0.0);
    assert_eq!(sum.resolved_pct, 0.0);
    assert!(outs
        .iter()
        .all(|o| o.patch.is_empty() && !o.rewards.contains_key("function")));
}

/// Localizes like the oracle; its edits are two copies of a wrong (but applying) edit of a line
/// that is not a ground-truth line (the greedy edit and the first sample), then the gold edit:
/// majority selection picks the wrong one.
struct OutVoted;

impl Answerer for OutVoted {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        t: f32,
        s: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let gold = Oracle.answer(recs, n, t, s)?;
        Ok(recs
            .iter()
            .zip(gold)
            .map(|(r, g)| {
                if r.subtask != Subtask::Edit {
                    return g;
                }
                let truth: Vec<usize> = r.truth.lines.iter().map(|l| l.line).collect();
                let wrong = r.shown.windows.iter().find_map(|w| {
                    w.text.lines().enumerate().find_map(|(k, line)| {
                        let bad = line.trim().is_empty()
                            || truth.contains(&(w.start_line + k))
                            || w.text.matches(line).count() > 1;
                        let indent = &line[..line.len() - line.trim_start().len()];
                        (!bad).then(|| {
                            format!(
                                "```python\n### {}\n<<<<<<< SEARCH\n{line}\n=======\n{indent}pass\n>>>>>>> REPLACE\n```",
                                w.path
                            )
                        })
                    })
                });
                let wrong = wrong.unwrap_or_default();
                if t == 0.0 {
                    vec![wrong]
                } else {
                    vec![wrong, g[0].clone()].into_iter().take(n).collect()
                }
            })
            .collect())
    }
}

#[test]
fn the_edit_hit_is_the_selected_patch_and_the_oracle_is_reported_apart() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 3,
            seed: 21,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    let cfg = EvalConfig {
        edit_samples: 3,
        run_tests: false,
        ..Default::default()
    };
    let repos = dir.path().join("repos");
    let (_, sum) = evaluate(&mut OutVoted, &report.instances, &repos, &cfg, &mut |_| {}).unwrap();
    assert_eq!(
        sum.hit_rate[sorft::rft::eval::ORACLE_EDIT],
        100.0,
        "{sum:?}"
    );
    assert_eq!(sum.hit_rate["edit"], 0.0, "{sum:?}");
}

/// Answers like the oracle, except that the greedy file localization names a wrong file: only
/// merging several localization samples (the sampled ones agree on the right file) finds it.
struct WrongGreedyFile;

impl Answerer for WrongGreedyFile {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        t: f32,
        s: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let gold = Oracle.answer(recs, n, t, s)?;
        Ok(recs
            .iter()
            .zip(gold)
            .map(|(r, g)| {
                if r.subtask != Subtask::File || t > 0.0 {
                    return g;
                }
                let wrong = r
                    .shown
                    .files
                    .iter()
                    .find(|f| !r.truth.files.contains(f))
                    .cloned()
                    .unwrap_or_default();
                vec![format!("```\n{wrong}\n```"); n]
            })
            .collect())
    }
}

#[test]
fn merged_localization_samples_outvote_a_wrong_greedy_answer() {
    let dir = tempfile::tempdir().unwrap();
    let report = generate(
        &SynthConfig {
            n: 3,
            seed: 21,
            ..Default::default()
        },
        dir.path(),
        &|_| {},
    )
    .unwrap();
    let repos = dir.path().join("repos");
    let mut cfg = EvalConfig {
        edit_samples: 1,
        loc_samples: 1,
        run_tests: false,
        ..Default::default()
    };
    let (_, greedy) = evaluate(
        &mut WrongGreedyFile,
        &report.instances,
        &repos,
        &cfg,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(greedy.hit_rate["file"], 0.0, "{greedy:?}");
    cfg.loc_samples = 3;
    let (outs, merged) = evaluate(
        &mut WrongGreedyFile,
        &report.instances,
        &repos,
        &cfg,
        &mut |_| {},
    )
    .unwrap();
    for st in ["file", "function", "line", "edit"] {
        assert_eq!(merged.hit_rate[st], 100.0, "{st}: {merged:?}");
    }
    assert_eq!(merged.applied_pct, 100.0, "{outs:?}");
    // Without tests there is no %Resolved curve.
    assert!(merged.resolved_curve.is_empty());
}
