//! Restarts of a stalled copy curriculum.
//!
//! Whether a small model acquires copying (the induction-head phase transition) within a
//! budget can depend on its random initialisation. The stall measured in session 36 turned out
//! to follow the tokenizer instead (the same weights crossed with another tokenizer, and a new
//! initialisation with the stalling tokenizer stalled too; notes/learn.md), so restarts are
//! off by default (`model.curriculum_restarts` = 0). When on, an attempt whose probe is still
//! above `stall_probe` at step `patience` is abandoned and the curriculum starts again from a
//! new initialisation; the report lists every attempt.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// When an attempt counts as stalled and how often to start again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestartPolicy {
    /// The step at which an attempt is judged (0: never judged, no restarts).
    pub patience: u64,
    /// Probe loss above which the attempt is stalled at `patience`.
    pub stall_probe: f64,
    /// New initialisations after the first; the last attempt always runs to the end.
    pub restarts: usize,
}

/// One attempt, as recorded in `curriculum_attempts.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its training directory, relative to the run's output.
    pub dir: String,
    /// Its initial model directory, relative to the run's output.
    pub init: String,
    /// Seed of its initialisation and data order.
    pub seed: u64,
    /// `(step, probe loss)` where it was judged stalled; `None`: it was kept.
    pub stalled: Option<(u64, f64)>,
}

/// The file listing the attempts of a run's curriculum.
pub const ATTEMPTS_FILE: &str = "curriculum_attempts.json";

/// `Some((step, probe))` when the probe series (step, loss) shows a stall: its first
/// evaluation at or after `patience` is above `stall_probe`. `None` while the series has not
/// reached `patience`, or when the attempt is on its way.
pub fn stalled(series: &[(u64, f64)], policy: &RestartPolicy) -> Option<(u64, f64)> {
    if policy.patience == 0 {
        return None;
    }
    series
        .iter()
        .find(|(s, _)| *s >= policy.patience)
        .filter(|(_, l)| l.is_nan() || *l > policy.stall_probe)
        .copied()
}

/// The attempts recorded by an earlier (interrupted) run in `out`; empty when none.
pub fn read_attempts(out: &Path) -> anyhow::Result<Vec<Attempt>> {
    let path = out.join(ATTEMPTS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| path.display().to_string()),
    }
}

fn write_attempts(out: &Path, attempts: &[Attempt]) -> anyhow::Result<()> {
    let path = out.join(ATTEMPTS_FILE);
    let text = serde_json::to_string_pretty(attempts)?;
    crate::model::weights::write_atomic(&path, text.as_bytes())
        .with_context(|| path.display().to_string())
}

/// What the caller does for attempt `k`.
pub trait Trainer {
    /// Creates attempt `k`'s initial model (deterministic; may run again on resume) and
    /// returns its directory and seed.
    fn init(&mut self, k: usize) -> anyhow::Result<(PathBuf, u64)>;
    /// Trains attempt `k` from `init` (continuing its own checkpoints), stopping after step
    /// `max_steps` (0: to the end). Returns the final model when the run finished.
    fn train(&mut self, k: usize, init: &Path, max_steps: u64) -> anyhow::Result<Option<PathBuf>>;
    /// Attempt `k`'s probe series so far, (step, loss).
    fn probe(&self, k: usize) -> Vec<(u64, f64)>;
    /// Attempt `k`'s training directory.
    fn dir(&self, k: usize) -> PathBuf;
}

