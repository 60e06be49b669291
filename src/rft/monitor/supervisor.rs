//! The closed loop of RFT-FM inside a run: after every step, features -> detection ->
//! diagnosis -> (in `remediate` mode) an action, applied to the trainer; the next steps tell
//! whether it worked, and a returning alarm escalates. Every event is attached to the step's
//! metrics.

use serde::{Deserialize, Serialize};

use super::detect::{Alarm, Detector, DetectorState, RobustConfig, RobustDetector};
use super::diagnose::{diagnose, Diagnosis};
use super::features::StepRecord;
use super::overrides::{MonitorState, Overrides, MONITOR_FILE, SNAPSHOT_FILE};
use super::remediate::{plan, Action};
use super::MonitorMode;
use crate::engine::{Backend, DType, HostData};
use crate::model::weights::HostTensor;
use crate::model::Model;
use crate::rft::rl::{RlConfig, RlMetrics, RlTrainer};
use crate::swe::subtask::EditReward;
use crate::train::params::{model_params, model_params_mut};

/// One monitor event of a step: an alarm with its diagnosis and action, or the outcome of an
/// earlier action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MonitorEvent {
    /// The step.
    pub step: usize,
    /// The detection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<Alarm>,
    /// The diagnosis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
    /// The remediation taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// The outcome of the last remediation ("recovered"), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

impl MonitorEvent {
    /// One line for logs and reports.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("step {}", self.step)];
        if let Some(a) = &self.alarm {
            let sig: Vec<String> = a
                .signals
                .iter()
                .take(3)
                .map(|s| format!("{} {:?} ({:?} {:.1})", s.feature, s.dir, s.rule, s.score))
                .collect();
            parts.push(format!("alarm: {}", sig.join(", ")));
        }
        if let Some(d) = &self.diagnosis {
            parts.push(format!(
                "diagnosis: {} [{}] ({})",
                d.fault.map(|f| f.name()).unwrap_or("unknown"),
                d.family.map(|f| f.code()).unwrap_or("?"),
                d.evidence
            ));
        }
        if let Some(a) = &self.action {
            parts.push(format!("action: {}", a.describe()));
        }
        if let Some(o) = &self.outcome {
            parts.push(format!("outcome: {o}"));
        }
        parts.join("; ")
    }
}

/// What the run does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Go on.
    Continue,
    /// Stop (the policy is back at its last healthy weights).
    Stop(String),
}

struct Snapshot {
    weights: Vec<Vec<f32>>,
    cfg: RlConfig,
}

/// Healthy steps after a remediation before it counts as recovered.
const CONFIRM_STEPS: usize = 2;

/// The monitor of one run.
pub struct Supervisor {
    mode: MonitorMode,
    detector: RobustDetector,
    snapshot: Option<Snapshot>,
    attempts: usize,
    pending: Option<usize>,
    last_fault: Option<Option<crate::rft::monitor::taxonomy::FaultType>>,
    healthy_since: usize,
    /// The policy's weights are the snapshot's (no step since it was taken or restored).
    snapshot_is_current: bool,
    stopped: Option<String>,
    /// Every event so far.
    pub events: Vec<MonitorEvent>,
}

/// The range the configured reward lives in.
pub fn reward_range(cfg: &RlConfig) -> (f64, f64) {
    match cfg.edit_reward {
        EditReward::LineFbeta => (0.0, 1.0),
        _ => (-1.0, 1.0),
    }
}

impl Supervisor {
    /// A monitor in `mode` for a run with settings `cfg`.
    pub fn new(mode: MonitorMode, cfg: &RlConfig) -> Self {
        Self::with_detector(
            mode,
            RobustDetector::new(RobustConfig {
                reward_range: Some(reward_range(cfg)),
                ..RobustConfig::default()
            }),
        )
    }

    /// A monitor with a given detector (tuned settings).
    pub fn with_detector(mode: MonitorMode, detector: RobustDetector) -> Self {
        Self {
            mode,
            detector,
            snapshot: None,
            attempts: 0,
            pending: None,
            last_fault: None,
            healthy_since: 0,
            snapshot_is_current: false,
            stopped: None,
            events: Vec::new(),
        }
    }

