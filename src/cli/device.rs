//! Choosing the backend of a run: `auto` takes the GPU when one is usable and otherwise says why
//! in one line and runs on the CPU; `cuda` insists on the GPU; `cpu` never touches CUDA.
//! Commands generic over the backend call [`pick`] and dispatch on the result.

use anyhow::{bail, Result};
use clap::ValueEnum;

use sorft::engine::{Cuda, DType};

/// The `--device` choice of a command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The GPU when usable, else the CPU (with a one-line note).
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend, or an error.
    Cuda,
}

/// The backend picked for a run.
pub enum Picked {
    /// Run on the CPU.
    Cpu,
    /// Run on this GPU.
    Cuda(Cuda),
}

/// Picks the backend for `choice`, with compute dtype `dtype` on the GPU. `open` opens the GPU
/// (a parameter so that tests can simulate machines with and without one).
pub fn pick_with(
    choice: DeviceChoice,
    dtype: DType,
    open: impl FnOnce(DType) -> sorft::engine::error::Result<Cuda>,
) -> Result<Picked> {
    match choice {
        DeviceChoice::Cpu => Ok(Picked::Cpu),
        DeviceChoice::Cuda => match open(dtype) {
            Ok(c) => Ok(Picked::Cuda(c)),
            Err(e) => bail!("--device cuda: {e}"),
        },
        DeviceChoice::Auto => match open(dtype) {
            Ok(c) => Ok(Picked::Cuda(c)),
            Err(e) => {
                eprintln!("note: running on the CPU (CUDA unavailable: {e})");
                Ok(Picked::Cpu)
            }
        },
    }
}

/// Picks the backend for `choice` on GPU 0.
pub fn pick(choice: DeviceChoice, dtype: DType) -> Result<Picked> {
    pick_with(choice, dtype, |d| Cuda::new(0, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sorft::engine::EngineError;

    fn no_gpu(_: DType) -> sorft::engine::error::Result<Cuda> {
        Err(EngineError::Device(
            "no NVIDIA driver (libcuda.so not found)".into(),
        ))
    }

    #[test]
    fn without_a_gpu_auto_falls_back_and_cuda_is_a_one_line_error() {
        assert!(matches!(
            pick_with(DeviceChoice::Auto, DType::BF16, no_gpu).unwrap(),
            Picked::Cpu
        ));
        assert!(matches!(
            pick_with(DeviceChoice::Cpu, DType::BF16, no_gpu).unwrap(),
            Picked::Cpu
        ));
        let e = pick_with(DeviceChoice::Cuda, DType::BF16, no_gpu)
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            "--device cuda: device: no NVIDIA driver (libcuda.so not found)"
        );
    }

    #[test]
    fn on_this_machine_auto_never_fails() {
        assert!(pick(DeviceChoice::Auto, DType::F32).is_ok());
    }
}
