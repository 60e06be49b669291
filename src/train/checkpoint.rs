//! Checkpoint directories: `step-NNNNNNNN/` under a root, each written into a temporary
//! directory (every file fsynced), closed by a `checksums.json` manifest, then renamed into place,
//! so a checkpoint either exists whole or not at all. Files are streamed: safetensors files one
//! tensor at a time from wherever the tensor lives, their checksums computed as the bytes go out,
//! so writing costs about one tensor of host memory and the checkpoint's size in bytes written.
//! Loading verifies every file against the manifest (read in chunks); a corrupt checkpoint is
//! refused with a clear error, or skipped for the previous good one when falling back is allowed.
//! Only the last N are kept. Tensors are read back memory-mapped.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::engine::cpu::bytes_to_f32;
use crate::engine::rng::mix64;
use crate::engine::{Backend, DType, Tensor};
use crate::model::st_writer::{name_stream_error, write_safetensors, StreamTensor};
use crate::model::weights::{write_atomic, HostTensor, WeightFiles};
use crate::train::error::{Result, TrainError};

/// Name of the manifest file of a checkpoint.
pub const MANIFEST: &str = "checksums.json";

const CK_P: u64 = 0x9E37_79B1_85EB_CA87;
const CK_LANES: [u64; 4] = [
    0x243F_6A88_85A3_08D3,
    0x1319_8A2E_0370_7344,
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
];

fn ck_block(lanes: &mut [u64; 4], c: &[u8]) {
    for (l, w) in lanes.iter_mut().zip(c.chunks_exact(8)) {
        let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        *l = (*l ^ x).wrapping_mul(CK_P).rotate_left(29);
    }
}

fn ck_finish(lanes: [u64; 4], len: u64, rest: &[u8]) -> u64 {
    let mut h = len;
    for l in lanes {
        h = mix64(h ^ l);
    }
    for &b in rest {
        h = mix64(h ^ b as u64);
    }
    h
}

/// A fast non-cryptographic 64-bit checksum of bytes (four lanes of multiply-rotate over 8-byte
/// words, then splitmix finalisation); it detects truncation and bit flips, not tampering.
pub fn checksum64(bytes: &[u8]) -> u64 {
    let mut lanes = CK_LANES;
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        ck_block(&mut lanes, c);
    }
    ck_finish(lanes, bytes.len() as u64, chunks.remainder())
}

/// [`checksum64`] computed incrementally over bytes given in pieces.
#[derive(Clone, Debug)]
pub struct Checksum64 {
    lanes: [u64; 4],
    pending: [u8; 32],
    npending: usize,
    len: u64,
}

impl Default for Checksum64 {
    fn default() -> Self {
        Self {
            lanes: CK_LANES,
            pending: [0; 32],
            npending: 0,
            len: 0,
        }
    }
}

impl Checksum64 {
    /// Adds bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.npending > 0 {
            let k = (32 - self.npending).min(bytes.len());
            self.pending[self.npending..self.npending + k].copy_from_slice(&bytes[..k]);
            self.npending += k;
            bytes = &bytes[k..];
            if self.npending < 32 {
                return;
            }
            let block = self.pending;
            ck_block(&mut self.lanes, &block);
            self.npending = 0;
        }
        let mut chunks = bytes.chunks_exact(32);
        for c in &mut chunks {
            ck_block(&mut self.lanes, c);
        }
        let rest = chunks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.npending = rest.len();
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no bytes were seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The checksum of all bytes seen.
    pub fn finish(&self) -> u64 {
        ck_finish(self.lanes, self.len, &self.pending[..self.npending])
    }
}

/// A writer that checksums and counts what passes through it.
struct Hashing<W: Write> {
    inner: W,
    sum: Checksum64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.sum.update(&buf[..k]);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The checksum and length of a file, read in chunks.
pub fn checksum_file(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 4 << 20];
    let mut sum = Checksum64::default();
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sum.update(&buf[..n]);
    }
    Ok((sum.finish(), sum.len()))
}

/// Serialises tensors to safetensors bytes in memory (the whole file at once; checkpoints use
/// [`CheckpointWriter::add_safetensors`], which streams the same bytes).
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

