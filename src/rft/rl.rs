//! Stage 2: reinforcement learning on subtask prompts with rule-based rewards.
//!
//! One step: sample prompts (a mix of the four subtasks) -> roll out `group_size` responses each
//! with the generation engine -> score them with the SWE layer's rewards -> old and reference
//! log-probabilities by a training forward -> advantages (PPO: token-level KL penalty in the
//! reward and GAE over a value head; GRPO: group-normalised scores with a KL term in the loss;
//! RLOO: leave-one-out baselines) -> several epochs of clipped-surrogate minibatch updates
//! through the training engine (entropy bonus included) -> metrics.
//!
//! The PPO value head is a linear map of the policy's final hidden state, trained on detached
//! features (the trunk gets no value gradient), so the policy and the reference share one
//! architecture and the critic costs one `[D]` vector.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::backend::IGNORE_TARGET;
use crate::engine::rng::{random_u64, SplitMix};
use crate::engine::{Backend, DType, HostData, SamplingParams, Tensor};
use crate::model::adapter::Adapters;
use crate::model::chat::{self, Message};
use crate::model::constraint::TokenSet;
use crate::model::generate::{generate_adapted, GenOptions, GenRequest};
use crate::model::{Model, Tokenizer};
use crate::rft::advantage::{gae, group_advantages, shaped_rewards, whiten};
use crate::rft::kl::KlEstimator;
use crate::rft::mismatch::{reconcile, Rescore};
use crate::rft::monitor::features::{self as health, Health};
use crate::rft::monitor::inject::Injection;
use crate::rft::monitor::{MonitorEvent, MonitorMode};
use crate::rft::ppo::{approx_kl, explained_variance, policy_loss, value_loss, PolicyLossConfig};
use crate::swe::reward::ZeroReason;
use crate::swe::subtask::{EditReward, SubtaskRecord};
use crate::train::backward::backward;
use crate::train::forward::{forward, Batch, ForwardOptions, Sequence};
use crate::train::lora::Lora;
use crate::train::optim::{AdamW, OptimConfig};
use crate::train::params::{model_params, model_params_mut, Grads};

/// The policy-gradient algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// PPO with a value head, GAE and a token-level KL penalty in the reward.
    Ppo,
    /// GRPO: group-normalised advantages, KL to the reference in the loss, no critic.
    Grpo,
    /// RLOO: leave-one-out baselines, KL penalty in the reward, no critic.
    Rloo,
}

/// Every knob of stage 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RlConfig {
    /// PPO, GRPO or RLOO.
    pub algorithm: Algorithm,
    /// Optimizer steps (one rollout batch each).
    pub steps: usize,
    /// Prompts per rollout batch.
    pub prompts_per_step: usize,
    /// Responses per prompt.
    pub group_size: usize,
    /// Passes over each rollout batch.
    pub ppo_epochs: usize,
    /// Sequences per minibatch.
    pub minibatch: usize,
    /// Learning rate of the policy.
    pub lr: f32,
    /// Learning rate of the value head (PPO).
    pub value_lr: f32,
    /// Clip range of the probability ratio.
    pub clip_eps: f32,
    /// Clip range of the value update (PPO).
    pub value_clip: f32,
    /// Coefficient of the KL to the reference (reward penalty for PPO/RLOO, loss term for GRPO).
    pub kl_coef: f32,
    /// KL estimator of the loss term (GRPO).
    pub kl_estimator: KlEstimator,
    /// Discount.
    pub gamma: f32,
    /// GAE lambda.
    pub lambda: f32,
    /// Entropy bonus coefficient.
    pub entropy_coef: f32,
    /// Global gradient-norm clip.
    pub max_grad_norm: f32,
    /// Rollout temperature; the policy being optimised is `softmax(logits / temperature)` (the
    /// training forward, the KL to the reference and the entropy all use it), so rollouts stay
    /// on-policy at any temperature.
    pub temperature: f32,
    /// Most tokens per response.
    pub max_new_tokens: usize,
    /// Prompts longer than this (in tokens) are skipped.
    pub max_prompt_tokens: usize,
    /// Edit reward: SoRFT's line F-beta or SWE-RL's patch similarity.
    pub edit_reward: EditReward,
    /// Edit reward from execution: `rule` (the rule reward only), `execution` (1 when the edit's
    /// patch resolves the instance in the sandbox, else 0) or `mixed` ([`crate::rft::exec_reward`]).
    pub edit_exec: crate::rft::exec_reward::EditExec,
    /// Whiten advantages over the batch (PPO).
    pub whiten_advantages: bool,
    /// Sequences decoded together.
    pub rollout_batch: usize,
    /// GRPO/RLOO: leave out of the update the groups whose responses all scored the same (their
    /// advantages are zero; DAPO's dynamic sampling), unless an entropy bonus is set.
    pub skip_uniform_groups: bool,
    /// DAPO's dynamic sampling ([`crate::rft::dynamic`]): roll out up to `max_refill` extra
    /// prompts and train on the first `prompts_per_step` groups whose rewards do not all tie;
    /// subtasks saturated (all-1) for `saturate_after` steps get fewer prompts.
    pub dynamic_sampling: bool,
    /// With `dynamic_sampling`: the cap on extra prompts per step.
    pub max_refill: usize,
    /// With `dynamic_sampling`: all-1 steps after which a subtask is saturated (0: never).
    pub saturate_after: usize,
    /// Save a checkpoint every N steps (0: only at the end).
    pub save_every: usize,
    /// Checkpoints kept.
    pub keep_last: usize,
    /// Seed of prompt choice and sampling.
    pub seed: u64,
    /// Constrained decoding of localization answers in rollouts: answers may only name what the
    /// prompt showed ([`crate::swe::grammar`]); the chain of thought stays free.
    pub constrain: bool,
    /// With `constrain`: quotes in localization chains of thought must copy the prompt
    /// ([`crate::swe::grounding`]).
    pub ground: bool,
    /// With `ground`: localization answers may only name what the thought quoted.
    pub faithful: bool,
    /// Tokens where the grammar left less than this share of the policy's probability count as
    /// forced and stay out of the loss (0: off). Without `renormalise` a gradient through the
    /// unconstrained log-probability there mostly pushes mass onto tokens the grammar bans; with
    /// it, those are the decisions the policy most needs to learn, so the default is 0.
    pub min_allowed_mass: f32,
    /// Score constrained tokens under the distribution they were sampled from: the policy
    /// renormalised on the grammar's allowed set ([`crate::train::restrict`]), in the ratio, the
    /// KL and the gradient. Off: the full (unconstrained) log-probabilities.
    pub renormalise: bool,
    /// Renamed copies of each training prompt, each with a fresh package name
    /// ([`crate::pipeline::augment::renamed_items`], applied by `sorft repro` and `sorft rl`
    /// before the run); 0: the original prompts.
    pub prompt_renames: usize,
    /// The RFT-FM monitor: off, detect (events in metrics and report) or remediate.
    pub monitor: MonitorMode,
    /// LoRA rank of the policy (0: full fine-tuning). With LoRA the policy is the base model plus
    /// fp32 adapters and the reference is the same base weights with the adapters off
    /// ([`crate::rft::rl_lora`]).
    pub lora: usize,
    /// LoRA alpha: the adapter update is scaled by `lora_alpha / lora`.
    pub lora_alpha: f32,
    /// Re-score the sampler's log-probabilities with the training forward: auto (on a GPU),
    /// on or off ([`crate::rft::mismatch`]).
    pub rescore: Rescore,
    /// With re-scoring: the cap of the truncated importance weights `pi_train / pi_sampler`.
    pub tis_cap: f32,
    /// Grammar distillation: the coefficient of `-log pi(A)` (the log of the probability the
    /// unconstrained policy puts on what the grammar allowed) on every restricted token of the
    /// update, per response token like the policy loss. The renormalised RL gradient only moves
    /// mass among the allowed tokens; this term moves it onto them, so the policy learns to stay
    /// in the grammar without it (free decoding). 0: off.
    pub grammar_distill: f32,
    /// Score the rollouts that beat their group's mean reward under the full (unconstrained)
    /// distribution, forced tokens included: their gradient `onehot - pi` moves mass from every
    /// other token, banned ones too, onto the rewarded answer, so what the grammar found is
    /// learned by the unconstrained policy (free decoding). The others stay renormalised, so a
    /// penalty never pushes mass onto banned tokens. Off: every rollout renormalised.
    pub positive_full: bool,
    /// Dual clip of the policy loss ([`crate::rft::ppo::PolicyLossConfig::dual_clip`]; 0: off).
    pub dual_clip: f32,
    /// With `constrain`: the first this many members of each group are sampled without the
    /// answer grammar (free decoding, scored under the full distribution), the rest with it, so a
    /// group compares what the free policy says against what the grammar finds. 0: all
    /// constrained; `group_size` or more: none (as `constrain = false`).
    pub free_per_group: usize,
    /// Expert iteration inside the update: every rollout that earned the full reward (1) is
    /// scored under the full distribution (forced tokens included, as `positive_full`) and gets
    /// this much added to its advantage, also in groups that all tied at 1 (which GRPO would
    /// skip). Near ratio 1 the bonus's gradient is `bonus * grad log pi(answer)`: supervised
    /// learning of the answers the grammar-guided policy got right, so the unconstrained policy
    /// (free decoding) learns them; PPO's clip bounds it per step. 0: off.
    pub success_bonus: f32,
    /// PPO-ptx ([`crate::rft::ptx`]): the coefficient of stage 1's supervised loss (mean token
    /// cross-entropy of examples of its training data) added to every minibatch update. 0: off.
    pub ptx_coef: f32,
    /// With `ptx_coef`: tokens of supervised examples per minibatch update.
    pub ptx_tokens: usize,
    /// Scales the advantages of the policy-gradient term (1: the algorithm as written; 0 leaves
    /// only the KL and ptx terms, the ablation that shows what the rewards add).
    pub policy_coef: f32,
}

