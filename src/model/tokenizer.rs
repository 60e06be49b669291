//! The tokenizer: a Hugging Face `tokenizer.json` through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use crate::model::error::{ModelError, Result};

/// The ChatML turn opener.
pub const IM_START: &str = "<|im_start|>";
/// The ChatML turn closer (and end of an assistant answer).
pub const IM_END: &str = "<|im_end|>";
/// The end-of-text token.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A loaded tokenizer with the special tokens sorft uses.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            ));
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::invalid(path, "tokenizer", e.to_string()))?;
        Ok(Self {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Wraps an in-memory tokenizer (`path` is used in messages).
    pub fn from_inner(inner: tokenizers::Tokenizer, path: PathBuf) -> Self {
        Self { inner, path }
    }

    /// The underlying `tokenizers` object.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The file it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of ids the tokenizer can produce (vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        let max_added = self
            .inner
            .get_added_tokens_decoder()
            .keys()
            .map(|&k| k as usize + 1)
            .max()
            .unwrap_or(0);
        self.inner.get_vocab_size(true).max(max_added)
    }

    /// Checks that every id the tokenizer produces fits a model vocabulary of `model_vocab`.
    pub fn check_fits(&self, model_vocab: usize) -> Result<()> {
        let n = self.vocab_size();
        if n > model_vocab {
            return Err(ModelError::invalid(
                &self.path,
                "model.vocab",
                format!("{n} tokens do not fit the model's vocab_size {model_vocab}"),
            ));
        }
        Ok(())
    }

    /// Encodes text; special tokens written in the text (`<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::invalid(&self.path, "encode", e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text, optionally dropping special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::invalid(&self.path, "decode", e.to_string()))
    }

    /// The id of a token string, if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The string of a token id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// End-of-sequence ids: `<|im_end|>` and `<|endoftext|>` where present.
    pub fn stop_ids(&self) -> Vec<u32> {
        [IM_END, END_OF_TEXT]
            .iter()
            .filter_map(|t| self.token_id(t))
            .collect()
    }
}
