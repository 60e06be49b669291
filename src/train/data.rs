//! JSONL for supervised fine-tuning: chat lines `{"messages":[{"role":..,"content":..},..]}`
//! (optional `"weight"`), encoded with the model's chat template so that the loss falls on
//! assistant tokens only, and plain-text lines `{"text": ".."}` for causal language modelling (loss on every
//! token; long documents are cut into windows); a deterministic held-out split; packed batches per
//! epoch.

use std::path::Path;

use serde_json::Value;

use crate::engine::rng::{mix64, SplitMix};
use crate::model::chat::{encode, Message};
use crate::model::Tokenizer;
use crate::train::error::{Result, TrainError};
use crate::train::forward::Sequence;

/// One conversation (or plain-text document) from a JSONL file.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatExample {
    /// The messages (empty for a plain-text document).
    pub messages: Vec<Message>,
    /// A plain-text document trained on every token, instead of messages.
    pub text: Option<String>,
    /// Loss weight of its tokens.
    pub weight: f32,
}

/// Parses a chat JSONL file; errors name the file, the line and the field.
pub fn read_chat_jsonl(path: &Path) -> Result<Vec<ChatExample>> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = |field: &str| format!("line {}: {field}", n + 1);
        let v: Value = serde_json::from_str(line)
            .map_err(|e| TrainError::invalid(path, at("json"), e.to_string()))?;
        let weight = match v.get("weight") {
            None | Some(Value::Null) => 1.0,
            Some(w) => w
                .as_f64()
                .filter(|w| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| {
                    TrainError::invalid(path, at("weight"), format!("{w} is not a number >= 0"))
                })? as f32,
        };
        if let Some(t) = v.get("text") {
            let text = t
                .as_str()
                .ok_or_else(|| TrainError::invalid(path, at("text"), "not a string"))?;
            out.push(ChatExample {
                messages: Vec::new(),
                text: Some(text.to_string()),
                weight,
            });
            continue;
        }
        let msgs = v.get("messages").and_then(Value::as_array).ok_or_else(|| {
            TrainError::invalid(
                path,
                at("messages"),
                "missing (and no \"text\") or not a list",
            )
        })?;
        let mut messages = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.iter().enumerate() {
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                TrainError::invalid(
                    path,
                    at(&format!("messages[{i}].role")),
                    "missing or not a string",
                )
            })?;
            if !matches!(role, "system" | "user" | "assistant") {
                return Err(TrainError::invalid(
                    path,
                    at(&format!("messages[{i}].role")),
                    format!("{role:?} is not system, user or assistant"),
                ));
            }
            let content = m.get("content").and_then(Value::as_str).ok_or_else(|| {
                TrainError::invalid(
                    path,
                    at(&format!("messages[{i}].content")),
                    "missing or not a string",
                )
            })?;
            messages.push(Message::new(role, content));
        }
        if !messages.iter().any(|m| m.role == "assistant") {
            return Err(TrainError::invalid(
                path,
                at("messages"),
                "no assistant message to train on",
            ));
        }
        out.push(ChatExample {
            messages,
            text: None,
            weight,
        });
    }
    if out.is_empty() {
        return Err(TrainError::invalid(
            path,
            "messages",
            "no examples in the file",
        ));
    }
    Ok(out)
}

/// Encodes conversations into training sequences of at most `max_len` tokens (longer ones are
/// cut); conversations with no assistant token left are dropped. Plain-text documents become
/// consecutive windows of `max_len` tokens trained on every token. Returns the sequences and the
/// number dropped.
pub fn encode_examples(
    tok: &Tokenizer,
    examples: &[ChatExample],
    max_len: usize,
) -> Result<(Vec<Sequence>, usize)> {
    let mut out = Vec::with_capacity(examples.len());
    let mut dropped = 0;
    for ex in examples {
        if let Some(text) = &ex.text {
            let ids = tok.encode(text)?;
            for w in ids.chunks(max_len.max(2)) {
                if w.len() < 2 {
                    continue;
                }
                out.push(Sequence {
                    ids: w.to_vec(),
                    mask: vec![1; w.len()],
                    weight: ex.weight,
                });
            }
            continue;
        }
        let (mut ids, mut mask) = encode(tok, &ex.messages, false)?;
        ids.truncate(max_len);
        mask.truncate(max_len);
        if ids.len() < 2 || !mask[1..].iter().any(|&m| m != 0) {
            dropped += 1;
            continue;
        }
        out.push(Sequence {
            ids,
            mask,
            weight: ex.weight,
        });
    }
    Ok((out, dropped))
}

