//! The forward phase: a receding-horizon window over a trajectory. From the committed prefix the
//! blinded teacher samples candidate segments; each prefix of a candidate is scored by its
//! effectiveness, windowed progress (mean Prog_t, clipped to [0, 1]) times groundedness (share of
//! grounded steps); with the gate on, a segment with an ungrounded step is rejected. The shortest
//! prefix that clears the floor wins (ties: higher effectiveness, then earlier candidate); it is
//! committed (at most `commit` steps of it) and the next window starts after it. Ablations: `gate = false` scores
//! without the groundedness check; `shortest = false` takes the most effective whole candidate.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::engine::rng::random_u64;

use super::flawed::{BlindInstance, FlawedTeacher};
use super::graph::ProcessGraph;
use super::grounded::unseen;
use super::progress::{score_step, ProgressConfig};
use super::trajectory::{current_stage, Observations, Step};

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
    /// Penalties of Prog_t.
    pub progress: ProgressConfig,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            window: 4,
            candidates: 2,
            floor: 0.6,
            gate: true,
            shortest: true,
            patience: 8,
            commit: 0,
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
        let n = (k + 1) as f64;
        let progress = (prog / n).clamp(0.0, 1.0);
        let all_grounded = grounded_steps == k + 1;
        let eff = if cfg.gate {
            if all_grounded {
                progress * grounded_steps as f64 / n
            } else {
                0.0
            }
        } else {
            progress
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
    while current_stage(&chain, &out.steps).is_some() && misses < cfg.patience {
        if out.sampled_steps + cfg.window.max(1) * cfg.candidates.max(1) > budget {
            break;
        }
        let cands: Vec<Vec<Step>> = (0..cfg.candidates.max(1))
            .map(|c| {
                let s = random_u64(seed, round, c as u64);
                teacher.continue_from(inst, &out.steps, cfg.window.max(1), s)
            })
            .collect();
        round += 1;
        out.sampled_steps += cands.iter().map(Vec::len).sum::<usize>();
        let scores: Vec<Vec<(f64, bool)>> = cands
            .iter()
            .map(|c| score_prefixes(g, obs, &est, c, cfg))
            .collect();
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
