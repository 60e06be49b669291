//! Constrained decoding: a [`TokenConstraint`] decides, from the text a sequence has generated so
//! far, which vocabulary pieces may come next and whether the sequence may end. The generation
//! engine masks the other tokens out before sampling (the way serving engines do guided decoding).

use std::fmt::Debug;

use crate::model::token_trie::VocabIndex;

/// What may follow the text generated so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// Per token id: whether its piece may come next.
    pub pieces: Vec<bool>,
    /// Whether a stop token may come next.
    pub stop: bool,
}

/// The tokens a constraint let through at one decoding step, as a packed bitmask over the
/// vocabulary (bit `i % 32` of word `i / 32`, the layout the samplers read): what RL needs to
/// score a sampled token under the distribution it was really drawn from (the policy
/// renormalised on this set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSet {
    bits: Vec<u32>,
    vocab: usize,
}

impl TokenSet {
    /// The ids for which `f` holds, over a vocabulary of `vocab`.
    pub fn from_fn(vocab: usize, f: impl Fn(u32) -> bool) -> Self {
        let mut bits = vec![0u32; vocab.div_ceil(32)];
        for i in 0..vocab {
            if f(i as u32) {
                bits[i / 32] |= 1 << (i % 32);
            }
        }
        Self { bits, vocab }
    }

    /// Adds `id` (ignored outside the vocabulary).
    pub fn insert(&mut self, id: u32) {
        if (id as usize) < self.vocab {
            self.bits[id as usize / 32] |= 1 << (id % 32);
        }
    }

    /// The packed words (bit `i % 32` of word `i / 32`; bits past the vocabulary are 0).
    pub fn words(&self) -> &[u32] {
        &self.bits
    }

    /// The same ids over a vocabulary of `vocab` (ids past it are dropped).
    pub fn resized(&self, vocab: usize) -> Self {
        Self::from_fn(vocab, |i| self.contains(i))
    }

