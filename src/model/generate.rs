//! Batched generation: each request is prefilled into a free KV-cache slot, then all active
//! sequences decode one token per step together; a slot is refilled as soon as its sequence ends
//! (continuous batching). Per-sequence sampling parameters; results do not depend on the batch.
//!
//! Requests with the same prompt share one prefill (the G samples of a GRPO group): a slot
//! remembers the prompt it was prefilled with and its last-row logits; a later request with that
//! prompt copies the slot's cached keys and values (or reuses them in place) instead of running
//! the prompt through the model again. Prefill is per request and deterministic, so the outputs
//! are the same bits either way.
//!
//! On backends that [share prefixes](crate::engine::Backend::shares_prefixes) (the CPU) the
//! prompt is not copied: the later request's slot records that its first positions live in the
//! slot that holds the prompt (`KvCache::shared`), and decode attention reads the prompt there
//! once for the whole group. Before a slot that others read is given a new sequence, each reader
//! gets its own copy. The outputs are again the same bits.

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::engine::sampling::Sampled;
use crate::engine::{Backend, HostData, SamplingParams, SharedPrefix, Tensor};
use crate::model::adapter::Adapters;
use crate::model::constraint::{ConstraintState, TokenConstraint, TokenSet};
use crate::model::error::{ModelError, Result};
use crate::model::kv_cache::KvCache;
use crate::model::token_trie::VocabIndex;
use crate::model::tokenizer::Tokenizer;
use crate::model::transformer::{Model, Step};

/// One sequence to generate.
#[derive(Clone, Debug, Default)]
pub struct GenRequest {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Token ids that end the sequence (kept in the output ids).
    pub stop_ids: Vec<u32>,
    /// Strings that end the sequence (cut from the output text).
    pub stop_strings: Vec<String>,
    /// Grammar the generated text must follow (needs a tokenizer).
    pub constraint: Option<Arc<dyn TokenConstraint>>,
    /// With a constraint: a token also counts as forced when the tokens the grammar allowed held
    /// less than this share of the model's probability (the grammar, not the policy, decided).
    pub min_allowed_mass: f32,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// A stop string appeared in the text.
    StopString,
    /// `max_new_tokens` were generated.
    Length,
}

/// One generated sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenOutput {
    /// Generated token ids (including a final stop token).
    pub ids: Vec<u32>,
    /// Log-probability of each generated token (see [`crate::engine::sampling::Sampled`]).
    pub logprobs: Vec<f32>,
    /// Decoded text without special tokens, cut before a stop string.
    pub text: String,
    /// Per token: whether a constraint left it as the only choice, or left less than the request's
    /// `min_allowed_mass` of the model's probability (empty without a constraint). Such tokens
    /// carry no decision of the model; RL leaves them out of its loss.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forced: Vec<bool>,
    /// Per token: the set the constraint let through (`None` where the step was free; empty
    /// without a constraint).
    #[serde(skip)]
    pub allowed: Vec<Option<TokenSet>>,
    /// Per token: `log` of the probability (at the request's temperature) the allowed set held,
    /// 0 where the step was free; `logprobs - allowed_logmass` is the log-probability under the
    /// renormalised distribution the token was drawn from (empty without a constraint).
    #[serde(skip)]
    pub allowed_logmass: Vec<f32>,
    /// Why it ended.
    pub finish: FinishReason,
}

/// Options of a generation call.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Sequences decoded together (KV-cache slots).
    pub max_batch: usize,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

impl Default for GenOptions {
    fn default() -> Self {
        Self {
            max_batch: 8,
            progress: false,
        }
    }
}

struct Active {
    req: usize,
    cached: usize,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    steps: Vec<StepConstraint>,
    state: Option<Box<dyn ConstraintState>>,
}

/// How the allowed sets of constrained steps are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MaskMode {
    /// Incrementally: a grammar state advanced by each sampled piece, walked over the
    /// vocabulary's trie (constraints without an incremental state fall back to the rescan).
    #[default]
    Incremental,
    /// The reference: re-decode the whole response and check every piece each step.
    Rescan,
}

