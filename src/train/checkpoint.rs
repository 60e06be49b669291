//! Checkpoint directories: `step-NNNNNNNN/` under a root, each written into a temporary
//! directory (every file fsynced), closed by a `checksums.json` manifest, then renamed into place,
//! so a checkpoint either exists whole or not at all. Loading verifies every file against the
//! manifest; a corrupt checkpoint is refused with a clear error, or skipped for the previous good
//! one when falling back is allowed. Only the last N are kept.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::engine::cpu::bytes_to_f32;
use crate::engine::rng::mix64;
use crate::engine::{Backend, DType, Tensor};
use crate::model::weights::{write_atomic, HostTensor};
use crate::train::error::{Result, TrainError};

/// Name of the manifest file of a checkpoint.
pub const MANIFEST: &str = "checksums.json";

/// A fast non-cryptographic 64-bit checksum of bytes (four lanes of multiply-rotate over 8-byte
/// words, then splitmix finalisation); it detects truncation and bit flips, not tampering.
pub fn checksum64(bytes: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B1_85EB_CA87;
    let mut lanes = [
        0x243F_6A88_85A3_08D3u64,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c.chunks_exact(8)) {
            let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            *l = (*l ^ x).wrapping_mul(P).rotate_left(29);
        }
    }
    let mut h = bytes.len() as u64;
    for l in lanes {
        h = mix64(h ^ l);
    }
    for &b in chunks.remainder() {
        h = mix64(h ^ b as u64);
    }
    h
}

/// Serialises tensors to safetensors bytes.
pub fn safetensors_bytes(tensors: &BTreeMap<String, HostTensor>) -> Result<Vec<u8>> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dt = match t.dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::BF16 => safetensors::Dtype::BF16,
            DType::F16 => safetensors::Dtype::F16,
            DType::U32 => safetensors::Dtype::U32,
        };
        let v = safetensors::tensor::TensorView::new(dt, t.shape.clone(), &t.bytes)
            .map_err(|e| TrainError::invalid("safetensors", name, e.to_string()))?;
        views.push((name.clone(), v));
    }
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize(views, Some(meta))
        .map_err(|e| TrainError::invalid("safetensors", "serialize", e.to_string()))
}

/// Host tensors by name: `(shape, values)`.
pub type HostF32Map = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Reads every floating-point tensor of a safetensors file as f32: name -> (shape, values).
pub fn read_f32_tensors(path: &Path) -> Result<HostF32Map> {
    let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
        TrainError::invalid(path, "header", format!("not a valid safetensors file: {e}"))
    })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F16 => DType::F16,
            other => {
                return Err(TrainError::invalid(
                    path,
                    name,
                    format!("unsupported dtype {other:?}"),
                ))
            }
        };
        let data = bytes_to_f32(view.data(), dtype)
            .map_err(|e| TrainError::invalid(path, name, e.to_string()))?;
        out.insert(name.to_string(), (view.shape().to_vec(), data));
    }
    Ok(out)
}

/// The directory name of the checkpoint of `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| TrainError::io(path, e))
}

/// Writes a checkpoint of `step` under `root` from named file contents; returns its directory.
/// An existing checkpoint of the same step is replaced.
pub fn save(root: &Path, step: u64, files: &[(String, Vec<u8>)]) -> Result<PathBuf> {
    io(root, std::fs::create_dir_all(root))?;
    let name = step_dir_name(step);
    let tmp = root.join(format!(".{name}.tmp{}", std::process::id()));
    if tmp.exists() {
        io(&tmp, std::fs::remove_dir_all(&tmp))?;
    }
    io(&tmp, std::fs::create_dir_all(&tmp))?;
    let mut sums = serde_json::Map::new();
    for (fname, bytes) in files {
        if fname.contains('/') || fname == MANIFEST {
            return Err(TrainError::Input(format!(
                "bad checkpoint file name {fname:?}"
            )));
        }
        write_atomic(&tmp.join(fname), bytes)?;
        sums.insert(
            fname.clone(),
            serde_json::json!({ "bytes": bytes.len(), "checksum64": format!("{:016x}", checksum64(bytes)) }),
        );
    }
    let manifest = serde_json::json!({ "step": step, "files": sums });
    let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
    write_atomic(&tmp.join(MANIFEST), text.as_bytes())?;
    let dst = root.join(&name);
    if dst.exists() {
        io(&dst, std::fs::remove_dir_all(&dst))?;
    }
    io(&dst, std::fs::rename(&tmp, &dst))?;
    if let Ok(d) = File::open(root) {
        let _ = d.sync_all();
    }
    Ok(dst)
}

