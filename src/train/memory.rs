//! Host memory of a training run: the process's resident and peak resident memory (from
//! `/proc/self/status`), and an account of a training step's large buffers by name, so that a
//! metrics line shows where the peak goes.

use serde::Serialize;

use crate::engine::{Backend, Tensor};

/// Bytes in a MiB.
const MIB: f64 = (1u64 << 20) as f64;

fn status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .split_whitespace()
        .next()?
        .parse::<u64>()
        .ok()
}

/// Peak resident memory of this process in bytes (`VmHWM`), where the system reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// Resident memory of this process in bytes (`VmRSS`), where the system reports it.
pub fn rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

/// Peak resident memory in MiB, or 0 where unknown.
pub fn peak_rss_mib() -> f64 {
    peak_rss_bytes().map_or(0.0, |b| b as f64 / MIB)
}

/// Bytes of named tensors (their element count times their dtype's size).
pub fn tensor_bytes<B: Backend>(ts: &[(String, &Tensor<B>)]) -> u64 {
    ts.iter()
        .map(|(_, t)| (t.shape().iter().product::<usize>() * t.dtype().size()) as u64)
        .sum()
}

/// The large buffers of one training step, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepMemory {
    /// Model weights (trained in place for full fine-tuning; frozen base for LoRA).
    pub weights: u64,
    /// LoRA adapters (0 for full fine-tuning).
    pub adapters: u64,
    /// Gradients of what is trained.
    pub grads: u64,
    /// Adam first and second moments.
    pub moments: u64,
    /// Activations saved by the largest micro-batch's forward for backward.
    pub activations: u64,
    /// One chunk of loss logits and their gradient (fp32).
    pub logits_chunk: u64,
}

impl StepMemory {
    /// Everything above: the state a step needs resident at its peak.
    pub fn total(&self) -> u64 {
        self.weights
            + self.adapters
            + self.grads
            + self.moments
            + self.activations
            + self.logits_chunk
    }

    /// The account as a JSON object in MiB, with the process's peak resident memory beside it.
    pub fn to_json_mib(&self) -> serde_json::Value {
        let m = |b: u64| (b as f64 / MIB * 10.0).round() / 10.0;
        serde_json::json!({
            "weights": m(self.weights), "adapters": m(self.adapters), "grads": m(self.grads),
            "moments": m(self.moments), "activations": m(self.activations),
            "logits_chunk": m(self.logits_chunk), "total": m(self.total()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_is_reported_and_grows_when_memory_is_touched() {
        let before = peak_rss_bytes().expect("VmHWM on Linux");
        assert!(before > 0);
        // Opaque to the optimiser, which may otherwise elide an allocation it can see through.
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let now = rss_bytes().unwrap();
        let after = peak_rss_bytes().unwrap();
        assert!(after >= now && after >= before);
        assert!(now >= 64 << 20, "{now}");
        assert_eq!(v[v.len() - 1], 1);
    }
}