    /// Why the monitor stopped the run, if it did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Records the healthy starting point (the weights before step 1) in `remediate` mode.
    pub fn start<B: Backend>(
        &mut self,
        trainer: &RlTrainer<B>,
        policy: &Model<B>,
    ) -> anyhow::Result<()> {
        if self.mode == MonitorMode::Remediate {
            self.take_snapshot(trainer, policy)?;
        }
        Ok(())
    }

    fn take_snapshot<B: Backend>(
        &mut self,
        trainer: &RlTrainer<B>,
        policy: &Model<B>,
    ) -> anyhow::Result<()> {
        let mut weights = Vec::new();
        for (_, t) in model_params(policy) {
            weights.push(policy.backend.to_host_f32(t)?);
        }
        self.snapshot = Some(Snapshot {
            weights,
            cfg: trainer.cfg.clone(),
        });
        self.snapshot_is_current = true;
        Ok(())
    }

    fn rollback<B: Backend>(
        &mut self,
        trainer: &mut RlTrainer<B>,
        policy: &mut Model<B>,
    ) -> anyhow::Result<()> {
        let Some(s) = &self.snapshot else {
            anyhow::bail!("no healthy snapshot to roll back to")
        };
        let be = policy.backend.clone();
        for ((_, t), w) in model_params_mut(policy).into_iter().zip(&s.weights) {
            let shape = t.shape().to_vec();
            // Same dtype as before: fp32 tensors (adapters, value head) stay fp32 on a bf16 GPU.
            *t = if t.dtype() == DType::F32 {
                be.upload_f32_exact(w, &shape)?
            } else {
                be.upload(HostData::F32(w), &shape)?
            };
        }
        let steps = trainer.cfg.steps;
        trainer.cfg = RlConfig {
            steps,
            ..s.cfg.clone()
        };
        trainer.reset_optimizer(policy)?;
        self.snapshot_is_current = true;
        Ok(())
    }

    fn apply<B: Backend>(
        &mut self,
        action: &Action,
        trainer: &mut RlTrainer<B>,
        policy: &mut Model<B>,
    ) -> anyhow::Result<()> {
        match action {
            Action::Rollback { lr_factor } => {
                self.rollback(trainer, policy)?;
                trainer.cfg.lr *= lr_factor;
            }
            Action::RaiseKl { factor } => {
                self.rollback(trainer, policy)?;
                trainer.cfg.lr *= 0.5;
                trainer.cfg.kl_coef = trainer.cfg.kl_coef.max(1e-3) * factor;
            }
            Action::RestoreEntropy { entropy_bonus } => {
                self.rollback(trainer, policy)?;
                trainer.cfg.entropy_coef += entropy_bonus;
            }
            Action::QuarantinePrompts { prompts } => trainer.quarantined.extend(prompts),
            // Stage 2 has no long-lived worker to restart: its rewards are rule-based and every
            // sandbox run is a fresh process. The action changes nothing in the trainer; it
            // clears only the simulated worker faults of `sorft faultbench` (below), and a real
            // failure that persists escalates to a stop at the next alarm.
            Action::RestartWorkers => {}
            Action::Stop { .. } => self.rollback(trainer, policy)?,
        }
        if let Some(f) = trainer.fault.as_mut() {
            f.respond(action);
        }
        Ok(())
    }

