//! Evaluation with the Agentless pipeline, end to end: file -> function -> line localization
//! (each stage a greedy answer plus samples, merged by votes ([`crate::rft::localize`]), its
//! prompt built from the previous stage's merged prediction) -> `n` edits (greedy plus samples)
//! -> apply -> regression tests (the repository's tests that pass at the base commit, found by
//! running them: [`crate::rft::regression`]) -> selection (fewest broken regression tests, then
//! majority over normalised patches) -> grading in the sandbox -> %Applied, %Resolved, %Resolved
//! against the number of edit samples (prefixes of one set of samples) and per-subtask hit rates.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::rng::random_u64;
use crate::engine::{Backend, SamplingParams};
use crate::model::chat::{self, Message};
use crate::model::generate::{generate, GenOptions, GenRequest};
use crate::model::{Model, Tokenizer};
use crate::rft::regression::{failing_regression, RegressionSuites, Suite};
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
    /// Edit samples per instance: the greedy edit, then samples at `temperature`.
    pub edit_samples: usize,
    /// Localization answers per stage (file, function, line): the greedy one, then samples at
    /// `temperature`, merged by votes; 1 is the greedy chain alone.
    pub loc_samples: usize,
    /// Temperature of the sampled (non-greedy) edits and localizations.
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
            loc_samples: 1,
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
    /// Whether the patch chosen among the first k edit samples resolved the instance, by k
    /// (1, 2, 4, ..., n); empty when the tests were not run.
    #[serde(default)]
    pub resolved_at: BTreeMap<usize, bool>,
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
    /// %Resolved against the number of edit samples the selection saw (prefixes of one set of
    /// samples): (samples, %Resolved); empty when the tests were not run.
    #[serde(default)]
    pub resolved_curve: Vec<(usize, f64)>,
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

    /// `n` answers per record: the greedy one first, then `n - 1` sampled at `temperature`
    /// (an empty list when the prompt does not fit). By default two calls of [`Self::answer`].
    fn answer_greedy_first(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temperature: f32,
        salt: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let mut out = self.answer(recs, 1, 0.0, salt)?;
        for o in &mut out {
            o.truncate(1);
        }
        if n > 1 {
            let more = self.answer(recs, n - 1, temperature, salt)?;
            for (o, m) in out.iter_mut().zip(more) {
                if !o.is_empty() {
                    o.extend(m.into_iter().take(n - 1));
                }
            }
        }
        Ok(out)
    }
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

