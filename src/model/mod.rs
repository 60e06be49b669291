//! Models: Hugging Face configs, memory-mapped safetensors weights, the Qwen2/Llama transformer
//! forward with a KV cache, batched generation, the tokenizer with the model's own chat
//! template and stop tokens, and the embedded default model.

pub mod adapter;
pub mod chat;
pub mod config;
pub mod constraint;
pub mod error;
pub mod generate;
pub mod init;
pub mod kv_cache;
pub mod plan;
pub mod random;
pub mod st_writer;
pub mod template;
pub mod tojson;
pub mod token_trie;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use config::ModelConfig;
pub use error::ModelError;
pub use generate::{generate, FinishReason, GenOutput, GenRequest};
pub use kv_cache::KvCache;
pub use tokenizer::Tokenizer;
pub use transformer::Model;

use std::path::Path;

use crate::engine::Backend;

/// Loads a model directory: the model, and its tokenizer when `tokenizer.json` exists (checked
/// to fit the model's vocabulary).
pub fn load_dir<B: Backend>(
    backend: &B,
    dir: &Path,
) -> error::Result<(Model<B>, Option<Tokenizer>)> {
    if !dir.is_dir() {
        return Err(ModelError::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
        ));
    }
    let model = Model::load(backend, dir)?;
    let tok_path = dir.join("tokenizer.json");
    let tok = if tok_path.exists() {
        let t = Tokenizer::from_file(&tok_path)?;
        t.check_fits(model.config.vocab_size)?;
        Some(t)
    } else {
        None
    };
    Ok((model, tok))
}
