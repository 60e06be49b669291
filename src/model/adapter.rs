//! Low-rank adapters in the inference forward: the KV-cache forward (and so generation) of a
//! base model with LoRA adapters applied on the fly, `y = x W^T + s (x A^T) B^T`, without merging
//! them into the base weights. The same base weights with the adapters switched off are the base
//! model itself, which is how LoRA RL gets its reference without a second copy.

use crate::engine::{Backend, Tensor};
use crate::model::error::Result;
use crate::train::lora::{Lora, LoraTarget};

/// The adapters a forward applies: `None` runs the base model (adapters off).
pub struct Adapters<'a, B: Backend> {
    lora: Option<&'a Lora<B>>,
}

impl<B: Backend> Clone for Adapters<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Adapters<'_, B> {}

impl<'a, B: Backend> Adapters<'a, B> {
    /// No adapters: the base model.
    pub fn off() -> Self {
        Self { lora: None }
    }

    /// Applies `lora` (or nothing when `None`).
    pub fn new(lora: Option<&'a Lora<B>>) -> Self {
        Self { lora }
    }

    /// Whether any adapter is applied.
    pub fn is_on(&self) -> bool {
        self.lora.is_some()
    }

    /// `x W^T (+ bias)`, plus the adapter update of projection `t` of layer `layer` when adapted.
    /// The same operations, in the same order, as the training forward's projection, so the
    /// sampler and the trainer see the same numbers.
    pub fn linear(
        &self,
        be: &B,
        x: &Tensor<B>,
        w: &Tensor<B>,
        bias: Option<&Tensor<B>>,
        layer: usize,
        t: LoraTarget,
    ) -> Result<Tensor<B>> {
        let mut y = be.linear(x, w, bias)?;
        if let Some(lo) = self.lora {
            if let Some(ad) = lo.adapter(layer, t) {
                let u = be.linear(x, &ad.a, None)?;
                let z = be.linear(&u, &ad.b, None)?;
                be.axpy(&mut y, lo.scale(), &z)?;
            }
        }
        Ok(y)
    }
}
