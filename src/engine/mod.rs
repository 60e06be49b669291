//! Tensors and the backend boundary.
