//! PPO-ptx (InstructGPT, Ouyang et al. 2022): a supervised term in every stage-2 update.
//!
//! Each minibatch update of stage 2 also takes `ptx_coef` times the mean token cross-entropy of
//! a few examples of stage 1's training data (drawn by seed), so the policy keeps what supervised
//! fine-tuning taught it (free decoding, which the grammar-guided rollouts do not exercise) while
//! the rewards move it. The examples are scored at temperature 1, as stage 1 trained them.

use std::path::Path;

use anyhow::Context;

use crate::engine::rng::{random_u64, SplitMix};
use crate::engine::Backend;
use crate::model::{Model, Tokenizer};
use crate::train::backward::backward;
use crate::train::data::{encode_examples, read_chat_jsonl};
use crate::train::forward::{forward, Batch, ForwardOptions, Sequence};
use crate::train::lora::Lora;
use crate::train::loss::cross_entropy;
use crate::train::params::Grads;

/// Reads and encodes the supervised data of the ptx term (chat JSONL, loss on assistant tokens),
/// each example cut to `max_len` tokens. Errors when the file holds nothing to train on.
pub fn load(path: &Path, tok: &Tokenizer, max_len: usize) -> anyhow::Result<Vec<Sequence>> {
    let examples =
        read_chat_jsonl(path).with_context(|| format!("stage2 ptx data {}", path.display()))?;
    let (seqs, _) = encode_examples(tok, &examples, max_len)?;
    anyhow::ensure!(
        !seqs.is_empty(),
        "stage2 ptx data {}: no example has an assistant token to train on",
        path.display()
    );
    Ok(seqs)
}

/// The examples of one ptx batch: distinct ones drawn uniformly by `seed` until their tokens
/// reach `tokens` (at least one; all of them when the data holds fewer tokens).
pub fn draw(lens: &[usize], tokens: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    let mut rng = SplitMix::new(seed);
    let (mut picked, mut sum) = (Vec::new(), 0usize);
    for i in 0..order.len() {
        let j = i + rng.below((order.len() - i) as u64) as usize;
        order.swap(i, j);
        if !picked.is_empty() && sum + lens[order[i]] > tokens {
            break;
        }
        sum += lens[order[i]];
        picked.push(order[i]);
    }
    picked
}

/// The seed of the ptx batch of one minibatch update.
pub fn batch_seed(seed: u64, step: usize, epoch: usize, minibatch: usize) -> u64 {
    random_u64(
        seed ^ 0x9707,
        step as u64,
        ((epoch as u64) << 32) | minibatch as u64,
    )
}

/// Adds the gradient of `coef` times the mean token cross-entropy of `seqs` to `grads`; returns
/// that mean cross-entropy (before the coefficient).
pub fn accumulate<B: Backend>(
    policy: &Model<B>,
    lora: Option<&Lora<B>>,
    seqs: &[Sequence],
    coef: f32,
    grads: &mut Grads<B>,
) -> anyhow::Result<f64> {
    anyhow::ensure!(
        coef.is_finite() && coef > 0.0,
        "ptx coefficient {coef} must be positive"
    );
    let batch = Batch::pack(seqs)?;
    let trained = batch.trained_tokens();
    anyhow::ensure!(trained > 0, "ptx batch has no trained token");
    let fwd = forward(policy, lora, &batch, ForwardOptions::default())?;
    // `cross_entropy` divides by its normaliser: trained / coef scales the gradient by coef.
    let lg = cross_entropy(
        &policy.backend,
        &fwd,
        &batch.weights,
        trained as f64 / coef as f64,
    )?;
    backward(policy, lora, fwd, &lg.g_logp, &lg.g_entropy, grads)?;
    Ok(lg.loss / coef as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_distinct_within_budget_seeded_and_never_empty() {
        let lens: Vec<usize> = (0..40).map(|i| 10 + (i * 13) % 50).collect();
        let a = draw(&lens, 200, 7);
        assert_eq!(a, draw(&lens, 200, 7));
        assert_ne!(a, draw(&lens, 200, 8));
        let mut u = a.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), a.len(), "an example drawn twice: {a:?}");
        assert!(a.iter().map(|&i| lens[i]).sum::<usize>() <= 200);
        // A budget below every example still trains one; a huge one takes them all.
        assert_eq!(draw(&lens, 1, 3).len(), 1);
        assert_eq!(draw(&lens, usize::MAX / 2, 3).len(), lens.len());
        assert!(draw(&[], 100, 3).is_empty());
    }
}