    /// Keeps only the ids also in `other`.
    pub fn intersect(&mut self, other: &TokenSet) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a &= b;
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    /// What `allowed` lets through (stop tokens count as allowed when `allowed.stop` is set).
    pub fn from_allowed(allowed: &Allowed, stop_ids: &[u32], vocab: usize) -> Self {
        Self::from_fn(vocab, |i| {
            if stop_ids.contains(&i) {
                allowed.stop
            } else {
                allowed.pieces.get(i as usize).copied().unwrap_or(false)
            }
        })
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        (id as usize) < self.vocab && self.bits[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// Size of the vocabulary the set is over.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Number of ids in the set.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// `log sum_{b in set} softmax(row / T)_b` (`T <= 0` reads as 1, like greedy log-probabilities).
    pub fn log_mass(&self, row: &[f32], temperature: f32) -> f64 {
        crate::engine::sampling::masked_log_mass(row, &self.bits, temperature)
    }
}

/// Restricts the next token of one sequence.
pub trait TokenConstraint: Send + Sync + Debug {
    /// What may follow `text` (the generated text so far) with `remaining` tokens of budget left,
    /// given every token's decoded piece (`None` for special tokens); `None` leaves the step free.
    fn allowed(&self, text: &str, remaining: usize, pieces: &[Option<String>]) -> Option<Allowed>;

    /// A fresh incremental state of this constraint (`None`: only [`TokenConstraint::allowed`]).
    fn start(&self) -> Option<Box<dyn ConstraintState>> {
        None
    }
}

/// What may come next, as a bitmask over the tokenizer's pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    /// The pieces that may come next.
    pub pieces: TokenSet,
    /// Whether a stop token may come next.
    pub stop: bool,
}

/// The incremental state of one sequence under a constraint: advanced by every sampled piece,
/// asked for the next step's mask without looking at the text again.
pub trait ConstraintState: Send + Debug {
    /// Takes in the decoded piece of a sampled token.
    fn advance(&mut self, piece: &str);
    /// What may come next with `remaining` tokens of budget left (`None` leaves the step free);
    /// the same sets as [`TokenConstraint::allowed`] on the text advanced so far.
    fn mask(&self, remaining: usize, vocab: &VocabIndex) -> Option<Mask>;
}

/// Every token's decoded piece (`None` for special tokens and pieces that are not valid UTF-8 alone).
pub fn token_pieces(tok: &crate::model::Tokenizer) -> Vec<Option<String>> {
    let stops = tok.stop_ids();
    (0..tok.vocab_size() as u32)
        .map(|id| {
            if stops.contains(&id) {
                return None;
            }
            let plain = tok.decode(&[id], true).ok()?;
            let raw = tok.decode(&[id], false).ok()?;
            (plain == raw && !plain.is_empty() && !plain.contains('\u{fffd}')).then_some(plain)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;

    /// Samples one row from the tokens in `allowed` (what constrained generation does per row).
    fn sample_masked(
        logits: &[f32],
        allowed: &TokenSet,
        p: &SamplingParams,
        counter: u64,
    ) -> Option<crate::engine::sampling::Sampled> {
        crate::engine::sampling::sample_row_masked(logits, allowed.words(), p, counter)
    }

    #[test]
    fn token_sets_follow_the_allowed_pieces_and_stops_and_weigh_their_mass() {
        let allowed = Allowed {
            pieces: vec![true, false, true, false],
            stop: true,
        };
        let set = TokenSet::from_allowed(&allowed, &[3], 4);
        assert_eq!(
            (0..5).map(|i| set.contains(i)).collect::<Vec<_>>(),
            vec![true, false, true, true, false]
        );
        assert_eq!(set.count(), 3);
        let row = [1.0f32, 2.0, 0.5, -1.0];
        let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        let want = ((1f64.exp() + 0.5f64.exp() + (-1f64).exp()) / z).ln();
        assert!((set.log_mass(&row, 1.0) - want).abs() < 1e-12);
        let everything = TokenSet::from_fn(4, |_| true);
        assert!(everything.log_mass(&row, 0.7).abs() < 1e-12);
        // Cooling moves mass to the largest logit (token 1, outside the set).
        assert!(set.log_mass(&row, 0.5) < set.log_mass(&row, 1.0));
        assert!(TokenSet::from_fn(130, |i| i == 129).contains(129));
    }

    #[test]
    fn masked_sampling_never_picks_a_banned_token_and_reports_the_full_logprob() {
        let logits = [5.0f32, 1.0, 0.0, -1.0];
        let allowed = Allowed {
            pieces: vec![false, true, true, false],
            stop: false,
        };
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 3,
        };
        let lse = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let mut seen = [0usize; 4];
        for c in 0..2000 {
            let set = TokenSet::from_allowed(&allowed, &[3], 4);
            let s = sample_masked(&logits, &set, &p, c).expect("some token allowed");
            seen[s.id as usize] += 1;
            assert!((s.logprob as f64 - (logits[s.id as usize] as f64 - lse)).abs() < 1e-5);
        }
        assert_eq!(seen[0] + seen[3], 0);
        // Renormalised over {1, 2}: p(1) = e / (e + 1) ~ 0.73.
        let f = seen[1] as f64 / 2000.0;
        assert!((f - 0.731).abs() < 0.05, "{f}");
        let stop_ok = Allowed {
            pieces: vec![false; 4],
            stop: true,
        };
        let stop_ok = TokenSet::from_allowed(&stop_ok, &[3], 4);
        let g = sample_masked(&logits, &stop_ok, &SamplingParams::greedy(), 0);
        assert_eq!(g.map(|s| s.id), Some(3));
        let none = Allowed {
            pieces: vec![false; 4],
            stop: false,
        };
        let none = TokenSet::from_allowed(&none, &[3], 4);
        assert!(sample_masked(&logits, &none, &p, 0).is_none());
    }
}
