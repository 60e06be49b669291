//! Subtask records, answer parsers and rewards.

use proptest::prelude::*;
use sorft::swe::answer;
use sorft::swe::codemap::DefKind;
use sorft::swe::diff::{FilePatch, Patch};
use sorft::swe::edit::render_blocks;
use sorft::swe::instance::Instance;
use sorft::swe::repo::Snapshot;
use sorft::swe::reward::{f_beta, file_reward, function_reward, line_reward, Window, ZeroReason};
use sorft::swe::subtask::{next_from_prediction, training_records, EditReward, Subtask};
use sorft::swe::truth::{ground_truth, FuncTarget, LineTarget};

const CALC: &str = "\"\"\"Calculator.\"\"\"\n\nSCALE = 10\n\n\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n\n\nclass Acc:\n    def __init__(self):\n        self.total = 0\n\n    def push(self, x):\n        self.total = sub(self.total, x)\n        return self.total\n";
const UTIL: &str = "def fmt(x):\n    return str(x)\n";

fn setup() -> (Instance, Snapshot, String) {
    let snap = Snapshot::from_texts([
        ("calc/core.py", CALC),
        ("calc/util.py", UTIL),
        ("calc/tests/test_core.py", "import unittest\n"),
    ]);
    let fixed = CALC.replace(
        "def sub(a, b):\n    return a + b",
        "def sub(a, b):\n    return a - b",
    );
    let patch = Patch {
        files: vec![FilePatch::from_texts(
            Some(("calc/core.py", CALC)),
            Some(("calc/core.py", &fixed)),
        )],
    }
    .to_string();
    let inst = Instance {
        instance_id: "o__calc-1".into(),
        repo: "o/calc".into(),
        base_commit: "0".into(),
        patch: patch.clone(),
        problem_statement: "sub(5, 3) returns 8 instead of 2".into(),
        ..Instance::default()
    };
    (inst, snap, patch)
}

#[test]
fn records_for_all_four_subtasks_and_gold_answers_score_one() {
    let (inst, snap, patch) = setup();
    let gt = ground_truth(&patch, &snap).unwrap();
    assert_eq!(gt.functions[0].name, "sub");
    assert_eq!(
        gt.lines,
        vec![LineTarget {
            path: "calc/core.py".into(),
            line: 12
        }]
    );
    let recs = training_records(&inst, &snap, &gt);
    let kinds: Vec<Subtask> = recs.iter().map(|r| r.subtask).collect();
    assert_eq!(kinds, Subtask::ALL.to_vec());
    // File prompt shows the tree with tests collapsed; the issue is in every prompt.
    assert!(
        recs[0].prompt.contains("tests/  [test folder, 1 files]"),
        "{}",
        recs[0].prompt
    );
    assert!(recs
        .iter()
        .all(|r| r.prompt.contains("sub(5, 3) returns 8")));
    assert_eq!(recs[0].shown.files, vec!["calc/core.py", "calc/util.py"]);
    // Function prompt shows skeletons, no bodies.
    assert!(recs[1].prompt.contains("def sub(a, b):\n    ...\n"));
    assert!(!recs[1].prompt.contains("return a + b"));
    // Line prompt shows numbered code of the modified function.
    assert!(
        recs[2].prompt.contains(" 12|     return a + b"),
        "{}",
        recs[2].prompt
    );

    let gold_answers = [
        "```\ncalc/core.py\n```".to_string(),
        "```\ncalc/core.py\nfunction: sub\n```".to_string(),
        "```\ncalc/core.py\nfunction: sub\nline: 12\n```".to_string(),
        render_blocks(&gt.edits),
    ];
    for (r, a) in recs.iter().zip(&gold_answers) {
        let b = r.reward(a, EditReward::LineFbeta);
        assert_eq!(b.reward, 1.0, "{:?} {b:?}", r.subtask);
    }
    let sim = recs[3].reward(&gold_answers[3], EditReward::PatchSimilarity);
    assert!(sim.reward > 0.95, "{sim:?}");
    let bad = recs[3].reward(
        "```\n### calc/core.py\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE\n```",
        EditReward::PatchSimilarity,
    );
    assert_eq!(bad.reward, -1.0);
    // A wrong but valid edit elsewhere in the shown code scores 0 with NoOverlap under the line reward.
    let wrong = "### calc/core.py\n<<<<<<< SEARCH\ndef sub(a, b):\n=======\ndef sub(a, b, c=0):\n>>>>>>> REPLACE\n";
    let w = recs[3].reward(wrong, EditReward::LineFbeta);
    assert_eq!(w.zero_reason, Some(ZeroReason::NoOverlap), "{w:?}");
    // Records round-trip through JSON.
    let j = serde_json::to_string(&recs[3]).unwrap();
    let back: sorft::swe::subtask::SubtaskRecord = serde_json::from_str(&j).unwrap();
    assert_eq!(back, recs[3]);
}