impl<B: Backend> ModelAnswerer<'_, B> {
    /// `n` answers per record, answer k at temperature `temp(k)`, in one generation call (the
    /// answers of one prompt are adjacent, so they share its prefill).
    fn generate_answers(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temp: &dyn Fn(usize) -> f32,
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
                let temperature = temp(k);
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

impl<B: Backend> Answerer for ModelAnswerer<'_, B> {
    fn answer(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temperature: f32,
        salt: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        self.generate_answers(recs, n, &|_| temperature, salt)
    }

    fn answer_greedy_first(
        &mut self,
        recs: &[&SubtaskRecord],
        n: usize,
        temperature: f32,
        salt: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        let temp = move |k: usize| if k == 0 { 0.0 } else { temperature };
        self.generate_answers(recs, n, &temp, salt)
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

/// Runs the whole pipeline on `instances`; `on_stage` hears progress messages. Regression
/// suites are found afresh (see [`evaluate_with`] to share them between evaluations).
pub fn evaluate(
    answerer: &mut dyn Answerer,
    instances: &[Instance],
    repos: &std::path::Path,
    cfg: &EvalConfig,
    on_stage: &mut dyn FnMut(&str),
) -> anyhow::Result<(Vec<InstanceOutcome>, EvalSummary)> {
    let mut suites = RegressionSuites::new(None);
    evaluate_with(answerer, instances, repos, cfg, &mut suites, on_stage)
}

/// The edit samples of one instance: each sample's patch when it applied, in sample order,
/// and the best edit reward per distinct patch.
#[derive(Clone, Debug, Default)]
struct EditSamples {
    patches: Vec<Option<String>>,
    reward: BTreeMap<String, f64>,
}

/// [`evaluate`] with regression suites kept in `suites` (found once per repository and commit).
pub fn evaluate_with(
    answerer: &mut dyn Answerer,
    instances: &[Instance],
    repos: &std::path::Path,
    cfg: &EvalConfig,
    suites: &mut RegressionSuites,
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
    let t0 = Instant::now();
    // Localization stages, each built on the previous stage's merged prediction.
    for stage in [Subtask::File, Subtask::Function, Subtask::Line] {
        on_stage(&format!("{} localization", stage.name()));
        let live: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].is_some()).collect();
        let batch: Vec<&SubtaskRecord> = live.iter().filter_map(|&i| recs[i].as_ref()).collect();
        let outs = answerer.answer_greedy_first(
            &batch,
            cfg.loc_samples.max(1),
            cfg.temperature,
            stage as u64,
        )?;
        for (k, &i) in live.iter().enumerate() {
            let Some(rec) = recs[i].take() else { continue };
            if outs[k].is_empty() {
                continue;
            }
            let ans = crate::rft::localize::merge(stage, &outs[k]);
            outcomes[i].rewards.insert(
                stage.name().into(),
                rec.reward(&ans, cfg.edit_reward).reward,
            );
            recs[i] = next_from_prediction(&instances[i], &snaps[i], &rec, &ans);
            outcomes[i].answers.insert(stage.name().into(), ans);
        }
    }
    on_stage("edit generation");
    let samples = edit_samples(answerer, &recs, &mut outcomes, cfg)?;
    on_stage(&format!(
        "generation took {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    if cfg.run_tests {
        test_and_select(
            instances,
            repos,
            cfg,
            suites,
            &samples,
            &mut outcomes,
            on_stage,
        )?;
    } else {
        for (o, s) in outcomes.iter_mut().zip(&samples) {
            let cands = candidates(&s.patches, &|_| Some(0));
            if let Some(j) = select(&cands) {
                o.patch = cands[j].patch.clone();
            }
        }
    }
    for (o, s) in outcomes.iter_mut().zip(&samples) {
        if let Some(&r) = s.reward.get(&o.patch) {
            o.rewards.insert("edit".into(), r);
        }
    }
    Ok((outcomes.clone(), summarize(&outcomes)))
}

/// Generates the edit samples (greedy first) of every instance whose chain reached the edit
/// stage; records the first answer, the oracle hit@n and whether any sample applied.
fn edit_samples(
    answerer: &mut dyn Answerer,
    recs: &[Option<SubtaskRecord>],
    outcomes: &mut [InstanceOutcome],
    cfg: &EvalConfig,
) -> anyhow::Result<Vec<EditSamples>> {
    let live: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].is_some()).collect();
    let batch: Vec<&SubtaskRecord> = live.iter().filter_map(|&i| recs[i].as_ref()).collect();
    let outs =
        answerer.answer_greedy_first(&batch, cfg.edit_samples.max(1), cfg.temperature, 0xed17)?;
    let mut samples = vec![EditSamples::default(); recs.len()];
    for (k, &i) in live.iter().enumerate() {
        let Some(rec) = recs[i].as_ref() else {
            continue;
        };
        let rewards: Vec<f64> = outs[k]
            .iter()
            .map(|a| rec.reward(a, cfg.edit_reward).reward)
            .collect();
        if let Some(first) = outs[k].first() {
            // The best reward over the samples is an oracle (hit@n); "edit" is set to the
            // selected patch's reward later.
            let best = rewards.iter().copied().fold(0.0f64, f64::max);
            outcomes[i].rewards.insert(ORACLE_EDIT.into(), best);
            outcomes[i].rewards.insert("edit".into(), 0.0);
            outcomes[i].answers.insert("edit".into(), first.clone());
        }
        let s = &mut samples[i];
        for (a, r) in outs[k].iter().zip(rewards) {
            let p = edit_to_patch(rec, a);
            if let Some(p) = &p {
                let e = s.reward.entry(p.clone()).or_insert(r);
                *e = f64::max(*e, r);
            }
            s.patches.push(p);
        }
        outcomes[i].applied = s.patches.iter().any(Option::is_some);
    }
    Ok(samples)
}

/// Selection candidates, one per sample (index = sample), with `failing(patch)` broken
/// regression tests.
fn candidates(
    patches: &[Option<String>],
    failing: &dyn Fn(&str) -> Option<usize>,
) -> Vec<Candidate> {
    patches
        .iter()
        .map(|p| match p {
            Some(p) => Candidate {
                patch: p.clone(),
                applied: true,
                failing_regression: failing(p),
            },
            None => Candidate::default(),
        })
        .collect()
}

/// The numbers of samples of the %Resolved curve: 1, 2, 4, ... below `n`, then `n`.
pub fn curve_sizes(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|&k| k < n)
        .collect();
    v.push(n.max(1));
    v
}

