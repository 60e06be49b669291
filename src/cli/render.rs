//! `sorft model render`: prints the exact text (or token ids) sorft feeds a model for a
//! conversation, rendered with the model's own chat template, to check against a serving stack.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;

use sorft::model::chat::{self, Message};
use sorft::model::Tokenizer;

/// Arguments of `sorft model render`.
#[derive(Args, Debug)]
pub struct RenderArgs {
    /// Model directory (`tokenizer.json` and `tokenizer_config.json` or `chat_template.jinja`).
    #[arg(long)]
    pub model: PathBuf,
    /// JSON file with the conversation: a list of `{"role", "content"}` or `{"messages": [...]}`.
    #[arg(long)]
    pub messages: PathBuf,
    /// End with the assistant turn opener, as for generation.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// Print the token ids (a JSON list) instead of the text.
    #[arg(long)]
    pub ids: bool,
    /// Print the supervised fine-tuning mask (a JSON list, 1 on the assistant's tokens) instead.
    #[arg(long, conflicts_with = "ids")]
    pub mask: bool,
}

/// Reads a conversation file; errors name the file and the message.
pub fn read_messages(path: &Path) -> Result<Vec<Message>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    let list = match &v {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("messages") {
            Some(Value::Array(a)) => a,
            _ => bail!("{}: expected a \"messages\" list", path.display()),
        },
        _ => bail!("{}: expected a list of messages", path.display()),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |k: &str| {
                m.get(k).and_then(Value::as_str).with_context(|| {
                    format!(
                        "{}: messages[{i}].{k}: missing or not a string",
                        path.display()
                    )
                })
            };
            Ok(Message::new(field("role")?, field("content")?))
        })
        .collect()
}

/// Runs `sorft model render`.
pub fn run(a: RenderArgs) -> Result<()> {
    let messages = read_messages(&a.messages)?;
    let tok = Tokenizer::from_file(&a.model.join("tokenizer.json"))?;
    if a.ids || a.mask {
        let (ids, mask) = chat::encode(&tok, &messages, a.add_generation_prompt)?;
        let line = if a.ids {
            serde_json::to_string(&ids)?
        } else {
            serde_json::to_string(&mask)?
        };
        println!("{line}");
    } else {
        let text = chat::render(&tok, &messages, a.add_generation_prompt)?;
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    Ok(())
}
