//! Patches-to-Trajectories (P2T): the gold patch as privileged supervision for stage-1 curation.
//! The reverse phase distils the patch, the shown views and the issue into a process graph G*
//! ([`graph`], [`reverse`]); the forward phase curates multi-step trajectories across the
//! Agentless chain ([`trajectory`]) from a blinded, flawed teacher ([`flawed`]), scoring each
//! step's progress against G* ([`progress`]) under a groundedness gate ([`grounded`]) and keeping
//! the shortest effective segments ([`forward`]). The curated stages become chat examples for SFT.

pub mod compare;
pub mod flawed;
pub mod forward;
pub mod graph;
pub mod grounded;
pub mod progress;
pub mod reverse;
pub mod trajectory;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::chat::Message;
use crate::rft::teacher::{Acceptance, IndexedKept, TeacherItem};
use crate::swe::subtask::{EditReward, Subtask, SubtaskRecord};

use flawed::{BlindInstance, FlawedTeacher};
use forward::ForwardConfig;
use graph::ProcessGraph;
use trajectory::{stage_response, Observations, Step};

/// How stage 1 turns teacher samples into SFT data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Curation {
    /// The built-in single-thought teacher, outcome-filtered per subtask (the default).
    #[default]
    Rejection,
    /// The flawed multi-step teacher's whole trajectories, outcome-filtered per stage (the
    /// baseline P2T is compared with, on the same teacher budget).
    Outcome,
    /// The flawed teacher's trajectories curated against G*.
    P2t,
}

/// Knobs of the flawed teacher and of P2T curation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct P2tConfig {
    /// The flawed teacher.
    pub teacher: FlawedTeacher,
    /// The forward phase.
    pub forward: ForwardConfig,
    /// Teacher steps per sample: an instance's teacher budget is `samples_per_prompt` times this,
    /// for outcome filtering (whole rollouts of at most this many steps, as many as the budget
    /// allows) and for P2T alike.
    pub max_steps: usize,
}

impl Default for P2tConfig {
    fn default() -> Self {
        Self {
            teacher: FlawedTeacher::default(),
            forward: ForwardConfig::default(),
            max_steps: 24,
        }
    }
}

/// Totals of one curation run, for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CurationStats {
    /// `outcome` or `p2t`.
    pub mode: String,
    /// Instances curated.
    pub instances: usize,
    /// Trajectories (P2T: one per instance; outcome: `samples_per_prompt` per instance).
    pub trajectories: usize,
    /// Trajectories that answered every stage.
    pub complete: usize,
    /// Trajectories whose edit resolved the instance in the sandbox (0 without the check).
    pub resolved: usize,
    /// Trajectories dropped because their edit did not resolve the instance.
    pub failed_execution: usize,
    /// Teacher steps sampled.
    pub sampled_steps: usize,
    /// Kept chat examples.
    pub examples: usize,
    /// Mean characters of a kept response.
    pub mean_response_chars: f64,
    /// Mean reasoning steps of a kept response.
    pub mean_reason_steps: f64,
    /// Share of the kept responses' steps that are grounded.
    pub grounded_share: f64,
    /// Jumps (nodes named before their prerequisites) per kept response.
    pub jumps_per_response: f64,
    /// Mean node count of G*.
    pub mean_graph_nodes: f64,
}

impl CurationStats {
    /// A markdown section.
    pub fn markdown(&self, cfg: &P2tConfig) -> String {
        format!(
            "\n## Stage 1 curation ({})\n\n{} instances, {} trajectories ({} complete; execution check: {} edits resolved, {} chains dropped), {} teacher steps sampled, {} examples kept. G*: {:.1} nodes per instance.{}\n\n| mean response chars | reasoning steps per response | grounded steps | jumps per response |\n|---|---|---|---|\n| {:.1} | {:.2} | {:.1}% | {:.3} |\n",
            self.mode,
            self.instances,
            self.trajectories,
            self.complete,
            self.resolved,
            self.failed_execution,
            self.sampled_steps,
            self.examples,
            self.mean_graph_nodes,
            if self.mode == "p2t" {
                format!(
                    " Forward phase: window {}, {} candidates, floor {}, groundedness gate {}, shortest-segment rule {}.",
                    cfg.forward.window,
                    cfg.forward.candidates,
                    cfg.forward.floor,
                    if cfg.forward.gate { "on" } else { "off" },
                    if cfg.forward.shortest { "on" } else { "off" }
                )
            } else {
                String::new()
            },
            self.mean_response_chars,
            self.mean_reason_steps,
            100.0 * self.grounded_share,
            self.jumps_per_response
        )
    }
}

/// Items grouped by instance, in first-seen order: `(instance id, item indices)`.
fn by_instance(items: &[TeacherItem<'_>]) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        match out.iter_mut().find(|(id, _)| id == &it.record.instance_id) {
            Some((_, v)) => v.push(i),
            None => out.push((it.record.instance_id.clone(), vec![i])),
        }
    }
    out
}

