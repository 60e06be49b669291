//! The forward phase: a receding-horizon window over a trajectory. From the committed prefix the
//! blinded teacher samples candidate segments. Step-wise decoding (`stepwise`, the default):
//! each candidate is sampled one step at a time and ends after its first step that establishes a
//! reachable G* node, after an answer (which moves to the next stage), or at the window, so it
//! carries at most one step of progress and a miss costs few teacher steps; otherwise each
//! candidate is a whole window of steps. Each prefix of a candidate is scored by its
//! effectiveness, windowed progress (the segment's summed Prog_t, clipped to [0, 1]: a segment
//! that establishes a node after some neutral steps still counts; the shortest rule, not a
//! per-step mean, is what penalises its extra steps) times groundedness (share of
//! grounded steps); with the gate on, a segment with an ungrounded step is rejected. The shortest
//! prefix that clears the floor wins (ties: higher effectiveness, then earlier candidate); it is
//! committed (at most `commit` steps of it) and the next window starts after it. Ablations: `gate = false` scores
//! without the groundedness check; `shortest = false` takes the most effective whole candidate.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::engine::rng::{random_u64, SplitMix};

use super::flawed::{BlindInstance, FlawedTeacher};
use super::graph::ProcessGraph;
use super::grounded::unseen;
use super::progress::{score_step, ProgressConfig};
use super::trajectory::{current_stage, Observations, Step, StepKind};

/// Knobs of the forward phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardConfig {
    /// Steps per candidate segment (the window).
    pub window: usize,
    /// Candidate segments sampled per window.
    pub candidates: usize,
    /// Least effectiveness a segment needs.
    pub floor: f64,
    /// The groundedness gate.
    pub gate: bool,
    /// The shortest-effective-segment rule.
    pub shortest: bool,
    /// Windows in a row without an effective candidate before the instance is given up.
    pub patience: usize,
    /// Most steps of a chosen segment committed before the window advances (0: the whole
    /// segment; `window / 2`: the paper's half-window advance, which costs more teacher steps).
    pub commit: usize,
    /// Step-wise candidate decoding: a candidate ends after its first step that establishes a
    /// reachable node (or after an answer); `false` samples whole windows.
    pub stepwise: bool,
    /// Penalties of Prog_t.
    pub progress: ProgressConfig,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            window: 4,
            candidates: 4,
            floor: 0.6,
            gate: true,
            shortest: true,
            patience: 12,
            commit: 0,
            stepwise: true,
            progress: ProgressConfig::default(),
        }
    }
}

/// A scored prefix of a candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// Which candidate.
    pub candidate: usize,
    /// Its first `len` steps.
    pub len: usize,
    /// Windowed progress times groundedness.
    pub effectiveness: f64,
    /// Every step grounded.
    pub grounded: bool,
}

/// Windowed progress of a segment whose summed Prog_t is `sum`: clipped to [0, 1]. A mean over
/// steps would need the establishing step to come first (with floor 0.6, a segment of two neutral
/// steps and an established milestone scored 1/3 and was rejected): no line-stage candidate ever
/// cleared the floor on the synthetic set and no chain reached the edit.
pub fn windowed(sum: f64) -> f64 {
    sum.clamp(0.0, 1.0)
}

/// Effectiveness and groundedness of every prefix of `cand`, after a committed prefix whose
/// established nodes are `est`.
pub fn score_prefixes(
    g: &ProcessGraph,
    obs: &Observations,
    est: &BTreeSet<usize>,
    cand: &[Step],
    cfg: &ForwardConfig,
) -> Vec<(f64, bool)> {
    let mut est = est.clone();
    let (mut prog, mut grounded_steps) = (0.0, 0usize);
    let mut out = Vec::new();
    for (k, st) in cand.iter().enumerate() {
        prog += score_step(g, st, &mut est, &cfg.progress).progress;
        let ok = unseen(st, &obs.seen(st.stage)).is_empty();
        grounded_steps += ok as usize;
        let all_grounded = grounded_steps == k + 1;
        // With the gate, an ungrounded step rejects the segment; a grounded one has share 1.
        let eff = if cfg.gate && !all_grounded {
            0.0
        } else {
            windowed(prog)
        };
        out.push((eff, all_grounded));
    }
    out
}

/// Picks a segment among candidates: `(candidate, steps to take)`, `None` when none is effective.
pub fn select(scores: &[Vec<(f64, bool)>], cfg: &ForwardConfig) -> Option<Scored> {
    let mut best: Option<Scored> = None;
    for (c, s) in scores.iter().enumerate() {
        let options: Vec<(usize, f64, bool)> = if cfg.shortest {
            s.iter()
                .enumerate()
                .find(|(_, (e, _))| *e >= cfg.floor)
                .map(|(k, &(e, g))| (k + 1, e, g))
                .into_iter()
                .collect()
        } else {
            s.last()
                .filter(|(e, _)| *e >= cfg.floor)
                .map(|&(e, g)| (s.len(), e, g))
                .into_iter()
                .collect()
        };
        for (len, e, g) in options {
            let better = match &best {
                None => true,
                Some(b) if cfg.shortest => len < b.len || (len == b.len && e > b.effectiveness),
                Some(b) => e > b.effectiveness,
            };
            if better {
                best = Some(Scored {
                    candidate: c,
                    len,
                    effectiveness: e,
                    grounded: g,
                });
            }
        }
    }
    best
}

