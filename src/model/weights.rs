//! Weights from `*.safetensors` files, memory-mapped: a single `model.safetensors` or shards listed
//! by `model.safetensors.index.json`. Tensors stay in the map until a backend takes them (the CPU
//! backend uses f32 tensors in place).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::tensor::{Dtype as StDtype, SafeTensors};
use serde_json::Value;

use crate::engine::backend::MappedBytes;
use crate::engine::{Backend, DType, Tensor};
use crate::model::error::{ModelError, Result};
use crate::model::st_writer::{write_safetensors, StreamTensor};

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Index of its shard in [`WeightFiles::shards`].
    pub shard: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte range inside the shard's map.
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
}

/// One memory-mapped safetensors file.
pub struct Shard {
    /// Its path.
    pub path: PathBuf,
    /// The map.
    pub map: Arc<memmap2::Mmap>,
}

/// All weight files of a model directory.
pub struct WeightFiles {
    /// The mapped files.
    pub shards: Vec<Shard>,
    /// Every tensor by name.
    pub tensors: BTreeMap<String, TensorEntry>,
}

fn dtype_from_st(d: StDtype) -> Option<DType> {
    match d {
        StDtype::F32 => Some(DType::F32),
        StDtype::BF16 => Some(DType::BF16),
        StDtype::F16 => Some(DType::F16),
        StDtype::U32 => Some(DType::U32),
        _ => None,
    }
}

/// The safetensors dtype of a dtype.
pub(crate) fn dtype_to_st(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::BF16 => StDtype::BF16,
        DType::F16 => StDtype::F16,
        DType::U32 => StDtype::U32,
    }
}

fn map_file(path: &Path) -> Result<Arc<memmap2::Mmap>> {
    let f = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only; a model file modified by another process while mapped would
    // change the weights we read, but cannot make us read outside the mapping.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ModelError::io(path, e))?;
    Ok(Arc::new(map))
}

