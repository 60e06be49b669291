//! Checkpoints.

use std::collections::BTreeMap;
use std::path::Path;

use crate::engine::cpu::bytes_to_f32;
use crate::engine::DType;
use crate::train::error::{Result, TrainError};

/// Reads every floating-point tensor of a safetensors file as f32: name -> (shape, values).
pub fn read_f32_tensors(path: &Path) -> Result<BTreeMap<String, (Vec<usize>, Vec<f32>)>> {
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