impl Default for RlConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::Grpo,
            steps: 20,
            prompts_per_step: 8,
            group_size: 4,
            ppo_epochs: 2,
            minibatch: 8,
            lr: 2e-5,
            value_lr: 1e-3,
            clip_eps: 0.2,
            value_clip: 0.2,
            kl_coef: 0.02,
            kl_estimator: KlEstimator::K3,
            gamma: 1.0,
            lambda: 0.95,
            entropy_coef: 0.0,
            max_grad_norm: 1.0,
            temperature: 1.0,
            max_new_tokens: 96,
            max_prompt_tokens: 2048,
            edit_reward: EditReward::LineFbeta,
            edit_exec: crate::rft::exec_reward::EditExec::Rule,
            whiten_advantages: true,
            rollout_batch: 16,
            skip_uniform_groups: true,
            dynamic_sampling: false,
            max_refill: 4,
            saturate_after: 3,
            save_every: 4,
            keep_last: 2,
            seed: 0,
            constrain: true,
            ground: true,
            faithful: true,
            min_allowed_mass: 0.0,
            renormalise: true,
            prompt_renames: 0,
            monitor: MonitorMode::Detect,
            lora: 0,
            lora_alpha: 16.0,
            rescore: Rescore::Auto,
            tis_cap: 2.0,
            grammar_distill: 0.0,
            positive_full: false,
            dual_clip: 0.0,
            free_per_group: 0,
            success_bonus: 0.0,
            ptx_coef: 0.0,
            ptx_tokens: 2048,
            policy_coef: 1.0,
        }
    }
}

/// A prompt of stage 2: a subtask record and its issue text.
#[derive(Clone, Debug)]
pub struct RlItem {
    /// The record.
    pub record: SubtaskRecord,
    /// The issue text.
    pub problem: String,
}

/// Metrics of one step.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RlMetrics {
    /// Groups of extra prompts that replaced tied groups (dynamic sampling).
    pub refilled_groups: usize,
    /// 1-based step.
    pub step: usize,
    /// Mean reward.
    pub reward_mean: f64,
    /// Standard deviation of rewards.
    pub reward_std: f64,
    /// Mean reward per subtask.
    pub reward_by_subtask: BTreeMap<String, f64>,
    /// Counts of zero-reward reasons (format errors, invented targets, empty answers, ...).
    pub zero_reasons: BTreeMap<String, usize>,
    /// Mean per-token KL (k1) of the rollout policy to the reference, over the updated sequences.
    pub kl: f64,
    /// Mean per-token entropy (of the updated sequences; when none, the rollouts' mean surprisal).
    pub entropy: f64,
    /// Fraction of clipped tokens.
    pub clip_frac: f64,
    /// Approximate KL between the rollout policy and the updated one.
    pub approx_kl: f64,
    /// Value loss (PPO).
    pub value_loss: f64,
    /// Explained variance of the value head (PPO).
    pub explained_variance: f64,
    /// Gradient norm before clipping (mean over minibatches).
    pub grad_norm: f64,
    /// Mean response length in tokens.
    pub response_len: f64,
    /// Generated tokens per second during rollout.
    pub rollout_tokens_per_s: f64,
    /// Seconds spent generating.
    pub time_rollout: f64,
    /// Seconds spent scoring.
    pub time_reward: f64,
    /// Seconds spent in forward/backward/optimizer.
    pub time_train: f64,
    /// Peak resident memory of the process so far, in MiB (0 where unknown).
    pub peak_rss_mib: f64,
    /// Sequences in the update (after leaving out empty responses and uniform groups).
    pub trained_sequences: usize,
    /// Mean share of the policy's probability the grammar banned, over the constrained steps of
    /// the rollouts, per subtask (`1 - pi(A)`; what free decoding would have put elsewhere).
    pub override_mass: BTreeMap<String, f64>,
    /// Mean token cross-entropy of the ptx term's supervised examples (before its coefficient;
    /// 0 when off).
    pub ptx_loss: f64,
    /// Mean `-log pi(A)` over the restricted tokens of the update (the grammar-distillation
    /// loss before its coefficient; 0 without restricted tokens).
    pub distill_loss: f64,
    /// Health features of the step (RFT-FM).
    pub health: Health,
    /// Mean `|p_sampler - p_trainer|` of the sampled tokens, when re-scored or PPO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_probs_diff_mean: Option<f64>,
    /// Largest `|p_sampler - p_trainer|` of the step's sampled tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_probs_diff_max: Option<f64>,
    /// Monitor events of the step (detections, diagnoses, actions, outcomes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitor: Vec<MonitorEvent>,
}

struct Rollout {
    group: usize,
    seq: Sequence,
    response: Vec<u32>,
    score: f32,
    /// Prompt length and, per response token, the set the grammar allowed (when renormalising).
    restrict: (usize, Vec<Option<TokenSet>>),
}

/// Steps where the grammar banned less than this log-mass (1e-4 of the probability) are scored
/// under the full distribution: the same numbers to 1e-4, without materialising their logits.
const NEGLIGIBLE_LOGMASS: f32 = -1e-4;

/// The allowed set token `t` of a rollout is scored under, when the grammar's cut mattered.
fn restricted_set(o: &crate::model::generate::GenOutput, t: usize) -> Option<TokenSet> {
    let mass = o.allowed_logmass.get(t).copied().unwrap_or(0.0);
    if mass < NEGLIGIBLE_LOGMASS {
        o.allowed.get(t).cloned().flatten()
    } else {
        None
    }
}

/// The rollouts whose score beats their group's mean are trained under the full distribution:
/// no restricted rows, and the tokens the grammar forced back in the loss.
fn unconstrain_above_mean(rolls: &mut [Rollout]) {
    let mut sums: BTreeMap<usize, (f32, usize)> = BTreeMap::new();
    for r in rolls.iter() {
        let e = sums.entry(r.group).or_insert((0.0, 0));
        (e.0, e.1) = (e.0 + r.score, e.1 + 1);
    }
    for r in rolls.iter_mut() {
        let (sum, n) = sums[&r.group];
        if r.score > sum / n as f32 + 1e-6 {
            unconstrain(r);
        }
    }
}

/// Scores a rollout under the full distribution: no restricted rows, forced tokens trained.
fn unconstrain(r: &mut Rollout) {
    let plen = r.restrict.0;
    r.restrict.1.iter_mut().for_each(|s| *s = None);
    r.seq.mask.iter_mut().skip(plen).for_each(|m| *m = 1);
}

/// Whether a rollout earned the full reward (`success_bonus`).
fn is_success(score: f32) -> bool {
    score >= 1.0 - 1e-6
}

/// Whether a rollout of a group whose rewards all tie stays out of the update: yes (no
/// advantage) unless the success bonus trains it.
fn left_out_as_tied(tied: bool, score: f32, bonus: f32) -> bool {
    tied && !(bonus > 0.0 && is_success(score))
}

/// Adds `bonus` to every token's advantage of the live rollouts that earned the full reward.
fn add_success_bonus(adv: &mut [Vec<f32>], live_scores: &[f32], bonus: f32) {
    for (a, &s) in adv.iter_mut().zip(live_scores) {
        if is_success(s) {
            a.iter_mut().for_each(|x| *x += bonus);
        }
    }
}

