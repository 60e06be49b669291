//! `sorft doctor`: what CUDA this machine has (driver, GPUs, libraries, embedded kernels) and
//! which backend a run would use. Works, and says so plainly, on machines without CUDA.

use anyhow::Result;
use clap::Args;

/// Arguments of `sorft doctor` (none).
#[derive(Args, Debug)]
pub struct DoctorArgs {}

/// Runs `sorft doctor`.
pub fn run(_a: DoctorArgs) -> Result<()> {
    let p = sorft::engine::cuda::probe();
    print!("{}", sorft::engine::cuda::report(&p));
    Ok(())
}
