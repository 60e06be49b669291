//! P2T curation: G* from hand-made patches, the leakage gate, progress scoring, segment selection
//! (and its ablation switches), and the forward phase against outcome filtering on one instance.

use std::collections::{BTreeMap, BTreeSet};

use sorft::engine::rng::SplitMix;
use sorft::rft::p2t::flawed::{BlindInstance, FlawedTeacher};
use sorft::rft::p2t::forward::{self, select, ForwardConfig};
use sorft::rft::p2t::graph::NodeKind;
use sorft::rft::p2t::grounded::unseen;
use sorft::rft::p2t::progress::{score_all, score_step, ProgressConfig};
use sorft::rft::p2t::trajectory::{Observations, Step, StepKind};
use sorft::rft::p2t::{curate_stage1, graphs, Curation, P2tConfig, Stage1Run};
use sorft::rft::teacher::TeacherItem;
use sorft::swe::diff::{FilePatch, Patch};
use sorft::swe::instance::Instance;
use sorft::swe::repo::Snapshot;
use sorft::swe::subtask::{training_records, EditReward, Subtask, SubtaskRecord};
use sorft::swe::truth::ground_truth;

const MONEY: &str = "class Money:\n    def __init__(self, cents):\n        self.cents = cents\n\n    def split(self, parts):\n        base = self.cents // parts\n        extra = self.cents % parts\n        return [base + (2 if i < extra else 0) for i in range(parts)]\n\n    def format(self):\n        return str(self.cents)\n";
const TEXT: &str = "def title(s):\n    return s.title()\n";
const ISSUE: &str = "Wrong value from `split`\n\n```python\nfrom shop import money\n\nprint(money.Money(100).split(3))  # expected: [34, 33, 33]\n```\n\nI get `[35, 33, 33]`.\n";

fn setup() -> (Instance, Vec<SubtaskRecord>) {
    let snap = Snapshot::from_texts([
        ("shop/money.py", MONEY),
        ("shop/text.py", TEXT),
        ("shop/tests/test_money.py", "import unittest\n"),
    ]);
    let fixed = MONEY.replace("(2 if", "(1 if");
    let patch = Patch {
        files: vec![FilePatch::from_texts(
            Some(("shop/money.py", MONEY)),
            Some(("shop/money.py", &fixed)),
        )],
    }
    .to_string();
    let inst = Instance {
        instance_id: "o__shop-1".into(),
        repo: "o/shop".into(),
        base_commit: "0".into(),
        patch: patch.clone(),
        problem_statement: ISSUE.into(),
        fail_to_pass: vec!["test_split (tests.test_money.TestMoney.test_split)".into()],
        ..Instance::default()
    };
    let gt = ground_truth(&patch, &snap).unwrap();
    let recs = training_records(&inst, &snap, &gt);
    (inst, recs)
}

fn items<'a>(inst: &'a Instance, recs: &'a [SubtaskRecord]) -> Vec<TeacherItem<'a>> {
    recs.iter()
        .map(|r| TeacherItem {
            record: r,
            problem: &inst.problem_statement,
        })
        .collect()
}

fn run(mode: Curation, cfg: &P2tConfig, seed: u64) -> Stage1Run<'_> {
    Stage1Run {
        mode,
        cfg,
        samples_per_prompt: 4,
        seed,
        edit_reward: EditReward::LineFbeta,
        check: None,
    }
}

fn failing(inst: &Instance) -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([(inst.instance_id.clone(), inst.fail_to_pass.clone())])
}

#[test]
fn g_star_of_a_hand_made_patch_has_typed_nodes_in_dependency_order() {
    let (inst, recs) = setup();
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let kinds: Vec<NodeKind> = g.nodes.iter().map(|n| n.kind).collect();
    assert_eq!(
        kinds,
        [
            NodeKind::IssueEvidence, // the import line
            NodeKind::Module,
            NodeKind::File,
            NodeKind::IssueEvidence, // `split` in the issue
            NodeKind::Definition,
            NodeKind::FailingTest,
            NodeKind::Computes,
            NodeKind::FaultyLine,
            NodeKind::Fix,
        ]
    );
    assert_eq!(g.nodes[0].label, "from shop import money");
    assert_eq!(g.nodes[2].label, "shop/money.py");
    assert_eq!(g.nodes[4].label, "Money.split");
    assert!(g.nodes[6].label.starts_with("return [base + (2 if"));
    assert_eq!(g.nodes[7].line, Some(("shop/money.py".to_string(), 8)));
    assert!(g.nodes[8].label.contains("(1 if i < extra"));
    // The test's name is never shown: only its message in the issue survives the critic.
    assert_eq!(
        g.nodes[5].surface,
        vec!["expected: [34, 33, 33]".to_string()]
    );
    // Prerequisites: module <- evidence, file <- module, definition <- file + evidence, fix <-
    // faulty line; the failing test's message is context without dependents.
    assert_eq!(g.prereqs(1), vec![0]);
    assert_eq!(g.prereqs(2), vec![1]);
    assert_eq!(g.prereqs(4), vec![2, 3]);
    assert_eq!(g.prereqs(8), vec![7]);
    assert!(g.edges.iter().all(|&(p, _)| p != 5));
    assert!(g.edges.iter().all(|(p, d)| p < d));
    // Nothing is reachable but the roots at first.
    assert_eq!(g.frontier(&BTreeSet::new()), vec![0, 3, 5]);
    assert!(g
        .describe()
        .contains("[4] definition (function) \"Money.split\" <- 2, 3"));
}

