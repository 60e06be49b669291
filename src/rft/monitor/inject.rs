//! Fault injection for `sorft faultbench`: one fault type at a strength from an onset step,
//! applied through a few hooks of the RL step ([`crate::rft::rl::RlTrainer::fault`]).
//!
//! The fault model: settings faults (learning rate, clip range, KL coefficient, temperature,
//! response budget) corrupt the trainer's settings once at the onset, so a rollback to the last
//! healthy settings undoes them; a non-finite spike and ignored stop tokens are run-state faults
//! that a rollback clears too; sandbox failures, timeouts and empty outputs are worker faults
//! that a worker restart clears; duplicated prompts are a data fault that quarantining the
//! duplicated prompt clears; reward, credit-assignment, flaky-test, repetition and advantage
//! faults persist whatever the run does (a correct monitor stops those runs).

use serde::{Deserialize, Serialize};

use super::remediate::Action;
use super::taxonomy::FaultType;
use crate::engine::rng::{random_u64, uniform, SplitMix};
use crate::model::generate::GenOutput;
use crate::model::Tokenizer;
use crate::rft::rl::RlConfig;

/// How strong an injected fault is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strength {
    /// Blatant.
    Easy,
    /// Subtle (a fraction of responses, or a smaller factor).
    Hard,
}

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// The fault.
    pub fault: FaultType,
    /// Its strength.
    pub strength: Strength,
    /// First faulty step (1-based).
    pub onset: usize,
    /// Seed of the fault's own random choices.
    pub seed: u64,
    /// False once a remediation removed the cause.
    pub armed: bool,
    /// Stop tokens are ignored (length explosion), until a rollback.
    ignore_stop: bool,
}

impl Injection {
    /// `fault` at `strength` from step `onset`.
    pub fn new(fault: FaultType, strength: Strength, onset: usize, seed: u64) -> Self {
        Self {
            fault,
            strength,
            onset: onset.max(1),
            seed,
            armed: true,
            ignore_stop: false,
        }
    }

    fn active(&self, step: usize) -> bool {
        self.armed && step >= self.onset
    }

    /// Active and `fault` is the injected one.
    pub fn is(&self, step: usize, fault: FaultType) -> bool {
        self.active(step) && self.fault == fault
    }

    /// Share of responses (or sequences) a per-item fault touches.
    fn rate(&self) -> f64 {
        match self.strength {
            Strength::Easy => 1.0,
            Strength::Hard => 0.35,
        }
    }

    fn easy(&self) -> bool {
        self.strength == Strength::Easy
    }

    /// A deterministic uniform draw in [0, 1) for item `i` of `step` (stream `k`).
    fn draw(&self, step: usize, i: usize, k: u64) -> f64 {
        uniform(self.seed, step as u64 * 0x1_0000 + k, i as u64)
    }

    fn hits(&self, step: usize, i: usize, k: u64) -> bool {
        self.draw(step, i, k) < self.rate()
    }

    /// Hook at the start of a step: settings faults corrupt `cfg` once, at the onset.
    pub fn on_step_start(&mut self, step: usize, cfg: &mut RlConfig) {
        if !self.armed || step != self.onset {
            return;
        }
        let e = self.easy();
        match self.fault {
            FaultType::LrTooHigh => cfg.lr *= if e { 300.0 } else { 20.0 },
            FaultType::LrZero => cfg.lr = if e { 0.0 } else { cfg.lr * 0.01 },
            FaultType::ClipOff => cfg.clip_eps = if e { 1e6 } else { 5.0 },
            FaultType::KlHuge => cfg.kl_coef = cfg.kl_coef.max(1e-3) * if e { 5e3 } else { 200.0 },
            FaultType::EntropyCollapse => cfg.temperature *= if e { 0.1 } else { 0.35 },
            FaultType::LengthCollapse => {
                cfg.max_new_tokens = if e {
                    1
                } else {
                    (cfg.max_new_tokens / 4).max(2)
                }
            }
            FaultType::LengthExplosion => self.ignore_stop = true,
            _ => {}
        }
    }

    /// Whether rollouts of `step` must ignore their stop tokens.
    pub fn ignore_stop(&self, step: usize, i: usize) -> bool {
        self.ignore_stop && self.active(step) && self.hits(step, i, 1)
    }

    /// Hook on the prompts chosen for a step (prompt indices): duplicated prompts.
    pub fn on_prompts(&self, step: usize, chosen: &mut [usize]) {
        if !self.is(step, FaultType::DuplicatedPrompts) || chosen.is_empty() {
            return;
        }
        // Hard: half the batch, and at least two (one copy of the first prompt is no fault).
        let n = if self.easy() {
            chosen.len()
        } else {
            chosen.len().div_ceil(2).max(2)
        };
        let first = chosen[0];
        for c in chosen.iter_mut().take(n) {
            *c = first;
        }
    }

