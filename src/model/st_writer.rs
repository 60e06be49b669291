//! Safetensors files written one tensor at a time: the header is built from shapes and dtypes
//! alone (the `safetensors` crate's `Metadata`, in the crate's own tensor order), then each
//! tensor's bytes are fetched from wherever it lives (a CPU tensor in place, a device tensor copied
//! to the host) and written, so that writing a file costs at most one tensor of host memory. The
//! bytes are exactly those of `safetensors::serialize` on the same tensors.

use std::collections::HashMap;
use std::io::Write;

use safetensors::tensor::{Metadata, TensorInfo};

use crate::engine::{Backend, DType, Tensor};
use crate::model::error::{ModelError, Result};
use crate::model::weights::{dtype_to_st, HostTensor};

/// Writes the little-endian bytes of one tensor into a writer.
pub type WriteBytes<'a> = Box<dyn Fn(&mut dyn Write) -> Result<()> + 'a>;

/// One tensor to be written: its name, dtype, shape and a way to produce its bytes on demand.
pub struct StreamTensor<'a> {
    /// Name in the file.
    pub name: String,
    /// Element type of the bytes.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Produces the bytes (exactly `numel * dtype.size()` of them).
    pub write: WriteBytes<'a>,
}

impl<'a> StreamTensor<'a> {
    /// A backend tensor written as f32: in place where the backend keeps f32 host memory, otherwise
    /// copied to the host while it is written.
    pub fn from_backend<B: Backend>(be: &'a B, name: String, t: &'a Tensor<B>) -> Self {
        Self {
            name,
            dtype: DType::F32,
            shape: t.shape().to_vec(),
            write: Box::new(move |w| {
                let v = be.host_f32(t)?;
                write_f32_le(w, &v)
            }),
        }
    }

    /// A host tensor (its bytes are borrowed).
    pub fn from_host(name: String, t: &'a HostTensor) -> Self {
        Self {
            name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            write: Box::new(move |w| w.write_all(&t.bytes).map_err(|e| ModelError::io(STREAM, e))),
        }
    }

    fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// The path stream errors carry until the file's writer names the file (see [`name_stream_error`]).
pub const STREAM: &str = "<safetensors stream>";

/// An error of writing a stream, with [`STREAM`] replaced by the file being written.
pub fn name_stream_error(e: ModelError, path: &std::path::Path) -> ModelError {
    match e {
        ModelError::Io { path: p, source } if p.as_os_str() == STREAM => {
            ModelError::io(path, source)
        }
        ModelError::Invalid {
            path: p,
            field,
            msg,
        } if p.as_os_str() == STREAM => ModelError::invalid(path, field, msg),
        other => other,
    }
}

/// Writes f32 values as little-endian bytes.
pub fn write_f32_le(w: &mut dyn Write, v: &[f32]) -> Result<()> {
    let io = |e| ModelError::io(STREAM, e);
    if cfg!(target_endian = "little") {
        return w.write_all(bytemuck::cast_slice(v)).map_err(io);
    }
    for chunk in v.chunks(1 << 16) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write_all(&bytes).map_err(io)?;
    }
    Ok(())
}

/// Counts the bytes that pass through it (to check each tensor wrote exactly its size).
struct Counting<'w> {
    inner: &'w mut dyn Write,
    n: usize,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The `__metadata__` every sorft safetensors file carries.
fn file_metadata() -> HashMap<String, String> {
    HashMap::from([("format".to_string(), "pt".to_string())])
}

