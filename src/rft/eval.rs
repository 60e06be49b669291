//! Evaluation with the Agentless pipeline, end to end: file -> function -> line localization
//! (greedy, each stage's prompt built from the previous prediction) -> `n` sampled edits ->
//! apply -> repository tests in the sandbox -> selection (fewest broken existing tests, then
//! majority over normalised patches) -> %Applied, %Resolved and per-subtask hit rates.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::rng::random_u64;
use crate::engine::{Backend, SamplingParams};
use crate::model::chat::{self, Message};
use crate::model::generate::{generate, GenOptions, GenRequest};
use crate::model::{Model, Tokenizer};
use crate::rft::select::{select, Candidate};
use crate::sandbox::runner::{run_instance, MirrorRepos, SandboxConfig};
use crate::swe::answer;
use crate::swe::instance::Instance;
use crate::swe::repo::{RepoStore, Snapshot};
use crate::swe::reward::{apply_to_windows, predicted_file_diffs};
use crate::swe::subtask::{file_record, next_from_prediction, EditReward, Subtask, SubtaskRecord};
use crate::swe::truth::ground_truth;

/// Settings of an evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Edit samples per instance.
    pub edit_samples: usize,
    /// Temperature of the edit samples (localization is greedy).
    pub temperature: f32,
    /// Most new tokens per answer.
    pub max_new_tokens: usize,
    /// Prompts longer than this count as a miss.
    pub max_prompt_tokens: usize,
    /// Sequences decoded together.
    pub batch: usize,
    /// Seed of the edit samples.
    pub seed: u64,
    /// Run the tests (needs python3); off gives hit rates and %Applied only.
    pub run_tests: bool,
    /// Parallel sandbox runs.
    pub workers: usize,
    /// Time limit of one test run, seconds.
    pub test_timeout: f64,
    /// Edit reward used for the edit hit rate.
    pub edit_reward: EditReward,
    /// Constrained decoding of localization answers: they may only name what the prompt showed
    /// ([`crate::swe::grammar`]); the chain of thought stays free. Off: free decoding, as Agentless.
    pub constrain: bool,
    /// With `constrain`: quotes in localization chains of thought must copy the prompt
    /// ([`crate::swe::grounding`]), so names cannot be invented.
    pub ground: bool,
    /// With `ground`: localization answers may only name what the thought quoted (when it quoted
    /// any shown target).
    pub faithful: bool,
    /// Responses sampled per held-out subtask prompt (at the RL temperature) for the sampled mean
    /// subtask reward, the quantity stage 2 maximises; 0: greedy only.
    pub reward_samples: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            edit_samples: 4,
            temperature: 0.8,
            max_new_tokens: 128,
            max_prompt_tokens: 3072,
            batch: 16,
            seed: 0,
            run_tests: true,
            workers: 2,
            test_timeout: 60.0,
            edit_reward: EditReward::LineFbeta,
            constrain: true,
            ground: true,
            faithful: true,
            reward_samples: 4,
        }
    }
}

/// What happened to one instance.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InstanceOutcome {
    /// The instance.
    pub instance_id: String,
    /// Reward of each stage's answer (missing once the chain broke).
    pub rewards: BTreeMap<String, f64>,
    /// Each stage's answer text (the first sample for edits), as generated.
    pub answers: BTreeMap<String, String>,
    /// The chosen patch (empty when none applied).
    pub patch: String,
    /// Whether some sampled edit applied.
    pub applied: bool,
    /// Whether the chosen patch resolved the instance.
    pub resolved: bool,
}

/// Totals of an evaluation, as in SoRFT's tables (percentages).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalSummary {
    /// Instances.
    pub instances: usize,
    /// Hit rate per subtask: answers with a positive reward (overlap with ground truth).
    pub hit_rate: BTreeMap<String, f64>,
    /// Mean reward per subtask over all instances (0 where the chain broke).
    pub mean_reward: BTreeMap<String, f64>,
    /// Instances with an applicable patch.
    pub applied_pct: f64,
    /// Instances resolved.
    pub resolved_pct: f64,
}

/// Something that answers subtask records (a model, or a test oracle).
pub trait Answerer {
    /// `n` answers per record (`temperature` 0 means greedy); an empty list when the record's
    /// prompt does not fit.
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temperature: f32,
        salt: u64,
    ) -> anyhow::Result<Vec<Vec<String>>>;
}

/// A model answering through the chat template and the generation engine.
pub struct ModelAnswerer<'a, B: Backend> {
    /// The model.
    pub model: &'a Model<B>,
    /// Its tokenizer.
    pub tok: &'a Tokenizer,
    /// Limits and seed.
    pub cfg: &'a EvalConfig,
}

