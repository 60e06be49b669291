//! Element types of tensors.

use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
    /// 32-bit unsigned integer (token ids, positions, slot indices).
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The safetensors name of the type (`F32`, `BF16`, `F16`, `U32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::U32 => "U32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