#[test]
fn the_critic_prunes_nodes_no_view_shows() {
    let (inst, mut recs) = setup();
    // A chain without the line stage's windows: the faulty line and its code are never shown.
    for r in &mut recs {
        r.shown.windows.retain(|w| w.path != "shop/money.py");
    }
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    assert!(g.of_kind(NodeKind::FaultyLine).next().is_none());
    assert!(g.of_kind(NodeKind::Computes).next().is_none());
    // No window shows the code, so no computes node is proposed; the critic prunes the line.
    assert_eq!(g.pruned.len(), 1, "{}", g.describe());
    // The fix inherits the pruned line's prerequisites (the definition).
    let fix = g.of_kind(NodeKind::Fix).next().unwrap().id;
    let def = g.of_kind(NodeKind::Definition).next().unwrap().id;
    assert!(g.prereqs(fix).contains(&def), "{}", g.describe());
}

fn good_trajectory() -> Vec<Step> {
    vec![
        Step::reason(Subtask::File, "The snippet runs `from shop import money`, so the code lives in shop/money.py."),
        Step::answer(Subtask::File, "```\nshop/money.py\n```"),
        Step::reason(Subtask::Function, "The issue calls `money.Money(100).split`; `Money.split` is defined in shop/money.py."),
        Step::answer(Subtask::Function, "```\nshop/money.py\nmethod: Money.split\n```"),
        Step::reason(Subtask::Line, "The wrong result comes from `return [base + (2 if i < extra else 0) for i in range(parts)]`."),
        Step::answer(Subtask::Line, "```\nshop/money.py\nline: 8\n```"),
        Step::reason(Subtask::Edit, "The issue reports `expected: [34, 33, 33]`."),
        Step::answer(Subtask::Edit, "```python\n### shop/money.py\n<<<<<<< SEARCH\n        return [base + (2 if i < extra else 0) for i in range(parts)]\n=======\n        return [base + (1 if i < extra else 0) for i in range(parts)]\n>>>>>>> REPLACE\n```"),
    ]
}

