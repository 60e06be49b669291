//! Choosing the backend of a run: `auto` takes the GPU when one is usable and otherwise says why
//! in one line and runs on the CPU; `cuda` insists on the GPU; `cpu` never touches CUDA.
//!
//! Every command that computes takes [`DeviceArgs`] and hands its work to [`run_on`] as a
//! [`Job`]: the one dispatch point, so the rest of the code is generic over the backend.

use anyhow::{bail, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
pub use sorft::engine::device::{DTypeChoice, DeviceChoice};
use sorft::engine::{Backend, Cpu, Cuda, DType};

/// `--device` and `--dtype`, flattened into every command that computes.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct DeviceArgs {
    /// Where to run: auto (the GPU when usable, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Compute dtype on the GPU (the CPU computes in f32).
    #[arg(long, value_enum, default_value_t = DTypeChoice::Bf16)]
    pub dtype: DTypeChoice,
}

/// The backend picked for a run.
pub enum Picked {
    /// Run on the CPU; the reason when `auto` wanted a GPU and could not have one.
    Cpu(Option<String>),
    /// Run on this GPU.
    Cuda(Cuda),
}

/// Work generic over the backend: what a command does once its backend is chosen.
pub trait Job {
    /// What the work returns.
    type Output;
    /// Does the work on `be`, described by `dev`.
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<Self::Output>;
}

/// Picks the backend for `choice`, with compute dtype `dtype` on the GPU. `open` opens the GPU
/// (a parameter so that tests can simulate machines with and without one).
pub fn pick_with(
    choice: DeviceChoice,
    dtype: DType,
    open: impl FnOnce(DType) -> sorft::engine::error::Result<Cuda>,
) -> Result<Picked> {
    match choice {
        DeviceChoice::Cpu => Ok(Picked::Cpu(None)),
        DeviceChoice::Cuda => match open(dtype) {
            Ok(c) => Ok(Picked::Cuda(c)),
            Err(e) => bail!("--device cuda: {e}"),
        },
        DeviceChoice::Auto => match open(dtype) {
            Ok(c) => Ok(Picked::Cuda(c)),
            Err(e) => Ok(Picked::Cpu(Some(format!("CUDA unavailable: {e}")))),
        },
    }
}

/// Picks the backend for `choice` on GPU 0; `auto` falling back prints one note line.
pub fn pick(choice: DeviceChoice, dtype: DType) -> Result<Picked> {
    let p = pick_with(choice, dtype, |d| Cuda::new(0, d))?;
    if let Picked::Cpu(Some(why)) = &p {
        eprintln!("note: running on the CPU ({why})");
    }
    Ok(p)
}

/// Runs `job` on the backend `args` picks (GPU 0): the one dispatch point of every command.
pub fn run_on<J: Job>(args: DeviceArgs, job: J) -> Result<J::Output> {
    dispatch(pick(args.device, args.dtype.dtype())?, job)
}

/// Runs `job` on an already picked backend.
pub fn dispatch<J: Job>(picked: Picked, job: J) -> Result<J::Output> {
    match picked {
        Picked::Cpu(why) => job.run(&Cpu, &DeviceInfo::cpu(&Cpu, why)),
        Picked::Cuda(c) => {
            let dev = DeviceInfo::cuda(&c);
            job.run(&c, &dev)
        }
    }
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

    /// Records which backend it ran on.
    struct Probe;
    impl Job for Probe {
        type Output = (String, DeviceInfo);
        fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<Self::Output> {
            Ok((be.name(), dev.clone()))
        }
    }

    #[test]
    fn without_a_gpu_auto_falls_back_and_cuda_is_a_one_line_error() {
        let p = pick_with(DeviceChoice::Auto, DType::BF16, no_gpu).unwrap();
        let (name, dev) = dispatch(p, Probe).unwrap();
        assert!(name.starts_with("cpu"), "{name}");
        assert_eq!(dev.device, "cpu");
        assert_eq!(
            dev.fallback.as_deref(),
            Some("CUDA unavailable: device: no NVIDIA driver (libcuda.so not found)")
        );
        let p = pick_with(DeviceChoice::Cpu, DType::BF16, no_gpu).unwrap();
        let (_, dev) = dispatch(p, Probe).unwrap();
        assert_eq!((dev.device.as_str(), dev.fallback), ("cpu", None));
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
    fn cpu_never_opens_the_gpu() {
        let p = pick_with(DeviceChoice::Cpu, DType::F32, |_| {
            panic!("--device cpu must not open CUDA")
        });
        assert!(matches!(p, Ok(Picked::Cpu(None))));
    }

    #[test]
    fn on_this_machine_auto_never_fails() {
        assert!(dispatch(pick(DeviceChoice::Auto, DType::F32).unwrap(), Probe).is_ok());
    }
}
