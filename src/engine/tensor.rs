//! A dense, contiguous, row-major tensor whose storage belongs to a backend.

use crate::engine::error::{EngineError, Result};
use crate::engine::{Backend, DType};

/// A tensor: a shape, a dtype and backend-owned storage (host memory on the CPU, device memory on a
/// GPU). Model code never indexes the storage; it calls backend operations.
pub struct Tensor<B: Backend> {
    storage: B::Storage,
    shape: Vec<usize>,
    dtype: DType,
}

impl<B: Backend> Tensor<B> {
    /// Wraps backend storage; used by backend implementations.
    pub fn from_parts(storage: B::Storage, shape: Vec<usize>, dtype: DType) -> Self {
        Self {
            storage,
            shape,
            dtype,
        }
    }

    /// The shape, outermost dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The backend storage (for backend implementations).
    pub fn storage(&self) -> &B::Storage {
        &self.storage
    }

    /// The backend storage, mutably (for backend implementations).
    pub fn storage_mut(&mut self) -> &mut B::Storage {
        &mut self.storage
    }

    /// The same data under another shape with the same number of elements.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != self.numel() {
            return Err(EngineError::Shape {
                op: "reshape",
                detail: format!(
                    "{:?} ({} elements) to {:?}",
                    self.shape,
                    self.numel(),
                    shape
                ),
            });
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// The two dimensions of a matrix, or a shape error naming `op`.
    pub fn dims2(&self, op: &'static str) -> Result<(usize, usize)> {
        match self.shape[..] {
            [a, b] => Ok((a, b)),
            _ => Err(EngineError::Shape {
                op,
                detail: format!("expected a matrix, got {:?}", self.shape),
            }),
        }
    }

    /// The single dimension of a vector, or a shape error naming `op`.
    pub fn dims1(&self, op: &'static str) -> Result<usize> {
        match self.shape[..] {
            [a] => Ok(a),
            _ => Err(EngineError::Shape {
                op,
                detail: format!("expected a vector, got {:?}", self.shape),
            }),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {})", self.shape, self.dtype)
    }
}