/// What a constraint did at one decoding step.
#[derive(Clone, Debug, Default)]
struct StepConstraint {
    forced: bool,
    allowed: Option<TokenSet>,
    logmass: f32,
}

fn validate<B: Backend>(
    model: &Model<B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
) -> Result<()> {
    let c = &model.config;
    for (i, r) in reqs.iter().enumerate() {
        r.params
            .validate()
            .map_err(|e| ModelError::Input(format!("request {i}: {e}")))?;
        if r.prompt.is_empty() {
            return Err(ModelError::Input(format!("request {i}: empty prompt")));
        }
        if let Some(&bad) = r.prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::Input(format!(
                "request {i}: token id {bad} is out of range for a vocabulary of {}",
                c.vocab_size
            )));
        }
        let total = r.prompt.len() + r.max_new_tokens;
        if total > c.max_position_embeddings {
            return Err(ModelError::Input(format!(
                "request {i}: prompt of {} tokens plus {} new tokens exceeds max_position_embeddings {}",
                r.prompt.len(),
                r.max_new_tokens,
                c.max_position_embeddings
            )));
        }
        if !r.stop_strings.is_empty() && tok.is_none() {
            return Err(ModelError::Input(format!(
                "request {i}: stop strings need a tokenizer"
            )));
        }
        if r.constraint.is_some() && tok.is_none() {
            return Err(ModelError::Input(format!(
                "request {i}: a constraint needs a tokenizer"
            )));
        }
    }
    Ok(())
}

/// What a generation call computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Prompt tokens run through the model.
    pub prefill_tokens: usize,
    /// Requests whose prompt's keys and values came from another request's prefill.
    pub shared_prefills: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Prompts copied into a sequence's own slot because the slot that kept them for several
    /// sequences was reused (backends that share prefixes in the cache).
    pub prefix_copies: usize,
}

/// The prefill a slot's cache holds: its prompt and the logits after it.
struct Prefilled<B: Backend> {
    prompt: Vec<u32>,
    logits: Arc<Tensor<B>>,
}

/// Copies positions `0..n` of slot `from` to slot `to` in every layer's keys and values.
fn copy_prefix<B: Backend>(
    be: &B,
    cache: &mut KvCache<B>,
    from: usize,
    to: usize,
    n: usize,
) -> Result<()> {
    let max_seq = cache.max_seq;
    let rows: Vec<u32> = (0..n).map(|j| (from * max_seq + j) as u32).collect();
    let rows = be.upload(HostData::U32(&rows), &[n])?;
    let slots = be.upload(HostData::U32(&vec![to as u32; n]), &[n])?;
    let pos: Vec<u32> = (0..n as u32).collect();
    let pos = be.upload(HostData::U32(&pos), &[n])?;
    for t in cache.k.iter_mut().chain(cache.v.iter_mut()) {
        let shape = t.shape().to_vec();
        let f = shape.last().copied().unwrap_or(0);
        let placeholder = be.zeros(&[1], t.dtype())?;
        let flat = std::mem::replace(t, placeholder).reshape(&[shape[0] * max_seq, f])?;
        let src = be.gather_rows(&flat, &rows);
        *t = flat.reshape(&shape)?;
        be.kv_write(t, &src?, &slots, &pos)?;
    }
    Ok(())
}

/// Before slot `slot` takes a new sequence: every slot that reads its prompt from `slot` gets its
/// own copy. Returns the number of copies made.
fn release<B: Backend>(be: &B, cache: &mut KvCache<B>, slot: usize) -> Result<usize> {
    let mut copies = 0;
    for x in 0..cache.slots {
        if let Some(sp) = cache.shared[x].filter(|sp| sp.slot as usize == slot) {
            copy_prefix(be, cache, slot, x, sp.len as usize)?;
            cache.shared[x] = None;
            copies += 1;
        }
    }
    Ok(copies)
}

/// Generates a continuation for every request; outputs come back in request order.
pub fn generate<B: Backend>(
    model: &Model<B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
    opts: &GenOptions,
) -> Result<Vec<GenOutput>> {
    Ok(generate_with_stats(model, tok, reqs, opts, true)?.0)
}

