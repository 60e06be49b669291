//! Finding CUDA at run time: which shared libraries can be loaded (nothing is linked at build
//! time), the driver version, the GPUs, and the `sorft doctor` report built from them.

use std::fmt::Write as _;

use super::registry;

/// Which CUDA libraries `dlopen` finds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Libraries {
    /// `libcuda.so` (the driver).
    pub cuda: bool,
    /// `libcublas.so`.
    pub cublas: bool,
    /// `libcublasLt.so`.
    pub cublaslt: bool,
    /// `libnvrtc.so` (run-time kernel compilation).
    pub nvrtc: bool,
}

/// Looks for the libraries (loading them, which has no side effect beyond the process's maps).
pub fn libraries() -> Libraries {
    // SAFETY: these only try `dlopen` on candidate names and report success.
    unsafe {
        Libraries {
            cuda: cudarc::driver::sys::is_culib_present(),
            cublas: cudarc::cublas::sys::is_culib_present(),
            cublaslt: cublaslt_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
        }
    }
}

/// cublasLt is not a cudarc feature here (cuBLAS loads it itself); look for it directly.
unsafe fn cublaslt_present() -> bool {
    ["libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"]
        .iter()
        .any(|n| libloading_present(n))
}

unsafe fn libloading_present(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
    if h.is_null() {
        return false;
    }
    libc::dlclose(h);
    true
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total memory in bytes.
    pub total_mem: usize,
}

/// Everything `sorft doctor` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// Libraries found.
    pub libraries: Libraries,
    /// Driver version as CUDA reports it (13000 = 13.0), when the driver loads.
    pub driver_version: Option<i32>,
    /// The GPUs, or why none could be listed.
    pub gpus: std::result::Result<Vec<GpuInfo>, String>,
    /// The backend a run would use, or why it would use the CPU.
    pub backend: std::result::Result<String, String>,
    /// What kernels are embedded.
    pub kernels: String,
}

/// Queries the driver for the GPUs (the driver must be present).
fn gpus() -> std::result::Result<Vec<GpuInfo>, String> {
    use cudarc::driver::result;
    result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let n = result::device::get_count().map_err(|e| format!("{e:?}"))?;
    let mut v = Vec::new();
    for i in 0..n {
        let dev = result::device::get(i).map_err(|e| format!("{e:?}"))?;
        // SAFETY: `dev` is a valid device handle from the driver.
        let (name, total, major, minor) = unsafe {
            use cudarc::driver::sys::CUdevice_attribute as A;
            (
                result::device::get_name(dev).unwrap_or_else(|_| "?".into()),
                result::device::total_mem(dev).unwrap_or(0),
                result::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                    .unwrap_or(0),
                result::device::get_attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                    .unwrap_or(0),
            )
        };
        v.push(GpuInfo {
            ordinal: i as usize,
            name,
            compute_capability: (major, minor),
            total_mem: total,
        });
    }
    Ok(v)
}

/// Probes the machine; never panics and needs no GPU.
pub fn probe() -> Probe {
    let libraries = libraries();
    let kernels = registry::embedded_summary();
    if !libraries.cuda {
        return Probe {
            libraries,
            driver_version: None,
            gpus: Err("no NVIDIA driver (libcuda.so not found)".into()),
            backend: Err("no NVIDIA driver (libcuda.so not found)".into()),
            kernels,
        };
    }
    let driver_version = super::catch_cuda_panic(|| {
        let mut v = 0i32;
        // SAFETY: the library is present; writes one int.
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        Ok((r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(v))
    })
    .ok()
    .flatten();
    let gpus = super::catch_cuda_panic(|| Ok(gpus())).unwrap_or_else(|e| Err(e.to_string()));
    let backend = match super::Cuda::new(0, crate::engine::DType::BF16) {
        Ok(c) => Ok(format!(
            "{} ({})",
            super::Backend::name(&c),
            c.load_summary()
        )),
        Err(e) => Err(e.to_string()),
    };
    Probe {
        libraries,
        driver_version,
        gpus,
        backend,
        kernels,
    }
}

fn gib(b: usize) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

fn found(b: bool) -> &'static str {
    if b {
        "found"
    } else {
        "not found"
    }
}

/// The `sorft doctor` text of a probe.
pub fn report(p: &Probe) -> String {
    let mut s = String::new();
    let l = &p.libraries;
    let _ = writeln!(
        s,
        "driver:   {}",
        match p.driver_version {
            Some(v) => format!("CUDA {}.{} (libcuda found)", v / 1000, (v % 1000) / 10),
            None if l.cuda => "libcuda found, version unknown".into(),
            None => "not found (libcuda.so)".into(),
        }
    );
    match &p.gpus {
        Ok(g) if g.is_empty() => {
            let _ = writeln!(s, "gpus:     none");
        }
        Ok(g) => {
            for d in g {
                let _ = writeln!(
                    s,
                    "gpu {}:    {}, compute capability {}.{}, {}",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    gib(d.total_mem)
                );
            }
        }
        Err(e) => {
            let _ = writeln!(s, "gpus:     none ({e})");
        }
    }
    let _ = writeln!(
        s,
        "libraries: libcuda {}, libcublas {}, libcublasLt {}, libnvrtc {}",
        found(l.cuda),
        found(l.cublas),
        found(l.cublaslt),
        found(l.nvrtc)
    );
    if l.cuda && !l.cublas {
        let _ = writeln!(
            s,
            "gemm:     libcublas not found: the built-in tiled GEMM kernel is used (slower)"
        );
    }
    let _ = writeln!(s, "kernels:  {}", p.kernels);
    let _ = writeln!(
        s,
        "backend:  {}",
        match &p.backend {
            Ok(b) => b.clone(),
            Err(e) => format!("cpu (CUDA unavailable: {e})"),
        }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doctor_without_a_driver_says_cpu_in_plain_words() {
        let p = Probe {
            libraries: Libraries::default(),
            driver_version: None,
            gpus: Err("no NVIDIA driver (libcuda.so not found)".into()),
            backend: Err("no NVIDIA driver (libcuda.so not found)".into()),
            kernels: "7 modules".into(),
        };
        let r = report(&p);
        assert!(r.contains("driver:   not found (libcuda.so)"), "{r}");
        assert!(r.contains("libcublas not found"), "{r}");
        assert!(r.contains("libnvrtc not found"), "{r}");
        assert!(
            r.contains("backend:  cpu (CUDA unavailable: no NVIDIA driver"),
            "{r}"
        );
        assert!(!r.contains("gemm:"), "{r}");
    }

    #[test]
    fn doctor_with_a_gpu_lists_it() {
        let p = Probe {
            libraries: Libraries {
                cuda: true,
                cublas: false,
                cublaslt: false,
                nvrtc: false,
            },
            driver_version: Some(13000),
            gpus: Ok(vec![GpuInfo {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                total_mem: 141 << 30,
            }]),
            backend: Ok("cuda:0 (NVIDIA H200)".into()),
            kernels: "7 modules".into(),
        };
        let r = report(&p);
        assert!(r.contains("CUDA 13.0"), "{r}");
        assert!(
            r.contains("NVIDIA H200, compute capability 9.0, 141.0 GiB"),
            "{r}"
        );
        assert!(r.contains("built-in tiled GEMM"), "{r}");
        assert!(r.contains("backend:  cuda:0"), "{r}");
    }

    #[test]
    fn probing_this_machine_never_panics() {
        let p = probe();
        let r = report(&p);
        assert!(r.contains("backend:"));
        if !p.libraries.cuda {
            assert!(p.backend.is_err());
        }
    }
}