/// Reads every floating-point tensor of a safetensors file as f32: name -> (shape, values). The
/// file is memory-mapped, not read whole; use it for small files (adapters, value heads).
pub fn read_f32_tensors(path: &Path) -> Result<HostF32Map> {
    let files = WeightFiles::open_file(path)?;
    let map = &files.shards[0].map;
    let mut out = BTreeMap::new();
    for (name, e) in &files.tensors {
        if e.dtype == DType::U32 {
            return Err(TrainError::invalid(path, name, "unsupported dtype U32"));
        }
        let data = bytes_to_f32(&map[e.start..e.end], e.dtype)
            .map_err(|err| TrainError::invalid(path, name, err.to_string()))?;
        out.insert(name.clone(), (e.shape.clone(), data));
    }
    Ok(out)
}

/// Loads a tensor of a memory-mapped safetensors file into a backend as an owned tensor of the
/// expected shape, releasing its mapped pages once copied (so reading a checkpoint costs its
/// tensors, not its tensors plus the file). A missing tensor or a wrong shape is an error naming
/// the file and the tensor.
pub fn load_owned<B: Backend>(
    be: &B,
    files: &WeightFiles,
    name: &str,
    shape: &[usize],
) -> Result<Tensor<B>> {
    let mut t = files.load(be, name, shape)?;
    be.own_weight(&mut t)?;
    Ok(t)
}

/// The directory name of the checkpoint of `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|e| TrainError::io(path, e))
}

/// A checkpoint being written: files go into a temporary directory beside the final one, each
/// checksummed as it is written and fsynced; [`CheckpointWriter::commit`] writes the manifest and
/// renames the directory into place. Dropped without a commit, the temporary directory is removed.
pub struct CheckpointWriter {
    root: PathBuf,
    step: u64,
    tmp: PathBuf,
    sums: serde_json::Map<String, Value>,
    bytes_written: u64,
    committed: bool,
}

impl CheckpointWriter {
    /// Starts the checkpoint of `step` under `root`.
    pub fn begin(root: &Path, step: u64) -> Result<Self> {
        io(root, std::fs::create_dir_all(root))?;
        let tmp = root.join(format!(
            ".{}.tmp{}",
            step_dir_name(step),
            std::process::id()
        ));
        if tmp.exists() {
            io(&tmp, std::fs::remove_dir_all(&tmp))?;
        }
        io(&tmp, std::fs::create_dir_all(&tmp))?;
        Ok(Self {
            root: root.to_path_buf(),
            step,
            tmp,
            sums: serde_json::Map::new(),
            bytes_written: 0,
            committed: false,
        })
    }

    /// Bytes written so far (every file, the manifest once committed).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Writes one file from a writer callback, checksumming the bytes as they go out.
    pub fn add_with(
        &mut self,
        fname: &str,
        body: impl FnOnce(&mut dyn Write) -> Result<()>,
    ) -> Result<()> {
        if fname.contains('/') || fname == MANIFEST || fname.starts_with('.') {
            return Err(TrainError::Input(format!(
                "bad checkpoint file name {fname:?}"
            )));
        }
        let path = self.tmp.join(fname);
        let f = io(&path, File::create(&path))?;
        let mut w = Hashing {
            inner: BufWriter::with_capacity(1 << 20, f),
            sum: Checksum64::default(),
        };
        body(&mut w).map_err(|e| match e {
            TrainError::Model(m) => TrainError::Model(name_stream_error(m, &path)),
            other => other,
        })?;
        io(&path, w.flush())?;
        let sum = w.sum;
        let f = w
            .inner
            .into_inner()
            .map_err(|e| TrainError::io(&path, e.into_error()))?;
        io(&path, f.sync_all())?;
        self.bytes_written += sum.len();
        self.sums.insert(
            fname.to_string(),
            serde_json::json!({ "bytes": sum.len(), "checksum64": format!("{:016x}", sum.finish()) }),
        );
        Ok(())
    }

    /// Writes one file from bytes in memory.
    pub fn add_bytes(&mut self, fname: &str, bytes: &[u8]) -> Result<()> {
        self.add_with(fname, |w| {
            w.write_all(bytes)
                .map_err(|e| TrainError::Input(format!("{fname}: {e}")))
        })
    }

    /// Writes one safetensors file, one tensor at a time (byte-identical to
    /// [`safetensors_bytes`] of the same tensors).
    pub fn add_safetensors(&mut self, fname: &str, tensors: Vec<StreamTensor<'_>>) -> Result<()> {
        self.add_with(fname, |w| Ok(write_safetensors(w, tensors).map(|_| ())?))
    }