/// The grammar-distillation term on a minibatch's restricted rows: `coef / nt * sum -log pi(A)`
/// with `-log pi(A) = logp_c - logp_full` (`logp_rows` holds the restricted `logp_c`). Adds
/// its gradient to `g_logp` (on `logp_c`) and to `r.full_grad` (on `logp_full`); returns the sum
/// of `-log pi(A)` over the rows and their count (logged whatever `coef`).
fn grammar_distill(
    r: &mut crate::train::restrict::Restricted,
    logp_rows: &[f32],
    g_logp: &mut [f32],
    coef: f32,
    nt: usize,
) -> (f64, usize) {
    let mut sum = 0.0f64;
    for (&row, &full) in r.rows.iter().zip(&r.full_logp) {
        let lp_c = logp_rows.get(row as usize).copied().unwrap_or(full);
        sum += (lp_c - full).max(0.0) as f64;
    }
    if coef > 0.0 {
        let w = coef / nt.max(1) as f32;
        for &row in &r.rows {
            if let Some(g) = g_logp.get_mut(row as usize) {
                *g += w;
            }
        }
        r.full_grad = vec![-w; r.rows.len()];
    }
    (sum, r.rows.len())
}

/// Packs sequences and restricts the rows of their constrained tokens.
fn pack_restricted(
    seqs: &[&Sequence],
    restrict: &[&(usize, Vec<Option<TokenSet>>)],
) -> anyhow::Result<Batch> {
    let owned: Vec<Sequence> = seqs.iter().map(|s| (*s).clone()).collect();
    let mut batch = Batch::pack(&owned)?;
    for (s, (plen, sets)) in restrict.iter().enumerate() {
        for (t, set) in sets.iter().enumerate() {
            if let Some(set) = set {
                batch.restrict(s, plen + t, set.clone())?;
            }
        }
    }
    Ok(batch)
}

/// One vector of per-token values for each sequence.
type PerSeq = Vec<Vec<f32>>;

/// Per `live` rollout, `f(rollout, step, renormalised)` over its trained (not forced) response
/// steps; `renormalised`: the update scores the step under the grammar's allowed set.
fn per_trained_step(
    outs: &[crate::model::generate::GenOutput],
    rolls: &[Rollout],
    live: &[usize],
    f: impl Fn(&crate::model::generate::GenOutput, usize, bool) -> f32,
) -> PerSeq {
    live.iter()
        .map(|&i| {
            let (plen, rows) = (rolls[i].restrict.0, &rolls[i].restrict.1);
            (0..outs[i].logprobs.len())
                .filter(|&t| rolls[i].seq.mask.get(plen + t).copied() == Some(1))
                .map(|t| f(&outs[i], t, rows.get(t).is_some_and(Option::is_some)))
                .collect()
        })
        .collect()
}

/// The sampler's log-probabilities of the trained (not forced) tokens of the `live` rollouts:
/// the policy's own at the rollout temperature, minus the allowed set's log-mass on restricted
/// tokens (the renormalised distribution they were drawn from).
fn sampler_logprobs(
    outs: &[crate::model::generate::GenOutput],
    rolls: &[Rollout],
    live: &[usize],
) -> PerSeq {
    per_trained_step(outs, rolls, live, |o, t, renormalised| {
        let mass = o.allowed_logmass.get(t).copied().filter(|_| renormalised);
        o.logprobs[t] - mass.unwrap_or(0.0)
    })
}

/// Per live rollout and trained token, the importance weight `old / sampler` of the token's
/// draw ([`crate::rft::ppo::approx_kl`]): 1 where the update scores a token under the
/// distribution it was drawn from (a free step, or a renormalised restricted row); the allowed
/// set's probability mass where a grammar restricted the draw but the update scores the token
/// under the full distribution (`positive_full`, or `renormalise = false`).
fn draw_weights(
    outs: &[crate::model::generate::GenOutput],
    rolls: &[Rollout],
    live: &[usize],
) -> PerSeq {
    per_trained_step(outs, rolls, live, |o, t, renormalised| {
        match o.allowed_logmass.get(t) {
            Some(&lm) if !renormalised => lm.min(0.0).exp(),
            _ => 1.0,
        }
    })
}

/// Errors when a rollout's sampled log-probabilities do not cover its trained tokens.
fn check_sampled(own: &PerSeq, rolls: &[Rollout], live: &[usize]) -> anyhow::Result<()> {
    for (o, &i) in own.iter().zip(live) {
        let trained = rolls[i].seq.mask.iter().filter(|&&m| m == 1).count();
        anyhow::ensure!(
            o.len() == trained,
            "rollout {i}: {} sampled log-probabilities for {trained} trained tokens",
            o.len()
        );
    }
    Ok(())
}

/// Whether two per-sequence vectors have the same lengths.
fn same_shape(a: &PerSeq, b: &PerSeq) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
}

/// Per-token log-probabilities of the response tokens of each sequence (training forward, no
/// gradient kept), plus the final hidden states' values when a value head is given.
fn response_logprobs<B: Backend>(
    model: &Model<B>,
    lora: Option<&Lora<B>>,
    seqs: &[&Sequence],
    restrict: &[&(usize, Vec<Option<TokenSet>>)],
    chunk: usize,
    value_head: Option<&(Tensor<B>, Tensor<B>)>,
    temperature: f32,
) -> anyhow::Result<(PerSeq, PerSeq)> {
    let opts = ForwardOptions {
        temperature,
        ..ForwardOptions::default()
    };
    let mut lps = Vec::with_capacity(seqs.len());
    let mut vals = Vec::with_capacity(seqs.len());
    for (group, rs) in seqs.chunks(chunk.max(1)).zip(restrict.chunks(chunk.max(1))) {
        let batch = pack_restricted(group, rs)?;
        let fwd = forward(model, lora, &batch, opts)?;
        let logp = model.backend.to_host_f32(&fwd.logp)?;
        let values = match value_head {
            Some((w, b)) => {
                model
                    .backend
                    .to_host_f32(&model.backend.linear(&fwd.h_final, w, Some(b))?)?
            }
            None => Vec::new(),
        };
        for s in 0..group.len() {
            let (a, z) = (
                batch.cu_seqlens[s] as usize,
                batch.cu_seqlens[s + 1] as usize,
            );
            let rows: Vec<usize> = (a..z)
                .filter(|&r| batch.targets[r] != IGNORE_TARGET)
                .collect();
            lps.push(rows.iter().map(|&r| logp[r]).collect());
            // The value of the state before response token i is read at the row predicting it.
            vals.push(if values.is_empty() {
                Vec::new()
            } else {
                rows.iter().map(|&r| values[r]).collect()
            });
        }
    }
    Ok((lps, vals))
}

/// A short stable name of a zero-reward reason (metrics keys).
pub fn zero_reason_name(z: &ZeroReason) -> &'static str {
    match z {
        ZeroReason::EmptyAnswer => "empty_answer",
        ZeroReason::InventedTarget { .. } => "invented_target",
        ZeroReason::NoBlocks => "format_error",
        ZeroReason::UnknownFile { .. } => "unknown_file",
        ZeroReason::SearchNotFound { .. } => "search_not_found",
        ZeroReason::NoChange => "no_change",
        ZeroReason::NoOverlap => "no_overlap",
        ZeroReason::NoTruth => "no_truth",
    }
}

/// Encodes every item's prompt; items whose prompt exceeds `max_prompt_tokens` are dropped.
pub fn encode_prompts(
    tok: &Tokenizer,
    items: &[RlItem],
    max_prompt_tokens: usize,
) -> anyhow::Result<Vec<(usize, Vec<u32>)>> {
    let mut out = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let (ids, _) = chat::encode(tok, &[Message::new("user", &it.record.prompt)], true)?;
        if ids.len() <= max_prompt_tokens {
            out.push((i, ids));
        }
    }
    Ok(out)
}