/// G* of every instance of `items` (`failing` maps instance ids to their failing tests).
pub fn graphs(
    items: &[TeacherItem<'_>],
    failing: &BTreeMap<String, Vec<String>>,
) -> Vec<ProcessGraph> {
    by_instance(items)
        .into_iter()
        .map(|(id, idx)| {
            let recs: Vec<_> = idx.iter().map(|&i| items[i].record).collect();
            let obs = Observations::of(&recs);
            let none = Vec::new();
            reverse::build(&reverse::ReverseInput {
                instance_id: &id,
                problem: items[idx[0]].problem,
                truth: &recs[0].truth,
                failing_tests: failing.get(&id).unwrap_or(&none),
                observations: &obs,
            })
        })
        .collect()
}

/// Runs edit answers in the sandbox: for `records[i]` and its answers `answers[i]`, whether each
/// resolves its instance (in a repro run: `rft::accept::execution_passes`).
pub type ExecutionCheck<'a> =
    dyn Fn(&[&SubtaskRecord], &[Vec<String>]) -> anyhow::Result<Vec<Vec<bool>>> + 'a;

/// How one stage-1 curation run is made.
pub struct Stage1Run<'a> {
    /// `Outcome` or `P2t` (`Rejection` is the caller's).
    pub mode: Curation,
    /// Teacher and forward-phase knobs.
    pub cfg: &'a P2tConfig,
    /// Samples per prompt: the teacher budget is this times `cfg.max_steps` steps per instance.
    pub samples_per_prompt: usize,
    /// Seed of every sample.
    pub seed: u64,
    /// Rule reward of edit answers.
    pub edit_reward: EditReward,
    /// With a check, a chain that answered the edit stage keeps its examples only when its edit
    /// resolves the instance.
    pub check: Option<&'a ExecutionCheck<'a>>,
}

/// Running totals of kept responses.
#[derive(Default)]
struct Tally {
    chars: usize,
    reason: usize,
    steps: usize,
    grounded: usize,
    jumps: usize,
}

