//! RFT-FM: the monitor of RL fine-tuning. Features of every step ([`features`]), online anomaly
//! detection ([`detect`]), diagnosis into a taxonomy of fault families and types ([`taxonomy`],
//! [`diagnose`]), remediation ([`remediate`]) applied in a closed loop by the [`supervisor`], and
//! fault injection for the benchmark ([`inject`], [`bench`]).

pub mod bench;
pub mod detect;
pub mod diagnose;
pub mod features;
pub mod inject;
pub mod overrides;
pub mod remediate;
pub mod supervisor;
pub mod taxonomy;

use serde::{Deserialize, Serialize};

pub use supervisor::{MonitorEvent, Supervisor};

/// What the monitor does during a run (`stage2.monitor`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MonitorMode {
    /// Nothing.
    Off,
    /// Detect and diagnose; events go to the metrics and the report, the run goes on.
    #[default]
    Detect,
    /// Detect, diagnose and remediate (roll back, adjust, quarantine, restart, stop).
    Remediate,
}
