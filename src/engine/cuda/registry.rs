//! The kernel registry: the modules build.rs embedded, which artifact of each a device loads
//! (an `sm_90a` cubin on compute capability 9.0, else PTX the driver compiles, else the source
//! compiled at run time with NVRTC and cached on disk), and kernel lookup by name.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::engine::error::{EngineError, Result};

/// One kernel file of `kernels/`, as embedded into the binary.
#[derive(Debug)]
pub struct EmbeddedModule {
    /// File stem (`attention`).
    pub name: &'static str,
    /// The self-contained CUDA source (`common.cuh` pasted in).
    pub source: &'static str,
    /// PTX for `compute_80`, when nvcc was available at build time.
    pub ptx: Option<&'static str>,
    /// A cubin for `sm_90a`, when nvcc was available at build time.
    pub cubin_sm90a: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// A form of a kernel module that a device can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Artifact {
    /// The embedded `sm_90a` cubin (exactly compute capability 9.0).
    Cubin,
    /// The embedded `compute_80` PTX, compiled by the driver (8.0 and newer).
    Ptx,
    /// The embedded source, compiled with NVRTC at run time for the device's architecture.
    Nvrtc,
}

impl std::fmt::Display for Artifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Artifact::Cubin => "cubin sm_90a",
            Artifact::Ptx => "PTX compute_80",
            Artifact::Nvrtc => "NVRTC",
        })
    }
}

/// The artifacts to try for `m` on a device of compute capability `cc`, best first.
pub fn candidates(m: &EmbeddedModule, cc: (i32, i32), nvrtc_present: bool) -> Vec<Artifact> {
    let mut v = Vec::new();
    if cc == (9, 0) && m.cubin_sm90a.is_some() {
        v.push(Artifact::Cubin);
    }
    if cc.0 >= 8 && m.ptx.is_some() {
        v.push(Artifact::Ptx);
    }
    if nvrtc_present {
        v.push(Artifact::Nvrtc);
    }
    v
}

/// A short summary of what is embedded (`7 modules: sources, PTX, sm_90a cubins (nvcc ...)`).
pub fn embedded_summary() -> String {
    let ptx = EMBEDDED.iter().filter(|m| m.ptx.is_some()).count();
    let cubin = EMBEDDED.iter().filter(|m| m.cubin_sm90a.is_some()).count();
    let mut s = format!(
        "{} modules: sources for NVRTC, {ptx} PTX (compute_80), {cubin} cubins (sm_90a)",
        EMBEDDED.len()
    );
    if let Some(v) = NVCC_VERSION {
        s.push_str(&format!(" from nvcc {v}"));
    } else {
        s.push_str(" (built without nvcc: kernels need libnvrtc at run time)");
    }
    s
}