/// What curating one instance produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curated {
    /// The committed trajectory.
    pub steps: Vec<Step>,
    /// Teacher steps sampled.
    pub sampled_steps: usize,
    /// Whether every stage was answered.
    pub complete: bool,
}

/// One step-wise candidate after `prefix` (whose established nodes are `est`): steps until one
/// establishes a node, an answer, `window` steps, or `room` steps (the budget left).
#[allow(clippy::too_many_arguments)]
pub fn stepwise_candidate(
    g: &ProcessGraph,
    inst: &BlindInstance,
    teacher: &FlawedTeacher,
    est: &BTreeSet<usize>,
    prefix: &[Step],
    window: usize,
    room: usize,
    progress: &ProgressConfig,
    seed: u64,
) -> Vec<Step> {
    let mut rng = SplitMix::new(seed);
    let mut all = prefix.to_vec();
    let mut est = est.clone();
    let mut out = Vec::new();
    while out.len() < window.max(1).min(room) {
        let Some(st) = teacher.next_step(inst, &all, &mut rng) else {
            break;
        };
        let s = score_step(g, &st, &mut est, progress);
        let end = !s.established.is_empty() || st.kind == StepKind::Answer;
        all.push(st.clone());
        out.push(st);
        if end {
            break;
        }
    }
    out
}

/// With the shortest rule, the most steps a further step-wise candidate can usefully carry given
/// the candidates scored so far: one less than the best's length once the best reaches full
/// effectiveness (a later candidate wins only when strictly shorter, so the selection is the
/// same and the teacher steps a longer one would cost are saved); `None`: no cap.
pub fn useful_length(scores: &[Vec<(f64, bool)>], cfg: &ForwardConfig) -> Option<usize> {
    if !cfg.shortest {
        return None;
    }
    select(scores, cfg)
        .filter(|b| b.effectiveness >= 1.0)
        .map(|b| b.len - 1)
}

/// Curates one instance's trajectory within `budget` sampled teacher steps.
pub fn curate(
    g: &ProcessGraph,
    obs: &Observations,
    inst: &BlindInstance,
    teacher: &FlawedTeacher,
    cfg: &ForwardConfig,
    budget: usize,
    seed: u64,
) -> Curated {
    let chain = inst.chain();
    let mut out = Curated::default();
    let mut est = BTreeSet::new();
    let mut misses = 0;
    let mut round = 0u64;
    let most = if cfg.commit == 0 {
        usize::MAX
    } else {
        cfg.commit
    };
    let window = cfg.window.max(1);
    while current_stage(&chain, &out.steps).is_some() && misses < cfg.patience {
        if !cfg.stepwise && out.sampled_steps + window * cfg.candidates.max(1) > budget {
            break;
        }
        let mut cands: Vec<Vec<Step>> = Vec::new();
        let mut scores: Vec<Vec<(f64, bool)>> = Vec::new();
        for c in 0..cfg.candidates.max(1) {
            let s = random_u64(seed, round, c as u64);
            let cand = if cfg.stepwise {
                let room = budget.saturating_sub(out.sampled_steps);
                let cap = useful_length(&scores, cfg).unwrap_or(window);
                if cap == 0 {
                    break;
                }
                stepwise_candidate(
                    g,
                    inst,
                    teacher,
                    &est,
                    &out.steps,
                    cap,
                    room,
                    &cfg.progress,
                    s,
                )
            } else {
                teacher.continue_from(inst, &out.steps, window, s)
            };
            out.sampled_steps += cand.len();
            scores.push(score_prefixes(g, obs, &est, &cand, cfg));
            cands.push(cand);
        }
        round += 1;
        if cands.iter().all(Vec::is_empty) {
            break;
        }
        let Some(pick) = select(&scores, cfg) else {
            misses += 1;
            continue;
        };
        misses = 0;
        for st in cands[pick.candidate].iter().take(pick.len.min(most)) {
            score_step(g, st, &mut est, &cfg.progress);
            out.steps.push(st.clone());
        }
    }
    out.complete = current_stage(&chain, &out.steps).is_none();
    out
}

/// Outcome-only rollouts (the baseline): whole trajectories of at most `max_steps` steps, at
/// least `k` and more while fewer than `budget` teacher steps were sampled.
pub fn rollouts(
    inst: &BlindInstance,
    teacher: &FlawedTeacher,
    k: usize,
    max_steps: usize,
    budget: usize,
    seed: u64,
) -> Vec<Vec<Step>> {
    let mut out: Vec<Vec<Step>> = Vec::new();
    let mut used = 0;
    while out.len() < k || used < budget {
        let t = teacher.continue_from(
            inst,
            &[],
            max_steps.max(1),
            random_u64(seed, 0x0c0e, out.len() as u64),
        );
        used += t.len().max(1);
        out.push(t);
    }
    out
}