#[test]
fn later_stages_from_predictions() {
    let (inst, snap, patch) = setup();
    let gt = ground_truth(&patch, &snap).unwrap();
    let recs = training_records(&inst, &snap, &gt);
    let f = next_from_prediction(&inst, &snap, &recs[0], "```\ncalc/util.py\n```").unwrap();
    assert_eq!(f.subtask, Subtask::Function);
    assert!(f.prompt.contains("def fmt(x):"));
    assert_eq!(
        f.reward(
            "```\ncalc/util.py\nfunction: fmt\n```",
            EditReward::LineFbeta
        )
        .reward,
        0.0
    );
    let l =
        next_from_prediction(&inst, &snap, &recs[1], "calc/core.py\nmethod: Acc.push\n").unwrap();
    assert_eq!(l.shown.windows.len(), 1);
    assert_eq!(l.shown.windows[0].start_line, 19);
    let e = next_from_prediction(&inst, &snap, &recs[2], "calc/core.py\nline: 12\n").unwrap();
    assert!(e.prompt.contains("return a + b"));
    assert!(next_from_prediction(&inst, &snap, &recs[0], "nothing useful").is_none());
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn file_reward_edge_cases() {
    let shown = s(&["a.py", "b.py", "c.py", "d.py"]);
    let truth = s(&["a.py", "b.py"]);
    let r = file_reward("", &shown, &truth);
    assert_eq!(
        (r.reward, r.zero_reason),
        (0.0, Some(ZeroReason::EmptyAnswer))
    );
    let r = file_reward("```\na.py\nzzz.py\n```", &shown, &truth);
    assert_eq!(r.reward, 0.0);
    assert_eq!(
        r.zero_reason,
        Some(ZeroReason::InventedTarget {
            target: "zzz.py".into()
        })
    );
    // Duplicates count once: {a} vs {a, b}: P = 1, R = 1/2 -> 10*0.5/(9+0.5).
    let r = file_reward("```\na.py\na.py\na.py\n```", &shown, &truth);
    assert!((r.reward - 5.0 / 9.5).abs() < 1e-12, "{r:?}");
    assert_eq!(r.predicted, 1);
    // Partial overlap {a, c} vs {a, b}: P = R = 1/2 -> F = 1/2.
    let r = file_reward("```\na.py\nc.py\n```", &shown, &truth);
    assert!((r.reward - 0.5).abs() < 1e-12);
    assert_eq!((r.precision, r.recall), (0.5, 0.5));
    // Over-prediction {a,b,c,d}: P = 1/2, R = 1 -> 10*0.5/(4.5+1) = 0.909...
    let r = file_reward("```\na.py\nb.py\nc.py\nd.py\n```", &shown, &truth);
    assert!((r.reward - 5.0 / 5.5).abs() < 1e-12);
    assert!((f_beta(0.5, 1.0, 3.0) - 0.9090909090909091).abs() < 1e-12);
    // Recall is worth more than precision with beta = 3.
    assert!(f_beta(0.5, 1.0, 3.0) > f_beta(1.0, 0.5, 3.0));
    let r = file_reward("```\nc.py\n```", &shown, &truth);
    assert_eq!(r.zero_reason, Some(ZeroReason::NoOverlap));
}

#[test]
fn function_and_line_reward_edge_cases() {
    let shown = vec![
        FuncTarget {
            path: "a.py".into(),
            kind: DefKind::Function,
            name: "f".into(),
        },
        FuncTarget {
            path: "a.py".into(),
            kind: DefKind::Method,
            name: "C.m".into(),
        },
    ];
    let truth = vec![shown[1].clone()];
    // Kind word is not scored: "function: C.m" still hits.
    let r = function_reward("a.py\nfunction: C.m\n", &shown, &truth);
    assert_eq!(r.reward, 1.0);
    let r = function_reward("a.py\nfunction: g\n", &shown, &truth);
    assert!(matches!(
        r.zero_reason,
        Some(ZeroReason::InventedTarget { .. })
    ));
    // A real name under the wrong file is invented too.
    let r = function_reward("b.py\nmethod: C.m\n", &shown, &truth);
    assert!(matches!(
        r.zero_reason,
        Some(ZeroReason::InventedTarget { .. })
    ));
    let windows = vec![Window {
        path: "a.py".into(),
        start_line: 10,
        text: "x\ny\nz\n".into(),
    }];
    let lt = vec![LineTarget {
        path: "a.py".into(),
        line: 11,
    }];
    assert_eq!(line_reward("a.py\nline: 11\n", &windows, &lt).reward, 1.0);
    let r = line_reward("a.py\nline: 13\n", &windows, &lt);
    assert!(
        matches!(r.zero_reason, Some(ZeroReason::InventedTarget { .. })),
        "{r:?}"
    );
    let r = line_reward("a.py\nline: 10\nline: 11\n", &windows, &lt);
    assert!((r.reward - f_beta(0.5, 1.0, 3.0)).abs() < 1e-12);
}

#[test]
fn edit_reward_zero_reasons() {
    let (inst, snap, patch) = setup();
    let gt = ground_truth(&patch, &snap).unwrap();
    let recs = training_records(&inst, &snap, &gt);
    let edit = &recs[3];
    let r = edit.reward("I would change the minus.", EditReward::LineFbeta);
    assert_eq!(r.zero_reason, Some(ZeroReason::NoBlocks));
    let same = "### calc/core.py\n<<<<<<< SEARCH\n    return a + b\n=======\n    return a + b\n>>>>>>> REPLACE\n";
    assert_eq!(
        edit.reward(same, EditReward::LineFbeta).zero_reason,
        Some(ZeroReason::NoChange)
    );
    let other = "### calc/util.py\n<<<<<<< SEARCH\n    return str(x)\n=======\n    return repr(x)\n>>>>>>> REPLACE\n";
    assert!(matches!(
        edit.reward(other, EditReward::LineFbeta).zero_reason,
        Some(ZeroReason::UnknownFile { .. })
    ));
    // Code that exists in the file but was not shown (class Acc) is not a valid SEARCH.
    let unseen = "### calc/core.py\n<<<<<<< SEARCH\n        self.total = 0\n=======\n        self.total = 1\n>>>>>>> REPLACE\n";
    assert!(matches!(
        edit.reward(unseen, EditReward::LineFbeta).zero_reason,
        Some(ZeroReason::SearchNotFound { block: 1, .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn parsers_and_rewards_never_panic(text in "(```\n|</think>|<think>|### [a-z/.]{0,8}\n|<<<<<<< SEARCH\n|=======\n|>>>>>>> REPLACE\n|line: [0-9-]{0,6}\n|function: [A-Za-z.]{0,6}\n|[a-z]{1,5}\\.py\n|.{0,12}\n){0,25}") {
        let _ = answer::parse_files(&text);
        let _ = answer::parse_functions(&text);
        let _ = answer::parse_lines(&text);
        let _ = answer::parse_edit(&text);
        let (inst, snap, patch) = setup();
        let gt = ground_truth(&patch, &snap).unwrap();
        for r in training_records(&inst, &snap, &gt) {
            for kind in [EditReward::LineFbeta, EditReward::PatchSimilarity] {
                let b = r.reward(&text, kind);
                prop_assert!(b.reward >= -1.0 && b.reward <= 1.0);
                prop_assert!(b.reward != 0.0 || b.zero_reason.is_some() || b.reward == 0.0);
            }
        }
    }

    #[test]
    fn parsers_never_panic_on_any_unicode(text in any::<String>()) {
        let _ = answer::parse_files(&text);
        let _ = answer::parse_functions(&text);
        let _ = answer::parse_lines(&text);
        let _ = answer::parse_edit(&text);
    }
}
