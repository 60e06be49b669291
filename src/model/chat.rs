//! The ChatML chat template of Qwen models, written in Rust.
//!
//! ```text
//! <|im_start|>system
//! You are a helpful assistant.<|im_end|>
//! <|im_start|>user
//! Hello<|im_end|>
//! <|im_start|>assistant
//! ```

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::tokenizer::{Tokenizer, IM_END, IM_START};

/// The system message used when a conversation has none.
pub const DEFAULT_SYSTEM: &str = "You are a helpful assistant.";

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

fn check_role(role: &str) -> Result<()> {
    match role {
        "system" | "user" | "assistant" => Ok(()),
        other => Err(ModelError::Input(format!(
            "message role {other:?} is not system, user or assistant"
        ))),
    }
}

/// The pieces of a rendered conversation: `(text, is_assistant_content)`.
fn pieces(messages: &[Message], add_generation_prompt: bool) -> Result<Vec<(String, bool)>> {
    let mut out = Vec::new();
    if messages.first().map(|m| m.role.as_str()) != Some("system") {
        out.push((
            format!("{IM_START}system\n{DEFAULT_SYSTEM}{IM_END}\n"),
            false,
        ));
    }
    for m in messages {
        check_role(&m.role)?;
        out.push((format!("{IM_START}{}\n", m.role), false));
        if m.role == "assistant" {
            out.push((m.content.clone(), true));
            out.push((IM_END.to_string(), true));
            out.push(("\n".to_string(), false));
        } else {
            out.push((format!("{}{IM_END}\n", m.content), false));
        }
    }
    if add_generation_prompt {
        out.push((format!("{IM_START}assistant\n"), false));
    }
    Ok(out)
}

/// Renders a conversation as ChatML text, with the assistant opener when `add_generation_prompt`.
pub fn render(messages: &[Message], add_generation_prompt: bool) -> Result<String> {
    Ok(pieces(messages, add_generation_prompt)?
        .into_iter()
        .map(|p| p.0)
        .collect())
}

/// Encodes a conversation; the mask is 1 on the tokens of assistant answers (their content and
/// closing `<|im_end|>`), the tokens a supervised fine-tuning loss is computed on.
pub fn encode(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<(Vec<u32>, Vec<u8>)> {
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for (text, train) in pieces(messages, add_generation_prompt)? {
        if text.is_empty() {
            continue;
        }
        let t = tok.encode(&text)?;
        mask.extend(std::iter::repeat_n(train as u8, t.len()));
        ids.extend(t);
    }
    Ok((ids, mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_default_system_and_generation_prompt() {
        let s = render(&[Message::new("user", "Hi")], true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn keeps_a_given_system_message_and_closes_assistant_turns() {
        let s = render(
            &[
                Message::new("system", "S"),
                Message::new("user", "U"),
                Message::new("assistant", "A"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        );
    }

    #[test]
    fn rejects_unknown_roles() {
        assert!(render(&[Message::new("tool", "x")], false).is_err());
    }
}