/// [`generate`], also counting what was computed; `share_prefill` lets requests with the same
/// prompt share one prefill (off: every request prefills its own prompt).
pub fn generate_with_stats<B: Backend>(
    model: &Model<B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
    opts: &GenOptions,
    share_prefill: bool,
) -> Result<(Vec<GenOutput>, GenStats)> {
    generate_inner(
        model,
        Adapters::off(),
        tok,
        reqs,
        opts,
        share_prefill,
        MaskMode::Incremental,
    )
}

/// [`generate_with_stats`] with the allowed sets of constrained steps found by `masks` (the
/// outputs are the same either way; the rescan is the reference and the benchmark's baseline).
pub fn generate_with_masks<B: Backend>(
    model: &Model<B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
    opts: &GenOptions,
    masks: MaskMode,
) -> Result<(Vec<GenOutput>, GenStats)> {
    generate_inner(model, Adapters::off(), tok, reqs, opts, true, masks)
}

/// [`generate`] from `model` with LoRA adapters applied in every forward (no merge into the
/// base weights): the LoRA policy's own rollouts.
pub fn generate_adapted<B: Backend>(
    model: &Model<B>,
    ad: Adapters<'_, B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
    opts: &GenOptions,
) -> Result<Vec<GenOutput>> {
    Ok(generate_inner(model, ad, tok, reqs, opts, true, MaskMode::Incremental)?.0)
}

