//! The embedded default model: a randomly initialised Qwen2-architecture model and a byte-level
//! BPE tokenizer trained on a corpus embedded in the binary (or given by the user).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;
use tokenizers::SplitDelimiterBehavior;

use crate::engine::rng::SplitMix;
use crate::model::config::{Family, ModelConfig};
use crate::model::error::{ModelError, Result};
use crate::model::tokenizer::{END_OF_TEXT, IM_END, IM_START};
use crate::model::weights::{save_safetensors, write_atomic, HostTensor};

/// The corpus embedded in the binary for tokenizer training.
pub const EMBEDDED_CORPUS: &str = include_str!("../../assets/corpus.txt");

/// A named model size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// For tests: under 1 MB of weights.
    Tiny,
    /// The embedded default that `sorft repro` trains: a few million parameters.
    Small,
    /// Qwen2.5-0.5B's shape (494M parameters, vocabulary 151936) with random weights and the
    /// embedded tokenizer: for memory and speed measurements at a real size, not for training.
    #[value(name = "qwen2.5-0.5b-shape")]
    #[serde(rename = "qwen2.5-0.5b-shape")]
    Qwen05bShape,
}

/// Shape of a preset.
#[derive(Clone, Copy, Debug)]
pub struct PresetSpec {
    /// Width.
    pub hidden: usize,
    /// Blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Target tokenizer vocabulary.
    pub vocab: usize,
    /// Context length.
    pub max_positions: usize,
}

impl Preset {
    /// The preset's shape.
    pub fn spec(self) -> PresetSpec {
        match self {
            Preset::Tiny => PresetSpec {
                hidden: 64,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                intermediate: 128,
                vocab: 512,
                max_positions: 2048,
            },
            Preset::Small => PresetSpec {
                hidden: 256,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                intermediate: 704,
                vocab: 4096,
                max_positions: 4096,
            },
            Preset::Qwen05bShape => PresetSpec {
                hidden: 896,
                layers: 24,
                heads: 14,
                kv_heads: 2,
                intermediate: 4864,
                vocab: 4096,
                max_positions: 32768,
            },
        }
    }

    /// The model's vocabulary when it is fixed by the shape rather than by the tokenizer.
    pub fn model_vocab(self) -> Option<usize> {
        match self {
            Preset::Qwen05bShape => Some(151_936),
            Preset::Tiny | Preset::Small => None,
        }
    }
}

/// Trains a byte-level BPE tokenizer with the ChatML special tokens (those of [`CHAT_TEMPLATE`]).
pub fn train_tokenizer(texts: &[String], vocab: usize) -> Result<tokenizers::Tokenizer> {
    let err = |e: tokenizers::Error| ModelError::invalid("tokenizer.json", "train", e.to_string());
    let specials: Vec<AddedToken> = [END_OF_TEXT, IM_START, IM_END]
        .iter()
        .map(|t| AddedToken::from(t.to_string(), true))
        .collect();
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::BpeTrainer(trainer);
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    // Whitespace runs are pieces of their own, so a word is the same tokens whether a space,
    // a slash or a line start precedes it: `umber3` in `from umber3 import x`, in the tree view
    // and at the start of an answer path. Copying a name the model has never seen from the
    // prompt into the answer is then a plain token-for-token copy.
    let split = Split::new(
        SplitPattern::Regex(r"\s+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(err)?;
    tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true)),
    ]))));
    tok.with_decoder(Some(ByteLevel::new(false, false, true)));
    tok.with_post_processor(Some(ByteLevel::new(false, false, true)));
    tok.train(&mut trainer, texts.iter()).map_err(err)?;
    Ok(tok)
}

