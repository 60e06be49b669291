//! The model configuration, read from a Hugging Face `config.json` (Qwen2 and Llama families).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::error::{ModelError, Result};

/// Architecture family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen2 / Qwen2.5 (QKV bias).
    Qwen2,
    /// Llama (optional attention bias).
    Llama,
}

/// The hyper-parameters a forward pass needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Architecture family.
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether the attention output projection has a bias (Llama's `attention_bias`).
    #[serde(default)]
    pub o_bias: bool,
    /// Longest supported sequence.
    pub max_position_embeddings: usize,
    /// End-of-sequence token ids named by the config.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token id, if any.
    pub bos_token_id: Option<u32>,
}

fn get_usize(v: &Value, key: &str, path: &Path) -> Result<usize> {
    match v.get(key) {
        Some(x) => x
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| {
                ModelError::invalid(path, key, format!("expected a positive integer, got {x}"))
            }),
        None => Err(ModelError::invalid(path, key, "missing")),
    }
}

fn get_f32(v: &Value, key: &str, default: f32, path: &Path) -> Result<f32> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0)
            .map(|f| f as f32)
            .ok_or_else(|| {
                ModelError::invalid(path, key, format!("expected a positive number, got {x}"))
            }),
    }
}

fn get_bool(v: &Value, key: &str, default: bool, path: &Path) -> Result<bool> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_bool().ok_or_else(|| {
            ModelError::invalid(path, key, format!("expected true or false, got {x}"))
        }),
    }
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .map(|x| vec![x])
            .unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .filter_map(|x| u32::try_from(x).ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// The stop token ids of a model directory: `eos_token_id` of `generation_config.json` (one id or
/// a list, as Llama 3.1's 128001, 128008, 128009), else of `config.json`; empty when neither names
/// one. A value that is not an id or a list of ids is an error naming the file.
pub fn generation_eos_ids(dir: &Path) -> Result<Vec<u32>> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::invalid(&path, "json", e.to_string()))?;
        let ids = match v.get("eos_token_id") {
            None | Some(Value::Null) => continue,
            Some(x @ (Value::Number(_) | Value::Array(_))) => {
                let n = match x {
                    Value::Array(a) => a.len(),
                    _ => 1,
                };
                let ids = token_ids(Some(x));
                if ids.len() != n {
                    return Err(ModelError::invalid(
                        &path,
                        "eos_token_id",
                        format!("expected token ids, got {x}"),
                    ));
                }
                ids
            }
            Some(x) => {
                return Err(ModelError::invalid(
                    &path,
                    "eos_token_id",
                    format!("expected a token id or a list of them, got {x}"),
                ))
            }
        };
        return Ok(ids);
    }
    Ok(Vec::new())
}

