//! `sorft selftest --gemm auto|cublas|builtin`: which GEMM the CUDA checks run through, so that
//! the built-in kernel is checked on a machine where cuBLAS loads too.

use anyhow::{bail, Result};
use clap::ValueEnum;

use sorft::engine::Cuda;

/// The GEMM the CUDA selftest uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GemmChoice {
    /// cuBLAS when it loads, else the built-in kernel (what every command does).
    Auto,
    /// cuBLAS; an error when it is not loaded.
    Cublas,
    /// The built-in tiled GEMM kernel, even when cuBLAS loads.
    Builtin,
}

/// Applies `choice` to the GPU (all its dtype views); `cublas` without cuBLAS is an error.
pub fn apply(gpu: &Cuda, choice: GemmChoice) -> Result<()> {
    match choice {
        GemmChoice::Auto => gpu.force_builtin_gemm(false),
        GemmChoice::Builtin => gpu.force_builtin_gemm(true),
        GemmChoice::Cublas => {
            if !gpu.cublas_loaded() {
                bail!("--gemm cublas: libcublas is not loaded on this machine (use --gemm builtin or auto)");
            }
            gpu.force_builtin_gemm(false);
        }
    }
    Ok(())
}