/// Runs attempts until one is not stalled, recording them in `out/curriculum_attempts.json`
/// (a resumed run skips the attempts recorded as stalled). Returns the kept attempt's model
/// and every attempt.
pub fn run_attempts(
    out: &Path,
    policy: &RestartPolicy,
    t: &mut dyn Trainer,
) -> anyhow::Result<(PathBuf, Vec<Attempt>)> {
    let earlier = read_attempts(out)?;
    let mut attempts = Vec::new();
    let rel = |p: &Path| {
        p.strip_prefix(out)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    for k in 0..=policy.restarts {
        let (init, seed) = t.init(k)?;
        let mut a = Attempt {
            dir: rel(&t.dir(k)),
            init: rel(&init),
            seed,
            stalled: None,
        };
        if let Some(e) = earlier
            .get(k)
            .filter(|e| e.stalled.is_some() && e.seed == seed)
        {
            a.stalled = e.stalled;
            attempts.push(a);
            continue;
        }
        let last = k == policy.restarts;
        let judged = !last && policy.patience > 0;
        if judged && !t.probe(k).iter().any(|(s, _)| *s >= policy.patience) {
            if let Some(model) = t.train(k, &init, policy.patience)? {
                attempts.push(a);
                write_attempts(out, &attempts)?;
                return Ok((model, attempts));
            }
        }
        if judged {
            if let Some(at) = stalled(&t.probe(k), policy) {
                a.stalled = Some(at);
                attempts.push(a);
                write_attempts(out, &attempts)?;
                continue;
            }
        }
        let model = t
            .train(k, &init, 0)?
            .with_context(|| format!("curriculum attempt {k}: the run exported no model"))?;
        attempts.push(a);
        write_attempts(out, &attempts)?;
        return Ok((model, attempts));
    }
    anyhow::bail!("curriculum: no attempt ran")
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RestartPolicy = RestartPolicy {
        patience: 800,
        stall_probe: 2.5,
        restarts: 2,
    };

    #[test]
    fn a_probe_above_the_limit_at_patience_is_a_stall_and_nan_counts_as_one() {
        let slow = [(400, 3.8), (800, 3.6), (1200, 2.0)];
        assert_eq!(stalled(&slow, &POLICY), Some((800, 3.6)));
        let fast = [(400, 3.0), (800, 0.9)];
        assert_eq!(stalled(&fast, &POLICY), None);
        assert_eq!(stalled(&[(400, 3.9)], &POLICY), None, "not judged yet");
        assert!(stalled(&[(900, f64::NAN)], &POLICY).is_some());
        let never = RestartPolicy {
            patience: 0,
            ..POLICY
        };
        assert_eq!(stalled(&slow, &never), None);
    }

    /// A fake trainer: attempt k's probe is `curves[k]`, evaluated every 100 steps up to `len`.
    struct Fake {
        root: PathBuf,
        curves: Vec<fn(u64) -> f64>,
        len: u64,
        done: Vec<u64>,
        calls: Vec<(usize, u64)>,
    }

    impl Trainer for Fake {
        fn init(&mut self, k: usize) -> anyhow::Result<(PathBuf, u64)> {
            Ok((self.root.join(format!("init{k}")), 10 + k as u64))
        }
        fn train(&mut self, k: usize, _: &Path, max_steps: u64) -> anyhow::Result<Option<PathBuf>> {
            self.calls.push((k, max_steps));
            let end = if max_steps == 0 {
                self.len
            } else {
                max_steps.min(self.len)
            };
            self.done[k] = self.done[k].max(end);
            Ok((end == self.len).then(|| self.root.join(format!("final{k}"))))
        }
        fn probe(&self, k: usize) -> Vec<(u64, f64)> {
            (1..=self.done[k] / 100)
                .map(|i| (i * 100, self.curves[k](i * 100)))
                .collect()
        }
        fn dir(&self, k: usize) -> PathBuf {
            self.root.join(format!("cur{k}"))
        }
    }

    fn fake(root: &Path, curves: Vec<fn(u64) -> f64>) -> Fake {
        let n = curves.len();
        Fake {
            root: root.to_path_buf(),
            curves,
            len: 2000,
            done: vec![0; n],
            calls: Vec::new(),
        }
    }

    #[test]
    fn a_stalled_attempt_is_restarted_and_the_record_lets_a_resumed_run_skip_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let flat: fn(u64) -> f64 = |_| 3.6;
        let learns: fn(u64) -> f64 = |s| if s >= 600 { 0.8 } else { 3.5 };
        let mut t = fake(root, vec![flat, learns, flat]);
        let (model, attempts) = run_attempts(root, &POLICY, &mut t).unwrap();
        assert_eq!(model, root.join("final1"));
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].stalled, Some((800, 3.6)));
        assert_eq!(attempts[1].stalled, None);
        assert_eq!(attempts[0].dir, "cur0");
        assert_eq!(t.calls, vec![(0, 800), (1, 800), (1, 0)]);
        assert_eq!(read_attempts(root).unwrap(), attempts);
        // Resumed: attempt 0 is not trained again.
        let mut again = fake(root, vec![flat, learns, flat]);
        again.done[1] = 800;
        let (m2, a2) = run_attempts(root, &POLICY, &mut again).unwrap();
        assert_eq!((m2, a2), (model, attempts));
        assert_eq!(again.calls, vec![(1, 0)]);
    }

    #[test]
    fn the_last_attempt_runs_to_the_end_even_when_it_stalls() {
        let dir = tempfile::tempdir().unwrap();
        let flat: fn(u64) -> f64 = |_| 3.6;
        let mut t = fake(dir.path(), vec![flat, flat, flat]);
        let (model, attempts) = run_attempts(dir.path(), &POLICY, &mut t).unwrap();
        assert_eq!(model, dir.path().join("final2"));
        assert_eq!(attempts.iter().filter(|a| a.stalled.is_some()).count(), 2);
        assert_eq!(t.calls.last(), Some(&(2, 0)));
        // No restarts: one attempt, never judged.
        let dir = tempfile::tempdir().unwrap();
        let once = RestartPolicy {
            restarts: 0,
            ..POLICY
        };
        let mut t = fake(dir.path(), vec![flat]);
        let (_, attempts) = run_attempts(dir.path(), &once, &mut t).unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(t.calls, vec![(0, 0)]);
    }

    #[test]
    fn a_malformed_attempts_file_is_a_one_line_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ATTEMPTS_FILE), "{not json").unwrap();
        let err = read_attempts(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains(ATTEMPTS_FILE), "{err:#}");
    }
}
