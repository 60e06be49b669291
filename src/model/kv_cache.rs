//! The key/value cache: per layer, `[slots, max_seq, kv_heads * head_dim]` for keys and values.
//! A slot holds one sequence; its length lives on the host.

use crate::engine::{Backend, DType, SharedPrefix, Tensor};
use crate::model::error::Result;
use crate::model::ModelConfig;

/// Keys and values of every layer for a fixed number of sequence slots.
pub struct KvCache<B: Backend> {
    /// Keys per layer.
    pub k: Vec<Tensor<B>>,
    /// Values per layer.
    pub v: Vec<Tensor<B>>,
    /// Number of slots.
    pub slots: usize,
    /// Positions per slot.
    pub max_seq: usize,
    /// Per slot: where its first positions live when they are another slot's prompt, kept once
    /// (only on backends that [share prefixes](Backend::shares_prefixes)). The named slot must
    /// keep those positions unchanged while any entry names it (generation copies them out
    /// before it reuses the slot).
    pub shared: Vec<Option<SharedPrefix>>,
}

impl<B: Backend> KvCache<B> {
    /// Allocates a zeroed cache.
    pub fn new(backend: &B, cfg: &ModelConfig, slots: usize, max_seq: usize) -> Result<Self> {
        let f = cfg.num_kv_heads * cfg.head_dim;
        let mut k = Vec::with_capacity(cfg.num_layers);
        let mut v = Vec::with_capacity(cfg.num_layers);
        for _ in 0..cfg.num_layers {
            k.push(backend.zeros(&[slots, max_seq, f], DType::F32)?);
            v.push(backend.zeros(&[slots, max_seq, f], DType::F32)?);
        }
        Ok(Self {
            k,
            v,
            slots,
            max_seq,
            shared: vec![None; slots],
        })
    }

    /// Bytes the cache occupies for a configuration (f32).
    pub fn bytes_for(cfg: &ModelConfig, slots: usize, max_seq: usize) -> usize {
        2 * cfg.num_layers * slots * max_seq * cfg.num_kv_heads * cfg.head_dim * 4
    }
}