/// The RL trainer's state between steps.
pub struct RlTrainer<B: Backend> {
    /// Settings.
    pub cfg: RlConfig,
    opt: AdamW<B>,
    value_head: Option<(Tensor<B>, Tensor<B>)>,
    value_opt: Option<AdamW<B>>,
    prompts: Vec<(usize, Vec<u32>)>,
    /// Steps done.
    pub step: usize,
    /// The last step's rollouts: (instance, subtask, response text, reward).
    pub last_rollouts: Vec<RolloutLog>,
    /// The last step's prompts (indices into the encoded prompts).
    pub last_chosen: Vec<usize>,
    /// Prompts the monitor keeps out of rollouts.
    pub quarantined: std::collections::BTreeSet<usize>,
    /// A fault injected by `sorft faultbench` (none in real runs).
    pub fault: Option<Injection>,
    /// The settings as configured: what checkpoints record and resumes compare (the monitor's
    /// changes to `cfg` are saved apart, see [`crate::rft::monitor::overrides`]).
    pub base_cfg: RlConfig,
    /// The LoRA adapters being trained (`cfg.lora > 0`); the base model stays frozen.
    pub lora: Option<Lora<B>>,
    /// The execution scorer of edit answers (`stage2.edit_exec`); none: rule rewards.
    pub exec: Option<std::sync::Arc<crate::rft::exec_reward::ExecReward>>,
    /// Saturated-subtask streaks of dynamic sampling (not checkpointed).
    pub saturation: crate::rft::dynamic::Saturation,
    /// The supervised examples of the ptx term (`cfg.ptx_coef`; [`crate::rft::ptx`]).
    pub ptx: Vec<Sequence>,
}

/// One rollout of a step, as written to `rollouts.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RolloutLog {
    /// The step (1-based).
    pub step: usize,
    /// The instance.
    pub instance_id: String,
    /// The subtask.
    pub subtask: String,
    /// The generated response.
    pub response: String,
    /// Its reward.
    pub reward: f64,
}

impl<B: Backend> RlTrainer<B> {
    /// How many prompts the trainer draws from (those that fit the prompt budget).
    pub fn prompts_len(&self) -> usize {
        self.prompts.len()
    }

    /// A trainer for `policy` over `items`.
    pub fn new(
        policy: &Model<B>,
        tok: &Tokenizer,
        items: &[RlItem],
        cfg: RlConfig,
    ) -> anyhow::Result<Self> {
        let be = &policy.backend;
        anyhow::ensure!(
            cfg.temperature.is_finite() && cfg.temperature > 0.0,
            "stage2.temperature must be positive (rollouts are sampled), got {}",
            cfg.temperature
        );
        anyhow::ensure!(
            cfg.grammar_distill.is_finite() && cfg.grammar_distill >= 0.0,
            "stage2.grammar_distill must be 0 or positive, got {}",
            cfg.grammar_distill
        );
        anyhow::ensure!(
            cfg.success_bonus.is_finite() && cfg.success_bonus >= 0.0,
            "stage2.success_bonus must be 0 or positive, got {}",
            cfg.success_bonus
        );
        anyhow::ensure!(
            cfg.dual_clip == 0.0 || (cfg.dual_clip.is_finite() && cfg.dual_clip > 1.0),
            "stage2.dual_clip must be 0 (off) or above 1, got {}",
            cfg.dual_clip
        );
        anyhow::ensure!(
            cfg.ptx_coef.is_finite() && cfg.ptx_coef >= 0.0,
            "stage2.ptx_coef must be 0 or positive, got {}",
            cfg.ptx_coef
        );
        anyhow::ensure!(
            cfg.ptx_coef == 0.0 || cfg.ptx_tokens > 0,
            "stage2.ptx_tokens must be positive when stage2.ptx_coef is set"
        );
        anyhow::ensure!(
            cfg.policy_coef.is_finite() && cfg.policy_coef >= 0.0,
            "stage2.policy_coef must be 0 or positive, got {}",
            cfg.policy_coef
        );
        anyhow::ensure!(
            cfg.tis_cap.is_finite() && cfg.tis_cap > 0.0,
            "stage2.tis_cap must be positive, got {}",
            cfg.tis_cap
        );
        let prompts = encode_prompts(tok, items, cfg.max_prompt_tokens)?;
        if prompts.is_empty() {
            anyhow::bail!(
                "no RL prompt fits max_prompt_tokens = {}",
                cfg.max_prompt_tokens
            );
        }
        let ocfg = OptimConfig {
            lr: cfg.lr,
            max_grad_norm: cfg.max_grad_norm,
            warmup_steps: 0,
            total_steps: (cfg.steps * cfg.ppo_epochs * 4).max(1) as u64,
            min_lr_ratio: 1.0,
            ..Default::default()
        };
        let lora = crate::rft::rl_lora::new_adapters(policy, &cfg)?;
        let opt = match &lora {
            Some(l) => AdamW::new(be, ocfg, &l.params())?,
            None => AdamW::new(be, ocfg, &model_params(policy))?,
        };
        let (value_head, value_opt) = if cfg.algorithm == Algorithm::Ppo {
            let d = policy.config.hidden_size;
            let w = be.zeros(&[1, d], DType::F32)?;
            let b = be.zeros(&[1], DType::F32)?;
            let vcfg = OptimConfig {
                lr: cfg.value_lr,
                max_grad_norm: 0.0,
                min_lr_ratio: 1.0,
                total_steps: 1,
                ..Default::default()
            };
            let vo = AdamW::new(
                be,
                vcfg,
                &[
                    ("value.weight".to_string(), &w),
                    ("value.bias".to_string(), &b),
                ],
            )?;
            (Some((w, b)), Some(vo))
        } else {
            (None, None)
        };
        Ok(Self {
            base_cfg: cfg.clone(),
            cfg,
            opt,
            value_head,
            value_opt,
            prompts,
            step: 0,
            last_rollouts: Vec::new(),
            last_chosen: Vec::new(),
            quarantined: Default::default(),
            fault: None,
            lora,
            exec: None,
            saturation: Default::default(),
            ptx: Vec::new(),
        })
    }

    /// Fresh optimizer moments (after the monitor rolled the policy back).
    pub fn reset_optimizer(&mut self, policy: &Model<B>) -> anyhow::Result<()> {
        let params = match &self.lora {
            Some(l) => l.params(),
            None => model_params(policy),
        };
        self.opt = AdamW::new(&policy.backend, self.opt.config.clone(), &params)?;
        Ok(())
    }

    /// One rollout + update step against a separate reference model.
    pub fn step(
        &mut self,
        policy: &mut Model<B>,
        reference: &Model<B>,
        tok: &Tokenizer,
        items: &[RlItem],
    ) -> anyhow::Result<RlMetrics> {
        self.step_impl(policy, Some(reference), tok, items)
    }

    /// One LoRA rollout + update step whose reference is `base` with the adapters switched off
    /// (no second copy of the weights). Errors without LoRA adapters.
    pub fn step_adapters_off(
        &mut self,
        base: &mut Model<B>,
        tok: &Tokenizer,
        items: &[RlItem],
    ) -> anyhow::Result<RlMetrics> {
        anyhow::ensure!(
            self.lora.is_some(),
            "the adapters-off reference needs LoRA (stage2.lora > 0)"
        );
        self.step_impl(base, None, tok, items)
    }

