//! LoRA adapters of rank r on any of the q, k, v, o, gate, up and down projections, with PEFT
//! export/import (`adapter_config.json` + `adapter_model.safetensors`) and merging into the base.
//!
//! The adapted projection is `y = x W^T + s (x A^T) B^T` with `A [r, in]`, `B [out, r]` and
//! `s = alpha / r`; `B` starts at zero so the adapted model starts equal to the base.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::engine::rng::SplitMix;
use crate::engine::{Backend, DType, Tensor};
use crate::model::config::ModelConfig;
use crate::model::transformer::Model;
use crate::model::weights::{save_safetensors, write_atomic, HostTensor};
use crate::train::checkpoint::read_f32_tensors;
use crate::train::error::{Result, TrainError};

/// A projection LoRA can adapt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Attention output projection.
    O,
    /// MLP gate projection.
    Gate,
    /// MLP up projection.
    Up,
    /// MLP down projection.
    Down,
}

impl LoraTarget {
    /// All targets, in slot order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The Hugging Face module name (`q_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The parent module (`self_attn` or `mlp`).
    pub fn parent(self) -> &'static str {
        match self {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
            _ => "mlp",
        }
    }

    /// Index of the target in a layer's slots.
    pub fn slot(self) -> usize {
        self as usize
    }

    /// Parses `q`, `q_proj`, `gate`, ... (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_suffix("_proj").unwrap_or(&s);
        Some(match s {
            "q" => LoraTarget::Q,
            "k" => LoraTarget::K,
            "v" => LoraTarget::V,
            "o" => LoraTarget::O,
            "gate" => LoraTarget::Gate,
            "up" => LoraTarget::Up,
            "down" => LoraTarget::Down,
            _ => return None,
        })
    }

    /// `(out_features, in_features)` of the projection in a model.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let (d, q, kv, i) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        match self {
            LoraTarget::Q => (q, d),
            LoraTarget::K | LoraTarget::V => (kv, d),
            LoraTarget::O => (d, q),
            LoraTarget::Gate | LoraTarget::Up => (i, d),
            LoraTarget::Down => (d, i),
        }
    }
}

/// Rank, scaling and targets of a LoRA run.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank r.
    pub rank: usize,
    /// Scaling numerator: the update is scaled by `alpha / rank`.
    pub alpha: f32,
    /// The adapted projections.
    pub targets: Vec<LoraTarget>,
}

/// One adapter: `A [r, in]` and `B [out, r]`.
pub struct Adapter<B: Backend> {
    /// Down projection `[r, in]`.
    pub a: Tensor<B>,
    /// Up projection `[out, r]`.
    pub b: Tensor<B>,
}

/// The adapters of a model, per layer and target slot.
pub struct Lora<B: Backend> {
    /// The configuration.
    pub config: LoraConfig,
    /// `layers[l][target.slot()]`.
    pub layers: Vec<Vec<Option<Adapter<B>>>>,
}

fn peft_name(l: usize, t: LoraTarget, ab: &str) -> String {
    format!(
        "base_model.model.model.layers.{l}.{}.{}.lora_{ab}.weight",
        t.parent(),
        t.module()
    )
}

impl<B: Backend> Lora<B> {
    /// Fresh adapters: `A` uniform in `±1/sqrt(in)` (PEFT's Kaiming-uniform bound), `B = 0`.
    pub fn new(backend: &B, mc: &ModelConfig, config: LoraConfig, seed: u64) -> Result<Self> {
        if config.rank == 0 || config.targets.is_empty() {
            return Err(TrainError::Input(
                "LoRA needs a positive rank and at least one target".into(),
            ));
        }
        let mut rng = SplitMix::new(seed ^ 0x4c6f_5241);
        let mut layers = Vec::with_capacity(mc.num_layers);
        for _ in 0..mc.num_layers {
            let mut slots: Vec<Option<Adapter<B>>> = (0..7).map(|_| None).collect();
            for &t in &LoraTarget::ALL {
                if !config.targets.contains(&t) {
                    continue;
                }
                let (out, inp) = t.dims(mc);
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f32> = (0..config.rank * inp)
                    .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                slots[t.slot()] = Some(Adapter {
                    a: backend.upload_f32_exact(&a, &[config.rank, inp])?,
                    b: backend.zeros(&[out, config.rank], DType::F32)?,
                });
            }
            layers.push(slots);
        }
        Ok(Self { config, layers })
    }

    /// The scale `alpha / rank` of the adapter update.
    pub fn scale(&self) -> f32 {
        self.config.alpha / self.config.rank as f32
    }

    /// The adapter of a layer's projection, if adapted.
    pub fn adapter(&self, layer: usize, t: LoraTarget) -> Option<&Adapter<B>> {
        self.layers.get(layer)?.get(t.slot())?.as_ref()
    }

    /// The adapter of a layer's projection, mutably.
    pub fn adapter_mut(&mut self, layer: usize, t: LoraTarget) -> Option<&mut Adapter<B>> {
        self.layers.get_mut(layer)?.get_mut(t.slot())?.as_mut()
    }

    /// The adapter tensors with their PEFT names, in a fixed order.
    pub fn params(&self) -> Vec<(String, &Tensor<B>)> {
        let mut v = Vec::new();
        for (l, slots) in self.layers.iter().enumerate() {
            for &t in &LoraTarget::ALL {
                if let Some(ad) = &slots[t.slot()] {
                    v.push((peft_name(l, t, "A"), &ad.a));
                    v.push((peft_name(l, t, "B"), &ad.b));
                }
            }
        }
        v
    }