impl WeightFiles {
    /// Opens the weights of a model directory.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if index.exists() {
            Self::open_sharded(dir, &index)
        } else if single.exists() {
            Self::open_file(&single)
        } else {
            Err(ModelError::invalid(
                dir,
                "weights",
                "no model.safetensors or model.safetensors.index.json",
            ))
        }
    }

    /// Maps one safetensors file (a checkpoint's optimizer state or adapter, for instance).
    pub fn open_file(path: &Path) -> Result<Self> {
        let mut w = Self {
            shards: Vec::new(),
            tensors: BTreeMap::new(),
        };
        w.add_shard(path, None)?;
        Ok(w)
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::invalid(index, "json", e.to_string()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::invalid(index, "weight_map", "missing or not an object"))?;
        let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                ModelError::invalid(index, format!("weight_map.{name}"), "not a file name")
            })?;
            if file.contains('/') || file.contains("..") {
                return Err(ModelError::invalid(
                    index,
                    format!("weight_map.{name}"),
                    format!("shard {file:?} is not a plain file name"),
                ));
            }
            by_file
                .entry(file.to_string())
                .or_default()
                .push(name.clone());
        }
        let mut w = Self {
            shards: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for (file, names) in by_file {
            let path = dir.join(&file);
            if !path.exists() {
                return Err(ModelError::invalid(
                    index,
                    "weight_map",
                    format!("shard {file} is missing"),
                ));
            }
            w.add_shard(&path, Some(&names))?;
        }
        Ok(w)
    }

    fn add_shard(&mut self, path: &Path, expected: Option<&[String]>) -> Result<()> {
        let map = map_file(path)?;
        let st = SafeTensors::deserialize(&map[..]).map_err(|e| {
            ModelError::invalid(path, "header", format!("not a valid safetensors file: {e}"))
        })?;
        let shard = self.shards.len();
        let base = map.as_ptr() as usize;
        for (name, view) in st.iter() {
            let dtype = dtype_from_st(view.dtype()).ok_or_else(|| {
                ModelError::invalid(path, name, format!("unsupported dtype {:?}", view.dtype()))
            })?;
            let data = view.data();
            let start = data.as_ptr() as usize - base;
            self.tensors.insert(
                name.to_string(),
                TensorEntry {
                    shard,
                    dtype,
                    shape: view.shape().to_vec(),
                    start,
                    end: start + data.len(),
                },
            );
        }
        if let Some(names) = expected {
            for n in names {
                if !self.tensors.contains_key(n) {
                    return Err(ModelError::invalid(
                        path,
                        n,
                        "listed in the index but absent from the shard (partial shard?)",
                    ));
                }
            }
        }
        drop(st);
        self.shards.push(Shard {
            path: path.to_path_buf(),
            map,
        });
        Ok(())
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// One floating-point tensor with the expected shape, as f32 values on the host (read from
    /// the map; the rest of the file is not touched).
    pub fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (shard, e) = self.entry(name, shape)?;
        let bytes = &shard.map[e.start..e.end];
        crate::engine::cpu::bytes_to_f32(bytes, e.dtype)
            .map_err(|err| ModelError::invalid(&shard.path, name, err.to_string()))
    }

    /// Loads a floating-point tensor with the expected shape into a backend.
    pub fn load<B: Backend>(&self, backend: &B, name: &str, shape: &[usize]) -> Result<Tensor<B>> {
        let (shard, e) = self.entry(name, shape)?;
        let src = MappedBytes {
            map: Arc::clone(&shard.map),
            start: e.start,
            end: e.end,
        };
        backend
            .upload_weight(src, e.dtype, shape)
            .map_err(|err| ModelError::invalid(&shard.path, name, err.to_string()))
    }

    /// The shard and entry of a floating-point tensor of the expected shape; a missing tensor, a
    /// wrong shape or an integer dtype is an error naming the file and the tensor.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<(&Shard, &TensorEntry)> {
        let e = self.tensors.get(name).ok_or_else(|| {
            let file = self
                .shards
                .first()
                .map(|s| s.path.clone())
                .unwrap_or_default();
            ModelError::invalid(file, name, "tensor missing")
        })?;
        let shard = &self.shards[e.shard];
        if e.shape != shape {
            return Err(ModelError::invalid(
                &shard.path,
                name,
                format!("shape {:?}, expected {:?}", e.shape, shape),
            ));
        }
        if e.dtype == DType::U32 {
            return Err(ModelError::invalid(
                &shard.path,
                name,
                "dtype U32, expected a float type",
            ));
        }
        Ok((shard, e))
    }

    /// The distinct dtypes of the stored tensors with their parameter counts.
    pub fn dtype_summary(&self) -> HashMap<DType, usize> {
        let mut m = HashMap::new();
        for e in self.tensors.values() {
            *m.entry(e.dtype).or_insert(0) += e.shape.iter().product::<usize>();
        }
        m
    }
}

/// A host tensor to be written to a safetensors file.
#[derive(Clone, Debug)]
pub struct HostTensor {
    /// Element type of `bytes`.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    /// An f32 tensor.
    pub fn f32(shape: &[usize], data: &[f32]) -> Self {
        Self {
            dtype: DType::F32,
            shape: shape.to_vec(),
            bytes: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// Writes tensors to a safetensors file atomically (temporary file, fsync, rename), one tensor at
/// a time (no second copy of the whole file in memory).
pub fn save_safetensors(path: &Path, tensors: &BTreeMap<String, HostTensor>) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(n, t)| StreamTensor::from_host(n.clone(), t))
        .collect();
    write_atomic_with(path, |w| write_safetensors(w, views).map(|_| ()))
}

/// Writes a file atomically from a writer callback: a temporary file beside it (buffered), fsync,
/// rename, fsync of the directory. The temporary file is removed on failure.
pub fn write_atomic_with(
    path: &Path,
    body: impl FnOnce(&mut dyn std::io::Write) -> Result<()>,
) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let res = (|| -> Result<()> {
        let f = File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        body(&mut w).map_err(|e| crate::model::st_writer::name_stream_error(e, path))?;
        w.flush().map_err(|e| ModelError::io(&tmp, e))?;
        let f = w
            .into_inner()
            .map_err(|e| ModelError::io(&tmp, e.into_error()))?;
        f.sync_all().map_err(|e| ModelError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Writes a file atomically: a temporary file beside it, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(ModelError::io(path, e));
    }
    Ok(())
}