impl ModelConfig {
    /// Reads `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::invalid(path, "json", e.to_string()))?;
        Self::from_json(&v, path)
    }

    /// Interprets a parsed `config.json`; `path` is used in error messages.
    pub fn from_json(v: &Value, path: &Path) -> Result<Self> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let family = match model_type {
            "qwen2" => Family::Qwen2,
            "llama" => Family::Llama,
            "" => {
                return Err(ModelError::invalid(path, "model_type", "missing"));
            }
            other => {
                return Err(ModelError::Unsupported {
                    path: path.into(),
                    msg: format!("model_type {other:?} (sorft runs qwen2 and llama)"),
                })
            }
        };
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(ModelError::Unsupported {
                    path: path.into(),
                    msg: format!("hidden_act {act:?} (only silu)"),
                });
            }
        }
        // transformers < 5 writes `rope_theta` and `rope_scaling`; 5.x writes `rope_parameters`.
        for key in ["rope_scaling", "rope_parameters"] {
            if let Some(rs) = v.get(key).filter(|x| !x.is_null()) {
                let kind = rs
                    .get("rope_type")
                    .or_else(|| rs.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if kind != "default" {
                    return Err(ModelError::Unsupported {
                        path: path.into(),
                        msg: format!("{key} of type {kind:?} (only plain RoPE)"),
                    });
                }
            }
        }
        let rope_theta = match v.get("rope_parameters").and_then(|r| r.get("rope_theta")) {
            Some(_) => get_f32(&v["rope_parameters"], "rope_theta", 10_000.0, path)?,
            None => get_f32(v, "rope_theta", 10_000.0, path)?,
        };
        if get_bool(v, "mlp_bias", false, path)? {
            return Err(ModelError::Unsupported {
                path: path.into(),
                msg: "mlp_bias = true".into(),
            });
        }
        let hidden_size = get_usize(v, "hidden_size", path)?;
        let num_heads = get_usize(v, "num_attention_heads", path)?;
        let num_kv_heads = match v.get("num_key_value_heads") {
            None | Some(Value::Null) => num_heads,
            Some(_) => get_usize(v, "num_key_value_heads", path)?,
        };
        let head_dim = match v.get("head_dim") {
            None | Some(Value::Null) => {
                if hidden_size % num_heads != 0 {
                    return Err(ModelError::invalid(
                        path,
                        "num_attention_heads",
                        format!("{num_heads} does not divide hidden_size {hidden_size}"),
                    ));
                }
                hidden_size / num_heads
            }
            Some(_) => get_usize(v, "head_dim", path)?,
        };
        if num_heads % num_kv_heads != 0 {
            return Err(ModelError::invalid(
                path,
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(ModelError::invalid(
                path,
                "head_dim",
                format!("{head_dim} is odd"),
            ));
        }
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            Family::Llama => {
                let b = get_bool(v, "attention_bias", false, path)?;
                (b, b)
            }
        };
        let eos = token_ids(v.get("eos_token_id"));
        let bos = token_ids(v.get("bos_token_id")).first().copied();
        Ok(Self {
            family,
            vocab_size: get_usize(v, "vocab_size", path)?,
            hidden_size,
            num_layers: get_usize(v, "num_hidden_layers", path)?,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: get_usize(v, "intermediate_size", path)?,
            rope_theta,
            rms_norm_eps: get_f32(v, "rms_norm_eps", 1e-6, path)?,
            tie_word_embeddings: get_bool(v, "tie_word_embeddings", false, path)?,
            qkv_bias,
            o_bias,
            max_position_embeddings: match v.get("max_position_embeddings") {
                None | Some(Value::Null) => 32_768,
                Some(_) => get_usize(v, "max_position_embeddings", path)?,
            },
            eos_token_ids: eos,
            bos_token_id: bos,
        })
    }

    /// The Hugging Face `config.json` for this configuration (transformers can load it).
    pub fn to_hf_json(&self) -> Value {
        let (model_type, arch) = match self.family {
            Family::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
            Family::Llama => ("llama", "LlamaForCausalLM"),
        };
        let mut v = serde_json::json!({
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
            "use_cache": true,
            "rope_parameters": { "rope_type": "default", "rope_theta": self.rope_theta },
        });
        if let Some(obj) = v.as_object_mut() {
            if self.family == Family::Llama {
                obj.insert("attention_bias".into(), Value::Bool(self.qkv_bias));
                obj.insert("mlp_bias".into(), Value::Bool(false));
            }
            match self.eos_token_ids.as_slice() {
                [] => {}
                [one] => {
                    obj.insert("eos_token_id".into(), (*one).into());
                }
                many => {
                    obj.insert("eos_token_id".into(), many.to_vec().into());
                }
            }
            if let Some(b) = self.bos_token_id {
                obj.insert("bos_token_id".into(), b.into());
            }
        }
        v
    }

    /// Number of parameters (weights and biases).
    pub fn num_params(&self) -> usize {
        let (d, hd) = (self.hidden_size, self.head_dim);
        let q = self.num_heads * hd;
        let kv = self.num_kv_heads * hd;
        let attn = d * q
            + 2 * d * kv
            + q * d
            + if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.o_bias { d } else { 0 };
        let mlp = 3 * d * self.intermediate_size;
        let layer = attn + mlp + 2 * d;
        let embed = self.vocab_size * d;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + self.num_layers * layer + d
    }
}
