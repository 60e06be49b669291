//! What the monitor changed in a run, kept apart from the run's configured settings: a
//! checkpoint records the settings as configured (what a resume compares) and, beside them in
//! `monitor.json`, the monitor's [`Overrides`] of those settings (learning rate, KL coefficient,
//! entropy bonus, ... after a remediation), the quarantined prompts, an injected fault's state
//! and the supervisor's own state, all re-applied on resume so that a resumed run continues the
//! trajectory of an uninterrupted one.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::inject::Injection;
use super::supervisor::SupervisorState;
use crate::rft::rl::RlConfig;

/// The monitor's file in a checkpoint directory.
pub const MONITOR_FILE: &str = "monitor.json";

/// The last healthy weights of a run, in a checkpoint directory, when they differ from the
/// checkpoint's policy (after a quarantine or a worker restart the run trains on without a
/// rollback).
pub const SNAPSHOT_FILE: &str = "monitor_snapshot.safetensors";

const FORMAT: &str = "sorft-monitor-v1";

/// Settings that are not the monitor's to change (and may differ on resume).
const NOT_OVERRIDDEN: &[&str] = &["steps", "save_every", "keep_last", "monitor"];

/// Settings that differ from the configured ones: field name -> value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Overrides(pub Map<String, Value>);

fn as_object(cfg: &RlConfig) -> anyhow::Result<Map<String, Value>> {
    match serde_json::to_value(cfg)? {
        Value::Object(m) => Ok(m),
        _ => anyhow::bail!("RL settings do not serialise to an object"),
    }
}

impl Overrides {
    /// The fields of `effective` that differ from `base` (never `steps`, `save_every`,
    /// `keep_last` or `monitor`).
    pub fn between(base: &RlConfig, effective: &RlConfig) -> anyhow::Result<Self> {
        let b = as_object(base)?;
        let mut out = Map::new();
        for (k, v) in as_object(effective)? {
            if !NOT_OVERRIDDEN.contains(&k.as_str()) && b.get(&k) != Some(&v) {
                out.insert(k, v);
            }
        }
        Ok(Self(out))
    }

    /// `base` with the overrides applied.
    pub fn apply(&self, base: &RlConfig) -> anyhow::Result<RlConfig> {
        let mut m = as_object(base)?;
        for (k, v) in &self.0 {
            anyhow::ensure!(
                m.contains_key(k) && !NOT_OVERRIDDEN.contains(&k.as_str()),
                "monitor state: {k:?} is not an RL setting the monitor can override"
            );
            m.insert(k.clone(), v.clone());
        }
        serde_json::from_value(Value::Object(m))
            .map_err(|e| anyhow::anyhow!("monitor state: overridden RL settings: {e}"))
    }

    /// No setting differs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Everything the monitor keeps across a checkpoint (`monitor.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MonitorState {
    /// Format tag.
    pub format: String,
    /// The trainer's settings against the configured ones.
    pub overrides: Overrides,
    /// Prompts kept out of rollouts.
    pub quarantined: BTreeSet<usize>,
    /// An injected fault (benchmarks and tests) with its state.
    pub fault: Option<Injection>,
    /// The supervisor's state.
    pub supervisor: SupervisorState,
}

impl MonitorState {
    /// The state of a run whose trainer runs with `effective` settings configured as `base`.
    pub fn new(
        base: &RlConfig,
        effective: &RlConfig,
        quarantined: &BTreeSet<usize>,
        fault: Option<&Injection>,
        supervisor: SupervisorState,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            format: FORMAT.into(),
            overrides: Overrides::between(base, effective)?,
            quarantined: quarantined.clone(),
            fault: fault.cloned(),
            supervisor,
        })
    }

    /// Reads `dir/monitor.json`; `None` when the checkpoint has none (an older one, or a run
    /// without a monitor).
    pub fn load(dir: &std::path::Path) -> anyhow::Result<Option<Self>> {
        let p = dir.join(MONITOR_FILE);
        if !p.exists() {
            return Ok(None);
        }
        let text =
            std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        let s: Self =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        anyhow::ensure!(
            s.format == FORMAT,
            "{}: format {:?}, expected {FORMAT:?}",
            p.display(),
            s.format
        );
        Ok(Some(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_hold_only_what_changed_and_restore_it() {
        let base = RlConfig::default();
        let mut eff = base.clone();
        assert!(Overrides::between(&base, &eff).unwrap().is_empty());
        eff.lr *= 0.5;
        eff.kl_coef = 0.37;
        eff.entropy_coef += 0.01;
        eff.steps = 99; // not an override
        let o = Overrides::between(&base, &eff).unwrap();
        let mut keys: Vec<&str> = o.0.keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["entropy_coef", "kl_coef", "lr"]);
        // Through the file's text and back: exact.
        let o: Overrides = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        let back = o.apply(&base).unwrap();
        assert_eq!(back.lr, eff.lr);
        assert_eq!(back.kl_coef, eff.kl_coef);
        assert_eq!(back.entropy_coef, eff.entropy_coef);
        assert_eq!(back.steps, base.steps);
        // A field that is no setting, or one the monitor never overrides, is refused.
        let bad = Overrides([("nope".to_string(), Value::from(1))].into_iter().collect());
        assert!(bad.apply(&base).unwrap_err().to_string().contains("nope"));
        let bad = Overrides(
            [("steps".to_string(), Value::from(1))]
                .into_iter()
                .collect(),
        );
        assert!(bad.apply(&base).is_err());
        let bad = Overrides([("lr".to_string(), Value::from("x"))].into_iter().collect());
        assert!(bad.apply(&base).is_err());
    }
}