/// Every kernel name the backend launches (the name patterns of the op modules), so that a test
/// can check each exists in the compiled modules without a GPU.
pub fn launched_kernels() -> Vec<String> {
    let mut v: Vec<String> = [
        "cast_f32_bf16",
        "cast_bf16_f32",
        "token_stats",
        "ppo_token_loss",
        "gemm_f32_f32",
        "gemm_bf16_bf16",
        "gemm_bf16_f32",
        "attn_mma_fwd_bf16_hd64",
        "attn_mma_fwd_bf16_hd128",
        "attn_mma_bwd_dq_bf16_hd64",
        "attn_mma_bwd_dq_bf16_hd128",
        "attn_mma_bwd_dkdv_bf16_hd64",
        "attn_mma_bwd_dkdv_bf16_hd128",
        "decode_gqa_bf16_hd64",
        "decode_gqa_bf16_hd128",
        "adamw_master_bf16",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for sfx in ["f32", "bf16"] {
        for base in [
            "fill",
            "scale",
            "axpy",
            "add_assign",
            "add_bias",
            "swiglu",
            "swiglu_backward",
            "adamw",
            "sum_squares",
            "sum_rows",
            "embedding",
            "embedding_backward",
            "kv_write",
            "rope",
            "rms_norm",
            "rms_norm_backward",
            "rms_norm_dweight",
            "log_softmax",
            "sample",
            "sample_masked",
            "masked_logprobs",
            "masked_dlogits",
            "token_grad",
        ] {
            v.push(format!("{base}_{sfx}"));
        }
        for hd in super::launch::HEAD_DIMS {
            for base in [
                "flash_fwd",
                "flash_bwd_pre",
                "flash_bwd_dq",
                "flash_bwd_dkdv",
                "decode_partial",
                "decode_combine",
            ] {
                v.push(format!("{base}_{sfx}_hd{hd}"));
            }
        }
    }
    v
}

/// 64-bit FNV-1a, the content hash of the NVRTC cache.
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The NVRTC cache directory: `$SORFT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/sorft/kernels`, else
/// `$HOME/.cache/sorft/kernels`.
pub fn cache_dir_from(
    explicit: Option<&str>,
    xdg: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    let nonempty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(p) = nonempty(explicit) {
        return Some(p);
    }
    if let Some(p) = nonempty(xdg) {
        return Some(p.join("sorft").join("kernels"));
    }
    nonempty(home).map(|h| h.join(".cache").join("sorft").join("kernels"))
}

/// The NVRTC cache directory of this process's environment.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var(k).ok();
    cache_dir_from(
        var("SORFT_KERNEL_CACHE").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// The cache file of a source compiled for `arch` by NVRTC `nvrtc_version`: `<dir>/<hash>.ptx`.
pub fn cache_path(dir: &Path, source: &str, arch: &str, nvrtc_version: &str) -> PathBuf {
    let h = fnv1a64(&[source.as_bytes(), arch.as_bytes(), nvrtc_version.as_bytes()]);
    dir.join(format!("{h:016x}.ptx"))
}

/// The NVRTC version as `major.minor`.
fn nvrtc_version() -> String {
    let (mut a, mut b) = (0i32, 0i32);
    // SAFETY: called only after the library was found; writes two ints.
    unsafe {
        cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b);
    }
    format!("{a}.{b}")
}

/// Compiles a module's source with NVRTC for `compute_XY`, through the on-disk cache in `cache`
/// (none: no caching). Needs libnvrtc, not a GPU.
pub fn compile_nvrtc(m: &EmbeddedModule, cc: (i32, i32), cache: Option<&Path>) -> Result<String> {
    if !crate::engine::cuda::loading::libraries().nvrtc {
        return Err(EngineError::Device("libnvrtc not found".into()));
    }
    super::catch_cuda_panic(|| nvrtc_ptx(m, cc, cache))
}

fn nvrtc_ptx(m: &EmbeddedModule, cc: (i32, i32), cache: Option<&Path>) -> Result<String> {
    let arch: &'static str = Box::leak(format!("compute_{}{}", cc.0, cc.1).into_boxed_str());
    let version = nvrtc_version();
    let cached = cache.map(|d| cache_path(d, m.source, arch, &version));
    if let Some(p) = &cached {
        if let Ok(text) = std::fs::read_to_string(p) {
            return Ok(text);
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some(format!("{}.cu", m.name)),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(m.source, opts).map_err(|e| {
        EngineError::Device(format!(
            "NVRTC could not compile kernels/{}.cu: {e:?}",
            m.name
        ))
    })?;
    let text = ptx.to_src();
    if let Some(p) = &cached {
        // The cache is an optimisation: failing to write it is not an error.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &text).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(text)
}

/// The kernel names a PTX text defines (its `.entry` directives).
pub fn ptx_entries(ptx: &str) -> HashSet<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.split(".entry").nth(1)?;
            let name = rest
                .trim_start()
                .split(|c: char| c == '(' || c.is_whitespace())
                .next()?;
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// The loaded kernel modules of one context, with a cache of looked-up functions.
pub struct Kernels {
    modules: Vec<(&'static str, Arc<CudaModule>)>,
    /// The kernel (`.entry`) names of each module, read from its PTX where the PTX is known
    /// (empty: unknown, e.g. on the software GPU), so that a lookup asks only the module that
    /// defines the kernel instead of failing `cuModuleGetFunction` calls on the others.
    entries: Vec<HashSet<String>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// How each module was loaded.
    pub loaded: Vec<(&'static str, Artifact)>,
}

impl Kernels {
    /// Loads every embedded module into `ctx`, trying the artifacts of [`candidates`] in order.
    pub fn load(ctx: &Arc<CudaContext>, cc: (i32, i32), nvrtc_present: bool) -> Result<Self> {
        let mut modules = Vec::new();
        let mut loaded = Vec::new();
        let mut entries = Vec::new();
        for m in EMBEDDED {
            let tries = candidates(m, cc, nvrtc_present);
            if tries.is_empty() {
                return Err(EngineError::Device(format!(
                    "no loadable form of kernels/{}.cu for compute capability {}.{}: this binary \
                     was built without nvcc and libnvrtc was not found (install the CUDA \
                     toolkit's libnvrtc, or rebuild with NVCC=/path/to/nvcc)",
                    m.name, cc.0, cc.1
                )));
            }
            let mut errors = Vec::new();
            let mut done = None;
            for a in tries {
                let mut names = m.ptx.map(ptx_entries).unwrap_or_default();
                let ptx = match a {
                    Artifact::Cubin => Ok(Ptx::from_binary(m.cubin_sm90a.unwrap_or(&[]).to_vec())),
                    Artifact::Ptx => Ok(Ptx::from_src(m.ptx.unwrap_or(""))),
                    Artifact::Nvrtc => nvrtc_ptx(m, cc, cache_dir().as_deref()).map(|text| {
                        names = ptx_entries(&text);
                        Ptx::from_src(text)
                    }),
                };
                match ptx.and_then(|p| {
                    ctx.load_module(p)
                        .map_err(|e| EngineError::Device(format!("{e:?}")))
                }) {
                    Ok(module) => {
                        done = Some((module, a, names));
                        break;
                    }
                    Err(e) => errors.push(format!("{a}: {e}")),
                }
            }
            match done {
                Some((module, a, names)) => {
                    modules.push((m.name, module));
                    loaded.push((m.name, a));
                    entries.push(names);
                }
                None => {
                    return Err(EngineError::Device(format!(
                        "could not load kernels/{}.cu ({}); a driver older than the CUDA 13.0 \
                         that built the PTX needs libnvrtc of its own toolkit",
                        m.name,
                        errors.join("; ")
                    )))
                }
            }
        }
        Ok(Self {
            modules,
            entries,
            functions: Mutex::new(HashMap::new()),
            loaded,
        })
    }

    /// The kernel called `name` (looked up once, then cached).
    pub fn get(&self, name: &str) -> Result<CudaFunction> {
        let mut f = self
            .functions
            .lock()
            .map_err(|_| EngineError::Device("kernel registry lock poisoned".into()))?;
        if let Some(func) = f.get(name) {
            return Ok(func.clone());
        }
        // The module whose PTX defines the kernel; where no PTX lists it, every module is asked.
        let owner = self.entries.iter().position(|e| e.contains(name));
        let asked = self
            .modules
            .iter()
            .enumerate()
            .filter(|(i, _)| owner.is_none_or(|o| o == *i));
        for (_, (_, m)) in asked {
            if let Ok(func) = m.load_function(name) {
                f.insert(name.to_string(), func.clone());
                return Ok(func);
            }
        }
        Err(EngineError::Device(format!(
            "kernel {name} not found in the embedded modules"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_lists_the_kernels_of_a_ptx_text() {
        let ptx =
            "//\n.visible .entry rms_norm_bf16(\n\t.param .u64 a\n)\n.entry helper (\n.func f(\n";
        let e = ptx_entries(ptx);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e.contains("rms_norm_bf16") && e.contains("helper"));
        if let Some(text) = EMBEDDED
            .iter()
            .find_map(|m| (m.name == "norm").then_some(m.ptx))
            .flatten()
        {
            assert!(ptx_entries(text).contains("rms_norm_bf16"));
        }
    }

    #[test]
    fn every_kernel_file_is_embedded_with_its_header_pasted_in() {
        let names: Vec<&str> = EMBEDDED.iter().map(|m| m.name).collect();
        for n in [
            "attention",
            "elementwise",
            "gemm",
            "loss",
            "norm",
            "sampling",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        for m in EMBEDDED {
            assert!(
                !m.source.contains("#include \""),
                "{} still includes a header",
                m.name
            );
            assert!(m.source.contains("mix64"), "{} lacks common.cuh", m.name);
        }
    }

    #[test]
    fn artifact_choice_prefers_cubin_on_hopper_then_ptx_then_nvrtc() {
        let m = EmbeddedModule {
            name: "x",
            source: "",
            ptx: Some(""),
            cubin_sm90a: Some(&[1]),
        };
        assert_eq!(
            candidates(&m, (9, 0), true),
            vec![Artifact::Cubin, Artifact::Ptx, Artifact::Nvrtc]
        );
        assert_eq!(candidates(&m, (8, 6), false), vec![Artifact::Ptx]);
        assert_eq!(candidates(&m, (7, 5), true), vec![Artifact::Nvrtc]);
        assert!(candidates(&m, (7, 5), false).is_empty());
        let src_only = EmbeddedModule {
            name: "x",
            source: "",
            ptx: None,
            cubin_sm90a: None,
        };
        assert_eq!(candidates(&src_only, (9, 0), true), vec![Artifact::Nvrtc]);
    }

    #[test]
    fn embedded_sources_compile_with_nvrtc_when_it_is_installed() {
        // Needs libnvrtc (for example pip's nvidia-cuda-nvrtc on LD_LIBRARY_PATH), not a GPU.
        if !crate::engine::cuda::loading::libraries().nvrtc {
            eprintln!("libnvrtc not found: skipping the NVRTC compile check");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for m in EMBEDDED {
            let ptx = compile_nvrtc(m, (8, 0), Some(dir.path()))
                .unwrap_or_else(|e| panic!("{}: {e}", m.name));
            assert!(ptx.contains(".entry"), "{}", m.name);
            // The second compile is served from the cache.
            assert_eq!(compile_nvrtc(m, (8, 0), Some(dir.path())).unwrap(), ptx);
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            EMBEDDED.len()
        );
    }

    #[test]
    fn every_launched_kernel_exists_in_the_compiled_modules() {
        // Uses the embedded PTX when nvcc built it, else NVRTC when installed; skips otherwise.
        let nvrtc = crate::engine::cuda::loading::libraries().nvrtc;
        let mut entries = std::collections::HashSet::new();
        for m in EMBEDDED {
            let ptx = match (m.ptx, nvrtc) {
                (Some(p), _) => p.to_string(),
                (None, true) => compile_nvrtc(m, (8, 0), None).unwrap(),
                (None, false) => {
                    eprintln!("no PTX and no libnvrtc: skipping the kernel-name check");
                    return;
                }
            };
            for line in ptx.lines() {
                if let Some(rest) = line.trim().strip_prefix(".visible .entry ") {
                    entries.insert(rest.split('(').next().unwrap_or("").trim().to_string());
                }
            }
        }
        let missing: Vec<String> = launched_kernels()
            .into_iter()
            .filter(|k| !entries.contains(k))
            .collect();
        assert!(
            missing.is_empty(),
            "kernels launched but not compiled: {missing:?}"
        );
    }

    #[test]
    fn nvrtc_cache_path_is_keyed_by_source_arch_and_version() {
        let dir = cache_dir_from(None, None, Some("/home/u")).unwrap();
        assert_eq!(dir, PathBuf::from("/home/u/.cache/sorft/kernels"));
        assert_eq!(
            cache_dir_from(None, Some("/x"), Some("/home/u")).unwrap(),
            PathBuf::from("/x/sorft/kernels")
        );
        assert_eq!(
            cache_dir_from(Some("/k"), Some("/x"), None).unwrap(),
            PathBuf::from("/k")
        );
        assert!(cache_dir_from(None, Some(""), None).is_none());
        let a = cache_path(&dir, "src", "compute_90", "13.0");
        assert!(a.starts_with(&dir));
        assert_eq!(a.extension().unwrap(), "ptx");
        assert_ne!(a, cache_path(&dir, "src2", "compute_90", "13.0"));
        assert_ne!(a, cache_path(&dir, "src", "compute_80", "13.0"));
        assert_ne!(a, cache_path(&dir, "src", "compute_90", "12.8"));
        assert_eq!(a, cache_path(&dir, "src", "compute_90", "13.0"));
    }
}
