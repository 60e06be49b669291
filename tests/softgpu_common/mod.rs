//! Helpers shared by the software-GPU tests (`tests/softgpu_*.rs`): building `tests/softgpu/`
//! with `scripts/softgpu.sh` and running the `sorft` binary on it.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the software GPU from `kernels` into `out` (defaults: kernels/, the target dir) and
/// returns the library folder, or `None` (with a message) where it cannot be built here.
pub fn build(kernels: Option<&Path>, out: Option<&Path>) -> Option<PathBuf> {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts/softgpu.sh"));
    if let Some(k) = kernels {
        cmd.arg("--kernels").arg(k);
    }
    if let Some(o) = out {
        cmd.arg("--out").arg(o);
    }
    let required = std::env::var("SORFT_REQUIRE_SOFTGPU").is_ok_and(|v| v == "1");
    let res = cmd.output().expect("bash runs");
    let stderr = String::from_utf8_lossy(&res.stderr);
    if !res.status.success() {
        assert!(
            !required && stderr.contains("not found"),
            "scripts/softgpu.sh failed:\n{stderr}"
        );
        eprintln!("software GPU not built here, skipping: {stderr}");
        return None;
    }
    let stdout = String::from_utf8_lossy(&res.stdout);
    let lib = PathBuf::from(stdout.lines().last().expect("a last line").trim());
    assert!(lib.join("libcuda.so").is_file(), "{stdout}");
    Some(lib)
}

pub fn sorft(lib: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sorft"));
    cmd.args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("SORFT_KERNEL_CACHE", cache.path());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("sorft runs")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