    /// Writes the manifest, fsyncs, and renames the checkpoint into place (replacing one of the
    /// same step); returns its directory.
    pub fn commit(mut self) -> Result<PathBuf> {
        let manifest = serde_json::json!({ "step": self.step, "files": self.sums });
        let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        write_atomic(&self.tmp.join(MANIFEST), text.as_bytes())?;
        self.bytes_written += text.len() as u64;
        let dst = self.root.join(step_dir_name(self.step));
        if dst.exists() {
            io(&dst, std::fs::remove_dir_all(&dst))?;
        }
        io(&dst, std::fs::rename(&self.tmp, &dst))?;
        if let Ok(d) = File::open(&self.root) {
            let _ = d.sync_all();
        }
        self.committed = true;
        Ok(dst)
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes a checkpoint of `step` under `root` from named file contents; returns its directory.
/// An existing checkpoint of the same step is replaced.
pub fn save(root: &Path, step: u64, files: &[(String, Vec<u8>)]) -> Result<PathBuf> {
    let mut w = CheckpointWriter::begin(root, step)?;
    for (fname, bytes) in files {
        w.add_bytes(fname, bytes)?;
    }
    w.commit()
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
        let (sum, len) =
            checksum_file(&dir.join(name)).map_err(|e| corrupt(format!("{name}: {e}")))?;
        let got = format!("{sum:016x}");
        if got != want {
            return Err(corrupt(format!(
                "{name}: checksum {got} does not match the manifest's {want} ({len} bytes)"
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

/// Deletes all but the newest `keep` checkpoints, and the temporary directories of writes that
/// never committed (a process killed while writing).
pub fn prune(root: &Path, keep: usize) -> Result<()> {
    let all = list(root)?;
    let n = all.len().saturating_sub(keep.max(1));
    for (_, dir) in &all[..n] {
        io(dir, std::fs::remove_dir_all(dir))?;
    }
    for entry in io(root, std::fs::read_dir(root))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".step-") && name.contains(".tmp") && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
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

/// Named backend tensors as streamed safetensors entries (written as f32 in place, or copied one
/// at a time from a device), their names prefixed.
pub fn stream_tensors<'a, B: Backend>(
    be: &'a B,
    named: Vec<(String, &'a Tensor<B>)>,
    prefix: &str,
) -> Vec<StreamTensor<'a>> {
    named
        .into_iter()
        .map(|(n, t)| StreamTensor::from_backend(be, format!("{prefix}{n}"), t))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::SplitMix;

    #[test]
    fn incremental_checksum_equals_the_whole_buffer_checksum_for_any_split() {
        let mut r = SplitMix::new(4);
        for len in [0usize, 1, 7, 31, 32, 33, 64, 100, 1000] {
            let bytes: Vec<u8> = (0..len).map(|_| r.below(256) as u8).collect();
            let want = checksum64(&bytes);
            for _ in 0..8 {
                let mut c = Checksum64::default();
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let k = 1 + r.below(40.min(rest.len() as u64)) as usize;
                    c.update(&rest[..k]);
                    rest = &rest[k..];
                }
                assert_eq!(c.finish(), want, "len {len}");
                assert_eq!(c.len(), len as u64);
            }
        }
        // It still tells apart what it should.
        assert_ne!(checksum64(b"abc"), checksum64(b"abd"));
        assert_ne!(checksum64(&[0; 32]), checksum64(&[0; 33]));
    }

    #[test]
    fn a_writer_dropped_before_commit_leaves_nothing_and_commit_records_checksums() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        {
            let mut w = CheckpointWriter::begin(r, 1).unwrap();
            w.add_bytes("a.bin", b"hello").unwrap();
        }
        assert!(list(r).unwrap().is_empty());
        assert_eq!(std::fs::read_dir(r).unwrap().count(), 0);
        let mut w = CheckpointWriter::begin(r, 2).unwrap();
        w.add_bytes("a.bin", b"hello").unwrap();
        assert!(w.add_bytes("../x", b"no").is_err());
        assert!(w.add_bytes(MANIFEST, b"no").is_err());
        let dir = w.commit().unwrap();
        verify(&dir).unwrap();
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(
            m["files"]["a.bin"]["checksum64"],
            format!("{:016x}", checksum64(b"hello"))
        );
        std::fs::write(dir.join("a.bin"), b"hellO").unwrap();
        assert!(matches!(verify(&dir), Err(TrainError::Corrupt { .. })));
    }

    #[test]
    fn prune_removes_leftover_temporary_directories() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        save(r, 1, &[("a".into(), b"1".to_vec())]).unwrap();
        std::fs::create_dir_all(r.join(".step-00000002.tmp999999")).unwrap();
        prune(r, 3).unwrap();
        assert!(!r.join(".step-00000002.tmp999999").exists());
        assert_eq!(list(r).unwrap().len(), 1);
    }
}