    /// Judges the step whose metrics are `m` (attaching the events to them) and, in `remediate`
    /// mode, acts on the trainer and the policy.
    pub fn after_step<B: Backend>(
        &mut self,
        trainer: &mut RlTrainer<B>,
        policy: &mut Model<B>,
        m: &mut RlMetrics,
    ) -> anyhow::Result<Verdict> {
        if self.mode == MonitorMode::Off {
            return Ok(Verdict::Continue);
        }
        self.snapshot_is_current = false;
        let v = serde_json::to_value(&*m)?;
        let rec = StepRecord::from_json(&v, m.step);
        let mut verdict = Verdict::Continue;
        let Some(alarm) = self.detector.observe(&rec) else {
            self.healthy_since += 1;
            if self.pending.is_some() && self.healthy_since >= CONFIRM_STEPS {
                self.pending = None;
                self.attempts = 0;
                self.push(
                    m,
                    MonitorEvent {
                        step: m.step,
                        outcome: Some("recovered".into()),
                        ..Default::default()
                    },
                );
            }
            if self.mode == MonitorMode::Remediate {
                self.take_snapshot(trainer, policy)?;
            }
            return Ok(verdict);
        };
        self.healthy_since = 0;
        let diagnosis = diagnose(&alarm);
        let mut ev = MonitorEvent {
            step: m.step,
            alarm: Some(alarm),
            diagnosis: Some(diagnosis.clone()),
            ..Default::default()
        };
        if self.mode == MonitorMode::Remediate {
            // Escalate when the same diagnosis comes back before the last action was confirmed.
            let again = self.pending.is_some() && self.last_fault == Some(diagnosis.fault);
            let attempt = if again { self.attempts } else { 0 };
            self.last_fault = Some(diagnosis.fault);
            let action = plan(&diagnosis, attempt, dominant(&trainer.last_chosen));
            self.apply(&action, trainer, policy)?;
            if let Action::Stop { reason } = &action {
                verdict = Verdict::Stop(reason.clone());
                self.stopped = Some(reason.clone());
            }
            self.attempts = attempt + 1;
            self.pending = Some(m.step);
            ev.action = Some(action);
        }
        self.push(m, ev);
        Ok(verdict)
    }

    /// The files the monitor adds to a checkpoint of `trainer` at `policy`: `monitor.json`
    /// (overrides of the configured settings, quarantine, injected fault, supervisor state) and,
    /// when the last healthy weights are not the policy's, those weights.
    pub fn checkpoint_files<B: Backend>(
        &self,
        trainer: &RlTrainer<B>,
        policy: &Model<B>,
    ) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let base = &trainer.base_cfg;
        let mut files = Vec::new();
        let snapshot = match &self.snapshot {
            None => None,
            Some(s) => {
                let weights_file = !self.snapshot_is_current;
                if weights_file {
                    let mut map = std::collections::BTreeMap::new();
                    for ((name, t), w) in model_params(policy).into_iter().zip(&s.weights) {
                        map.insert(name, HostTensor::f32(t.shape(), w));
                    }
                    let bytes = crate::train::checkpoint::safetensors_bytes(&map)?;
                    files.push((SNAPSHOT_FILE.to_string(), bytes));
                }
                Some(SnapshotState {
                    overrides: Overrides::between(base, &s.cfg)?,
                    weights_file,
                })
            }
        };
        let sup = SupervisorState {
            attempts: self.attempts,
            pending: self.pending,
            last_fault_seen: self.last_fault.is_some(),
            last_fault: self.last_fault.flatten(),
            healthy_since: self.healthy_since,
            detector: self.detector.state(),
            snapshot,
            stopped: self.stopped.clone(),
            events: self.events.clone(),
        };
        let st = MonitorState::new(
            base,
            &trainer.cfg,
            &trainer.quarantined,
            trainer.fault.as_ref(),
            sup,
        )?;
        files.push((
            MONITOR_FILE.to_string(),
            serde_json::to_string_pretty(&st)?.into_bytes(),
        ));
        Ok(files)
    }

    /// Restores the monitor and the trainer's monitored state (settings overrides, quarantine,
    /// injected fault) from checkpoint `dir`, whose policy is `policy`. A checkpoint without a
    /// monitor file (an older one) starts the monitor afresh at `policy`.
    pub fn resume<B: Backend>(
        &mut self,
        dir: &std::path::Path,
        trainer: &mut RlTrainer<B>,
        policy: &Model<B>,
    ) -> anyhow::Result<()> {
        let Some(st) = MonitorState::load(dir)? else {
            return self.start(trainer, policy);
        };
        let steps = trainer.cfg.steps;
        trainer.cfg = RlConfig {
            steps,
            ..st.overrides.apply(&trainer.base_cfg)?
        };
        trainer.quarantined = st.quarantined;
        trainer.fault = st.fault;
        let s = st.supervisor;
        self.attempts = s.attempts;
        self.pending = s.pending;
        self.last_fault = s.last_fault_seen.then_some(s.last_fault);
        self.healthy_since = s.healthy_since;
        self.detector.restore(&s.detector)?;
        self.events = s.events;
        self.stopped = s.stopped;
        self.snapshot = None;
        self.snapshot_is_current = false;
        if self.mode != MonitorMode::Remediate {
            return Ok(());
        }
        let Some(snap) = s.snapshot else {
            return self.start(trainer, policy);
        };
        let cfg = RlConfig {
            steps,
            ..snap.overrides.apply(&trainer.base_cfg)?
        };
        let weights = if snap.weights_file {
            let p = dir.join(SNAPSHOT_FILE);
            let mut t = crate::train::checkpoint::read_f32_tensors(&p)?;
            let mut out = Vec::new();
            for (name, cur) in model_params(policy) {
                let (shape, data) = t
                    .remove(&name)
                    .ok_or_else(|| anyhow::anyhow!("{}: {name} missing", p.display()))?;
                anyhow::ensure!(
                    shape.as_slice() == cur.shape(),
                    "{}: {name} has shape {shape:?}, expected {:?}",
                    p.display(),
                    cur.shape()
                );
                out.push(data);
            }
            out
        } else {
            let mut out = Vec::new();
            for (_, t) in model_params(policy) {
                out.push(policy.backend.to_host_f32(t)?);
            }
            self.snapshot_is_current = true;
            out
        };
        self.snapshot = Some(Snapshot { weights, cfg });
        Ok(())
    }

    fn push(&mut self, m: &mut RlMetrics, ev: MonitorEvent) {
        tracing::warn!("monitor: {}", ev.describe());
        m.monitor.push(ev.clone());
        self.events.push(ev);
    }
}