/// Verifies every file of a checkpoint against its manifest.
pub fn verify(dir: &Path) -> Result<()> {
    let corrupt = |msg: String| TrainError::Corrupt {
        path: dir.to_path_buf(),
        msg,
    };
    let mpath = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&mpath).map_err(|e| corrupt(format!("{MANIFEST}: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| corrupt(format!("{MANIFEST}: {e}")))?;
    let files = v
        .get("files")
        .and_then(Value::as_object)
        .ok_or_else(|| corrupt(format!("{MANIFEST}: files: missing")))?;
    for (name, meta) in files {
        let want = meta
            .get("checksum64")
            .and_then(Value::as_str)
            .ok_or_else(|| corrupt(format!("{MANIFEST}: files.{name}.checksum64: missing")))?;
        let bytes = std::fs::read(dir.join(name)).map_err(|e| corrupt(format!("{name}: {e}")))?;
        let got = format!("{:016x}", checksum64(&bytes));
        if got != want {
            return Err(corrupt(format!(
                "{name}: checksum {got} does not match the manifest's {want} ({} bytes)",
                bytes.len()
            )));
        }
    }
    Ok(())
}

/// The checkpoints under `root` as `(step, dir)`, oldest first.
pub fn list(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(TrainError::io(root, e)),
    };
    for entry in rd {
        let entry = io(root, entry)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix("step-")
            .and_then(|s| s.parse::<u64>().ok())
        {
            if entry.path().is_dir() {
                out.push((n, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The checkpoint to resume from: the latest under `root` if it verifies. A corrupt latest one is
/// an error unless `fallback`, in which case older ones are tried newest first; the skipped ones
/// are returned with their errors.
pub fn latest_good(root: &Path, fallback: bool) -> Result<(Option<PathBuf>, Vec<TrainError>)> {
    let mut skipped = Vec::new();
    for (_, dir) in list(root)?.into_iter().rev() {
        match verify(&dir) {
            Ok(()) => return Ok((Some(dir), skipped)),
            Err(e) if fallback => skipped.push(e),
            Err(e) => {
                return Err(match e {
                    TrainError::Corrupt { path, msg } => TrainError::Corrupt {
                        path,
                        msg: format!("{msg} (pass --resume-fallback to resume from the previous good checkpoint)"),
                    },
                    other => other,
                })
            }
        }
    }
    Ok((None, skipped))
}

/// Deletes all but the newest `keep` checkpoints (and leftover temporary directories).
pub fn prune(root: &Path, keep: usize) -> Result<()> {
    let all = list(root)?;
    let n = all.len().saturating_sub(keep.max(1));
    for (_, dir) in &all[..n] {
        io(dir, std::fs::remove_dir_all(dir))?;
    }
    Ok(())
}

/// Copies named tensors to the host as f32, their names prefixed.
pub fn host_tensors<B: Backend>(
    be: &B,
    named: Vec<(String, &Tensor<B>)>,
    prefix: &str,
) -> Result<BTreeMap<String, HostTensor>> {
    let mut out = BTreeMap::new();
    for (n, t) in named {
        out.insert(
            format!("{prefix}{n}"),
            HostTensor::f32(t.shape(), &be.to_host_f32(t)?),
        );
    }
    Ok(out)
}

/// Files copied from the base model into checkpoints and exports.
pub const MODEL_SIDE_FILES: [&str; 5] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// The [`MODEL_SIDE_FILES`] present in `model_dir`, read.
pub fn side_files(model_dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    for f in MODEL_SIDE_FILES {
        let p = model_dir.join(f);
        if p.exists() {
            out.push((
                f.to_string(),
                std::fs::read(&p).map_err(|e| TrainError::io(&p, e))?,
            ));
        }
    }
    Ok(out)
}