/// Splits off a deterministic held-out set of about `fraction` of the items (at least one when
/// `fraction > 0` and there are two or more items). Returns `(train, held_out)`.
pub fn split_held_out<T: Clone>(items: &[T], fraction: f64, seed: u64) -> (Vec<T>, Vec<T>) {
    let n = items.len();
    let k = if fraction > 0.0 && n >= 2 {
        ((n as f64 * fraction).round() as usize).clamp(1, n - 1)
    } else {
        0
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| mix64(seed ^ mix64(i as u64 ^ 0x5eed)));
    let mut held = vec![false; n];
    for &i in &order[..k] {
        held[i] = true;
    }
    let (mut tr, mut ev) = (Vec::new(), Vec::new());
    for (i, it) in items.iter().enumerate() {
        if held[i] {
            ev.push(it.clone());
        } else {
            tr.push(it.clone());
        }
    }
    (tr, ev)
}

/// The packed batches of one epoch: the examples shuffled by `(seed, epoch)` and packed greedily
/// into batches of at most `batch_tokens` tokens (a longer example is a batch of its own).
pub fn epoch_batches(
    lens: &[usize],
    batch_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    let mut rng = SplitMix::new(mix64(seed) ^ mix64(epoch.wrapping_add(1)));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut tokens = 0;
    for i in order {
        if !cur.is_empty() && tokens + lens[i] > batch_tokens {
            out.push(std::mem::take(&mut cur));
            tokens = 0;
        }
        tokens += lens[i];
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_the_budget_cover_every_example_once_and_depend_on_the_epoch() {
        let lens: Vec<usize> = (0..50).map(|i| 5 + (i * 7) % 23).collect();
        let b0 = epoch_batches(&lens, 64, 3, 0);
        let b1 = epoch_batches(&lens, 64, 3, 1);
        assert_ne!(b0, b1);
        assert_eq!(b0, epoch_batches(&lens, 64, 3, 0));
        let mut seen: Vec<usize> = b0.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        for b in &b0 {
            assert!(b.iter().map(|&i| lens[i]).sum::<usize>() <= 64);
        }
    }

    #[test]
    fn plain_text_lines_train_on_every_token_in_windows_and_bad_text_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        std::fs::write(
            &p,
            "{\"text\": \"def f(x):\\n    return x + 1\\n\"}\n{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n",
        )
        .unwrap();
        let ex = read_chat_jsonl(&p).unwrap();
        assert_eq!(ex.len(), 2);
        assert!(ex[0].messages.is_empty() && ex[0].text.is_some());
        let tok = crate::model::init::train_tokenizer(
            &["def f(x):\n    return x + 1\nhi yo".to_string()],
            300,
        )
        .map(|t| crate::model::Tokenizer::from_inner(t, std::path::PathBuf::new()))
        .unwrap();
        let n = tok.encode("def f(x):\n    return x + 1\n").unwrap().len();
        assert!(n >= 4, "{n}");
        let (seqs, dropped) = encode_examples(&tok, &ex[..1], 3).unwrap();
        assert_eq!(dropped, 0);
        // Windows of 3 tokens cover the document; a 1-token tail trains nothing and is skipped.
        assert_eq!(seqs.len(), n / 3 + usize::from(n % 3 >= 2));
        assert!(seqs.iter().all(|s| s.mask.iter().all(|&m| m == 1)));
        std::fs::write(&p, "{\"text\": 5}\n").unwrap();
        let e = read_chat_jsonl(&p).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("text"), "{e}");
    }

    #[test]
    fn held_out_split_is_deterministic_and_disjoint() {
        let items: Vec<u32> = (0..100).collect();
        let (tr, ev) = split_held_out(&items, 0.1, 9);
        assert_eq!((tr.len(), ev.len()), (90, 10));
        assert_eq!(split_held_out(&items, 0.1, 9).1, ev);
        assert!(ev.iter().all(|e| !tr.contains(e)));
        assert_eq!(split_held_out(&items, 0.0, 9).1.len(), 0);
    }
}
