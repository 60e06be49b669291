//! What a run runs on, described for reports, metrics and printed configurations: the device
//! kind, the GPU, the compute dtype and how the kernels were loaded (cubin / PTX / NVRTC).

use serde::{Deserialize, Serialize};

use crate::engine::{Backend, Cpu, Cuda, DType};

/// Where a run computes: the `--device` flag and the `device` configuration key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The GPU when usable, else the CPU (with a one-line note).
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend, or an error.
    Cuda,
}

/// The GPU's compute dtype: the `--dtype` flag and the `dtype` configuration key (the CPU
/// always computes in f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeChoice {
    /// bfloat16 weights and activations.
    #[default]
    Bf16,
    /// f32 everywhere.
    F32,
}

impl DTypeChoice {
    /// The engine's dtype.
    pub fn dtype(self) -> DType {
        match self {
            DTypeChoice::Bf16 => DType::BF16,
            DTypeChoice::F32 => DType::F32,
        }
    }
}

/// A description of the backend a run uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `cpu` or `cuda`.
    pub device: String,
    /// The backend's own name (`cpu (2 threads)`, `cuda:0 (NVIDIA H200)`).
    pub name: String,
    /// The GPU's name, when on a GPU.
    pub gpu: Option<String>,
    /// Compute dtype (`f32` on the CPU; `bf16` or `f32` on the GPU).
    pub dtype: String,
    /// How the kernels were loaded and which GEMM runs, when on a GPU.
    pub kernels: Option<String>,
    /// Why `auto` fell back to the CPU, when it did.
    pub fallback: Option<String>,
    /// Total GPU memory in bytes, when on a GPU.
    pub memory: Option<u64>,
}

impl DeviceInfo {
    /// The CPU backend (always f32); `fallback` says why a GPU was not used, if one was wanted.
    pub fn cpu(cpu: &Cpu, fallback: Option<String>) -> Self {
        Self {
            device: "cpu".into(),
            name: cpu.name(),
            gpu: None,
            dtype: "f32".into(),
            kernels: None,
            fallback,
            memory: None,
        }
    }

    /// The CUDA backend `c`.
    pub fn cuda(c: &Cuda) -> Self {
        let name = c.name();
        // The backend names itself `cuda:N (GPU NAME)`.
        let gpu = name
            .split_once('(')
            .map(|(_, g)| g.trim_end_matches(')').to_string())
            .unwrap_or_else(|| name.clone());
        Self {
            device: "cuda".into(),
            name,
            gpu: Some(gpu),
            dtype: c.dtype().name().to_ascii_lowercase(),
            kernels: Some(c.load_summary()),
            fallback: None,
            memory: c.mem_info().ok().map(|(_, total)| total as u64),
        }
    }

    /// One line: `cuda:0 (NVIDIA H200), bf16, kernels from cubin, GEMM by cuBLAS` or
    /// `cpu (2 threads), f32 (auto: CUDA unavailable: ...)`.
    pub fn summary(&self) -> String {
        let mut s = format!("{}, {}", self.name, self.dtype);
        if let Some(k) = &self.kernels {
            s.push_str(&format!(", {k}"));
        }
        if let Some(f) = &self.fallback {
            s.push_str(&format!(" (auto: {f})"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_described_with_its_fallback_reason() {
        let d = DeviceInfo::cpu(&Cpu, Some("CUDA unavailable: no driver".into()));
        assert_eq!(d.device, "cpu");
        assert_eq!(d.dtype, "f32");
        assert!(d.gpu.is_none() && d.kernels.is_none());
        let s = d.summary();
        assert!(s.starts_with("cpu"), "{s}");
        assert!(s.ends_with("(auto: CUDA unavailable: no driver)"), "{s}");
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["device"], "cpu");
    }
}