/// Orders tensors as `safetensors::serialize` does (descending dtype alignment, then name) and
/// builds the header bytes: the 8-byte length and the space-padded JSON.
fn header(tensors: &mut [StreamTensor<'_>]) -> Result<(Vec<u8>, usize)> {
    tensors.sort_by(|a, b| {
        dtype_to_st(b.dtype)
            .cmp(&dtype_to_st(a.dtype))
            .then(a.name.cmp(&b.name))
    });
    let mut infos = Vec::with_capacity(tensors.len());
    let mut offset = 0usize;
    for t in tensors.iter() {
        let n = t.byte_len();
        infos.push((
            t.name.clone(),
            TensorInfo {
                dtype: dtype_to_st(t.dtype),
                shape: t.shape.clone(),
                data_offsets: (offset, offset + n),
            },
        ));
        offset += n;
    }
    let bad = |e: String| ModelError::invalid(STREAM, "header", e);
    let meta = Metadata::new(Some(file_metadata()), infos).map_err(|e| bad(e.to_string()))?;
    let mut json = serde_json::to_string(&meta)
        .map_err(|e| bad(e.to_string()))?
        .into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok((out, offset))
}

/// Writes `tensors` as one safetensors file into `w`, one tensor at a time; returns the bytes
/// written. Tensor names must be distinct.
pub fn write_safetensors(w: &mut dyn Write, mut tensors: Vec<StreamTensor<'_>>) -> Result<u64> {
    let (head, data_len) = header(&mut tensors)?;
    let io = |e| ModelError::io(STREAM, e);
    w.write_all(&head).map_err(io)?;
    for t in &tensors {
        let mut c = Counting { inner: w, n: 0 };
        (t.write)(&mut c)?;
        if c.n != t.byte_len() {
            return Err(ModelError::invalid(
                STREAM,
                &t.name,
                format!("wrote {} bytes, its shape needs {}", c.n, t.byte_len()),
            ));
        }
    }
    Ok((head.len() + data_len) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cpu::Cpu;
    use crate::engine::HostData;

    #[test]
    fn streamed_bytes_equal_the_crates_serialize() {
        let be = Cpu;
        let a = be
            .upload(HostData::F32(&[1.0, -2.5, 3.25, 0.0, 7.0, 8.0]), &[2, 3])
            .unwrap();
        let b = be.upload(HostData::F32(&[0.5; 5]), &[5]).unwrap();
        let h = HostTensor {
            dtype: DType::BF16,
            shape: vec![3],
            bytes: vec![1, 2, 3, 4, 5, 6],
        };
        let mut want_map = std::collections::BTreeMap::new();
        want_map.insert(
            "z.a".to_string(),
            HostTensor::f32(&[2, 3], &be.to_host_f32(&a).unwrap()),
        );
        want_map.insert(
            "b".to_string(),
            HostTensor::f32(&[5], &be.to_host_f32(&b).unwrap()),
        );
        want_map.insert("h".to_string(), h.clone());
        let mut views = Vec::new();
        for (n, t) in &want_map {
            let v = safetensors::tensor::TensorView::new(
                dtype_to_st(t.dtype),
                t.shape.clone(),
                &t.bytes,
            )
            .unwrap();
            views.push((n.clone(), v));
        }
        let want = safetensors::serialize(views, Some(file_metadata())).unwrap();
        let mut got = Vec::new();
        let n = write_safetensors(
            &mut got,
            vec![
                StreamTensor::from_backend(&be, "z.a".into(), &a),
                StreamTensor::from_host("h".into(), &h),
                StreamTensor::from_backend(&be, "b".into(), &b),
            ],
        )
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(n as usize, want.len());
    }

    #[test]
    fn stream_errors_name_the_file_being_written() {
        let e = ModelError::io(STREAM, std::io::Error::other("disk full"));
        let e = name_stream_error(e, std::path::Path::new("/x/model.safetensors"));
        assert_eq!(e.to_string(), "/x/model.safetensors: disk full");
    }

    #[test]
    fn a_tensor_writing_the_wrong_length_is_an_error() {
        let short = StreamTensor {
            name: "x".into(),
            dtype: DType::F32,
            shape: vec![4],
            write: Box::new(|w| write_f32_le(w, &[1.0, 2.0])),
        };
        let err = write_safetensors(&mut Vec::new(), vec![short]).unwrap_err();
        assert!(err.to_string().contains("wrote 8 bytes"), "{err}");
    }
}