    /// The adapter tensors, mutably, in the order of [`Lora::params`].
    pub fn params_mut(&mut self) -> Vec<(String, &mut Tensor<B>)> {
        let mut v = Vec::new();
        for (l, slots) in self.layers.iter_mut().enumerate() {
            for (s, slot) in slots.iter_mut().enumerate() {
                if let Some(ad) = slot {
                    let t = LoraTarget::ALL[s];
                    v.push((peft_name(l, t, "A"), &mut ad.a));
                    v.push((peft_name(l, t, "B"), &mut ad.b));
                }
            }
        }
        v
    }

    /// Zero tensors of the same shapes (the adapters' gradients).
    pub fn zeros_like(&self, backend: &B) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for slots in &self.layers {
            let mut out = Vec::with_capacity(slots.len());
            for s in slots {
                out.push(match s {
                    Some(ad) => Some(Adapter {
                        a: backend.zeros(ad.a.shape(), DType::F32)?,
                        b: backend.zeros(ad.b.shape(), DType::F32)?,
                    }),
                    None => None,
                });
            }
            layers.push(out);
        }
        Ok(Self {
            config: self.config.clone(),
            layers,
        })
    }

    /// Writes a PEFT adapter directory: `adapter_config.json` and `adapter_model.safetensors`.
    pub fn save_peft(&self, backend: &B, dir: &Path, base_model: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let mut tensors = BTreeMap::new();
        for (name, t) in self.params() {
            tensors.insert(name, HostTensor::f32(t.shape(), &backend.to_host_f32(t)?));
        }
        save_safetensors(&dir.join("adapter_model.safetensors"), &tensors)?;
        let modules: Vec<&str> = self.config.targets.iter().map(|t| t.module()).collect();
        let cfg = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": self.config.rank,
            "lora_alpha": self.config.alpha,
            "lora_dropout": 0.0,
            "target_modules": modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
        });
        let text = serde_json::to_string_pretty(&cfg).unwrap_or_default();
        write_atomic(&dir.join("adapter_config.json"), text.as_bytes())?;
        Ok(())
    }

    /// Reads a PEFT adapter directory written by sorft or peft for a model of config `mc`.
    pub fn load_peft(backend: &B, dir: &Path, mc: &ModelConfig) -> Result<Self> {
        let cpath = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cpath).map_err(|e| TrainError::io(&cpath, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| TrainError::invalid(&cpath, "json", e.to_string()))?;
        let rank = v
            .get("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| TrainError::invalid(&cpath, "r", "missing or not a positive integer"))?
            as usize;
        let alpha =
            v.get("lora_alpha").and_then(Value::as_f64).ok_or_else(|| {
                TrainError::invalid(&cpath, "lora_alpha", "missing or not a number")
            })? as f32;
        let mods = v
            .get("target_modules")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                TrainError::invalid(&cpath, "target_modules", "missing or not a list")
            })?;
        let mut targets = Vec::new();
        for m in mods {
            let s = m.as_str().unwrap_or("");
            let t = LoraTarget::parse(s).ok_or_else(|| {
                TrainError::invalid(&cpath, "target_modules", format!("unknown module {s:?}"))
            })?;
            targets.push(t);
        }
        targets.sort();
        targets.dedup();
        let wpath = dir.join("adapter_model.safetensors");
        let files = read_f32_tensors(&wpath)?;
        let load = |name: &str, shape: &[usize]| -> Result<Tensor<B>> {
            let (sh, data) = files
                .get(name)
                .ok_or_else(|| TrainError::invalid(&wpath, name, "tensor missing"))?;
            if sh != shape {
                return Err(TrainError::invalid(
                    &wpath,
                    name,
                    format!("shape {sh:?}, expected {shape:?}"),
                ));
            }
            Ok(backend.upload_f32_exact(data, shape)?)
        };
        let config = LoraConfig {
            rank,
            alpha,
            targets,
        };
        let mut layers = Vec::with_capacity(mc.num_layers);
        for l in 0..mc.num_layers {
            let mut slots: Vec<Option<Adapter<B>>> = (0..7).map(|_| None).collect();
            for &t in &config.targets {
                let (out, inp) = t.dims(mc);
                slots[t.slot()] = Some(Adapter {
                    a: load(&peft_name(l, t, "A"), &[rank, inp])?,
                    b: load(&peft_name(l, t, "B"), &[out, rank])?,
                });
            }
            layers.push(slots);
        }
        Ok(Self { config, layers })
    }

    /// Adds `s * B @ A` to every adapted base weight of `model` (the merged model).
    pub fn merge_into(&self, model: &mut Model<B>) -> Result<()> {
        let b = model.backend.clone();
        let s = self.scale();
        for (l, blk) in model.blocks.iter_mut().enumerate() {
            for &t in &LoraTarget::ALL {
                let Some(ad) = self.adapter(l, t) else {
                    continue;
                };
                let w = match t {
                    LoraTarget::Q => &mut blk.q,
                    LoraTarget::K => &mut blk.k,
                    LoraTarget::V => &mut blk.v,
                    LoraTarget::O => &mut blk.o,
                    LoraTarget::Gate => &mut blk.gate,
                    LoraTarget::Up => &mut blk.up,
                    LoraTarget::Down => &mut blk.down,
                };
                let mut delta = b.zeros(w.shape(), DType::F32)?;
                b.matmul(&ad.b, false, &ad.a, false, &mut delta, false)?;
                b.axpy(w, s, &delta)?;
            }
        }
        Ok(())
    }
}
