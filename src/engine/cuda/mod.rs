//! The CUDA backend: device memory through cudarc (the driver, cuBLAS and NVRTC are loaded with
//! `dlopen` at run time, so the binary builds and runs without CUDA), the hand-written kernels of
//! `kernels/` (embedded by build.rs), and cuBLAS GEMMs, or a built-in tiled GEMM kernel where
//! libcublas is absent.
//!
//! Floating-point tensors are f32 or bf16 (the backend's compute dtype decides what uploads
//! become); every kernel accumulates in f32. Index tensors are u32. Results are checked against
//! the CPU backend by `sorft selftest --device cuda`.

mod attention;
mod backend;
mod gemm;
pub mod launch;
pub mod loading;
mod loss;
pub mod memory;
mod ops;
pub mod registry;
mod restrict;
mod sampling;
pub mod transfers;

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use crate::engine::backend::Backend;
use crate::engine::error::{EngineError, Result};
use crate::engine::{DType, Tensor};

pub use loading::{probe, report, Libraries, Probe};
pub use loss::PpoOutput;

/// Device storage of a CUDA tensor: bytes on the device and their element type.
pub struct CudaStorage {
    /// The bytes (at least one, so that empty tensors have a valid pointer).
    pub data: CudaSlice<u8>,
    /// The element type of the bytes.
    pub dtype: DType,
    /// The host values of an index tensor uploaded from the host (index tensors are never
    /// written on the device), so that validating indices needs no device-to-host copy.
    pub host_index: Option<Arc<[u32]>>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Arc<registry::Kernels>,
    blas: Option<Arc<Mutex<cudarc::cublas::CudaBlas>>>,
    dtype: DType,
    gpu_name: String,
    ordinal: usize,
    cc: (i32, i32),
    sms: u32,
    poison: std::sync::atomic::AtomicBool,
    transfers: Arc<transfers::TransferCounter>,
    force_builtin_gemm: Arc<std::sync::atomic::AtomicBool>,
}

/// The CUDA backend on one GPU. Cloning shares the context, stream and kernels.
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
}

/// Runs `f`, turning a panic inside cudarc (a library or symbol that cannot be loaded) into an
/// error instead of a crash; the panic message is not printed.
/// Keeps memory freed to the stream-ordered pool in the pool (release threshold: unlimited)
/// instead of returning it to the driver at every synchronisation: without this, each decode or
/// training step (which synchronises to read its results) unmaps and maps its activations again,
/// and a 1 GiB device copy measured 1.1 TB/s on an H200 instead of its ~4 TB/s. Devices without
/// memory pools (and the software GPU) keep the driver's default.
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    let pools = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .unwrap_or(0);
    if pools != 1 {
        return;
    }
    let dev = ctx.cu_device();
    // Called inside `open`, itself inside `catch_cuda_panic` (not reentrant): a missing driver
    // symbol panics in cudarc's loader, caught here without touching the hook again.
    let set = std::panic::catch_unwind(|| {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut threshold: u64 = u64::MAX;
        // SAFETY: `pool` receives the device's default pool; the attribute value is a u64.
        unsafe {
            match sys::cuDeviceGetDefaultMemPool(&mut pool, dev) {
                sys::CUresult::CUDA_SUCCESS => sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
                e => e,
            }
        }
    });
    if !matches!(set, Ok(sys::CUresult::CUDA_SUCCESS)) {
        tracing::debug!("memory pool release threshold not set ({set:?})");
    }
}

pub(crate) fn catch_cuda_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    // One caller at a time swaps the process's panic hook (not reentrant: callers never nest).
    static HOOK_LOCK: Mutex<()> = Mutex::new(());
    let _guard = HOOK_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(EngineError::Device(format!("CUDA library failure: {msg}")))
        }
    }
}

fn dev_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> EngineError + '_ {
    move |e| EngineError::Device(format!("{what}: {e:?}"))
}

/// One argument of a kernel launch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A device pointer.
    P(u64),
    /// A 32-bit unsigned integer.
    U(u32),
    /// A 64-bit unsigned integer.
    L(u64),
    /// A 32-bit float.
    F(f32),
    /// A 32-bit signed integer.
    I(i32),
}

