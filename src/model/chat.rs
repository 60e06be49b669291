//! Conversations in a model's own chat format: rendered with the model's chat template
//! ([`crate::model::template`]), encoded to ids, with a mask on the tokens the assistant writes.
//!
//! The assistant's tokens are the template's `{% generation %}` blocks where it has them;
//! otherwise they are found by rendering incrementally: assistant turn `i` starts where the
//! conversation before it, rendered with the generation prompt, ends, and ends where the
//! conversation up to it ends, or (for templates that render a turn differently once later turns
//! follow, as Qwen3's thinking blocks) at the first stop token after its start. Text after the
//! turn's last stop token (the newline after `<|im_end|>`) is not the assistant's: the model
//! stops before writing it.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::model::error::{ModelError, Result};
use crate::model::template::{ChatTemplate, TemplateMessage};
use crate::model::tokenizer::Tokenizer;

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

fn template_messages(messages: &[Message]) -> Result<Vec<TemplateMessage<'_>>> {
    messages
        .iter()
        .map(|m| {
            check_role(&m.role)?;
            Ok(TemplateMessage {
                role: &m.role,
                content: &m.content,
            })
        })
        .collect()
}

/// Renders a conversation with the model's chat template, with the assistant opener when
/// `add_generation_prompt`: the exact text sorft feeds the model.
pub fn render(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<String> {
    tok.chat_template()?
        .render(&template_messages(messages)?, add_generation_prompt)
}

/// The strings that end an assistant turn: the stop tokens' and the template's `eos_token`.
fn stop_strings(tok: &Tokenizer, t: &ChatTemplate) -> Vec<String> {
    let mut out: Vec<String> = tok
        .stop_ids()
        .iter()
        .filter_map(|&id| tok.id_to_token(id))
        .collect();
    out.extend(t.special("eos_token").map(str::to_string));
    out.retain(|s| !s.is_empty());
    out
}

/// Where the assistant's text in `span` ends: after its last stop string, or at its end.
fn trim_after_stop(text: &str, span: Range<usize>, stops: &[String]) -> Range<usize> {
    let body = &text[span.clone()];
    let end = stops
        .iter()
        .filter_map(|s| body.rfind(s.as_str()).map(|i| i + s.len()))
        .max()
        .unwrap_or(body.len());
    span.start..span.start + end
}

/// Renders a conversation and finds the byte ranges of the assistant's text in it (see the module
/// documentation); an error when the template gives no way to find them.
pub fn assistant_spans(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<(String, Vec<Range<usize>>)> {
    let t = tok.chat_template()?;
    let msgs = template_messages(messages)?;
    let (text, marked) = t.render_marked(&msgs, add_generation_prompt)?;
    let turns: Vec<usize> = (0..msgs.len())
        .filter(|&i| msgs[i].role == "assistant")
        .collect();
    if turns.is_empty() {
        return Ok((text, Vec::new()));
    }
    if t.has_generation() {
        if marked.is_empty() {
            return Err(no_mask(t, "its {% generation %} blocks marked no text"));
        }
        return Ok((text, marked));
    }
    let stops = stop_strings(tok, t);
    let mut spans = Vec::with_capacity(turns.len());
    for i in turns {
        let before = t.render(&msgs[..i], true)?;
        if !text.starts_with(&before) {
            return Err(no_mask(
                t,
                &format!("the conversation before message {i}, with the generation prompt, is not a prefix of the whole"),
            ));
        }
        let upto = t.render(&msgs[..=i], false)?;
        let span = if upto.len() > before.len()
            && upto.starts_with(&before)
            && text.starts_with(&upto)
        {
            trim_after_stop(&text, before.len()..upto.len(), &stops)
        } else {
            let rest = &text[before.len()..];
            let end = stops
                .iter()
                .filter_map(|s| rest.find(s.as_str()).map(|j| j + s.len()))
                .min()
                .ok_or_else(|| {
                    no_mask(t, &format!("message {i} renders differently once later turns follow, and no stop token ends it"))
                })?;
            before.len()..before.len() + end
        };
        if span.is_empty()
            || spans
                .last()
                .is_some_and(|p: &Range<usize>| p.end > span.start)
        {
            return Err(no_mask(t, &format!("message {i} has no text of its own")));
        }
        spans.push(span);
    }
    Ok((text, spans))
}

fn no_mask(t: &ChatTemplate, why: &str) -> ModelError {
    ModelError::invalid(
        t.origin(),
        "chat_template",
        format!("cannot find the assistant's tokens for supervised training: {why}"),
    )
}

/// Encodes a conversation in the model's chat format; the mask is 1 on the tokens of assistant
/// answers (the tokens a supervised fine-tuning loss is computed on). Text is encoded in pieces
/// split where assistant answers start and end, so no token straddles a mask boundary; a prompt
/// without assistant turns is encoded whole, as transformers' `apply_chat_template` does.
pub fn encode(
    tok: &Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
) -> Result<(Vec<u32>, Vec<u8>)> {
    let (text, spans) = assistant_spans(tok, messages, add_generation_prompt)?;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut push = |range: Range<usize>, train: bool| -> Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let t = tok.encode(&text[range])?;
        mask.extend(std::iter::repeat_n(train as u8, t.len()));
        ids.extend(t);
        Ok(())
    };
    let mut at = 0;
    for s in spans {
        push(at..s.start, false)?;
        push(s.clone(), true)?;
        at = s.end;
    }
    push(at..text.len(), false)?;
    Ok((ids, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    fn tok_with(template: &str) -> Tokenizer {
        let inner = crate::model::init::train_tokenizer(
            &["hello world assistant user system helpful".to_string()],
            300,
        )
        .unwrap();
        let cfg = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"});
        let t = ChatTemplate::new(template, Path::new("tokenizer_config.json"), &cfg).unwrap();
        Tokenizer::from_inner(inner, "tokenizer.json".into()).with_chat_template(t)
    }

    fn conv() -> Vec<Message> {
        vec![
            Message::new("user", "hello"),
            Message::new("assistant", "world"),
            Message::new("user", "hello again"),
            Message::new("assistant", "world world"),
        ]
    }

    fn masked_text(tok: &Tokenizer, messages: &[Message]) -> String {
        let (ids, mask) = encode(tok, messages, false).unwrap();
        let on: Vec<u32> = ids
            .iter()
            .zip(&mask)
            .filter(|p| *p.1 == 1)
            .map(|p| *p.0)
            .collect();
        tok.decode(&on, false).unwrap()
    }

    #[test]
    fn chatml_masks_assistant_content_and_its_end_token_only() {
        let tok = tok_with(CHATML);
        assert_eq!(
            masked_text(&tok, &conv()),
            "world<|im_end|>world world<|im_end|>"
        );
        let (ids, _) = encode(&tok, &conv(), false).unwrap();
        let text = render(&tok, &conv(), false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }

    #[test]
    fn turns_rendered_differently_later_end_at_the_stop_token() {
        // Like Qwen3: the last assistant turn gets an empty thinking block, earlier ones do not.
        let tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}<think></think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let tok = tok_with(tmpl);
        assert_eq!(
            masked_text(&tok, &conv()),
            "world<|im_end|><think></think>world world<|im_end|>"
        );
    }

    #[test]
    fn a_template_without_findable_assistant_text_is_an_error() {
        // The assistant's answers are not rendered at all: nothing to train on.
        let tmpl = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}\n{% endif %}{% endfor %}";
        let tok = tok_with(tmpl);
        let e = encode(&tok, &conv(), false).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("assistant's tokens"),
            "{e}"
        );
    }

    #[test]
    fn generation_blocks_decide_the_mask() {
        let tmpl = "{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}";
        let tok = tok_with(tmpl);
        assert_eq!(masked_text(&tok, &conv()), "world!world world!");
    }

    #[test]
    fn no_template_and_unknown_roles_are_errors() {
        let inner = crate::model::init::train_tokenizer(&["hello".to_string()], 300).unwrap();
        let tok = Tokenizer::from_inner(inner, "m/tokenizer.json".into());
        let e = render(&tok, &conv(), true).unwrap_err().to_string();
        assert!(
            e.contains("m/tokenizer_config.json") && e.contains("chat_template"),
            "{e}"
        );
        let tok = tok_with(CHATML);
        assert!(render(&tok, &[Message::new("tool", "x")], false).is_err());
    }
}