    fn step_impl(
        &mut self,
        policy: &mut Model<B>,
        reference: Option<&Model<B>>,
        tok: &Tokenizer,
        items: &[RlItem],
    ) -> anyhow::Result<RlMetrics> {
        if let Some(f) = self.fault.as_mut() {
            f.on_step_start(self.step + 1, &mut self.cfg);
        }
        self.opt.config.lr = self.cfg.lr;
        let cfg = self.cfg.clone();
        let be = policy.backend.clone();
        self.step += 1;
        let mut m = RlMetrics {
            step: self.step,
            ..Default::default()
        };
        // ---- rollout ----
        let t0 = Instant::now();
        let mut rng = SplitMix::new(random_u64(cfg.seed, 0x5e1, self.step as u64));
        let n_sample = crate::rft::dynamic::prompts_to_sample(
            cfg.prompts_per_step,
            cfg.dynamic_sampling,
            cfg.max_refill,
        );
        // Uniform draws from the prompts not quarantined (all of them: `allowed[i] == i`).
        let allowed: Vec<usize> = (0..self.prompts.len())
            .filter(|p| !self.quarantined.contains(p))
            .collect();
        let allowed = if allowed.is_empty() {
            (0..self.prompts.len()).collect()
        } else {
            allowed
        };
        let mut chosen: Vec<usize> = (0..n_sample)
            .map(|_| allowed[rng.below(allowed.len() as u64) as usize])
            .collect();
        // The pool the duplicate chance is judged against: thinning makes draws non-uniform, so
        // its effective size (1 / sum p^2, exact for the chance that two draws agree).
        let mut pool = allowed.len();
        if cfg.dynamic_sampling {
            let sat = self.saturation.saturated(cfg.saturate_after);
            let n = self.prompts.len() as u64;
            let sub = |p: usize| items[self.prompts[p].0].record.subtask.name().to_string();
            let thinned = allowed.iter().filter(|&&p| sat.contains(&sub(p))).count();
            pool = crate::rft::dynamic::effective_pool(allowed.len(), thinned);
            crate::rft::dynamic::thin_saturated(&mut chosen, sub, &sat, || rng.below(n) as usize);
        }
        if let Some(f) = &self.fault {
            f.on_prompts(self.step, &mut chosen);
        }
        let n_prompts = self.prompts.len();
        crate::rft::monitor::supervisor::avoid_quarantined(
            &mut chosen,
            n_prompts,
            &self.quarantined,
        );
        self.last_chosen = chosen.clone();
        let mut reqs = Vec::new();
        for (gi, &p) in chosen.iter().enumerate() {
            let constraint = crate::swe::grammar::constraint_for(
                &items[self.prompts[p].0].record,
                cfg.max_new_tokens,
                cfg.constrain,
                cfg.ground,
                cfg.faithful,
            );
            for k in 0..cfg.group_size {
                reqs.push(GenRequest {
                    prompt: self.prompts[p].1.clone(),
                    params: SamplingParams {
                        temperature: cfg.temperature,
                        top_k: 0,
                        top_p: 1.0,
                        seed: random_u64(
                            cfg.seed,
                            self.step as u64,
                            (gi * cfg.group_size + k) as u64,
                        ),
                    },
                    max_new_tokens: cfg.max_new_tokens,
                    stop_ids: match &self.fault {
                        Some(f) if f.ignore_stop(self.step, gi * cfg.group_size + k) => Vec::new(),
                        _ => tok.stop_ids(),
                    },
                    stop_strings: Vec::new(),
                    constraint: if k < cfg.free_per_group {
                        None
                    } else {
                        constraint.clone()
                    },
                    min_allowed_mass: cfg.min_allowed_mass,
                });
            }
        }
        let mut outs = generate_adapted(
            policy,
            Adapters::new(self.lora.as_ref()),
            Some(tok),
            &reqs,
            &GenOptions {
                max_batch: cfg.rollout_batch,
                progress: false,
            },
        )?;
        if let Some(f) = &self.fault {
            crate::rft::monitor::inject::corrupt_outputs(f, self.step, tok, &mut outs)?;
        }
        m.time_rollout = t0.elapsed().as_secs_f64();
        let gen_tokens: usize = outs.iter().map(|o| o.ids.len()).sum();
        m.rollout_tokens_per_s = gen_tokens as f64 / m.time_rollout.max(1e-9);
        // ---- reward ----
        let t1 = Instant::now();
        let mut rolls = Vec::with_capacity(outs.len());
        self.last_rollouts.clear();
        let mut by_sub: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut override_by_sub: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        let texts: Vec<&str> = outs.iter().map(|o| o.text.as_str()).collect();
        let record_of = |j: usize| &items[self.prompts[chosen[j / cfg.group_size.max(1)]].0].record;
        let executed = crate::rft::exec_reward::step_rewards(
            self.exec.as_deref(),
            &texts,
            record_of,
            cfg.edit_reward,
        )?;
        let mut audits = Vec::with_capacity(outs.len());
        for (j, o) in outs.iter().enumerate() {
            let gi = j / cfg.group_size.max(1);
            let (item, prompt) = (&self.prompts[chosen[gi]].0, &self.prompts[chosen[gi]].1);
            let rec = &items[*item].record;
            let mut r = rec.reward(&o.text, cfg.edit_reward);
            // The monitor's audit: the rule score, where it is the reward.
            audits.push(executed[j].is_none().then_some(r.reward));
            let mut reason = r.zero_reason.as_ref().map(zero_reason_name);
            if let Some(x) = executed[j] {
                if x == 0.0 && reason.is_none() {
                    reason = Some("unresolved");
                }
                r.reward = x;
            }
            if let Some(f) = &self.fault {
                let other = &items[self.prompts[(chosen[gi] + 1) % n_prompts].0].record;
                let score_other = || other.reward(&o.text, cfg.edit_reward).reward;
                let (x, why) = f.on_reward(self.step, j, r.reward, o.ids.is_empty(), &score_other);
                r.reward = x;
                reason = why.or(reason);
            }
            self.last_rollouts.push(RolloutLog {
                step: self.step,
                instance_id: rec.instance_id.clone(),
                subtask: rec.subtask.name().to_string(),
                response: o.text.clone(),
                reward: r.reward,
            });
            if let Some(z) = reason {
                *m.zero_reasons.entry(z.to_string()).or_default() += 1;
            }
            by_sub
                .entry(rec.subtask.name().to_string())
                .or_default()
                .push(r.reward);
            let cut = override_by_sub
                .entry(rec.subtask.name().to_string())
                .or_insert((0.0, 0usize));
            for (a, lm) in o.allowed.iter().zip(&o.allowed_logmass) {
                if a.is_some() {
                    cut.0 += 1.0 - (*lm as f64).exp();
                    cut.1 += 1;
                }
            }
            let mut ids = prompt.clone();
            ids.extend(&o.ids);
            // Tokens a constraint forced carry no decision: they stay out of the loss.
            let mut mask = vec![0u8; prompt.len()];
            mask.extend(
                (0..o.ids.len()).map(|t| u8::from(!o.forced.get(t).copied().unwrap_or(false))),
            );
            rolls.push(Rollout {
                group: gi,
                seq: Sequence {
                    ids,
                    mask,
                    weight: 1.0,
                },
                response: o.ids.clone(),
                score: r.reward as f32,
                restrict: (
                    prompt.len(),
                    if cfg.renormalise {
                        (0..o.ids.len()).map(|t| restricted_set(o, t)).collect()
                    } else {
                        Vec::new()
                    },
                ),
            });
        }
        let mut scores: Vec<f32> = rolls.iter().map(|r| r.score).collect();
        if let Some(f) = &self.fault {
            f.on_scores(self.step, &mut scores);
        }
        m.health = health::rollout_health(
            &outs,
            &scores,
            &chosen,
            (cfg.group_size, pool),
            &m.zero_reasons,
        );
        m.health.audit = health::reward_audit(&scores, &audits);
        // Non-finite rewards are counted (a fault) and zeroed so they never reach the weights.
        for (r, s) in rolls.iter_mut().zip(scores.iter_mut()) {
            if !s.is_finite() {
                *s = 0.0;
            }
            r.score = *s;
        }
        if cfg.positive_full {
            unconstrain_above_mean(&mut rolls);
        }
        if cfg.success_bonus > 0.0 {
            rolls
                .iter_mut()
                .filter(|r| is_success(r.score))
                .for_each(unconstrain);
        }
        let n = scores.len().max(1) as f64;
        m.reward_mean = scores.iter().map(|&s| s as f64).sum::<f64>() / n;
        m.reward_std = (scores
            .iter()
            .map(|&s| (s as f64 - m.reward_mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        m.reward_by_subtask = by_sub
            .into_iter()
            .map(|(k, v)| (k, v.iter().sum::<f64>() / v.len() as f64))
            .collect();
        m.override_mass = override_by_sub
            .into_iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(k, (sum, n))| (k, sum / n as f64))
            .collect();
        m.response_len = gen_tokens as f64 / n;
        m.time_reward = t1.elapsed().as_secs_f64();
        // ---- old / reference log-probs, advantages ----
        let t2 = Instant::now();
        let uniform = |g: usize| {
            let mut it = rolls.iter().filter(|r| r.group == g).map(|r| r.score);
            let first = it.next();
            it.all(|s| Some(s) == first)
        };
        let skip_uniform =
            cfg.skip_uniform_groups && cfg.algorithm != Algorithm::Ppo && cfg.entropy_coef == 0.0;
        let group_scores: Vec<Vec<f32>> = (0..chosen.len())
            .map(|g| {
                rolls
                    .iter()
                    .filter(|r| r.group == g)
                    .map(|r| r.score)
                    .collect()
            })
            .collect();
        let sel = crate::rft::dynamic::select_groups(
            &group_scores,
            if cfg.dynamic_sampling {
                cfg.prompts_per_step
            } else {
                chosen.len()
            },
        );
        m.refilled_groups = sel.refilled;
        if cfg.dynamic_sampling {
            let subs: Vec<(String, Vec<f32>)> = (chosen.iter().zip(group_scores))
                .map(|(&p, s)| {
                    (
                        items[self.prompts[p].0].record.subtask.name().to_string(),
                        s,
                    )
                })
                .collect();
            self.saturation.update(&subs);
        }
        let live: Vec<usize> = (0..rolls.len())
            .filter(|&i| !rolls[i].response.is_empty() && rolls[i].seq.mask.contains(&1))
            .filter(|&i| {
                !left_out_as_tied(
                    skip_uniform && uniform(rolls[i].group),
                    rolls[i].score,
                    cfg.success_bonus,
                )
            })
            .filter(|&i| sel.keep[rolls[i].group])
            .collect();
        m.trained_sequences = live.len();
        let seqs: Vec<&Sequence> = live.iter().map(|&i| &rolls[i].seq).collect();
        let restrict: Vec<&(usize, Vec<Option<TokenSet>>)> =
            live.iter().map(|&i| &rolls[i].restrict).collect();
        // The sampler's log-probabilities are the policy's own at the rollout temperature (on
        // the CPU the same kernels as the training forward); minus the allowed set's log-mass on
        // the restricted tokens, they are what the training forward computes. Where they are not
        // (a GPU, or `rescore = on`), the training forward re-scores them (and PPO's critic
        // needs that pass anyway): see [`crate::rft::mismatch`].
        let fopts = ForwardOptions {
            temperature: cfg.temperature,
            ..ForwardOptions::default()
        };
        let own = sampler_logprobs(&outs, &rolls, &live);
        let draw_w = draw_weights(&outs, &rolls, &live);
        let rescore = cfg.rescore.enabled(&be.name());
        let (trainer_lp, old_values) = if self.value_head.is_some() || rescore {
            let (lp, v) = response_logprobs(
                policy,
                self.lora.as_ref(),
                &seqs,
                &restrict,
                cfg.minibatch,
                self.value_head.as_ref(),
                cfg.temperature,
            )?;
            (Some(lp), v)
        } else {
            (None, vec![Vec::new(); live.len()])
        };
        let rec = match trainer_lp {
            None => {
                check_sampled(&own, &rolls, &live)?;
                reconcile(own, None, cfg.tis_cap)
            }
            // PPO without re-scoring: the trainer's numbers, as always (no comparison).
            Some(t) if !rescore && !same_shape(&own, &t) => reconcile(t, None, cfg.tis_cap),
            t => reconcile(own, t, cfg.tis_cap),
        }
        .map_err(anyhow::Error::msg)?;
        if let Some(d) = rec.diff {
            (m.rollout_probs_diff_mean, m.rollout_probs_diff_max) = (Some(d.mean), Some(d.max));
        }
        let tis = rescore.then_some(rec.weights);
        let mut old = rec.old;
        // The reference: a separate model, or the policy's base weights with the adapters off.
        let (refl, _) = response_logprobs(
            reference.unwrap_or(policy),
            None,
            &seqs,
            &restrict,
            cfg.minibatch,
            None,
            cfg.temperature,
        )?;
        let kl_tok: Vec<Vec<f32>> = old
            .iter()
            .zip(&refl)
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x - y).collect())
            .collect();
        if let Some(f) = &self.fault {
            f.on_old_logprobs(self.step, &mut old);
        }
        m.health.kl_k3 = health::kl_k3(&kl_tok.concat());
        let ntok: usize = old.iter().map(Vec::len).sum();
        m.kl = kl_tok.iter().flatten().map(|&x| x as f64).sum::<f64>() / ntok.max(1) as f64;
        let live_scores: Vec<f32> = live.iter().map(|&i| rolls[i].score).collect();
        let (mut adv, returns): (Vec<Vec<f32>>, Vec<Vec<f32>>) = match cfg.algorithm {
            Algorithm::Grpo | Algorithm::Rloo => {
                // Group statistics over every member (also those left out of the update); RLOO
                // folds the KL penalty into the score before its leave-one-out baseline.
                let all_scores: Vec<f32> = rolls.iter().map(|r| r.score).collect();
                let all_groups: Vec<usize> = rolls.iter().map(|r| r.group).collect();
                let kl_sums: Vec<f32> = kl_tok.iter().map(|k| k.iter().sum()).collect();
                let a = group_advantages(
                    &all_scores,
                    &all_groups,
                    &live,
                    cfg.algorithm == Algorithm::Rloo,
                    &kl_sums,
                    cfg.kl_coef,
                );
                (
                    old.iter()
                        .zip(&a)
                        .map(|(lp, &x)| vec![x; lp.len()])
                        .collect(),
                    Vec::new(),
                )
            }
            Algorithm::Ppo => {
                let mut advs = Vec::new();
                let mut rets = Vec::new();
                for (i, (&score, k)) in live_scores.iter().zip(&kl_tok).enumerate() {
                    let rewards = shaped_rewards(score, k, cfg.kl_coef);
                    let (a, r) = gae(&rewards, &old_values[i], cfg.gamma, cfg.lambda);
                    advs.push(a);
                    rets.push(r);
                }
                (advs, rets)
            }
        };
        if cfg.algorithm == Algorithm::Ppo && cfg.whiten_advantages {
            let mut flat: Vec<f32> = adv.iter().flatten().copied().collect();
            whiten(&mut flat, true);
            let mut it = flat.into_iter();
            for a in adv.iter_mut() {
                for x in a.iter_mut() {
                    *x = it.next().unwrap_or(0.0);
                }
            }
        }
        if cfg.success_bonus > 0.0 {
            add_success_bonus(&mut adv, &live_scores, cfg.success_bonus);
        }
        if cfg.policy_coef != 1.0 {
            adv.iter_mut().flatten().for_each(|a| *a *= cfg.policy_coef);
        }
        if let Some(f) = &self.fault {
            f.on_advantages(self.step, &mut adv);
        }
        health::advantage_health(&mut m.health, &mut adv, &live_scores);
        // ---- updates ----
        let pcfg = PolicyLossConfig {
            clip_eps: cfg.clip_eps,
            kl_coef: if cfg.algorithm == Algorithm::Grpo {
                cfg.kl_coef
            } else {
                0.0
            },
            kl_estimator: cfg.kl_estimator,
            dual_clip: cfg.dual_clip,
        };
        let mut grads = Grads::new(policy, self.lora.as_ref())?;
        let (mut ent_sum, mut ent_n, mut clip_sum, mut akl_sum, mut gn_sum, mut nmb) =
            (0.0, 0usize, 0.0, 0.0, 0.0, 0usize);
        let (mut vl_sum, mut ev_sum) = (0.0, 0.0);
        let (mut distill_sum, mut distill_n) = (0.0f64, 0usize);
        let mut ptx_sum = 0.0f64;
        let ptx_lens: Vec<usize> = self.ptx.iter().map(|s| s.ids.len()).collect();
        let mut order: Vec<usize> = (0..live.len()).collect();
        for epoch in 0..cfg.ppo_epochs {
            let mut r = SplitMix::new(random_u64(cfg.seed, self.step as u64, 0xe0 + epoch as u64));
            for i in (1..order.len()).rev() {
                order.swap(i, r.below(i as u64 + 1) as usize);
            }
            for mb in order.chunks(cfg.minibatch.max(1)) {
                let mb_seqs: Vec<&Sequence> = mb.iter().map(|&i| seqs[i]).collect();
                let mb_restrict: Vec<_> = mb.iter().map(|&i| restrict[i]).collect();
                let batch = pack_restricted(&mb_seqs, &mb_restrict)?;
                let mut fwd = forward(policy, self.lora.as_ref(), &batch, fopts)?;
                let logp_rows = be.to_host_f32(&fwd.logp)?;
                // Restricted rows hold (and get the gradient of) their renormalised entropy.
                let ent_rows = be.to_host_f32(&fwd.entropy)?;
                // Gather response-token rows in order.
                let mut rows = Vec::new();
                for s in 0..mb.len() {
                    let (a, z) = (
                        batch.cu_seqlens[s] as usize,
                        batch.cu_seqlens[s + 1] as usize,
                    );
                    rows.extend((a..z).filter(|&r| batch.targets[r] != IGNORE_TARGET));
                }
                let new_lp: Vec<f32> = rows.iter().map(|&r| logp_rows[r]).collect();
                let old_lp: Vec<f32> = mb.iter().flat_map(|&i| old[i].iter().copied()).collect();
                let ref_lp: Vec<f32> = mb.iter().flat_map(|&i| refl[i].iter().copied()).collect();
                let mut a: Vec<f32> = mb.iter().flat_map(|&i| adv[i].iter().copied()).collect();
                if let Some(w) = &tis {
                    // Truncated importance sampling: the sampler, not the old policy, drew them.
                    let w = mb.iter().flat_map(|&i| w[i].iter().copied());
                    a.iter_mut().zip(w).for_each(|(x, w)| *x *= w);
                }
                let pl = policy_loss(&pcfg, &new_lp, &old_lp, &a, Some(&ref_lp));
                let w: Vec<f32> = mb.iter().flat_map(|&i| draw_w[i].iter().copied()).collect();
                health::ratio_health(&mut m.health, &new_lp, &old_lp, Some(&w), nmb == 0);
                let nt = rows.len().max(1);
                let mut g_logp = vec![0.0f32; batch.len()];
                let mut g_ent = vec![0.0f32; batch.len()];
                for (k, &r) in rows.iter().enumerate() {
                    g_logp[r] = pl.dlogp[k];
                    g_ent[r] = -cfg.entropy_coef / nt as f32;
                    ent_sum += ent_rows[r] as f64;
                }
                ent_n += rows.len();
                if let Some(r) = fwd.restricted.as_mut() {
                    let (sum, n) =
                        grammar_distill(r, &logp_rows, &mut g_logp, cfg.grammar_distill, nt);
                    distill_sum += sum;
                    distill_n += n;
                }
                clip_sum += pl.clip_frac;
                akl_sum += approx_kl(&new_lp, &old_lp, Some(&w));
                // Value head on detached features.
                if let (Some((w, b)), Some(vopt)) =
                    (self.value_head.as_mut(), self.value_opt.as_mut())
                {
                    let vals_rows = be.to_host_f32(&be.linear(&fwd.h_final, w, Some(b))?)?;
                    let v: Vec<f32> = rows.iter().map(|&r| vals_rows[r]).collect();
                    let vo: Vec<f32> = mb
                        .iter()
                        .flat_map(|&i| old_values[i].iter().copied())
                        .collect();
                    let ret: Vec<f32> = mb
                        .iter()
                        .flat_map(|&i| returns[i].iter().copied())
                        .collect();
                    let (vl, dv, _) = value_loss(&v, &vo, &ret, cfg.value_clip);
                    vl_sum += vl;
                    ev_sum += explained_variance(&v, &ret);
                    let mut dv_rows = vec![0.0f32; batch.len()];
                    for (k, &r) in rows.iter().enumerate() {
                        dv_rows[r] = dv[k];
                    }
                    let dvt = be.upload(HostData::F32(&dv_rows), &[batch.len(), 1])?;
                    let mut gw = be.zeros(&[1, policy.config.hidden_size], DType::F32)?;
                    be.matmul(&dvt, true, &fwd.h_final, false, &mut gw, false)?;
                    let gb_val: f32 = dv_rows.iter().sum();
                    let mut gb = be.upload(HostData::F32(&[gb_val]), &[1])?;
                    vopt.step_with_lr(
                        &be,
                        vec![("value.weight".into(), w), ("value.bias".into(), b)],
                        vec![
                            ("value.weight".into(), &mut gw),
                            ("value.bias".into(), &mut gb),
                        ],
                        cfg.value_lr,
                    )?;
                }
                let g_logp_t = be.upload(HostData::F32(&g_logp), &[batch.len()])?;
                let g_ent_t = be.upload(HostData::F32(&g_ent), &[batch.len()])?;
                backward(
                    policy,
                    self.lora.as_ref(),
                    fwd,
                    &g_logp_t,
                    &g_ent_t,
                    &mut grads,
                )?;
                if cfg.ptx_coef > 0.0 && !self.ptx.is_empty() {
                    let seed = crate::rft::ptx::batch_seed(cfg.seed, self.step, epoch, nmb);
                    let pick = crate::rft::ptx::draw(&ptx_lens, cfg.ptx_tokens, seed);
                    let seqs: Vec<Sequence> = pick.iter().map(|&i| self.ptx[i].clone()).collect();
                    ptx_sum += crate::rft::ptx::accumulate(
                        policy,
                        self.lora.as_ref(),
                        &seqs,
                        cfg.ptx_coef,
                        &mut grads,
                    )?;
                }
                let params = match self.lora.as_mut() {
                    Some(l) => l.params_mut(),
                    None => model_params_mut(policy),
                };
                let st = self.opt.step(&be, params, &mut grads)?;
                grads.zero(&be)?;
                gn_sum += st.grad_norm;
                m.health.lr = st.lr as f64;
                nmb += 1;
            }
        }
        let nmb_f = nmb.max(1) as f64;
        m.entropy = if ent_n > 0 {
            ent_sum / ent_n as f64
        } else {
            // No update this step: the sampled tokens' mean surprisal estimates the entropy.
            let (sum, n) = outs
                .iter()
                .flat_map(|o| o.logprobs.iter())
                .fold((0.0, 0usize), |(s, n), &lp| (s - lp as f64, n + 1));
            sum / n.max(1) as f64
        };
        m.clip_frac = clip_sum / nmb_f;
        m.distill_loss = distill_sum / distill_n.max(1) as f64;
        m.ptx_loss = ptx_sum / nmb_f;
        if nmb == 0 {
            m.health.lr = cfg.lr as f64;
        }
        (m.health.kl_coef, m.health.clip_eps) = (cfg.kl_coef as f64, cfg.clip_eps as f64);
        m.health.temperature = cfg.temperature as f64;
        m.approx_kl = akl_sum / nmb_f;
        m.grad_norm = gn_sum / nmb_f;
        m.value_loss = vl_sum / nmb_f;
        m.explained_variance = ev_sum / nmb_f;
        m.time_train = t2.elapsed().as_secs_f64();
        m.peak_rss_mib = crate::train::memory::peak_rss_mib();
        Ok(m)
    }
}

