//! Embeds the CUDA kernels of `kernels/` into the binary.
//!
//! Every kernel's source is embedded (with `common.cuh` and `ptx.cuh` pasted in place of their
//! `#include`s) so that the runtime can compile it with NVRTC. When nvcc is available it also
//! compiles each kernel to PTX for `compute_80` (JIT-compiled by the driver on any GPU from Ampere
//! on) and to a cubin for `sm_90a` (H100/H200, loaded as is), so a GPU machine needs nothing but
//! the driver.
//!
//! nvcc is looked up in `$NVCC`, then in `$SORFT_NVCC_VENV` (a virtualenv made by
//! `scripts/check-kernels.sh`), then in `vendor/nvcc` (the pinned wheels unpacked by
//! `scripts/vendor.sh`, for offline builds), then on `PATH`. A compiler named explicitly or
//! vendored must succeed; one merely found on `PATH` that fails only produces a warning (the
//! sources are still embedded).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=SORFT_NVCC_VENV");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let kernels = Path::new("kernels");
    let common = std::fs::read_to_string(kernels.join("common.cuh")).expect("kernels/common.cuh");
    let common = common.replace("#pragma once", "");
    let ptx = std::fs::read_to_string(kernels.join("ptx.cuh")).expect("kernels/ptx.cuh");
    let ptx = ptx.replace("#pragma once", "");
    let mut names: Vec<String> = std::fs::read_dir(kernels)
        .expect("kernels/ directory")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "cu").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    names.sort();

    let (nvcc, explicit) = find_nvcc();
    let nvcc_version = nvcc.as_ref().and_then(|n| version(n));
    let mut gen = String::new();
    writeln!(gen, "/// Kernel modules embedded by build.rs.").unwrap();
    writeln!(gen, "pub static EMBEDDED: &[EmbeddedModule] = &[").unwrap();
    for name in &names {
        let src =
            std::fs::read_to_string(kernels.join(format!("{name}.cu"))).expect("kernel source");
        let expanded = src
            .replace("#include \"common.cuh\"", &common)
            .replace("#include \"ptx.cuh\"", &ptx);
        let src_path = out.join(format!("{name}.cu"));
        std::fs::write(&src_path, &expanded).expect("write expanded kernel source");
        let mut ptx = "None".to_string();
        let mut cubin = "None".to_string();
        if let Some(nvcc) = &nvcc {
            let ptx_path = out.join(format!("{name}.ptx"));
            let cubin_path = out.join(format!("{name}.sm_90a.cubin"));
            let a = compile(nvcc, &src_path, &["-ptx", "-arch=compute_80"], &ptx_path);
            let b = compile(nvcc, &src_path, &["-cubin", "-arch=sm_90a"], &cubin_path);
            match (a, b) {
                (Ok(()), Ok(())) => {
                    ptx = format!("Some(include_str!({:?}))", ptx_path.display().to_string());
                    cubin = format!(
                        "Some(include_bytes!({:?}))",
                        cubin_path.display().to_string()
                    );
                }
                (Err(e), _) | (_, Err(e)) => {
                    if explicit {
                        panic!("nvcc failed on kernels/{name}.cu: {e}");
                    }
                    println!("cargo:warning=nvcc failed on kernels/{name}.cu, embedding the source only: {e}");
                }
            }
        }
        writeln!(
            gen,
            "    EmbeddedModule {{ name: {name:?}, source: include_str!({:?}), ptx: {ptx}, cubin_sm90a: {cubin} }},",
            src_path.display().to_string()
        )
        .unwrap();
    }
    writeln!(gen, "];").unwrap();
    writeln!(
        gen,
        "/// The nvcc that compiled the embedded PTX and cubins, if any.\npub static NVCC_VERSION: Option<&str> = {};",
        match &nvcc_version {
            Some(v) => format!("Some({v:?})"),
            None => "None".into(),
        }
    )
    .unwrap();
    std::fs::write(out.join("kernels.rs"), gen).expect("write kernels.rs");
}

/// Where `scripts/vendor.sh` unpacks nvcc (relative to the package root, the build script's
/// working directory).
const VENDORED_NVCC: &str = "vendor/nvcc/nvidia/cu13/bin/nvcc";

/// The nvcc to use and whether it was named explicitly (or vendored).
fn find_nvcc() -> (Option<PathBuf>, bool) {
    if let Ok(p) = std::env::var("NVCC") {
        if !p.is_empty() {
            return (Some(PathBuf::from(p)), true);
        }
    }
    if let Ok(venv) = std::env::var("SORFT_NVCC_VENV") {
        let lib = Path::new(&venv).join("lib");
        if let Ok(entries) = std::fs::read_dir(&lib) {
            for e in entries.flatten() {
                let cand = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
                if cand.exists() {
                    return (Some(cand), true);
                }
            }
        }
        panic!("SORFT_NVCC_VENV={venv} has no nvidia/cu13/bin/nvcc; run scripts/check-kernels.sh");
    }
    let vendored = Path::new(VENDORED_NVCC);
    if vendored.is_file() {
        println!("cargo:rerun-if-changed={VENDORED_NVCC}");
        return (Some(vendored.to_path_buf()), true);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nvcc"))
            .find(|p| p.is_file())
    });
    (on_path, false)
}

fn version(nvcc: &Path) -> Option<String> {
    let out = Command::new(nvcc).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_string())
}

fn compile(nvcc: &Path, src: &Path, args: &[&str], out: &Path) -> Result<(), String> {
    let res = Command::new(nvcc)
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if res.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&res.stderr)
            .lines()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n"))
    }
}