    /// The prompt a duplicated-prompts fault repeats (what a quarantine removes).
    pub fn duplicated_prompt(&self, step: usize, chosen: &[usize]) -> Option<usize> {
        self.is(step, FaultType::DuplicatedPrompts)
            .then(|| chosen.first().copied())
            .flatten()
    }

    /// Hook on response `i`'s ids: empty outputs (`Some(empty)`) or a repetition loop of its
    /// first two tokens (`Some(loop)`); `None`: unchanged.
    pub fn on_response(&self, step: usize, i: usize, ids: &[u32]) -> Option<Vec<u32>> {
        if self.is(step, FaultType::EmptyOutputs) && self.hits(step, i, 2) {
            return Some(Vec::new());
        }
        if self.is(step, FaultType::RepetitionLoop) && self.hits(step, i, 3) && ids.len() > 2 {
            let pat = [ids[0], ids[1]];
            return Some((0..ids.len()).map(|t| pat[t % 2]).collect());
        }
        None
    }

    /// Hook on response `i`'s reward `r` (from `score_other`, the reward against another
    /// prompt's truth, when the fault needs it). Returns the reward and a zero-reward reason that
    /// replaces the scorer's (sandbox faults).
    pub fn on_reward(
        &self,
        step: usize,
        i: usize,
        r: f64,
        empty: bool,
        score_other: &dyn Fn() -> f64,
    ) -> (f64, Option<&'static str>) {
        // A non-finite spike hits the first response (every step when easy, the onset's when
        // hard), not a random share: a share of one response in four often drew none.
        let nan = self.fault == FaultType::NonFinite;
        if !self.active(step) || (!nan && !self.hits(step, i, 4)) {
            return (r, None);
        }
        let e = self.easy();
        match self.fault {
            FaultType::RewardSignFlip => (-r, None),
            FaultType::RewardNoise => {
                let u = self.draw(step, i, 5) + self.draw(step, i, 6) + self.draw(step, i, 7);
                let noise = (u - 1.5) * 2.0; // zero mean, std 1
                if e {
                    (r + noise, None)
                } else {
                    ((r + 0.3 * noise).clamp(0.0, 1.0), None)
                }
            }
            FaultType::RewardScale => (r * if e { 50.0 } else { 3.0 }, None),
            FaultType::RewardLenient => (if empty { r } else { r.max(1.0) }, None),
            FaultType::RewardStaleTruth => (score_other(), None),
            FaultType::NonFinite if e || step == self.onset => {
                (if i == 0 { f64::NAN } else { r }, None)
            }
            FaultType::SandboxFailure => (0.0, Some("sandbox_error")),
            FaultType::SandboxTimeout => (0.0, Some("timeout")),
            FaultType::FlakyTests => (
                if self.draw(step, i, 8) < 0.5 {
                    0.0
                } else {
                    1.0
                },
                None,
            ),
            _ => (r, None),
        }
    }

    /// Hook on the step's scores (after rewards): shuffled prompt/answer pairs.
    pub fn on_scores(&self, step: usize, scores: &mut [f32]) {
        if !self.is(step, FaultType::ShuffledPairs) || scores.len() < 2 {
            return;
        }
        let mut r = SplitMix::new(random_u64(self.seed, step as u64, 0x5a));
        let n = scores.len();
        for i in (1..n).rev() {
            if self.easy() || self.hits(step, i, 9) {
                scores.swap(i, r.below(i as u64 + 1) as usize);
            }
        }
    }

    /// Hook on the old log-probabilities: stale ones (noise as from another policy).
    pub fn on_old_logprobs(&self, step: usize, old: &mut [Vec<f32>]) {
        if !self.is(step, FaultType::StaleLogprobs) {
            return;
        }
        let sd = if self.easy() { 1.0 } else { 0.25 };
        for (i, seq) in old.iter_mut().enumerate() {
            for (t, x) in seq.iter_mut().enumerate() {
                let u = self.draw(step, i * 4096 + t, 10) + self.draw(step, i * 4096 + t, 11);
                *x += ((u - 1.0) * 2.45 * sd) as f32;
            }
        }
    }

    /// Hook on the advantages of the live sequences: sign flips.
    pub fn on_advantages(&self, step: usize, adv: &mut [Vec<f32>]) {
        if !self.is(step, FaultType::AdvantageSignFlip) {
            return;
        }
        for (i, a) in adv.iter_mut().enumerate() {
            if self.hits(step, i, 12) {
                a.iter_mut().for_each(|x| *x = -*x);
            }
        }
    }

    /// What a remediation does to the fault's cause (see the module doc).
    pub fn respond(&mut self, action: &Action) {
        use FaultType::*;
        let clears = match action {
            Action::Rollback { .. } | Action::RaiseKl { .. } | Action::RestoreEntropy { .. } => {
                self.ignore_stop = false;
                matches!(self.fault, NonFinite | LengthExplosion)
            }
            Action::RestartWorkers => {
                matches!(self.fault, SandboxFailure | SandboxTimeout | EmptyOutputs)
            }
            Action::QuarantinePrompts { .. } => self.fault == DuplicatedPrompts,
            Action::Stop { .. } => false,
        };
        if clears {
            self.armed = false;
        }
    }
}