/// Format tag of `rl_state.json`.
const RL_STATE_FORMAT: &str = "sorft-rl-state-1";

/// What an RL checkpoint records besides tensors.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RlState {
    format: String,
    step: usize,
    opt_step: u64,
    value_opt_step: u64,
    reference: String,
    config: RlConfig,
}

/// A fingerprint of a reference model directory that survives moving or renaming it: the sizes of
/// its weight files and checksums of `config.json` and of 16 spread 64 KiB samples of each weight
/// file (cheap even for a 15 GB model).
fn reference_fingerprint(dir: &std::path::Path) -> anyhow::Result<String> {
    use crate::train::checkpoint::checksum64;
    use std::io::{Read, Seek, SeekFrom};
    let cfg = dir.join("config.json");
    let text = std::fs::read(&cfg).map_err(|e| anyhow::anyhow!("{}: {e}", cfg.display()))?;
    let mut parts = vec![format!("config:{:016x}", checksum64(&text))];
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for p in files {
        let mut f = std::fs::File::open(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        let len = f.metadata()?.len();
        let mut buf = vec![0u8; 1 << 16];
        let mut h = Vec::new();
        for k in 0..16u64 {
            let off = len.saturating_sub(buf.len() as u64) * k / 15;
            f.seek(SeekFrom::Start(off))?;
            let n = f.read(&mut buf)?;
            h.extend_from_slice(&checksum64(&buf[..n]).to_le_bytes());
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        parts.push(format!("{name}:{len}:{:016x}", checksum64(&h)));
    }
    Ok(parts.join(","))
}

/// The settings that must match for a resumed run to continue the same trajectory (`steps`,
/// `save_every` and `keep_last` may change).
fn trajectory_settings(c: &RlConfig) -> RlConfig {
    RlConfig {
        steps: 0,
        save_every: 0,
        keep_last: 0,
        ..c.clone()
    }
}

impl<B: Backend> RlTrainer<B> {
    /// Writes a checkpoint of the run after `self.step` steps under `root` (`step-N/`: the policy
    /// as a model directory with the side files of `model_src`, the optimizer moments, the value
    /// head and its moments, and `rl_state.json` with the step — the rollout cursor and the RNG
    /// position, since both are functions of `(seed, step)` — and a fingerprint of the reference model), then
    /// keeps the newest `keep_last`. Written whole or not at all.
    pub fn save_checkpoint(
        &self,
        policy: &Model<B>,
        model_src: &std::path::Path,
        reference: &std::path::Path,
        root: &std::path::Path,
    ) -> anyhow::Result<std::path::PathBuf> {
        self.save_checkpoint_with(policy, model_src, reference, root, Vec::new())
    }

    /// [`RlTrainer::save_checkpoint`] with `extra` files (name, bytes) in the same checkpoint
    /// (the monitor's state).
    pub fn save_checkpoint_with(
        &self,
        policy: &Model<B>,
        model_src: &std::path::Path,
        reference: &std::path::Path,
        root: &std::path::Path,
        extra: Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<std::path::PathBuf> {
        use crate::train::checkpoint::{self, side_files, stream_tensors, CheckpointWriter};
        let be = &policy.backend;
        let mut w = CheckpointWriter::begin(root, self.step as u64)?;
        for (f, bytes) in extra {
            w.add_bytes(&f, &bytes)?;
        }
        for (f, bytes) in side_files(model_src)? {
            w.add_bytes(&f, &bytes)?;
        }
        match &self.lora {
            // LoRA: the adapters only (the base model is the reference directory itself).
            Some(l) => crate::rft::rl_lora::add_to_checkpoint(
                &mut w,
                be,
                l,
                root,
                &reference.to_string_lossy(),
            )?,
            None => w.add_safetensors(
                "model.safetensors",
                stream_tensors(be, model_params(policy), ""),
            )?,
        }
        w.add_safetensors("optimizer.safetensors", self.opt.state_stream(be))?;
        let mut value_opt_step = 0;
        if let (Some((vw, vb)), Some(vo)) = (&self.value_head, &self.value_opt) {
            let mut t = vo.state_stream(be);
            t.extend(stream_tensors(
                be,
                vec![("value.weight".into(), vw), ("value.bias".into(), vb)],
                "",
            ));
            w.add_safetensors("value.safetensors", t)?;
            value_opt_step = vo.step;
        }
        let st = RlState {
            format: RL_STATE_FORMAT.into(),
            step: self.step,
            opt_step: self.opt.step,
            value_opt_step,
            reference: reference_fingerprint(reference)?,
            config: self.base_cfg.clone(),
        };
        w.add_bytes(
            "rl_state.json",
            serde_json::to_string_pretty(&st)?.as_bytes(),
        )?;
        let dir = w.commit()?;
        checkpoint::prune(root, self.cfg.keep_last)?;
        Ok(dir)
    }

    /// Restores the trainer from checkpoint `dir` (verified against its manifest) and returns the
    /// policy saved there (`None` for LoRA: the adapters are restored into the trainer and the
    /// policy stays the base model). The checkpoint must come from the same settings and
    /// reference.
    pub fn resume(
        &mut self,
        dir: &std::path::Path,
        reference: &std::path::Path,
        backend: &B,
    ) -> anyhow::Result<Option<Model<B>>> {
        use crate::train::checkpoint::{read_f32_tensors, verify};
        verify(dir)?;
        let sp = dir.join("rl_state.json");
        let text =
            std::fs::read_to_string(&sp).map_err(|e| anyhow::anyhow!("{}: {e}", sp.display()))?;
        let st: RlState =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", sp.display()))?;
        if st.format != RL_STATE_FORMAT {
            anyhow::bail!(
                "{}: format {:?}, expected {RL_STATE_FORMAT:?}",
                sp.display(),
                st.format
            );
        }
        if trajectory_settings(&st.config) != trajectory_settings(&self.base_cfg) {
            anyhow::bail!(
                "{}: the checkpoint was made with other RL settings; resume with the same configuration (only steps, save_every and keep_last may change)",
                sp.display()
            );
        }
        if st.reference != reference_fingerprint(reference)? {
            anyhow::bail!(
                "{}: the checkpoint was made against another reference model than {}",
                sp.display(),
                reference.display()
            );
        }
        let policy = match &mut self.lora {
            Some(l) => {
                let mc = crate::model::ModelConfig::from_file(&dir.join("config.json"))?;
                *l = Lora::load_peft(backend, dir, &mc)?;
                None
            }
            None => Some(Model::load(backend, dir)?),
        };
        self.opt
            .load_state(backend, &dir.join("optimizer.safetensors"))?;
        self.opt.step = st.opt_step;
        if let (Some((w, b)), Some(vo)) = (self.value_head.as_mut(), self.value_opt.as_mut()) {
            let vp = dir.join("value.safetensors");
            vo.load_state(backend, &vp)?;
            vo.step = st.value_opt_step;
            let t = read_f32_tensors(&vp)?;
            for (name, dst) in [("value.weight", w), ("value.bias", b)] {
                let (shape, data) = t
                    .get(name)
                    .ok_or_else(|| anyhow::anyhow!("{}: {name} missing", vp.display()))?;
                if shape.as_slice() != dst.shape() {
                    anyhow::bail!(
                        "{}: {name} has shape {shape:?}, expected {:?}",
                        vp.display(),
                        dst.shape()
                    );
                }
                *dst = backend.upload_f32_exact(data, shape)?;
            }
        }
        self.step = st.step;
        Ok(policy)
    }
}

/// Writes a policy as a Hugging Face model directory: `model.safetensors` with its current
/// weights, and the config and tokenizer files copied from `src_dir`.
pub fn export_policy<B: Backend>(
    policy: &Model<B>,
    src_dir: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use crate::model::st_writer::write_safetensors;
    use crate::model::weights::write_atomic_with;
    std::fs::create_dir_all(out)?;
    let views = crate::train::checkpoint::stream_tensors(&policy.backend, model_params(policy), "");
    write_atomic_with(&out.join("model.safetensors"), |w| {
        write_safetensors(w, views).map(|_| ())
    })?;
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        let src = src_dir.join(f);
        if src.exists() {
            std::fs::copy(&src, out.join(f))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(group: usize, score: f32) -> Rollout {
        let set = TokenSet::from_fn(8, |t| t < 3);
        Rollout {
            group,
            seq: Sequence {
                ids: vec![5, 6, 1, 2, 7],
                // Prompt of 2 tokens, then a free token, a forced one and a restricted one.
                mask: vec![0, 0, 1, 0, 1],
                weight: 1.0,
            },
            response: vec![1, 2, 7],
            score,
            restrict: (2, vec![None, None, Some(set)]),
        }
    }

    #[test]
    fn only_rollouts_above_their_groups_mean_are_unconstrained() {
        // Group 0: mean 0.5 (one above, one below); group 1: all tie (none above).
        let mut rolls = vec![
            rollout(0, 1.0),
            rollout(0, 0.0),
            rollout(1, 0.5),
            rollout(1, 0.5),
        ];
        unconstrain_above_mean(&mut rolls);
        assert_eq!(
            rolls[0].seq.mask,
            vec![0, 0, 1, 1, 1],
            "forced token back in"
        );
        assert!(rolls[0].restrict.1.iter().all(Option::is_none));
        for r in &rolls[1..] {
            assert_eq!(r.seq.mask, vec![0, 0, 1, 0, 1]);
            assert!(r.restrict.1[2].is_some());
        }
    }

    #[test]
    fn the_success_bonus_goes_to_full_reward_rollouts_only() {
        let mut adv = vec![vec![0.5, 0.5], vec![0.0; 3], vec![-0.5], vec![0.0]];
        add_success_bonus(&mut adv, &[1.0, 1.0, 0.999, 0.0], 0.7);
        assert_eq!(
            adv,
            vec![vec![1.2, 1.2], vec![0.7; 3], vec![-0.5], vec![0.0]]
        );
        assert!(is_success(1.0) && !is_success(0.99));
        // Tied groups: out of the update, unless they tied at 1 and the bonus is on.
        assert!(left_out_as_tied(true, 1.0, 0.0) && left_out_as_tied(true, 0.5, 1.0));
        assert!(!left_out_as_tied(true, 1.0, 1.0) && !left_out_as_tied(false, 0.0, 0.0));
        let mut r = rollout(0, 1.0);
        unconstrain(&mut r);
        assert_eq!(r.seq.mask, vec![0, 0, 1, 1, 1]);
        assert!(r.restrict.1.iter().all(Option::is_none));
    }

    #[test]
    fn forced_tokens_scored_in_full_weigh_by_their_allowed_mass() {
        let mut rolls = vec![rollout(0, 1.0), rollout(0, 0.0)];
        unconstrain_above_mean(&mut rolls);
        let out = crate::model::generate::GenOutput {
            ids: vec![1, 2, 7],
            logprobs: vec![-0.1, -9.0, -1.0],
            text: String::new(),
            forced: vec![false, true, false],
            allowed: Vec::new(),
            allowed_logmass: vec![0.0, 0.01f32.ln(), 0.5f32.ln()],
            finish: crate::model::generate::FinishReason::Stop,
        };
        let w = draw_weights(&[out.clone(), out], &rolls, &[0, 1]);
        // Above the mean: every token in the loss under the full distribution, each weighted by
        // the mass its draw's allowed set held (1 on the free step).
        let close = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
        };
        assert!(close(&w[0], &[1.0, 0.01, 0.5]), "{:?}", w[0]);
        // Below: the forced token is out, the restricted one is scored renormalised (its draw).
        assert!(close(&w[1], &[1.0, 1.0]), "{:?}", w[1]);
    }
}