fn generate_inner<B: Backend>(
    model: &Model<B>,
    ad: Adapters<'_, B>,
    tok: Option<&Tokenizer>,
    reqs: &[GenRequest],
    opts: &GenOptions,
    share_prefill: bool,
    masks: MaskMode,
) -> Result<(Vec<GenOutput>, GenStats)> {
    validate(model, tok, reqs)?;
    let mut outputs: Vec<Option<GenOutput>> = vec![None; reqs.len()];
    let mut stats = GenStats::default();
    if reqs.is_empty() {
        return Ok((Vec::new(), stats));
    }
    let max_seq = reqs
        .iter()
        .map(|r| r.prompt.len() + r.max_new_tokens)
        .max()
        .unwrap_or(1);
    let n_slots = opts.max_batch.max(1).min(reqs.len());
    let mut cache = KvCache::new(&model.backend, &model.config, n_slots, max_seq)?;
    // Shared prompts stay in one slot (others read them there) where the backend supports it;
    // elsewhere they are copied into each sequence's slot.
    let share_kv = share_prefill && model.backend.shares_prefixes();
    let bar = if opts.progress {
        indicatif::ProgressBar::new(reqs.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} sequences {elapsed}<{eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let index = match tok {
        Some(t) if reqs.iter().any(|r| r.constraint.is_some()) => Some(t.vocab_index()),
        _ => None,
    };
    let index = index.as_deref();
    let mut slots: Vec<Option<Active>> = (0..n_slots).map(|_| None).collect();
    let mut held: Vec<Option<Prefilled<B>>> = (0..n_slots).map(|_| None).collect();
    let mut next = 0usize;
    let mut generated = 0usize;
    let start = std::time::Instant::now();
    loop {
        // Fill free slots with new requests (one prefill each, so rows never depend on the batch).
        for (slot, entry) in slots.iter_mut().enumerate() {
            while entry.is_none() && next < reqs.len() {
                let i = next;
                next += 1;
                let r = &reqs[i];
                if r.max_new_tokens == 0 {
                    outputs[i] = Some(finish(
                        tok,
                        r,
                        Vec::new(),
                        Vec::new(),
                        Vec::new(),
                        FinishReason::Length,
                    )?);
                    bar.inc(1);
                    continue;
                }
                let n = r.prompt.len();
                // A slot already holding this prompt's prefill: this one, else any other.
                let source = if share_prefill {
                    std::iter::once(slot)
                        .chain(0..n_slots)
                        .find(|&p| held[p].as_ref().is_some_and(|h| h.prompt == r.prompt))
                } else {
                    None
                };
                let logits = match source {
                    Some(p) => {
                        if p != slot && share_kv {
                            stats.prefix_copies += release(&model.backend, &mut cache, slot)?;
                            let root = cache.shared[p].map_or(p as u32, |sp| sp.slot);
                            cache.shared[slot] = Some(SharedPrefix {
                                slot: root,
                                len: n as u32,
                            });
                        } else if p != slot {
                            copy_prefix(&model.backend, &mut cache, p, slot, n)?;
                        }
                        stats.shared_prefills += 1;
                        held[p].as_ref().map(|h| h.logits.clone())
                    }
                    None => None,
                };
                let logits = match logits {
                    Some(l) => l,
                    None => {
                        stats.prefix_copies += release(&model.backend, &mut cache, slot)?;
                        cache.shared[slot] = None;
                        let sl = vec![slot as u32; n];
                        let pos: Vec<u32> = (0..n as u32).collect();
                        stats.prefill_tokens += n;
                        Arc::new(model.forward_adapted(
                            &mut cache,
                            &Step {
                                ids: &r.prompt,
                                slots: &sl,
                                positions: &pos,
                                logit_rows: &[n as u32 - 1],
                            },
                            ad,
                        )?)
                    }
                };
                held[slot] = Some(Prefilled {
                    prompt: r.prompt.clone(),
                    logits: logits.clone(),
                });
                let mut state = match masks {
                    MaskMode::Incremental => r.constraint.as_ref().and_then(|c| c.start()),
                    MaskMode::Rescan => None,
                };
                let row = Row {
                    req: r,
                    ids: &[],
                    state: state.as_deref(),
                };
                let (s, steps) = sample_step(model, tok, index, &logits, &[row])?;
                advance(tok, index, state.as_deref_mut(), s[0].id)?;
                let mut a = Active {
                    req: i,
                    cached: n,
                    ids: vec![s[0].id],
                    logprobs: vec![s[0].logprob],
                    steps,
                    state,
                };
                generated += 1;
                match check_done(tok, r, &a.ids)? {
                    Some(reason) => {
                        outputs[i] = Some(finish(
                            tok,
                            r,
                            std::mem::take(&mut a.ids),
                            a.logprobs,
                            a.steps,
                            reason,
                        )?);
                        bar.inc(1);
                    }
                    None => *entry = Some(a),
                }
            }
        }
        let active: Vec<usize> = (0..n_slots).filter(|&s| slots[s].is_some()).collect();
        if active.is_empty() {
            break;
        }
        let mut ids = Vec::with_capacity(active.len());
        let mut sl = Vec::with_capacity(active.len());
        let mut pos = Vec::with_capacity(active.len());
        for &s in &active {
            if let Some(a) = &slots[s] {
                ids.push(*a.ids.last().unwrap_or(&0));
                sl.push(s as u32);
                pos.push(a.cached as u32);
            }
        }
        let rows: Vec<u32> = (0..active.len() as u32).collect();
        let logits = model.forward_adapted(
            &mut cache,
            &Step {
                ids: &ids,
                slots: &sl,
                positions: &pos,
                logit_rows: &rows,
            },
            ad,
        )?;
        let rows_done: Vec<Row> = active
            .iter()
            .filter_map(|&s| {
                slots[s].as_ref().map(|a| Row {
                    req: &reqs[a.req],
                    ids: &a.ids,
                    state: a.state.as_deref(),
                })
            })
            .collect();
        let (sampled, mut steps) = sample_step(model, tok, index, &logits, &rows_done)?;
        for (k, &s) in active.iter().enumerate() {
            let done = match slots[s].as_mut() {
                Some(a) => {
                    a.cached += 1;
                    advance(tok, index, a.state.as_deref_mut(), sampled[k].id)?;
                    a.ids.push(sampled[k].id);
                    a.logprobs.push(sampled[k].logprob);
                    a.steps.push(std::mem::take(&mut steps[k]));
                    generated += 1;
                    check_done(tok, &reqs[a.req], &a.ids)?
                }
                None => None,
            };
            if let Some(reason) = done {
                if let Some(a) = slots[s].take() {
                    let r = &reqs[a.req];
                    outputs[a.req] = Some(finish(tok, r, a.ids, a.logprobs, a.steps, reason)?);
                    bar.inc(1);
                }
            }
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{:.0} tok/s", generated as f64 / secs));
    }
    bar.finish_and_clear();
    stats.generated_tokens = generated;
    let outs = outputs
        .into_iter()
        .enumerate()
        .map(|(i, o)| o.ok_or_else(|| ModelError::Input(format!("request {i} produced no output"))))
        .collect::<Result<Vec<_>>>()?;
    Ok((outs, stats))
}

/// One decoding row as the constraint sees it: the request, the ids so far and the
/// incremental state (`None`: the rescan reference).
struct Row<'a> {
    req: &'a GenRequest,
    ids: &'a [u32],
    state: Option<&'a dyn ConstraintState>,
}

/// Feeds a sampled token's piece to a row's incremental state.
fn advance(
    tok: Option<&Tokenizer>,
    index: Option<&VocabIndex>,
    state: Option<&mut (dyn ConstraintState + 'static)>,
    id: u32,
) -> Result<()> {
    let (Some(state), Some(index)) = (state, index) else {
        return Ok(());
    };
    match index.pieces.get(id as usize).and_then(|p| p.as_deref()) {
        Some(p) => state.advance(p),
        // Special tokens and partial characters (free steps only): their decoded text.
        None => {
            if let Some(t) = tok {
                state.advance(&t.decode(&[id], true)?);
            }
        }
    }
    Ok(())
}

/// The allowed set of one row over a vocabulary of `vocab` logits, and how many choices it
/// holds (every stop token together counting as one); `None` leaves the step free.
fn allowed_set(
    tok: &Tokenizer,
    index: &VocabIndex,
    row: &Row,
    vocab: usize,
) -> Result<Option<(TokenSet, usize, bool)>> {
    let r = row.req;
    let Some(c) = &r.constraint else {
        return Ok(None);
    };
    let remaining = r.max_new_tokens.saturating_sub(row.ids.len());
    let (pieces, stop) = match row.state {
        Some(s) => match s.mask(remaining, index) {
            Some(m) => (m.pieces, m.stop),
            None => return Ok(None),
        },
        None => {
            let text = tok.decode(row.ids, true)?;
            match c.allowed(&text, remaining, &index.pieces) {
                Some(a) => {
                    let n = a.pieces.len();
                    (TokenSet::from_fn(n, |i| a.pieces[i as usize]), a.stop)
                }
                None => return Ok(None),
            }
        }
    };
    let mut set = pieces.resized(vocab);
    for &s in &r.stop_ids {
        if stop {
            set.insert(s);
        }
    }
    let stops = usize::from(stop && !r.stop_ids.is_empty());
    Ok(Some((set, pieces.count() + stops, stop)))
}

/// Samples one token per row of `logits`; rows whose request has an active constraint sample
/// from their allowed set on the backend (masks up, tokens and log-masses down; the logits stay
/// where they are). Per row, the token and what the constraint did:
/// whether it decided (a single choice, or too little allowed mass), the set it allowed and
/// that set's log-probability mass. A row whose allowed set holds no finite logit keeps the
/// unconstrained sample, unconstrained.
fn sample_step<B: Backend>(
    model: &Model<B>,
    tok: Option<&Tokenizer>,
    index: Option<&VocabIndex>,
    logits: &Tensor<B>,
    rows: &[Row],
) -> Result<(Vec<Sampled>, Vec<StepConstraint>)> {
    let params: Vec<SamplingParams> = rows.iter().map(|r| r.req.params).collect();
    let counters: Vec<u64> = rows.iter().map(|r| r.ids.len() as u64).collect();
    let mut out = vec![StepConstraint::default(); rows.len()];
    let (_, vocab) = logits.dims2("sample")?;
    let sets = match (tok, index) {
        (Some(tok), Some(index)) if rows.iter().any(|r| r.req.constraint.is_some()) => rows
            .iter()
            .map(|row| allowed_set(tok, index, row, vocab))
            .collect::<Result<Vec<_>>>()?,
        _ => Vec::new(),
    };
    if sets.iter().all(Option::is_none) {
        return Ok((model.backend.sample(logits, &params, &counters)?, out));
    }
    let masks: Vec<Option<&[u32]>> = sets
        .iter()
        .map(|s| s.as_ref().map(|(set, _, _)| set.words()))
        .collect();
    // On the device the logits stay there: the masks go up, tokens and log-masses come back.
    let masked = model
        .backend
        .sample_masked(logits, &params, &counters, &masks)?;
    // Rows with nothing allowed (rare) fall back to the unconstrained sample.
    let fallback = if masked.iter().any(Option::is_none) {
        Some(model.backend.sample(logits, &params, &counters)?)
    } else {
        None
    };
    let mut sampled = Vec::with_capacity(rows.len());
    for (k, (m, set)) in masked.into_iter().zip(sets).enumerate() {
        let Some(m) = m else {
            let f = fallback.as_ref().and_then(|f| f.get(k).copied());
            sampled.push(f.ok_or_else(|| ModelError::Input("sampler returned no row".into()))?);
            continue;
        };
        sampled.push(m.sampled);
        if let Some((set, choices, _)) = set {
            out[k] = StepConstraint {
                forced: choices == 1
                    || below_min_mass(m.log_mass as f64, rows[k].req.min_allowed_mass),
                allowed: Some(set),
                logmass: m.log_mass,
            };
        }
    }
    Ok((sampled, out))
}

/// A constrained step whose allowed set holds less than `min_mass` of the policy's probability
/// *at the sampling temperature* (`logmass`, as sampled) is forced: it leaves the update.
fn below_min_mass(logmass: f64, min_mass: f32) -> bool {
    min_mass > 0.0 && logmass < (min_mass as f64).ln()
}

fn check_done(
    tok: Option<&Tokenizer>,
    r: &GenRequest,
    ids: &[u32],
) -> Result<Option<FinishReason>> {
    let last = ids.last().copied().unwrap_or(0);
    if r.stop_ids.contains(&last) {
        return Ok(Some(FinishReason::Stop));
    }
    if !r.stop_strings.is_empty() {
        if let Some(t) = tok {
            let text = t.decode(ids, true)?;
            if r.stop_strings
                .iter()
                .any(|s| !s.is_empty() && text.contains(s.as_str()))
            {
                return Ok(Some(FinishReason::StopString));
            }
        }
    }
    if ids.len() >= r.max_new_tokens {
        return Ok(Some(FinishReason::Length));
    }
    Ok(None)
}

fn finish(
    tok: Option<&Tokenizer>,
    r: &GenRequest,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    steps: Vec<StepConstraint>,
    finish: FinishReason,
) -> Result<GenOutput> {
    let mut text = match tok {
        Some(t) => t.decode(&ids, true)?,
        None => String::new(),
    };
    if finish == FinishReason::StopString {
        let cut = r
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(c) = cut {
            text.truncate(c);
        }
    }
    Ok(GenOutput {
        ids,
        logprobs,
        text,
        forced: if r.constraint.is_some() {
            steps.iter().map(|s| s.forced).collect()
        } else {
            Vec::new()
        },
        allowed_logmass: if r.constraint.is_some() {
            steps.iter().map(|s| s.logmass).collect()
        } else {
            Vec::new()
        },
        allowed: if r.constraint.is_some() {
            steps.into_iter().map(|s| s.allowed).collect()
        } else {
            Vec::new()
        },
        finish,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_allowed_mass_is_tested_at_the_sampling_temperature() {
        // The allowed token holds ~13% of the mass at T = 1 but ~6% at T = 0.5.
        let row = [1.0f32, 0.0, 0.0, 1.0];
        let set = TokenSet::from_fn(4, |i| i == 1);
        let at_1 = set.log_mass(&row, 1.0);
        let at_half = set.log_mass(&row, 0.5);
        assert!(
            at_1.exp() > 0.12 && at_half.exp() < 0.12,
            "{at_1} {at_half}"
        );
        assert!(!below_min_mass(at_1, 0.12));
        assert!(below_min_mass(at_half, 0.12));
        assert!(!below_min_mass(at_half, 0.0), "0 turns the check off");
    }
}