/// The supervisor's state in a checkpoint (see [`Supervisor::checkpoint_files`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SupervisorState {
    /// Remediations tried for the current diagnosis.
    pub attempts: usize,
    /// The step of the last remediation, until confirmed.
    pub pending: Option<usize>,
    /// Whether a diagnosis was seen (then `last_fault` is the last one's fault type).
    pub last_fault_seen: bool,
    /// The last diagnosis's fault type.
    pub last_fault: Option<crate::rft::monitor::taxonomy::FaultType>,
    /// Healthy steps since the last alarm.
    pub healthy_since: usize,
    /// The detector's baselines.
    pub detector: DetectorState,
    /// The last healthy snapshot (remediate mode).
    pub snapshot: Option<SnapshotState>,
    /// Why the monitor stopped the run, if it did (a resume does not train on).
    pub stopped: Option<String>,
    /// Every event so far.
    pub events: Vec<MonitorEvent>,
}

/// The last healthy snapshot in a checkpoint: its settings, and whether its weights are in
/// their own file (otherwise they are the checkpoint's policy).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotState {
    /// Its settings against the configured ones.
    pub overrides: Overrides,
    /// Its weights are in `monitor_snapshot.safetensors`.
    pub weights_file: bool,
}

/// The prompt that fills more than half of a batch, if one does.
fn dominant(chosen: &[usize]) -> Option<usize> {
    let mut counts = std::collections::BTreeMap::new();
    for &c in chosen {
        *counts.entry(c).or_insert(0usize) += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .filter(|&(_, n)| 2 * n > chosen.len())
        .map(|(p, _)| p)
}

/// Moves chosen prompts off the quarantined ones (to the next free index), unless all are.
pub fn avoid_quarantined(
    chosen: &mut [usize],
    n: usize,
    quarantined: &std::collections::BTreeSet<usize>,
) {
    if n == 0 || quarantined.len() >= n {
        return;
    }
    for c in chosen.iter_mut() {
        while quarantined.contains(c) {
            *c = (*c + 1) % n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_and_dominance() {
        let q = [2usize].into_iter().collect();
        let mut c = vec![2, 2, 1, 2];
        assert_eq!(dominant(&c), Some(2));
        avoid_quarantined(&mut c, 3, &q);
        assert_eq!(c, vec![0, 0, 1, 0]);
        assert_eq!(dominant(&[1, 2, 3]), None);
    }
}