/// Random weights for a configuration: matrices ~ N(0, 0.02), norms 1, biases 0.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let mut rng = SplitMix::new(seed);
    let mut normal = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| (rng.next_normal() * 0.02) as f32).collect();
        HostTensor::f32(shape, &v)
    };
    let (d, hd) = (cfg.hidden_size, cfg.head_dim);
    let (q, kv, i) = (
        cfg.num_heads * hd,
        cfg.num_kv_heads * hd,
        cfg.intermediate_size,
    );
    let mut w = BTreeMap::new();
    w.insert(
        "model.embed_tokens.weight".into(),
        normal(&[cfg.vocab_size, d]),
    );
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        w.insert(format!("{p}.self_attn.q_proj.weight"), normal(&[q, d]));
        w.insert(format!("{p}.self_attn.k_proj.weight"), normal(&[kv, d]));
        w.insert(format!("{p}.self_attn.v_proj.weight"), normal(&[kv, d]));
        w.insert(format!("{p}.self_attn.o_proj.weight"), normal(&[d, q]));
        w.insert(format!("{p}.mlp.gate_proj.weight"), normal(&[i, d]));
        w.insert(format!("{p}.mlp.up_proj.weight"), normal(&[i, d]));
        w.insert(format!("{p}.mlp.down_proj.weight"), normal(&[d, i]));
        if cfg.qkv_bias {
            for (name, n) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                w.insert(
                    format!("{p}.self_attn.{name}.bias"),
                    HostTensor::f32(&[n], &vec![0.0; n]),
                );
            }
        }
        for name in ["input_layernorm", "post_attention_layernorm"] {
            w.insert(
                format!("{p}.{name}.weight"),
                HostTensor::f32(&[d], &vec![1.0; d]),
            );
        }
    }
    w.insert(
        "model.norm.weight".into(),
        HostTensor::f32(&[d], &vec![1.0; d]),
    );
    if !cfg.tie_word_embeddings {
        w.insert("lm_head.weight".into(), normal(&[cfg.vocab_size, d]));
    }
    w
}

/// What `init_model` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct InitSummary {
    /// The configuration.
    pub config: ModelConfig,
    /// Parameters.
    pub params: usize,
    /// Tokenizer vocabulary (with special tokens).
    pub tokenizer_vocab: usize,
}

/// The presets' chat template (ChatML with Qwen2's default system message), shipped in their
/// `tokenizer_config.json` like any Hugging Face model's.
pub const CHAT_TEMPLATE: &str = "{% if not messages or messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| ModelError::invalid(path, "json", e.to_string()))?;
    write_atomic(path, text.as_bytes())
}

/// Creates a randomly initialised Qwen2-architecture model directory: `config.json`,
/// `generation_config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`.
pub fn init_model(preset: Preset, out: &Path, seed: u64, corpus: &[String]) -> Result<InitSummary> {
    let spec = preset.spec();
    std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    let tok = train_tokenizer(corpus, spec.vocab)?;
    let wrapped = crate::model::Tokenizer::from_inner(tok.clone(), out.join("tokenizer.json"));
    let tokenizer_vocab = wrapped.vocab_size();
    let vocab = preset
        .model_vocab()
        .unwrap_or(tokenizer_vocab.div_ceil(64) * 64);
    let eos: Vec<u32> = [IM_END, END_OF_TEXT]
        .iter()
        .filter_map(|t| wrapped.token_id(t))
        .collect();
    let config = ModelConfig {
        family: Family::Qwen2,
        vocab_size: vocab,
        hidden_size: spec.hidden,
        num_layers: spec.layers,
        num_heads: spec.heads,
        num_kv_heads: spec.kv_heads,
        head_dim: spec.hidden / spec.heads,
        intermediate_size: spec.intermediate,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        max_position_embeddings: spec.max_positions,
        eos_token_ids: eos.clone(),
        bos_token_id: None,
    };
    let weights = random_weights(&config, seed);
    save_safetensors(&out.join("model.safetensors"), &weights)?;
    write_json(&out.join("config.json"), &config.to_hf_json())?;
    write_json(
        &out.join("generation_config.json"),
        &serde_json::json!({ "eos_token_id": eos, "do_sample": false }),
    )?;
    let tok_json = tok
        .to_string(true)
        .map_err(|e| ModelError::invalid(out.join("tokenizer.json"), "serialize", e.to_string()))?;
    write_atomic(&out.join("tokenizer.json"), tok_json.as_bytes())?;
    write_json(
        &out.join("tokenizer_config.json"),
        &serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": IM_END,
            "pad_token": END_OF_TEXT,
            "model_max_length": spec.max_positions,
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;
    Ok(InitSummary {
        params: config.num_params(),
        config,
        tokenizer_vocab,
    })
}