impl Cuda {
    /// Opens GPU `ordinal` with compute dtype `dtype` (F32 or BF16): checks the driver library is
    /// there (cudarc would panic otherwise), creates the context and stream, loads the kernels and
    /// cuBLAS if present. Every failure is an error, never a panic.
    pub fn new(ordinal: usize, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(EngineError::DType {
                op: "cuda backend",
                dtype,
            });
        }
        let libs = loading::libraries();
        if !libs.cuda {
            return Err(EngineError::Device(
                "no NVIDIA driver (libcuda.so not found)".into(),
            ));
        }
        catch_cuda_panic(|| Self::open(ordinal, dtype, libs))
    }

    fn open(ordinal: usize, dtype: DType, libs: Libraries) -> Result<Self> {
        let n = CudaContext::device_count().map_err(dev_err("cannot initialise the driver"))?;
        if n <= 0 {
            return Err(EngineError::Device("the driver reports no GPU".into()));
        }
        if ordinal >= n as usize {
            return Err(EngineError::Device(format!(
                "GPU {ordinal} requested but only {n} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev_err("cannot create a CUDA context"))?;
        // One stream, in order: cudarc's cross-stream event tracking is not needed.
        // SAFETY: no other stream of this context is ever used.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        keep_pool_memory(&ctx);
        let cc = ctx
            .compute_capability()
            .map_err(dev_err("compute capability"))?;
        if cc.0 < 8 {
            return Err(EngineError::Device(format!(
                "compute capability {}.{} is below 8.0 (Ampere); the bf16 kernels need 8.0+",
                cc.0, cc.1
            )));
        }
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(1) as u32;
        let gpu_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let kernels = Arc::new(registry::Kernels::load(&ctx, cc, libs.nvrtc)?);
        // SORFT_GEMM=builtin forces the built-in tiled GEMM kernel even where cuBLAS loads (to test it).
        let forced_builtin = std::env::var("SORFT_GEMM").is_ok_and(|v| v == "builtin");
        let blas = if libs.cublas && !forced_builtin {
            match cudarc::cublas::CudaBlas::new(stream.clone()) {
                Ok(b) => Some(Arc::new(Mutex::new(b))),
                Err(e) => {
                    tracing::warn!("cuBLAS found but unusable ({e:?}); using the built-in GEMM");
                    None
                }
            }
        } else {
            None
        };
        Ok(Self {
            inner: Arc::new(Inner {
                ctx,
                stream,
                kernels,
                blas,
                dtype,
                gpu_name,
                ordinal,
                cc,
                sms,
                poison: std::sync::atomic::AtomicBool::new(false),
                transfers: Arc::default(),
                force_builtin_gemm: Arc::default(),
            }),
        })
    }

    /// The compute dtype (what floating-point uploads become).
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The same GPU with another compute dtype, sharing the context, stream, kernels and cuBLAS.
    pub fn with_dtype(&self, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(EngineError::DType {
                op: "cuda backend",
                dtype,
            });
        }
        let i = &self.inner;
        Ok(Self {
            inner: Arc::new(Inner {
                ctx: i.ctx.clone(),
                stream: i.stream.clone(),
                kernels: i.kernels.clone(),
                blas: i.blas.clone(),
                dtype,
                gpu_name: i.gpu_name.clone(),
                ordinal: i.ordinal,
                cc: i.cc,
                sms: i.sms,
                poison: std::sync::atomic::AtomicBool::new(
                    i.poison.load(std::sync::atomic::Ordering::Relaxed),
                ),
                transfers: i.transfers.clone(),
                force_builtin_gemm: i.force_builtin_gemm.clone(),
            }),
        })
    }

    /// Uploads f32 values as an f32 tensor whatever the compute dtype (gradients, moments).
    pub fn upload_f32(&self, x: &[f32], shape: &[usize]) -> Result<Tensor<Self>> {
        let n: usize = shape.iter().product();
        if n != x.len() {
            return Err(EngineError::HostData(format!(
                "{} elements do not fill shape {shape:?}",
                x.len()
            )));
        }
        self.upload_bytes(bytemuck::cast_slice(x), shape, DType::F32)
    }

    /// Compute capability of the GPU.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.cc
    }

    /// Whether GEMMs go through cuBLAS (else the built-in kernel).
    pub fn has_cublas(&self) -> bool {
        self.cublas().is_some()
    }

    /// cuBLAS, unless absent or the built-in GEMM is forced.
    pub(crate) fn cublas(&self) -> Option<&Arc<Mutex<cudarc::cublas::CudaBlas>>> {
        if self
            .inner
            .force_builtin_gemm
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        self.inner.blas.as_ref()
    }

    /// Whether cuBLAS was loaded (whether or not the built-in GEMM is forced).
    pub fn cublas_loaded(&self) -> bool {
        self.inner.blas.is_some()
    }

    /// Forces the built-in GEMM kernel even where cuBLAS is loaded (`selftest --gemm builtin`),
    /// for every dtype view of this GPU context.
    pub fn force_builtin_gemm(&self, on: bool) {
        self.inner
            .force_builtin_gemm
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Device-to-host transfers of this GPU context so far (all dtype views together).
    pub fn d2h_transfers(&self) -> transfers::Transfers {
        self.inner.transfers.get()
    }

    /// Multiprocessor count.
    pub fn sm_count(&self) -> u32 {
        self.inner.sms
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.inner
            .ctx
            .mem_get_info()
            .map_err(dev_err("memory info"))
    }

    /// How the kernels were loaded and which GEMM is used, in one line.
    pub fn load_summary(&self) -> String {
        let mut forms: Vec<String> = self
            .inner
            .kernels
            .loaded
            .iter()
            .map(|(_, a)| a.to_string())
            .collect();
        forms.sort();
        forms.dedup();
        format!(
            "kernels from {}, GEMM by {}",
            forms.join(" + "),
            match (self.has_cublas(), self.cublas_loaded()) {
                (true, _) => "cuBLAS",
                (false, true) => "the built-in kernel (forced; cuBLAS loaded)",
                (false, false) => "the built-in kernel",
            }
        )
    }

    /// When set, every uninitialised output is filled with NaN bytes first (selftest: a kernel
    /// that forgets to write an element is caught).
    pub fn set_poison(&self, on: bool) {
        self.inner
            .poison
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(dev_err("synchronize"))
    }

    /// The stream every operation is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    pub(crate) fn alloc_bytes(&self, bytes: usize, zero: bool) -> Result<CudaSlice<u8>> {
        let n = bytes.max(1);
        // SAFETY: the memory is either zeroed or poisoned below, or fully written by the caller.
        let r = unsafe { self.inner.stream.alloc::<u8>(n) };
        let mut s = match r {
            Ok(s) => s,
            Err(e) => {
                let info = self.inner.ctx.mem_get_info().ok();
                return Err(memory::alloc_error(n, info, &format!("{e:?}")));
            }
        };
        let poison = self.inner.poison.load(std::sync::atomic::Ordering::Relaxed);
        if zero {
            self.inner
                .stream
                .memset_zeros(&mut s)
                .map_err(dev_err("memset"))?;
        } else if poison {
            let p = self.ptr_of(&s);
            // SAFETY: `p` points at `n` bytes allocated on this stream.
            unsafe {
                cudarc::driver::result::memset_d8_async(p, 0xff, n, self.inner.stream.cu_stream())
            }
            .map_err(dev_err("memset"))?;
        }
        Ok(s)
    }

    /// A new tensor, zeroed or (for outputs the kernels overwrite) uninitialised.
    pub(crate) fn alloc(&self, shape: &[usize], dtype: DType, zero: bool) -> Result<Tensor<Self>> {
        let n: usize = shape.iter().product();
        let data = self.alloc_bytes(n * dtype.size(), zero)?;
        Ok(Tensor::from_parts(
            CudaStorage {
                data,
                dtype,
                host_index: None,
            },
            shape.to_vec(),
            dtype,
        ))
    }

    fn ptr_of(&self, s: &CudaSlice<u8>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.inner.stream);
        p
    }

    /// The device address of a tensor's first element.
    pub(crate) fn ptr(&self, t: &Tensor<Self>) -> u64 {
        self.ptr_of(&t.storage().data)
    }

    /// Launches kernel `name` with `grid` x `block` threads and `args`. A grid with no blocks
    /// in some dimension has no work and launches nothing.
    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_smem(name, grid, block, 0, args)
    }

    /// As [`Cuda::launch`] with `smem` bytes of dynamic shared memory per block (checked against
    /// the device's limits; above 48 KiB the kernel is opted in first).
    pub(crate) fn launch_smem(
        &self,
        name: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if launch::empty_grid(grid) {
            return Ok(());
        }
        let f = self.inner.kernels.get(name)?;
        if smem > 0 {
            self.prepare_dynamic_smem(name, &f, smem)?;
        }
        let mut b = self.inner.stream.launch_builder(&f);
        for a in args {
            match a {
                Arg::P(x) | Arg::L(x) => b.arg(x),
                Arg::U(x) => b.arg(x),
                Arg::F(x) => b.arg(x),
                Arg::I(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: argument lists match the kernels' signatures (see kernels/*.cu); buffers are
        // sized by the callers, which check shapes first.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| EngineError::Device(format!("launching {name}: {e:?}")))
    }

    /// Checks `smem` dynamic bytes against the device's limits and, above the default 48 KiB,
    /// raises the kernel's dynamic shared memory limit to it.
    fn prepare_dynamic_smem(
        &self,
        name: &str,
        f: &cudarc::driver::CudaFunction,
        smem: u32,
    ) -> Result<()> {
        use cudarc::driver::sys::{CUdevice_attribute as A, CUfunction_attribute as F};
        let optin = self
            .inner
            .ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map(|v| v.max(0) as u32)
            .unwrap_or(launch::DEFAULT_DYNAMIC_SMEM);
        let static_bytes = f
            .get_attribute(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map(|v| v.max(0) as u32)
            .unwrap_or(0);
        if launch::dynamic_smem_plan(name, smem, static_bytes, optin)? {
            f.set_attribute(
                F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(dev_err("raising the dynamic shared memory limit"))?;
        }
        Ok(())
    }

    /// The kernel-name suffix of a floating dtype (`f32`, `bf16`).
    pub(crate) fn suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
        match dtype {
            DType::F32 => Ok("f32"),
            DType::BF16 => Ok("bf16"),
            _ => Err(EngineError::DType { op, dtype }),
        }
    }

    /// `t` converted to `dtype` (a new tensor), or `None` when it already is.
    pub(crate) fn cast(&self, t: &Tensor<Self>, dtype: DType) -> Result<Option<Tensor<Self>>> {
        if t.dtype() == dtype {
            return Ok(None);
        }
        let name = match (t.dtype(), dtype) {
            (DType::F32, DType::BF16) => "cast_f32_bf16",
            (DType::BF16, DType::F32) => "cast_bf16_f32",
            (from, _) => {
                return Err(EngineError::DType {
                    op: "cast",
                    dtype: from,
                })
            }
        };
        let out = self.alloc(t.shape(), dtype, false)?;
        let n = t.numel();
        self.launch(
            name,
            (launch::grid_for(n), 1),
            launch::BLOCK,
            &[
                Arg::P(self.ptr(&out)),
                Arg::P(self.ptr(t)),
                Arg::L(n as u64),
            ],
        )?;
        Ok(Some(out))
    }

    /// Downloads raw bytes.
    pub(crate) fn download_bytes(&self, t: &Tensor<Self>) -> Result<Vec<u8>> {
        let n = t.numel() * t.dtype().size();
        self.inner.transfers.record(n);
        let mut v = self
            .inner
            .stream
            .clone_dtoh(&t.storage().data)
            .map_err(dev_err("copy to host"))?;
        self.synchronize()?;
        v.truncate(n);
        Ok(v)
    }

    /// Uploads raw bytes as a tensor.
    pub(crate) fn upload_bytes(
        &self,
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor<Self>> {
        let mut data = self.alloc_bytes(bytes.len(), false)?;
        if !bytes.is_empty() {
            self.inner
                .stream
                .memcpy_htod(bytes, &mut data)
                .map_err(dev_err("copy to device"))?;
        }
        Ok(Tensor::from_parts(
            CudaStorage {
                data,
                dtype,
                host_index: None,
            },
            shape.to_vec(),
            dtype,
        ))
    }

    /// Uploads u32 values (launch tables, indices).
    pub(crate) fn upload_u32(&self, v: &[u32]) -> Result<Tensor<Self>> {
        self.upload_index(v, &[v.len()])
    }

    /// Uploads an index tensor and keeps its host values beside it (see
    /// [`CudaStorage::host_index`]).
    pub(crate) fn upload_index(&self, v: &[u32], shape: &[usize]) -> Result<Tensor<Self>> {
        let mut t = self.upload_bytes(bytemuck::cast_slice(v), shape, DType::U32)?;
        t.storage_mut().host_index = Some(Arc::from(v));
        Ok(t)
    }
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())
    }
}

/// `cuda:N (name)`.
pub(crate) fn display_name(ordinal: usize, gpu: &str) -> String {
    format!("cuda:{ordinal} ({gpu})")
}