#[test]
fn progress_counts_legitimate_nodes_and_penalises_jumps_repeats_and_wrong_answers() {
    let (inst, recs) = setup();
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let cfg = ProgressConfig::default();
    let scores = score_all(&g, &good_trajectory(), &cfg);
    let prog: Vec<f64> = scores.iter().map(|s| s.progress).collect();
    // evidence + module + approaching the file; file; `split` evidence + approaching the
    // definition; definition; computes; faulty line; failing test message; fix.
    assert_eq!(prog, vec![2.5, 1.0, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let total: usize = scores.iter().map(|s| s.established.len()).sum();
    assert_eq!(total, g.nodes.len());
    // A repeated step establishes nothing.
    let mut est = BTreeSet::new();
    let first = &good_trajectory()[0];
    assert_eq!(score_step(&g, first, &mut est, &cfg).progress, 2.5);
    assert_eq!(score_step(&g, first, &mut est, &cfg).progress, 0.0);
    // Jumping to the faulty code before the definition is established: a penalty.
    let jump = Step::reason(
        Subtask::File,
        "The culprit is `return [base + (2 if i < extra else 0) for i in range(parts)]`.",
    );
    let s = score_step(&g, &jump, &mut est, &cfg);
    assert_eq!((s.jumps.len(), s.progress), (1, -1.0));
    // Answering a file off G*: a penalty.
    let wrong = Step::answer(Subtask::File, "```\nshop/text.py\n```");
    let s = score_step(&g, &wrong, &mut est, &cfg);
    assert!(s.off_target);
    assert_eq!(s.progress, -1.0);
}

#[test]
fn segment_selection_keeps_the_shortest_effective_prefix_and_the_switches_change_it() {
    // Candidate 0: effective only at length 3; candidate 1: at length 2, less effective.
    let scores = vec![
        vec![(0.0, true), (0.2, true), (1.0, true)],
        vec![(0.0, true), (0.7, true), (0.8, true)],
        vec![(0.0, false), (0.0, false), (0.0, false)],
    ];
    let cfg = ForwardConfig::default();
    let s = select(&scores, &cfg).unwrap();
    assert_eq!((s.candidate, s.len), (1, 2));
    // Without the shortest rule: the most effective whole candidate.
    let long = ForwardConfig {
        shortest: false,
        ..ForwardConfig::default()
    };
    let s = select(&scores, &long).unwrap();
    assert_eq!((s.candidate, s.len), (0, 3));
    // Nothing clears a higher floor.
    let strict = ForwardConfig {
        floor: 1.5,
        ..ForwardConfig::default()
    };
    assert!(select(&scores, &strict).is_none());
}

#[test]
fn the_gate_rejects_a_segment_with_an_ungrounded_step_and_the_ablation_lets_it_through() {
    let (inst, recs) = setup();
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let refs: Vec<&SubtaskRecord> = recs.iter().collect();
    let obs = Observations::of(&refs);
    // The file stage quotes the fix: an entity not yet observed (and never observed at all).
    let leak = vec![
        Step::reason(
            Subtask::File,
            "The snippet runs `from shop import money`; it should read `(1 if i < extra else 0)`.",
        ),
        Step::answer(Subtask::File, "```\nshop/money.py\n```"),
    ];
    let gated =
        forward::score_prefixes(&g, &obs, &BTreeSet::new(), &leak, &ForwardConfig::default());
    assert_eq!(gated, vec![(0.0, false), (0.0, false)]);
    let open = ForwardConfig {
        gate: false,
        ..ForwardConfig::default()
    };
    let ungated = forward::score_prefixes(&g, &obs, &BTreeSet::new(), &leak, &open);
    assert!(ungated[1].0 >= open.floor, "{ungated:?}");
    // The grounded version passes the gate.
    let ok = &good_trajectory()[..2];
    let s = forward::score_prefixes(&g, &obs, &BTreeSet::new(), ok, &ForwardConfig::default());
    assert_eq!(s, vec![(1.0, true), (1.0, true)]);
}

#[test]
fn p2t_curates_shorter_grounded_responses_than_outcome_filtering_on_the_same_budget() {
    let (inst, recs) = setup();
    let its = items(&inst, &recs);
    let cfg = P2tConfig::default();
    let mut p2t_chars = 0.0;
    let mut out_chars = 0.0;
    let (mut p2t_grounded, mut out_grounded) = (0.0, 0.0);
    let mut flawed = 0usize;
    for seed in 0..6 {
        let ((kept, _), st, _) =
            curate_stage1(&its, &failing(&inst), &run(Curation::P2t, &cfg, seed)).unwrap();
        let ((okept, _), ost, _) =
            curate_stage1(&its, &failing(&inst), &run(Curation::Outcome, &cfg, seed)).unwrap();
        assert!(
            st.sampled_steps <= ost.sampled_steps + cfg.forward.window * cfg.forward.candidates,
            "{st:?} {ost:?}"
        );
        assert!(!okept.is_empty());
        // Every kept P2T response is grounded under the gate.
        assert_eq!(
            st.grounded_share,
            if kept.is_empty() { 0.0 } else { 1.0 },
            "{st:?}"
        );
        assert_eq!(st.jumps_per_response, 0.0);
        flawed += (ost.grounded_share < 1.0 || ost.jumps_per_response > 0.0) as usize;
        p2t_chars += st.mean_response_chars;
        out_chars += ost.mean_response_chars;
        p2t_grounded += st.grounded_share;
        out_grounded += ost.grounded_share;
    }
    // The flawed teacher's trajectories carry flaws outcome filtering keeps; P2T's are shorter.
    assert!(flawed > 0);
    assert!(p2t_grounded > out_grounded);
    assert!(p2t_chars < out_chars, "{p2t_chars} vs {out_chars}");
}

#[test]
fn quick_repro_runs_end_to_end_with_p2t_curation() {
    let out = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args([
            "repro",
            "--quick",
            "--device",
            "cpu",
            "--set",
            "stage1.curation=p2t",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(report.contains("## Stage 1 curation (p2t)"), "{report}");
    assert!(report.contains("groundedness gate on"), "{report}");
    let graphs = std::fs::read_to_string(out.path().join("g_star.jsonl")).unwrap();
    for line in graphs.lines() {
        let g: sorft::rft::p2t::graph::ProcessGraph = serde_json::from_str(line).unwrap();
        assert!(
            g.nodes.iter().any(|n| n.kind == NodeKind::Fix),
            "{}",
            g.describe()
        );
    }
    let preds = std::fs::read_to_string(out.path().join("predictions_sft.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(preds.lines().next().unwrap()).unwrap();
    assert!(
        first["rewards"].is_object() && first["resolved"].is_boolean(),
        "{first}"
    );
    let stats: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("stage1_curation.json")).unwrap(),
    )
    .unwrap();
    assert!(stats["examples"].as_u64().unwrap() > 0, "{stats}");
}

fn one_flaw(f: impl Fn(&mut FlawedTeacher)) -> FlawedTeacher {
    let mut t = FlawedTeacher {
        detour: 0.0,
        repeat: 0.0,
        peek: 0.0,
        wrong: 0.0,
        leak: 0.0,
        cite: 0.0,
        ..FlawedTeacher::default()
    };
    f(&mut t);
    t
}

#[test]
fn each_flaw_knob_produces_its_flaw_and_the_anchored_teacher_reaches_the_fix() {
    let (inst, recs) = setup();
    let refs: Vec<&SubtaskRecord> = recs.iter().collect();
    let blind = BlindInstance::new(&refs, &inst.problem_statement);
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let obs = Observations::of(&refs);
    let good = good_trajectory();
    let at_function = &good[..2];
    let mut rng = SplitMix::new(1);
    // A wrong answer commits to another shown definition: off target.
    let wrong = one_flaw(|t| t.wrong = 1.0);
    let s = wrong.next_step(&blind, at_function, &mut rng).unwrap();
    assert_eq!(s.kind, StepKind::Answer);
    // A detour reasons about another shown definition.
    let detour = one_flaw(|t| t.detour = 1.0);
    let s = detour.next_step(&blind, at_function, &mut rng).unwrap();
    assert_eq!(s.kind, StepKind::Reason);
    assert!(s.text.contains("could also be responsible"), "{}", s.text);
    // A repeat copies the last reasoning step.
    let repeat = one_flaw(|t| t.repeat = 1.0);
    let s = repeat.next_step(&blind, &good[..3], &mut rng).unwrap();
    assert_eq!(s.text, good[2].text);
    // A leaking answer cites a later stage's fact in its prose: the gate rejects it.
    let leak = one_flaw(|t| t.leak = 1.0);
    let mut planned = good[..2].to_vec();
    let mut r = Step::reason(Subtask::Function, "Looking at the definitions.");
    r.plan = Some(good[3].text.clone());
    planned.push(r);
    let mut leaked = 0;
    for _ in 0..10 {
        let s = leak.next_step(&blind, &planned, &mut rng).unwrap();
        assert_eq!(s.kind, StepKind::Answer);
        assert!(s.text.ends_with(&good[3].text), "{}", s.text);
        leaked += !unseen(&s, &obs.seen(Subtask::Function)).is_empty() as usize;
    }
    assert!(leaked > 0);
    // Anchored on the located line, the teacher's edit changes that line: the one known change
    // of `(2 if` is not the gold fix here, but it edits the faulty line and names it.
    let anchored = one_flaw(|t| {
        t.anchor = 1.0;
        t.follow = 1.0;
    });
    let at_edit = &good[..6];
    let think = anchored.next_step(&blind, at_edit, &mut rng).unwrap();
    assert!(
        think.text.contains("Line 8 of shop/money.py"),
        "{}",
        think.text
    );
    let plan = think.plan.clone().unwrap();
    assert!(
        plan.contains("SEARCH\n        return [base + (2 if i < extra else 0)"),
        "{plan}"
    );
    let mut est = BTreeSet::new();
    for st in at_edit {
        score_step(&g, st, &mut est, &ProgressConfig::default());
    }
    assert!(g
        .frontier(&est)
        .iter()
        .any(|&n| g.nodes[n].kind == NodeKind::Fix));
}

#[test]
fn a_stepwise_candidate_carries_at_most_one_establishing_step() {
    let (inst, recs) = setup();
    let refs: Vec<&SubtaskRecord> = recs.iter().collect();
    let blind = BlindInstance::new(&refs, &inst.problem_statement);
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let teacher = FlawedTeacher::default();
    let cfg = ProgressConfig::default();
    for seed in 0..40 {
        let c = forward::stepwise_candidate(
            &g,
            &blind,
            &teacher,
            &BTreeSet::new(),
            &[],
            4,
            4,
            &cfg,
            seed,
        );
        assert!(!c.is_empty() && c.len() <= 4);
        let scores = score_all(&g, &c, &cfg);
        let establishing = scores.iter().filter(|s| !s.established.is_empty()).count();
        assert!(establishing <= 1, "{c:?}");
        // Only the last step may establish a node or answer.
        for (k, st) in c.iter().enumerate().take(c.len() - 1) {
            assert!(scores[k].established.is_empty() && st.kind == StepKind::Reason);
        }
        // The budget bounds it.
        let short = forward::stepwise_candidate(
            &g,
            &blind,
            &teacher,
            &BTreeSet::new(),
            &[],
            4,
            1,
            &cfg,
            seed,
        );
        assert_eq!(short.len(), 1);
    }
}

#[test]
fn a_failing_execution_check_drops_every_chain_that_answered_the_edit() {
    let (inst, recs) = setup();
    let its = items(&inst, &recs);
    let cfg = P2tConfig::default();
    let deny = |_: &[&SubtaskRecord], a: &[Vec<String>]| -> anyhow::Result<Vec<Vec<bool>>> {
        Ok(a.iter().map(|x| vec![false; x.len()]).collect())
    };
    let allow = |_: &[&SubtaskRecord], a: &[Vec<String>]| -> anyhow::Result<Vec<Vec<bool>>> {
        Ok(a.iter().map(|x| vec![true; x.len()]).collect())
    };
    let mut dropped = 0;
    for seed in 0..4 {
        let mut r = run(Curation::Outcome, &cfg, seed);
        let ((open, _), ost, _) = curate_stage1(&its, &failing(&inst), &r).unwrap();
        r.check = Some(&allow);
        let ((allowed, _), ast, _) = curate_stage1(&its, &failing(&inst), &r).unwrap();
        assert_eq!(open, allowed);
        assert_eq!(ast.failed_execution, 0);
        r.check = Some(&deny);
        let ((kept, acc), st, _) = curate_stage1(&its, &failing(&inst), &r).unwrap();
        // Same trajectories; those with an edit answer lose all their examples.
        assert_eq!(st.trajectories, ost.trajectories);
        assert!(kept.len() <= open.len());
        assert!(kept
            .iter()
            .all(|(i, _)| its[*i].record.subtask != Subtask::Edit));
        assert_eq!(
            acc.get("edit").map_or(0, |a| a.failed_execution),
            st.failed_execution
        );
        assert_eq!(st.resolved, 0);
        dropped += st.failed_execution;
    }
    assert!(dropped > 0);
}

#[test]
fn a_segment_reaching_a_node_after_neutral_steps_clears_the_floor_and_caps_later_candidates() {
    let (inst, recs) = setup();
    let g = graphs(&items(&inst, &recs), &failing(&inst)).remove(0);
    let refs: Vec<&SubtaskRecord> = recs.iter().collect();
    let obs = Observations::of(&refs);
    let cfg = ForwardConfig::default();
    let mut est = BTreeSet::new();
    for st in &good_trajectory()[..2] {
        score_step(&g, st, &mut est, &cfg.progress);
    }
    // Two grounded steps that name nothing, then the step that reaches the definition.
    let neutral = Step::reason(
        Subtask::Function,
        "Let me read the listed definitions first.",
    );
    let seg = vec![neutral.clone(), neutral, good_trajectory()[2].clone()];
    let s = forward::score_prefixes(&g, &obs, &est, &seg, &cfg);
    assert_eq!(s[..2], [(0.0, true), (0.0, true)]);
    // A per-step mean (1.5 / 3 = 0.5) fell under the floor; the windowed sum does not.
    assert!(s[2].1 && s[2].0 >= cfg.floor, "{s:?}");
    assert_eq!(forward::windowed(1.5), 1.0);
    assert_eq!(forward::windowed(-1.0), 0.0);
    let pick = select(std::slice::from_ref(&s), &cfg).unwrap();
    assert_eq!(pick.len, 3);
    // Once a fully effective candidate of 3 steps is known, a later one is useful only when
    // shorter; without the shortest rule there is no cap; a weaker best caps nothing.
    let scored = std::slice::from_ref(&s);
    assert_eq!(forward::useful_length(scored, &cfg), Some(2));
    let long = ForwardConfig {
        shortest: false,
        ..ForwardConfig::default()
    };
    assert_eq!(forward::useful_length(scored, &long), None);
    assert_eq!(
        forward::useful_length(&[vec![(0.0, true), (0.8, true)]], &cfg),
        None
    );
}