/// Runs `f` on every job, `workers` at a time, results in job order.
fn par_map<T: Sync, R: Send>(
    workers: usize,
    jobs: &[T],
    f: impl Fn(&T) -> R + Sync + Send,
) -> anyhow::Result<Vec<R>> {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers.max(1))
        .build()?;
    Ok(pool.install(|| jobs.par_iter().map(f).collect()))
}

/// Regression runs of every distinct applied patch, selection among the first k samples for
/// every k of the curve, and grading (once per distinct selected patch) in the sandbox.
fn test_and_select(
    instances: &[Instance],
    repos: &std::path::Path,
    cfg: &EvalConfig,
    suites: &mut RegressionSuites,
    samples: &[EditSamples],
    outcomes: &mut [InstanceOutcome],
    on_stage: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let sb = sandbox_config(cfg.test_timeout)?;
    let mirrors = MirrorRepos::new(repos);
    let distinct = |i: usize| -> std::collections::BTreeSet<&String> {
        samples[i].patches.iter().flatten().collect()
    };
    let with_patches: Vec<&Instance> = (0..instances.len())
        .filter(|&i| !distinct(i).is_empty())
        .map(|i| &instances[i])
        .collect();
    on_stage("regression tests at the base commits");
    suites.prepare(&sb, &mirrors, &with_patches, cfg.workers)?;
    let jobs: Vec<(usize, String)> = (0..instances.len())
        .flat_map(|i| distinct(i).into_iter().map(move |p| (i, p.clone())))
        .collect();
    let applied_samples: usize = samples
        .iter()
        .map(|s| s.patches.iter().flatten().count())
        .sum();
    on_stage(&format!(
        "regression tests of {} distinct patches ({applied_samples} applied samples)",
        jobs.len()
    ));
    let suite_of: Vec<Suite> = instances
        .iter()
        .map(|inst| {
            if with_patches.iter().any(|w| std::ptr::eq(*w, inst)) {
                suites.suite(&sb, &mirrors, inst).clone()
            } else {
                Suite::new()
            }
        })
        .collect();
    let broken = par_map(cfg.workers, &jobs, |(i, p)| {
        failing_regression(&sb, &mirrors, &instances[*i], &suite_of[*i], p)
    })?;
    let broken: BTreeMap<(usize, &str), usize> = jobs
        .iter()
        .zip(broken)
        .map(|((i, p), b)| ((*i, p.as_str()), b))
        .collect();
    // Selection among every prefix of the samples.
    let mut chosen: Vec<BTreeMap<usize, Option<String>>> = vec![BTreeMap::new(); instances.len()];
    for (i, s) in samples.iter().enumerate() {
        let cands = candidates(&s.patches, &|p| broken.get(&(i, p)).copied());
        for k in curve_sizes(cfg.edit_samples.max(1)) {
            let pick = select(&cands[..k.min(cands.len())]).map(|j| cands[j].patch.clone());
            chosen[i].insert(k, pick);
        }
    }
    let grade_jobs: Vec<(usize, String)> = chosen
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            c.values()
                .flatten()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(move |p| (i, p.clone()))
        })
        .collect();
    on_stage(&format!("grading {} selected patches", grade_jobs.len()));
    let resolved = par_map(cfg.workers, &grade_jobs, |(i, p)| {
        run_instance(&sb, &mirrors, &instances[*i], "sorft", p).resolved
    })?;
    let resolved: BTreeMap<(usize, &str), bool> = grade_jobs
        .iter()
        .zip(resolved)
        .map(|((i, p), r)| ((*i, p.as_str()), r))
        .collect();
    for (i, o) in outcomes.iter_mut().enumerate() {
        for (&k, pick) in &chosen[i] {
            let r = pick
                .as_ref()
                .is_some_and(|p| resolved.get(&(i, p.as_str())).copied().unwrap_or(false));
            o.resolved_at.insert(k, r);
        }
        if let Some((_, Some(p))) = chosen[i].iter().next_back() {
            o.patch = p.clone();
            o.resolved = o.resolved_at.values().next_back().copied().unwrap_or(false);
        }
    }
    on_stage(&format!(
        "tests took {:.1} s ({} regression runs, {} grading runs)",
        t0.elapsed().as_secs_f64(),
        jobs.len(),
        grade_jobs.len()
    ));
    Ok(())
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
    let sizes: std::collections::BTreeSet<usize> = outcomes
        .iter()
        .flat_map(|o| o.resolved_at.keys().copied())
        .collect();
    s.resolved_curve = sizes
        .into_iter()
        .map(|k| {
            let r = outcomes
                .iter()
                .filter(|o| o.resolved_at.get(&k) == Some(&true))
                .count();
            (k, 100.0 * r as f64 / n)
        })
        .collect();
    s
}