/// Applies [`Injection::on_response`] to a step's outputs: a replaced response keeps its
/// sampled log-probabilities (what a broken sampler reports) and loses its constraint records.
pub fn corrupt_outputs(
    f: &Injection,
    step: usize,
    tok: &Tokenizer,
    outs: &mut [GenOutput],
) -> anyhow::Result<()> {
    for (i, o) in outs.iter_mut().enumerate() {
        if let Some(ids) = f.on_response(step, i, &o.ids) {
            o.text = tok.decode(&ids, true)?;
            let n = ids.len();
            o.logprobs.resize(n, 0.0);
            o.forced = vec![false; n];
            o.allowed = vec![None; n];
            o.allowed_logmass = vec![0.0; n];
            o.ids = ids;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_faults_apply_once_at_the_onset() {
        let mut f = Injection::new(FaultType::LrTooHigh, Strength::Easy, 3, 1);
        let mut cfg = RlConfig::default();
        let lr = cfg.lr;
        f.on_step_start(2, &mut cfg);
        assert_eq!(cfg.lr, lr);
        f.on_step_start(3, &mut cfg);
        assert!(cfg.lr > lr * 100.0);
        let after = cfg.lr;
        f.on_step_start(4, &mut cfg);
        assert_eq!(cfg.lr, after);
    }

    #[test]
    fn per_item_faults_respect_onset_strength_and_remediation() {
        let f = Injection::new(FaultType::RewardSignFlip, Strength::Easy, 2, 1);
        assert_eq!(f.on_reward(1, 0, 0.5, false, &|| 0.0).0, 0.5);
        assert_eq!(f.on_reward(2, 0, 0.5, false, &|| 0.0).0, -0.5);
        let hard = Injection::new(FaultType::RewardSignFlip, Strength::Hard, 1, 1);
        let flipped = (0..200)
            .filter(|&i| hard.on_reward(1, i, 0.5, false, &|| 0.0).0 < 0.0)
            .count();
        assert!((40..=100).contains(&flipped), "{flipped}");
        let mut sb = Injection::new(FaultType::SandboxFailure, Strength::Easy, 1, 1);
        assert_eq!(
            sb.on_reward(1, 0, 0.7, false, &|| 0.0),
            (0.0, Some("sandbox_error"))
        );
        sb.respond(&Action::Stop {
            reason: String::new(),
        });
        assert!(sb.armed);
        sb.respond(&Action::RestartWorkers);
        assert_eq!(sb.on_reward(1, 0, 0.7, false, &|| 0.0), (0.7, None));
    }

    #[test]
    fn data_hooks_change_what_they_should() {
        let d = Injection::new(FaultType::DuplicatedPrompts, Strength::Easy, 1, 1);
        let mut c = vec![3, 1, 4, 1];
        d.on_prompts(1, &mut c);
        assert_eq!(c, vec![3, 3, 3, 3]);
        let h = Injection::new(FaultType::DuplicatedPrompts, Strength::Hard, 1, 1);
        let mut c = vec![3, 1, 4, 1, 5, 9];
        h.on_prompts(1, &mut c);
        assert_eq!(c, vec![3, 3, 3, 1, 5, 9]);
        // A hard non-finite spike: the first response of the onset step, whatever the draws.
        let n = Injection::new(FaultType::NonFinite, Strength::Hard, 3, 1);
        assert!(n.on_reward(3, 0, 0.5, false, &|| 0.0).0.is_nan());
        assert_eq!(n.on_reward(3, 1, 0.5, false, &|| 0.0).0, 0.5);
        assert_eq!(n.on_reward(4, 0, 0.5, false, &|| 0.0).0, 0.5);
        // A batch of two: the hard fault still repeats a prompt.
        let mut c = vec![2, 7];
        h.on_prompts(1, &mut c);
        assert_eq!(c, vec![2, 2]);
        let s = Injection::new(FaultType::ShuffledPairs, Strength::Easy, 1, 1);
        let mut sc: Vec<f32> = (0..16).map(|x| x as f32).collect();
        s.on_scores(1, &mut sc);
        assert_ne!(sc, (0..16).map(|x| x as f32).collect::<Vec<_>>());
        let a = Injection::new(FaultType::AdvantageSignFlip, Strength::Easy, 1, 1);
        let mut adv = vec![vec![1.0, 1.0], vec![-2.0]];
        a.on_advantages(1, &mut adv);
        assert_eq!(adv, vec![vec![-1.0, -1.0], vec![2.0]]);
        let r = Injection::new(FaultType::RepetitionLoop, Strength::Easy, 1, 1);
        assert_eq!(
            r.on_response(1, 0, &[5, 6, 7, 8, 9]),
            Some(vec![5, 6, 5, 6, 5])
        );
    }
}
