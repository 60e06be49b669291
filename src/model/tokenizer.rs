//! The tokenizer: a Hugging Face `tokenizer.json` through the `tokenizers` crate, with what the
//! files beside it say about conversations: the chat template (`tokenizer_config.json` or
//! `chat_template.jinja`) and the stop tokens (`generation_config.json`, `config.json`, the
//! tokenizer config's `eos_token`).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::model::error::{ModelError, Result};
use crate::model::template::{token_text, ChatTemplate};

/// The ChatML turn opener.
pub const IM_START: &str = "<|im_start|>";
/// The ChatML turn closer (and end of an assistant answer).
pub const IM_END: &str = "<|im_end|>";
/// The end-of-text token.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A loaded tokenizer with the chat template and stop tokens of its model directory.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    chat: Option<ChatTemplate>,
    stop_ids: Vec<u32>,
    /// The pieces' trie for constrained decoding, built on first use.
    index: std::sync::OnceLock<std::sync::Arc<crate::model::token_trie::VocabIndex>>,
}

/// Reads a JSON file of the model directory, `Null` when it does not exist.
fn read_json(path: &Path) -> Result<Json> {
    if !path.exists() {
        return Ok(Json::Null);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::invalid(path, "json", e.to_string()))
}

impl Tokenizer {
    /// Loads `tokenizer.json`, and from the same directory the chat template and the stop tokens.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            ));
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::invalid(path, "tokenizer", e.to_string()))?;
        let mut tok = Self::from_inner(inner, path.to_path_buf());
        let dir = path.parent().unwrap_or(Path::new("."));
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        tok.chat = ChatTemplate::load(dir, &config)?;
        let mut stops = crate::model::config::generation_eos_ids(dir)?;
        if let Some(id) = config
            .get("eos_token")
            .and_then(token_text)
            .and_then(|t| tok.token_id(&t))
        {
            stops.push(id);
        }
        if !stops.is_empty() {
            stops.sort_unstable();
            stops.dedup();
            tok.stop_ids = stops;
        }
        Ok(tok)
    }

    /// Wraps an in-memory tokenizer (`path` is used in messages): no chat template, and
    /// `<|im_end|>` and `<|endoftext|>` as stop tokens where present.
    pub fn from_inner(inner: tokenizers::Tokenizer, path: PathBuf) -> Self {
        let stop_ids = [IM_END, END_OF_TEXT]
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        Self {
            inner,
            path,
            chat: None,
            stop_ids,
            index: std::sync::OnceLock::new(),
        }
    }

    /// Every piece with its trie (built once, on first use; see [`crate::model::token_trie`]).
    pub fn vocab_index(&self) -> std::sync::Arc<crate::model::token_trie::VocabIndex> {
        self.index
            .get_or_init(|| {
                std::sync::Arc::new(crate::model::token_trie::VocabIndex::new(
                    crate::model::constraint::token_pieces(self),
                ))
            })
            .clone()
    }

    /// The same tokenizer with a chat template.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> Self {
        self.chat = Some(template);
        self
    }

    /// The model's chat template, or an error naming the file that lacks one.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.chat.as_ref().ok_or_else(|| {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            ModelError::invalid(
                dir.join("tokenizer_config.json"),
                "chat_template",
                "missing (and no chat_template.jinja beside it): this model has no chat format",
            )
        })
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

    /// Stop token ids: every `eos_token_id` of `generation_config.json` (else `config.json`) and
    /// the tokenizer config's `eos_token`; for a tokenizer without those, `<|im_end|>` and
    /// `<|endoftext|>` where present.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.stop_ids.clone()
    }
}