impl<B: Backend> Answerer for ModelAnswerer<'_, B> {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temperature: f32,
        salt: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let (model, tok, cfg) = (self.model, self.tok, self.cfg);
        let mut reqs = Vec::new();
        let mut fits = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            let (ids, _) = chat::encode(tok, &[Message::new("user", &r.prompt)], true)?;
            let ok = ids.len() <= cfg.max_prompt_tokens
                && ids.len() + cfg.max_new_tokens <= model.config.max_position_embeddings;
            fits.push(ok);
            if !ok {
                continue;
            }
            let constraint = crate::swe::grammar::constraint_for(
                r,
                cfg.max_new_tokens,
                cfg.constrain,
                cfg.ground,
                cfg.faithful,
            );
            for k in 0..n {
                reqs.push(GenRequest {
                    prompt: ids.clone(),
                    params: SamplingParams {
                        temperature,
                        top_k: 0,
                        top_p: if temperature > 0.0 { 0.95 } else { 1.0 },
                        seed: random_u64(cfg.seed ^ salt, i as u64, k as u64),
                    },
                    max_new_tokens: cfg.max_new_tokens,
                    stop_ids: tok.stop_ids(),
                    stop_strings: Vec::new(),
                    constraint: constraint.clone(),
                    min_allowed_mass: 0.0,
                });
            }
        }
        let outs = generate(
            model,
            Some(tok),
            &reqs,
            &GenOptions {
                max_batch: cfg.batch,
                progress: false,
            },
        )?;
        let mut it = outs.into_iter();
        Ok(fits
            .into_iter()
            .map(|ok| {
                if ok {
                    (0..n).filter_map(|_| it.next().map(|o| o.text)).collect()
                } else {
                    Vec::new()
                }
            })
            .collect())
    }
}

/// The unified diff of an edit answer applied to an edit record's windows, if it applies.
pub fn edit_to_patch(rec: &SubtaskRecord, answer_text: &str) -> Option<String> {
    let blocks = answer::parse_edit(answer_text);
    let edit = apply_to_windows(&rec.shown.windows, &blocks).ok()?;
    let diffs = predicted_file_diffs(&rec.shown.windows, &edit, &rec.shown.sources);
    let patch: String = diffs.values().cloned().collect();
    crate::rft::select::changes_something(&patch).then_some(patch)
}

/// A sandbox configuration for evaluation runs with the host's default interpreter and layers.
pub fn sandbox_config(timeout: f64) -> anyhow::Result<SandboxConfig> {
    use crate::sandbox::isolation::HostSupport;
    use crate::sandbox::limits::Limits;
    let host = HostSupport::get();
    let python = crate::sandbox::python::resolve(None, host.root && host.uid_drop.is_ok())?;
    Ok(SandboxConfig {
        limits: Limits {
            wall: Duration::from_secs_f64(timeout),
            cpu_secs: timeout.ceil() as u64 + 1,
            ..Limits::default()
        },
        policy: Default::default(),
        python,
        commands: Default::default(),
        work_dir: crate::sandbox::workspace::default_base(),
        integrity: Default::default(),
    })
}