/// Which chains' edits resolve their instance: `resolved[n][t]` for trajectory `t` of instance
/// `n` (`true` when it has no edit answer, or without a check).
pub fn resolved_chains(
    items: &[TeacherItem<'_>],
    groups: &[Vec<usize>],
    trajectories: &[Vec<Vec<Step>>],
    check: Option<&ExecutionCheck<'_>>,
) -> anyhow::Result<Vec<Vec<bool>>> {
    let mut out: Vec<Vec<bool>> = trajectories.iter().map(|ts| vec![true; ts.len()]).collect();
    let Some(check) = check else {
        return Ok(out);
    };
    let mut recs: Vec<&SubtaskRecord> = Vec::new();
    let mut answers: Vec<Vec<String>> = Vec::new();
    let mut at: Vec<(usize, usize)> = Vec::new();
    for (n, (idx, ts)) in groups.iter().zip(trajectories).enumerate() {
        let Some(&e) = idx
            .iter()
            .find(|&&i| items[i].record.subtask == Subtask::Edit)
        else {
            continue;
        };
        for (t, steps) in ts.iter().enumerate() {
            if let Some(resp) = stage_response(steps, Subtask::Edit) {
                recs.push(items[e].record);
                answers.push(vec![resp]);
                at.push((n, t));
            }
        }
    }
    if recs.is_empty() {
        return Ok(out);
    }
    let ran = check(&recs, &answers)?;
    for ((n, t), ok) in at.into_iter().zip(ran) {
        out[n][t] = ok.first().copied().unwrap_or(false);
    }
    Ok(out)
}

/// The teacher's trajectories of one instance: P2T's curated chain, or the outcome baseline's
/// whole rollouts; with the steps sampled.
fn trajectories_of(
    run: &Stage1Run<'_>,
    g: &ProcessGraph,
    obs: &Observations,
    blind: &BlindInstance,
    iseed: u64,
) -> (Vec<Vec<Step>>, usize) {
    let cfg = run.cfg;
    let k = run.samples_per_prompt.max(1);
    let budget = k * cfg.max_steps;
    if run.mode == Curation::P2t {
        let c = forward::curate(g, obs, blind, &cfg.teacher, &cfg.forward, budget, iseed);
        (vec![c.steps], c.sampled_steps)
    } else {
        let outs = forward::rollouts(blind, &cfg.teacher, k, cfg.max_steps, budget, iseed);
        let n = outs.iter().map(Vec::len).sum();
        (outs, n)
    }
}

/// Stage 1 data of `run.mode`: kept chat examples with the index of their item, per-subtask
/// counts, totals, and G* of every instance.
pub fn curate_stage1(
    items: &[TeacherItem<'_>],
    failing: &BTreeMap<String, Vec<String>>,
    run: &Stage1Run<'_>,
) -> anyhow::Result<(IndexedKept, CurationStats, Vec<ProcessGraph>)> {
    let groups = by_instance(items);
    let gs = graphs(items, failing);
    let mut stats = CurationStats {
        mode: if run.mode == Curation::P2t {
            "p2t"
        } else {
            "outcome"
        }
        .into(),
        instances: groups.len(),
        ..CurationStats::default()
    };
    let mut all: Vec<Vec<Vec<Step>>> = Vec::new();
    let mut views: Vec<(Observations, Vec<Subtask>)> = Vec::new();
    for (n, ((_, idx), g)) in groups.iter().zip(&gs).enumerate() {
        let recs: Vec<_> = idx.iter().map(|&i| items[i].record).collect();
        let obs = Observations::of(&recs);
        let blind = BlindInstance::new(&recs, items[idx[0]].problem);
        let iseed = crate::engine::rng::random_u64(run.seed, 0x9279, n as u64);
        let (ts, sampled) = trajectories_of(run, g, &obs, &blind, iseed);
        stats.sampled_steps += sampled;
        all.push(ts);
        views.push((obs, blind.chain()));
    }
    let idxs: Vec<Vec<usize>> = groups.iter().map(|(_, v)| v.clone()).collect();
    let resolved = resolved_chains(items, &idxs, &all, run.check)?;
    let mut kept = Vec::new();
    let mut acc: BTreeMap<String, Acceptance> = BTreeMap::new();
    let mut tally = Tally::default();
    for (n, idx) in idxs.iter().enumerate() {
        let (obs, chain) = &views[n];
        for (t, steps) in all[n].iter().enumerate() {
            stats.trajectories += 1;
            let complete = trajectory::current_stage(chain, steps).is_none();
            stats.complete += complete as usize;
            if !resolved[n][t] {
                stats.failed_execution += 1;
                acc.entry(Subtask::Edit.name().to_string())
                    .or_default()
                    .failed_execution += 1;
                continue;
            }
            if run.check.is_some() && stage_response(steps, Subtask::Edit).is_some() {
                stats.resolved += 1;
            }
            let ctx = Chain {
                g: &gs[n],
                obs,
                steps,
            };
            keep_chain(items, idx, &ctx, run, &mut acc, &mut tally, &mut kept);
        }
    }
    let n = kept.len().max(1) as f64;
    stats.examples = kept.len();
    stats.mean_response_chars = tally.chars as f64 / n;
    stats.mean_reason_steps = tally.reason as f64 / n;
    stats.grounded_share = tally.grounded as f64 / tally.steps.max(1) as f64;
    stats.jumps_per_response = tally.jumps as f64 / n;
    stats.mean_graph_nodes =
        gs.iter().map(|g| g.nodes.len()).sum::<usize>() as f64 / gs.len().max(1) as f64;
    Ok(((kept, acc), stats, gs))
}

/// One trajectory with its instance's G* and views.
struct Chain<'a> {
    g: &'a ProcessGraph,
    obs: &'a Observations,
    steps: &'a [Step],
}

/// Keeps the stage responses of one chain that pass the rule filter (once each).
fn keep_chain(
    items: &[TeacherItem<'_>],
    idx: &[usize],
    c: &Chain<'_>,
    run: &Stage1Run<'_>,
    acc: &mut BTreeMap<String, Acceptance>,
    tally: &mut Tally,
    kept: &mut Vec<(usize, Vec<Message>)>,
) {
    let t = c.steps;
    let scores = progress::score_all(c.g, t, &run.cfg.forward.progress);
    for &i in idx {
        let rec = items[i].record;
        let a = acc.entry(rec.subtask.name().to_string()).or_default();
        let Some(resp) = stage_response(t, rec.subtask) else {
            continue;
        };
        a.sampled += 1;
        if rec.reward(&resp, run.edit_reward).reward <= 0.0 {
            continue;
        }
        a.passed += 1;
        if kept
            .iter()
            .any(|(j, m)| *j == i && m.get(1).is_some_and(|m| m.content == resp))
        {
            continue;
        }
        a.kept += 1;
        let in_stage: Vec<usize> = (0..t.len())
            .filter(|&k| t[k].stage == rec.subtask)
            .collect();
        let seen = c.obs.seen(rec.subtask);
        tally.chars += resp.len();
        tally.steps += in_stage.len();
        tally.reason += in_stage
            .iter()
            .filter(|&&k| t[k].kind == trajectory::StepKind::Reason)
            .count();
        tally.grounded += in_stage
            .iter()
            .filter(|&&k| grounded::unseen(&t[k], &seen).is_empty())
            .count();
        tally.jumps += in_stage
            .iter()
            .map(|&k| scores[k].jumps.len())
            .sum::<usize>();
        kept.push((
            i,
            vec![
                Message::new("user", &rec.prompt),
                Message::new("assistant", &resp),
            ],
        ));
    }
}