/// Runs the whole pipeline on `instances`; `on_stage` hears progress messages.
pub fn evaluate(
    answerer: &mut dyn Answerer,
    instances: &[Instance],
    repos: &std::path::Path,
    cfg: &EvalConfig,
    on_stage: &mut dyn FnMut(&str),
) -> anyhow::Result<(Vec<InstanceOutcome>, EvalSummary)> {
    let store = RepoStore::new(repos);
    let mut snaps: Vec<Snapshot> = Vec::with_capacity(instances.len());
    let mut recs: Vec<Option<SubtaskRecord>> = Vec::with_capacity(instances.len());
    for inst in instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit)?;
        let gt = ground_truth(&inst.patch, &snap)?;
        recs.push(Some(file_record(inst, &snap, &gt)));
        snaps.push(snap);
    }
    let mut outcomes: Vec<InstanceOutcome> = instances
        .iter()
        .map(|i| InstanceOutcome {
            instance_id: i.instance_id.clone(),
            ..Default::default()
        })
        .collect();
    // Localization stages, greedy, each built on the previous prediction.
    for stage in [Subtask::File, Subtask::Function, Subtask::Line] {
        on_stage(&format!("{} localization", stage.name()));
        let live: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].is_some()).collect();
        let batch: Vec<&SubtaskRecord> = live.iter().filter_map(|&i| recs[i].as_ref()).collect();
        let outs = answerer.answer(&batch, 1, 0.0, stage as u64)?;
        for (k, &i) in live.iter().enumerate() {
            let Some(rec) = recs[i].take() else { continue };
            let Some(ans) = outs[k].first() else { continue };
            outcomes[i]
                .rewards
                .insert(stage.name().into(), rec.reward(ans, cfg.edit_reward).reward);
            outcomes[i].answers.insert(stage.name().into(), ans.clone());
            recs[i] = next_from_prediction(&instances[i], &snaps[i], &rec, ans);
        }
    }
    // Edit generation: n samples per instance.
    on_stage("edit generation");
    let live: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].is_some()).collect();
    let batch: Vec<&SubtaskRecord> = live.iter().filter_map(|&i| recs[i].as_ref()).collect();
    let outs = answerer.answer(&batch, cfg.edit_samples.max(1), cfg.temperature, 0xed17)?;
    let mut candidates: Vec<Vec<String>> = vec![Vec::new(); instances.len()];
    let mut patch_reward: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); instances.len()];
    for (k, &i) in live.iter().enumerate() {
        let Some(rec) = recs[i].as_ref() else {
            continue;
        };
        let best = outs[k]
            .iter()
            .map(|a| rec.reward(a, cfg.edit_reward).reward)
            .fold(0.0f64, f64::max);
        if let Some(first) = outs[k].first() {
            // The best reward over the samples is an oracle (hit@n); "edit" is set to the
            // selected patch's reward below.
            outcomes[i].rewards.insert(ORACLE_EDIT.into(), best);
            outcomes[i].rewards.insert("edit".into(), 0.0);
            outcomes[i].answers.insert("edit".into(), first.clone());
        }
        let mut rewards = BTreeMap::new();
        candidates[i] = outs[k]
            .iter()
            .filter_map(|a| {
                let p = edit_to_patch(rec, a)?;
                let r = rec.reward(a, cfg.edit_reward).reward;
                let e = rewards.entry(p.clone()).or_insert(r);
                *e = f64::max(*e, r);
                Some(p)
            })
            .collect();
        patch_reward[i] = rewards;
        outcomes[i].applied = !candidates[i].is_empty();
    }
    // Tests and selection.
    if cfg.run_tests {
        on_stage("tests");
        let sb = sandbox_config(cfg.test_timeout)?;
        let mirrors = MirrorRepos::new(repos);
        let jobs: Vec<(usize, String)> = candidates
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.iter().map(move |p| (i, p.clone())))
            .collect();
        let results: Vec<(usize, String, bool, usize)> = {
            use rayon::prelude::*;
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(cfg.workers.max(1))
                .build()?;
            pool.install(|| {
                jobs.par_iter()
                    .map(|(i, p)| {
                        let r = run_instance(&sb, &mirrors, &instances[*i], "sorft", p);
                        let broken = r
                            .grade
                            .as_ref()
                            .map_or(usize::MAX, |g| g.report.p2p_failure.len());
                        (*i, p.clone(), r.resolved, broken)
                    })
                    .collect()
            })
        };
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let mine: Vec<&(usize, String, bool, usize)> =
                results.iter().filter(|r| r.0 == i).collect();
            let cands: Vec<Candidate> = mine
                .iter()
                .map(|r| Candidate {
                    patch: r.1.clone(),
                    applied: true,
                    failing_regression: (r.3 != usize::MAX).then_some(r.3),
                })
                .collect();
            if let Some(j) = select(&cands) {
                outcome.patch = mine[j].1.clone();
                outcome.resolved = mine[j].2;
            }
        }
    } else {
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let cands: Vec<Candidate> = candidates[i]
                .iter()
                .map(|p| Candidate {
                    patch: p.clone(),
                    applied: true,
                    failing_regression: Some(0),
                })
                .collect();
            if let Some(j) = select(&cands) {
                outcome.patch = candidates[i][j].clone();
            }
        }
    }
    for (o, rewards) in outcomes.iter_mut().zip(&patch_reward) {
        if let Some(&r) = rewards.get(&o.patch) {
            o.rewards.insert("edit".into(), r);
        }
    }
    Ok((outcomes.clone(), summarize(&outcomes)))
}

/// The key of the best edit reward over all samples of an instance (an oracle: hit@n), beside
/// `edit`, the reward of the patch the selection picked.
pub const ORACLE_EDIT: &str = "edit_oracle@n";

/// Percentages over outcomes.
pub fn summarize(outcomes: &[InstanceOutcome]) -> EvalSummary {
    let n = outcomes.len().max(1) as f64;
    let mut s = EvalSummary {
        instances: outcomes.len(),
        ..Default::default()
    };
    let names = Subtask::ALL.iter().map(|s| s.name()).chain([ORACLE_EDIT]);
    for name in names {
        let rewards: Vec<f64> = outcomes
            .iter()
            .map(|o| o.rewards.get(name).copied().unwrap_or(0.0))
            .collect();
        s.hit_rate.insert(
            name.into(),
            100.0 * rewards.iter().filter(|&&r| r > 0.0).count() as f64 / n,
        );
        s.mean_reward
            .insert(name.into(), rewards.iter().sum::<f64>() / n);
    }
    s.applied_pct = 100.0 * outcomes.iter().filter(|o| o.applied).count() as f64 / n;
    s.resolved_pct = 100.0 * outcomes.iter().filter(|o| o.resolved).count() as f64 / n;
    s
}
