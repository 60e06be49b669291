//! `sorft repro`: the whole SoRFT loop on the embedded default, in one command.
//!
//! data (synthetic task set, split by repository) -> model (tokenizer trained on the training
//! repositories, random Qwen2-architecture weights) -> warm-up (causal LM on the training code)
//! -> stage 1 (built-in teacher, rejection filter, SFT) -> stage 2 (RL with rule-based rewards)
//! -> evaluation of the three checkpoints on the held-out repositories -> report.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::engine::device::DeviceInfo;
use crate::engine::rng::{random_u64, SplitMix};
use crate::engine::{Backend, SamplingParams};
use crate::model::chat::{self, Message};
use crate::model::generate::{generate, GenOptions, GenOutput, GenRequest};
use crate::model::init::{init_model, EMBEDDED_CORPUS};
use crate::model::{load_dir, Model, Tokenizer};
use crate::pipeline::augment::{fresh_name, package_name, package_of, Renamer};
use crate::pipeline::compare::{cluster_ids, clusters, delta_section, split_repos, Delta};
use crate::pipeline::config::ReproConfig;
use crate::pipeline::plot::{bar_chart, line_chart, Series};
use crate::pipeline::scores::{scores_deltas, SavedScores, StageScores};
use crate::rft::accept::{execution_passes, EditAcceptance};
use crate::rft::eval::{evaluate_with, EvalSummary, ModelAnswerer};
use crate::rft::regression::RegressionSuites;
use crate::rft::rl::{zero_reason_name, RlItem, RlMetrics};
use crate::rft::rl_run::RlRun;
use crate::rft::teacher::{rejection_filter_checked, Acceptance, BuiltinTeacher, TeacherItem};
use crate::swe::instance::{write_jsonl, Instance};
use crate::swe::repo::{RepoStore, Snapshot};
use crate::swe::subtask::{training_records, Subtask, SubtaskRecord};
use crate::swe::synth::{generate as synth, SynthConfig};
use crate::swe::truth::ground_truth;
use crate::train::sft::{run_sft, Resume, SftConfig, SftEvent};

/// Results of one evaluated checkpoint.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct StageResult {
    /// `initial`, `sft` or `sft+rl`.
    pub stage: String,
    /// Mean reward per subtask on the test split's ground-truth prompts, free decoding (answers
    /// not constrained), greedy: the primary row.
    pub subtask_reward: BTreeMap<String, f64>,
    /// Mean of those.
    pub mean_reward: f64,
    /// Why answers scored zero (format errors, invented targets, ...), free decoding.
    pub zero_reasons: BTreeMap<String, usize>,
    /// The same with grammar-constrained decoding (`eval.constrain`; empty when off).
    pub constrained_subtask_reward: BTreeMap<String, f64>,
    /// Zero reasons with constrained decoding.
    pub constrained_zero_reasons: BTreeMap<String, usize>,
    /// Mean reward per subtask over `eval.reward_samples` responses per test prompt sampled at
    /// the stage-2 temperature, decoded as in stage 2 (empty when 0): what stage 2 maximises.
    pub sampled_subtask_reward: BTreeMap<String, f64>,
    /// Mean of those.
    pub sampled_mean_reward: f64,
    /// Mean reward per subtask on the dev split (free, greedy): the numbers to tune on.
    pub dev_subtask_reward: BTreeMap<String, f64>,
    /// The same, constrained greedy decoding (empty when `eval.constrain` is off).
    #[serde(default)]
    pub dev_constrained_subtask_reward: BTreeMap<String, f64>,
    /// The same, sampled as in stage 2 (empty when `eval.reward_samples` is 0).
    #[serde(default)]
    pub dev_sampled_subtask_reward: BTreeMap<String, f64>,
    /// Loss on the second copy of held-out random spans (`pipeline::curriculum`'s induction
    /// probe): under ~1 the model copies from its context, ~3 it guesses.
    pub induction_probe_loss: f64,
    /// The end-to-end Agentless evaluation on the test split.
    pub pipeline: EvalSummary,
    /// Per-instance scores behind the means, for the paired comparisons.
    #[serde(skip)]
    pub scores: StageScores,
}

/// What a run produced.
#[derive(Clone, Debug, Serialize)]
pub struct ReproSummary {
    /// Per stage.
    pub stages: Vec<StageResult>,
    /// Stage-1 acceptance per subtask.
    pub acceptance: BTreeMap<String, Acceptance>,
    /// RL metrics per step.
    pub rl: Vec<RlMetrics>,
    /// Seconds per phase.
    pub seconds: BTreeMap<String, f64>,
    /// Training, dev and test instances.
    pub instances: (usize, usize, usize),
    /// Every stage-to-stage delta on the test split, with intervals and tests.
    pub deltas: Vec<Delta>,
}

struct Status {
    bar: indicatif::ProgressBar,
    t0: Instant,
}

impl Status {
    fn new() -> Self {
        let bar = indicatif::ProgressBar::new(7);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "[{elapsed_precise}] {bar:20} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        Self {
            bar,
            t0: Instant::now(),
        }
    }
    fn phase(&self, msg: &str) {
        self.bar.inc(1);
        self.bar.set_message(msg.to_string());
        let line = format!("[{:>6.1}s] {msg}", self.t0.elapsed().as_secs_f64());
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
    fn detail(&self, msg: String) {
        self.bar.set_message(msg);
    }
}

fn write_text(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| path.display().to_string())
}

fn chat_jsonl(path: &Path, convs: &[Vec<Message>]) -> anyhow::Result<()> {
    write_chat_jsonl(path, convs, false)
}

/// Conversations as chat JSONL lines, appended to `path` or replacing it.
fn write_chat_jsonl(path: &Path, convs: &[Vec<Message>], append: bool) -> anyhow::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .with_context(|| path.display().to_string())?;
    let mut f = std::io::BufWriter::new(file);
    for c in convs {
        writeln!(f, "{}", serde_json::json!({ "messages": c }))?;
    }
    f.flush()?;
    Ok(())
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Held-out repeat exercises in the induction probe.
const PROBE_SIZE: usize = 64;

/// Mean loss of `model` on the assistant tokens of the induction probe.
fn probe_loss<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    probe: &[Vec<Message>],
) -> anyhow::Result<f64> {
    let examples: Vec<crate::train::data::ChatExample> = probe
        .iter()
        .map(|m| crate::train::data::ChatExample {
            messages: m.clone(),
            text: None,
            weight: 1.0,
        })
        .collect();
    let (seqs, _) = crate::train::data::encode_examples(tok, &examples, 512)?;
    Ok(crate::train::sft::eval_loss(model, None, &seqs, 2048, 256)?.0)
}

fn text_jsonl(path: &Path, docs: &[String]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| path.display().to_string())?,
    );
    for d in docs {
        writeln!(f, "{}", serde_json::json!({ "text": d }))?;
    }
    f.flush()?;
    Ok(())
}

/// One SFT phase. A finished phase of a resumed run is reused; an unfinished one continues from
/// its newest checkpoint; without `resume` the phase starts afresh (old outputs removed).
fn sft<B: Backend>(
    be: &B,
    status: &Status,
    label: &str,
    cfg: SftConfig,
    resume: bool,
    stop: &AtomicBool,
) -> anyhow::Result<PathBuf> {
    let out = cfg.out.clone();
    sft_until(be, status, label, cfg, resume, stop)?
        .with_context(|| format!("{}: the run exported no model", out.display()))
}

/// [`sft`] that may stop at `cfg.max_steps` with a checkpoint: `None` then (the next call with
/// `resume` continues from it).
fn sft_until<B: Backend>(
    be: &B,
    status: &Status,
    label: &str,
    cfg: SftConfig,
    resume: bool,
    stop: &AtomicBool,
) -> anyhow::Result<Option<PathBuf>> {
    let done = cfg.out.join("final");
    if resume && done.join("model.safetensors").exists() {
        status.detail(format!("{label}: reusing {}", done.display()));
        return Ok(Some(done));
    }
    if !resume && cfg.out.exists() {
        std::fs::remove_dir_all(&cfg.out).with_context(|| cfg.out.display().to_string())?;
    }
    let how = if resume {
        Resume::Latest { fallback: true }
    } else {
        Resume::No
    };
    let res = run_sft(be, &cfg, how, stop, &mut |e| {
        if let SftEvent::Step(m) = e {
            status.detail(format!(
                "{label}: step {} loss {:.3} {:.0} tok/s",
                m.step, m.loss, m.tokens_per_s
            ));
        }
    })?;
    if res.interrupted {
        anyhow::bail!("{label} interrupted; run again with --resume to continue");
    }
    Ok(res.final_dir)
}

/// The curriculum's attempts for [`crate::pipeline::curriculum_run`]: attempt 0 starts from
/// the run's own initialisation (seed = the run's seed), later ones from new ones.
struct CurriculumAttempts<'a, B: Backend> {
    be: &'a B,
    status: &'a Status,
    out: &'a Path,
    preset: crate::model::init::Preset,
    corpus: &'a [String],
    /// Attempt 0's configuration (model, output, seed are replaced per attempt).
    template: SftConfig,
    resume: bool,
    stop: &'a AtomicBool,
    /// Attempts already started in this process (continue from their checkpoints).
    started: BTreeSet<usize>,
}

impl<B: Backend> CurriculumAttempts<'_, B> {
    fn seed(&self, k: usize) -> u64 {
        if k == 0 {
            self.template.seed
        } else {
            random_u64(self.template.seed, 0xa09, 100 + k as u64)
        }
    }
}

impl<B: Backend> crate::pipeline::curriculum_run::Trainer for CurriculumAttempts<'_, B> {
    fn init(&mut self, k: usize) -> anyhow::Result<(PathBuf, u64)> {
        let name = if k == 0 {
            "random".to_string()
        } else {
            format!("random-r{k}")
        };
        let dir = self.out.join("models").join(name);
        if k > 0 {
            self.status.phase(&format!(
                "curriculum: the probe stalled; attempt {} from a new initialisation",
                k + 1
            ));
        }
        init_model(self.preset, &dir, self.seed(k), self.corpus)?;
        Ok((dir, self.seed(k)))
    }

    fn train(&mut self, k: usize, init: &Path, max_steps: u64) -> anyhow::Result<Option<PathBuf>> {
        let mut c = self.template.clone();
        c.model = init.to_path_buf();
        c.out = self.dir(k);
        c.seed = self.seed(k);
        c.max_steps = max_steps;
        let resume = self.resume || !self.started.insert(k);
        sft_until(self.be, self.status, "curriculum", c, resume, self.stop)
    }

    fn probe(&self, k: usize) -> Vec<(u64, f64)> {
        crate::pipeline::curriculum::probe_series(&self.dir(k).join("metrics.jsonl"))
    }

    fn dir(&self, k: usize) -> PathBuf {
        let name = if k == 0 {
            "curriculum".to_string()
        } else {
            format!("curriculum-r{k}")
        };
        self.out.join(name)
    }
}

/// One way of decoding the subtask prompts.
#[derive(Clone, Copy)]
struct Decoding {
    /// Answers constrained by the grammar.
    constrain: bool,
    /// Greedy with 0, else this many draws at the stage-2 temperature.
    samples: usize,
}

/// Mean reward per subtask of `recs` under each of `decodings`. Every decoding's requests for one
/// prompt are queued together, so they share the prompt's prefill (`generate` gives the same bits
/// as separate passes: prefill is per request and deterministic).
fn subtask_rewards<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    recs: &[SubtaskRecord],
    cfg: &ReproConfig,
    decodings: &[Decoding],
) -> anyhow::Result<Vec<RewardEval>> {
    let mut reqs = Vec::new();
    // (decoding, record) of each request.
    let mut which = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let (ids, _) = chat::encode(tok, &[Message::new("user", &r.prompt)], true)?;
        if ids.len() > cfg.eval.max_prompt_tokens {
            continue;
        }
        for (d, dec) in decodings.iter().enumerate() {
            let constraint = crate::swe::grammar::constraint_for(
                r,
                cfg.eval.max_new_tokens,
                dec.constrain,
                cfg.eval.ground,
                cfg.eval.faithful,
            );
            for k in 0..dec.samples.max(1) {
                reqs.push(GenRequest {
                    prompt: ids.clone(),
                    params: if dec.samples == 0 {
                        SamplingParams::greedy()
                    } else {
                        SamplingParams {
                            temperature: cfg.stage2.temperature,
                            top_k: 0,
                            top_p: 1.0,
                            seed: random_u64(cfg.seed, 0x5a3 + i as u64, k as u64),
                        }
                    },
                    max_new_tokens: cfg.eval.max_new_tokens,
                    stop_ids: tok.stop_ids(),
                    stop_strings: Vec::new(),
                    constraint: constraint.clone(),
                    min_allowed_mass: 0.0,
                });
                which.push((d, i));
            }
        }
    }
    let outs = generate(
        model,
        Some(tok),
        &reqs,
        &GenOptions {
            max_batch: cfg.eval.batch,
            progress: false,
        },
    )?;
    Ok(decodings
        .iter()
        .enumerate()
        .map(|(d, dec)| {
            let outs = outs.iter().zip(&which).filter(|(_, w)| w.0 == d);
            reward_eval(recs, cfg, dec.samples, outs.map(|(o, w)| (o, w.1)))
        })
        .collect())
}

/// The rewards of one decoding's answers `(output, record index)`, in request order.
fn reward_eval<'a>(
    recs: &[SubtaskRecord],
    cfg: &ReproConfig,
    samples: usize,
    outs: impl Iterator<Item = (&'a GenOutput, usize)>,
) -> RewardEval {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for r in recs {
        sums.entry(r.subtask.name().into()).or_default().1 += samples.max(1);
    }
    let mut zeros: BTreeMap<String, usize> = BTreeMap::new();
    // Per record: the mean over its responses (0 for a prompt too long to answer).
    let mut per_record = vec![0.0f64; recs.len()];
    for (o, i) in outs {
        let r = &recs[i];
        let sc = r.reward(&o.text, cfg.stage2.edit_reward);
        if let Some(z) = &sc.zero_reason {
            *zeros.entry(zero_reason_name(z).to_string()).or_default() += 1;
        }
        sums.entry(r.subtask.name().into()).or_default().0 += sc.reward;
        per_record[i] += sc.reward / samples.max(1) as f64;
    }
    let means = sums
        .into_iter()
        .map(|(k, (s, n))| (k, s / n.max(1) as f64))
        .collect();
    RewardEval {
        means,
        zeros,
        clusters: clusters(recs, &per_record),
    }
}

/// The decodings an evaluation scores subtask prompts under, in this order: free greedy,
/// constrained greedy (with `eval.constrain`), sampled (with `eval.reward_samples`; constrained
/// like the pipeline).
fn decodings(cfg: &ReproConfig) -> Vec<Decoding> {
    let mut d = vec![Decoding {
        constrain: false,
        samples: 0,
    }];
    if cfg.eval.constrain {
        d.push(Decoding {
            constrain: true,
            samples: 0,
        });
    }
    if cfg.eval.reward_samples > 0 {
        d.push(Decoding {
            constrain: cfg.eval.constrain,
            samples: cfg.eval.reward_samples,
        });
    }
    d
}

/// Subtask rewards of one checkpoint under one decoding.
struct RewardEval {
    /// Mean reward per subtask.
    means: BTreeMap<String, f64>,
    /// Why answers scored zero.
    zeros: BTreeMap<String, usize>,
    /// Per-instance clusters of per-record scores (for the paired bootstrap).
    clusters: Vec<Vec<f64>>,
}

/// A markdown table of per-subtask mean rewards and their mean, one row per stage.
fn reward_table(
    md: &mut String,
    stages: &[StageResult],
    pick: impl Fn(&StageResult) -> &BTreeMap<String, f64>,
) {
    md.push_str("\n| stage | file | function | line | edit | mean |\n|---|---|---|---|---|---|\n");
    for r in stages {
        let m = pick(r);
        let g = |k: &str| m.get(k).copied().unwrap_or(0.0);
        let mean = m.values().sum::<f64>() / m.len().max(1) as f64;
        md.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            r.stage,
            g("file"),
            g("function"),
            g("line"),
            g("edit"),
            mean
        ));
    }
}

/// How many instances to generate and how many per repository: `data.instances` sets the number
/// of repositories (at `per_repo` each); when `train_per_repo` is larger, every repository gets
/// that many and the dev and test splits keep only their first `per_repo` (the split is by
/// repository name, known only after generation).
fn generated_counts(d: &crate::pipeline::config::DataConfig) -> (usize, usize) {
    let per = d.per_repo.max(1);
    if d.train_per_repo <= per {
        return (d.instances, per);
    }
    (
        d.instances.div_ceil(per) * d.train_per_repo,
        d.train_per_repo,
    )
}

/// The training repositories' Python files as the edit drills read them: (repository-relative
/// path, text), two copies of each repository under fresh package names (as stage 1 renames its
/// teacher data), so that drills teach copying rather than the training packages' names.
fn drill_files(
    code_files: &BTreeMap<String, (String, String)>,
    seed: u64,
) -> Vec<(String, String)> {
    let mut rng = SplitMix::new(seed);
    let mut by_repo: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (key, (repo, text)) in code_files {
        let path = key.strip_prefix(&format!("{repo}/")).unwrap_or(key);
        by_repo.entry(repo).or_default().push((path, text));
    }
    let mut out = Vec::new();
    for (repo, files) in by_repo {
        let renamer = Renamer::new(package_of(repo));
        for _ in 0..2 {
            let to = package_name(&mut rng);
            out.extend(files.iter().map(|(p, t)| match &renamer {
                Some(r) => (r.apply(p, &to), r.apply(t, &to)),
                None => (p.to_string(), t.to_string()),
            }));
        }
    }
    out
}

/// The first `per` instances of each repository, in their order.
fn first_per_repo<'a>(instances: impl Iterator<Item = &'a Instance>, per: usize) -> Vec<Instance> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    instances
        .filter(|i| {
            let k = seen.entry(i.repo.as_str()).or_insert(0);
            *k += 1;
            *k <= per
        })
        .cloned()
        .collect()
}

/// The file beside a finished data phase's `instances.jsonl` naming the generator settings that
/// wrote it; a resumed run with the same settings reads the instances instead of generating them
/// again (the generator runs every candidate bug's tests: minutes).
const DATA_STAMP: &str = "generated.txt";

/// The synthetic instances of `cfg` in `data`: generated (then stamped), or with `resume` read
/// back where a finished phase of the same settings left them.
fn generated_data(
    cfg: &SynthConfig,
    data: &Path,
    resume: bool,
    progress: &(dyn Fn(usize) + Sync),
) -> anyhow::Result<Vec<Instance>> {
    let stamp = format!("{cfg:?}\n");
    let (stamp_path, file) = (data.join(DATA_STAMP), data.join("instances.jsonl"));
    if resume && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        if let Ok(inst) = crate::swe::instance::read_jsonl(&file) {
            if inst.len() == cfg.n && data.join("repos").is_dir() {
                return Ok(inst);
            }
        }
    }
    // A stamp is only ever beside the instances it describes.
    if stamp_path.exists() {
        std::fs::remove_file(&stamp_path).with_context(|| stamp_path.display().to_string())?;
    }
    let report = synth(cfg, data, progress)?;
    write_text(&stamp_path, &stamp)?;
    Ok(report.instances)
}

/// Runs the whole reproduction into `out`. With `resume`, the phases a previous run of the same
/// configuration finished are reused (warm-up, stage-1 SFT), unfinished SFT runs continue from
/// their checkpoints and stage 2 from its newest checkpoint; `stop` (Ctrl-C) ends a long phase with
/// a checkpoint. Everything computes on `be`, which `dev` describes (in `metrics.jsonl` and the
/// report).
pub fn run_repro<B: Backend>(
    be: &B,
    dev: &DeviceInfo,
    cfg: &ReproConfig,
    out: &Path,
    resume: bool,
    stop: &AtomicBool,
) -> anyhow::Result<ReproSummary> {
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let cfg_path = out.join("config.toml");
    if resume {
        if let Ok(old) = std::fs::read_to_string(&cfg_path) {
            if old != cfg.to_toml() {
                anyhow::bail!(
                    "{}: the run there used another configuration; resume it with the same one (or drop --resume)",
                    cfg_path.display()
                );
            }
        }
    }
    write_text(&cfg_path, &cfg.to_toml())?;
    let status = Status::new();
    let mut seconds = BTreeMap::new();
    let mut metrics = std::io::BufWriter::new(std::fs::File::create(out.join("metrics.jsonl"))?);
    writeln!(metrics, "{}", crate::rft::rl_run::start_line(dev, 0)?)?;

    // ---- data ----
    let t = Instant::now();
    status.phase("data: generating the synthetic task set");
    let data = out.join("data");
    let (n_gen, per_gen) = generated_counts(&cfg.data);
    let synth_cfg = SynthConfig {
        n: n_gen,
        seed: cfg.seed,
        per_repo: per_gen,
        test_timeout: std::time::Duration::from_secs_f64(cfg.data.test_timeout),
        issue_styles: cfg.data.issue_styles,
        multi_file_fraction: cfg.data.multi_file_fraction,
        distractors: cfg.data.distractors,
    };
    let generated = generated_data(&synth_cfg, &data, resume, &|k| {
        status.detail(format!("data: {k}/{n_gen} instances"))
    })?;
    let repos: Vec<String> = generated.iter().map(|i| i.repo.clone()).collect();
    let split = split_repos(&repos, cfg.data.heldout_fraction, cfg.data.dev_fraction)
        .with_context(|| {
            format!(
                "data: {} instances in too few repositories for a train and a test split",
                generated.len()
            )
        })?;
    let of = |set: &BTreeSet<String>, per: usize| -> Vec<Instance> {
        first_per_repo(generated.iter().filter(|i| set.contains(&i.repo)), per)
    };
    let per = cfg.data.per_repo.max(1);
    let (train, dev_set, held) = (
        of(&split.train, per_gen),
        of(&split.dev, per),
        of(&split.test, per),
    );
    write_jsonl(&data.join("train.jsonl"), &train)?;
    write_jsonl(&data.join("dev.jsonl"), &dev_set)?;
    write_jsonl(&data.join("test.jsonl"), &held)?;
    let store = RepoStore::new(data.join("repos"));
    let snapshot =
        |i: &Instance| -> anyhow::Result<Snapshot> { Ok(store.snapshot(&i.repo, &i.base_commit)?) };
    let mut train_items: Vec<RlItem> = Vec::new();
    let mut code_files: BTreeMap<String, (String, String)> = BTreeMap::new();
    // The first `per_repo` instances of each training repository: the code and issues the
    // tokenizer and the warm-up read come from them only, so that more training instances
    // (`data.train_per_repo`) leave both as they were.
    let base = first_per_repo(train.iter(), per);
    let base_ids: BTreeSet<&str> = base.iter().map(|i| i.instance_id.as_str()).collect();
    for inst in &train {
        let snap = snapshot(inst)?;
        let gt = ground_truth(&inst.patch, &snap)?;
        let paths = if base_ids.contains(inst.instance_id.as_str()) {
            snap.paths().collect()
        } else {
            Vec::new()
        };
        for p in paths {
            if p.ends_with(".py") {
                if let Some(text) = snap.text(p) {
                    code_files.insert(
                        format!("{}/{p}", inst.repo),
                        (inst.repo.clone(), text.to_string()),
                    );
                }
            }
        }
        for r in training_records(inst, &snap, &gt) {
            train_items.push(RlItem {
                record: r,
                problem: inst.problem_statement.clone(),
            });
        }
    }
    let records_of = |set: &[Instance]| -> anyhow::Result<Vec<SubtaskRecord>> {
        let mut recs = Vec::new();
        for inst in set {
            let snap = snapshot(inst)?;
            let gt = ground_truth(&inst.patch, &snap)?;
            recs.extend(training_records(inst, &snap, &gt));
        }
        Ok(recs)
    };
    let held_records = records_of(&held)?;
    let dev_records = records_of(&dev_set)?;
    seconds.insert("data".to_string(), t.elapsed().as_secs_f64());

    // ---- model ----
    let t = Instant::now();
    status.phase("model: tokenizer and random initialisation");
    // The repositories' names (the replays in the warm-up and stage 1 use them, so that the
    // model also copies the one-token names the real tasks name) and the curriculum's.
    let code_names = crate::pipeline::curriculum::Names::from_code(
        code_files
            .iter()
            .map(|(p, (_, t))| (p.as_str(), t.as_str())),
    );
    let names = if cfg.model.curriculum_invented_names {
        let (m, f) = code_names.counts();
        crate::pipeline::curriculum::Names::invented(m, f, random_u64(cfg.seed, 0xa09, 11))
    } else {
        code_names.clone()
    };
    let mut corpus = vec![EMBEDDED_CORPUS.to_string()];
    corpus.extend(code_files.values().map(|(_, t)| t.clone()));
    // Prompts of the base instances only, as for the code above.
    corpus.extend(
        train_items
            .iter()
            .filter(|i| base_ids.contains(i.record.instance_id.as_str()))
            .take(cfg.model.tokenizer_prompts)
            .map(|i| i.record.prompt.clone()),
    );
    if cfg.model.tokenizer_renames > 0 {
        // The code as the warm-up reads it (again): each file under a `# path` header, and
        // package-renamed copies of it. Measured in session 36: no crossing either.
        let mut rng = SplitMix::new(random_u64(cfg.seed, 0xa09, 10));
        for (p, (repo, text)) in &code_files {
            let doc = format!("# {p}\n{text}");
            if let Some(r) = Renamer::new(package_of(repo)) {
                for _ in 0..cfg.model.tokenizer_renames {
                    corpus.push(r.apply(&doc, &fresh_name(&mut rng)));
                }
            }
            corpus.push(doc);
        }
    }
    if cfg.model.tokenizer_exercises > 0 {
        // Text of the copy exercises (fresh names, letter spans) in the tokenizer's corpus.
        // Measured in session 36 (notes/learn.md): fewer single-letter pieces, but the
        // curriculum still did not cross; kept for these experiments.
        corpus.extend(
            crate::pipeline::curriculum::exercises(
                cfg.model.tokenizer_exercises,
                &names,
                random_u64(cfg.seed, 0xa09, 9),
            )
            .iter()
            .flat_map(|c| c.iter().map(|m| m.content.clone())),
        );
    }
    let initial = if cfg.model.base.is_empty() {
        let dir = out.join("models").join("random");
        init_model(cfg.model.preset, &dir, cfg.seed, &corpus)?;
        dir
    } else {
        let dir = PathBuf::from(&cfg.model.base);
        let (_, tok) =
            load_dir(be, &dir).with_context(|| format!("model.base {}", dir.display()))?;
        tok.with_context(|| format!("model.base {}: no tokenizer.json", dir.display()))?;
        dir
    };

    let sft_cfg = |model: &Path, data: &Path, dir: &str, epochs: u64, lr: f32, batch: usize| {
        let mut c = SftConfig {
            model: model.to_path_buf(),
            data: data.to_path_buf(),
            out: out.join(dir),
            epochs,
            batch_tokens: batch,
            max_len: cfg.stage1.max_len.min(batch),
            eval_fraction: 0.05,
            save_every: 0,
            keep_last: 1,
            seed: cfg.seed,
            ..SftConfig::default()
        };
        c.optim.lr = lr;
        c
    };

    // ---- copy / induction curriculum ----
    let probe = crate::pipeline::curriculum::induction_probe(
        PROBE_SIZE,
        &names,
        random_u64(cfg.seed, 0xa09, 5),
    );
    let probe_path = out.join("induction_probe.jsonl");
    chat_jsonl(&probe_path, &probe)?;
    let curriculum: Option<PathBuf> =
        if cfg.model.curriculum_exercises > 0 && cfg.model.base.is_empty() {
            status.phase("curriculum: copy and induction exercises");
            let train_path = out.join("curriculum.jsonl");
            let ex = crate::pipeline::curriculum::exercises(
                cfg.model.curriculum_exercises,
                &names,
                random_u64(cfg.seed, 0xa09, 4),
            );
            chat_jsonl(&train_path, &ex)?;
            let mut c = sft_cfg(
                &initial,
                &train_path,
                "curriculum",
                1,
                cfg.model.curriculum_lr,
                cfg.model.curriculum_batch_tokens,
            );
            c.eval_data = Some(probe_path);
            c.max_len = cfg.model.curriculum_batch_tokens.min(512);
            // Every 100 steps, and at the step where an attempt is judged.
            c.eval_every = match cfg.model.curriculum_patience {
                0 => 100,
                p => gcd(100, p),
            };
            // A constant learning rate: a decaying one stalled before the copy loss's phase
            // transition in every measured run (notes/learn.md).
            c.optim.min_lr_ratio = 1.0;
            c.stop_below_eval =
                (cfg.model.curriculum_stop_probe > 0.0).then_some(cfg.model.curriculum_stop_probe);
            let policy = crate::pipeline::curriculum_run::RestartPolicy {
                patience: cfg.model.curriculum_patience,
                stall_probe: cfg.model.curriculum_stall_probe,
                restarts: cfg.model.curriculum_restarts,
            };
            let mut attempts = CurriculumAttempts {
                be,
                status: &status,
                out,
                preset: cfg.model.preset,
                corpus: &corpus,
                template: c,
                resume,
                stop,
                started: BTreeSet::new(),
            };
            let record = out.join(crate::pipeline::curriculum_run::ATTEMPTS_FILE);
            if !resume && record.exists() {
                std::fs::remove_file(&record).with_context(|| record.display().to_string())?;
            }
            let (model, _) =
                crate::pipeline::curriculum_run::run_attempts(out, &policy, &mut attempts)?;
            Some(model)
        } else {
            None
        };

    // ---- warm-up ----
    status.phase("warm-up: causal language modelling on the training repositories");
    let warm_data = out.join("warmup.jsonl");
    // Plain-text documents: the training repositories' code and the training issues' text
    // (unlabelled: no answers), every token trained.
    let mut originals: Vec<(&str, String)> = code_files
        .iter()
        .map(|(p, (repo, text))| (repo.as_str(), format!("# {p}\n{text}")))
        .collect();
    originals.extend(
        base.iter()
            .map(|i| (i.repo.as_str(), i.problem_statement.clone())),
    );
    let mut rng = SplitMix::new(random_u64(cfg.seed, 0xa09, 1));
    let mut docs = Vec::new();
    for (repo, text) in &originals {
        docs.push(text.clone());
        if let Some(r) = Renamer::new(package_of(repo)) {
            for _ in 0..cfg.model.warmup_renames {
                docs.push(r.apply(text, &fresh_name(&mut rng)));
            }
        }
    }
    text_jsonl(&warm_data, &docs)?;
    if curriculum.is_some() {
        // Replay of the copy exercises among the code, so that the warm-up keeps the copying
        // the curriculum taught (without it the probe loss went from 2.3 to 5.6).
        write_chat_jsonl(
            &warm_data,
            &crate::pipeline::curriculum::exercises(
                cfg.model.warmup_replay,
                &code_names,
                random_u64(cfg.seed, 0xa09, 7),
            ),
            true,
        )?;
    }
    let start = curriculum.clone().unwrap_or_else(|| initial.clone());
    let warm = if cfg.model.warmup_epochs == 0 {
        start.clone()
    } else {
        sft(
            be,
            &status,
            "warm-up",
            sft_cfg(
                &start,
                &warm_data,
                "warmup",
                cfg.model.warmup_epochs,
                cfg.model.warmup_lr,
                cfg.model.warmup_batch_tokens,
            ),
            resume,
            stop,
        )?
    };

    seconds.insert("model+warmup".to_string(), t.elapsed().as_secs_f64());

    // ---- stage 1 ----
    let t = Instant::now();
    status.phase("stage 1: teacher chains of thought, rejection filter, SFT");
    let items: Vec<TeacherItem> = train_items
        .iter()
        .map(|i| TeacherItem {
            record: &i.record,
            problem: &i.problem,
        })
        .collect();
    let mut teacher = BuiltinTeacher {
        temperature: cfg.stage1.teacher_temperature,
    };
    let (kept_idx, acceptance, curation_md, failforge_md) = match cfg.stage1.curation {
        crate::rft::p2t::Curation::Rejection => {
            let samples = cfg.stage1.teacher_samples(&mut teacher, &items, cfg.seed)?;
            let executed = stage1_execution(cfg, &items, &samples, &train, &data.join("repos"))?;
            let (mut k, a) = rejection_filter_checked(
                &items,
                &samples,
                cfg.stage2.edit_reward,
                executed.as_deref(),
            );
            let failforge_md = if cfg.stage1.failforge {
                let (recovered, md) = crate::pipeline::failforge::repro_stage(
                    cfg,
                    &items,
                    &samples,
                    executed.as_deref(),
                    &train,
                    &data.join("repos"),
                    out,
                )?;
                k.extend(recovered);
                md
            } else {
                String::new()
            };
            (k, a, String::new(), failforge_md)
        }
        mode => {
            let (k, a, md) = crate::pipeline::p2t_stage1::curate(
                out,
                &items,
                &train,
                &data.join("repos"),
                mode,
                cfg,
            )?;
            (k, a, md, String::new())
        }
    };
    let mut rng = SplitMix::new(random_u64(cfg.seed, 0xa09, 2));
    let mut kept = Vec::new();
    for (i, conv) in kept_idx {
        let renamer = Renamer::new(package_of(&items[i].record.repo));
        if let Some(r) = &renamer {
            for _ in 0..cfg.stage1.renames {
                let to = package_name(&mut rng);
                kept.push(
                    conv.iter()
                        .map(|m| Message::new(&m.role, &r.apply(&m.content, &to)))
                        .collect(),
                );
            }
        }
        if cfg.stage1.keep_originals || renamer.is_none() || cfg.stage1.renames == 0 {
            kept.push(conv);
        }
    }
    for (k, a) in &acceptance {
        writeln!(
            metrics,
            "{}",
            serde_json::json!({"stage": "stage1", "subtask": k, "sampled": a.sampled, "passed": a.passed, "failed_execution": a.failed_execution, "kept": a.kept})
        )?;
    }
    // stage1_sft.jsonl holds the curated teacher examples only (FailForge re-draws and checks
    // them); the SFT data adds the replayed copy exercises, so that fine-tuning on a few hundred
    // long examples does not wipe out copying.
    let mut s1_data = out.join("stage1_sft.jsonl");
    chat_jsonl(&s1_data, &kept)?;
    let replay = curriculum.is_some() && cfg.stage1.replay_exercises > 0;
    if replay {
        kept.extend(crate::pipeline::curriculum::exercises(
            cfg.stage1.replay_exercises,
            &code_names,
            random_u64(cfg.seed, 0xa09, 6),
        ));
    }
    if cfg.stage1.edit_drills > 0 {
        let files = drill_files(&code_files, random_u64(cfg.seed, 0xa09, 12));
        kept.extend(crate::pipeline::edit_drill::edit_drills(
            cfg.stage1.edit_drills,
            &files,
            random_u64(cfg.seed, 0xa09, 13),
        ));
    }
    if replay || cfg.stage1.edit_drills > 0 {
        s1_data = out.join("stage1_train.jsonl");
        chat_jsonl(&s1_data, &kept)?;
    }
    let sft_dir = sft(
        be,
        &status,
        "stage 1",
        sft_cfg(
            &warm,
            &s1_data,
            "stage1",
            cfg.stage1.epochs,
            cfg.stage1.lr,
            cfg.stage1.batch_tokens.max(cfg.stage1.max_len),
        ),
        resume,
        stop,
    )?;
    seconds.insert("stage1".to_string(), t.elapsed().as_secs_f64());

    // ---- stage 2 ----
    let t = Instant::now();
    status.phase("stage 2: reinforcement learning with rule-based rewards");
    let stage2_out = out.join("stage2");
    if !resume && stage2_out.exists() {
        std::fs::remove_dir_all(&stage2_out).with_context(|| stage2_out.display().to_string())?;
    }
    let mut rl_cfg = cfg.stage2.clone();
    rl_cfg.seed = cfg.seed;
    let rl_items = crate::pipeline::augment::renamed_items(
        &train_items,
        cfg.stage2.prompt_renames,
        random_u64(cfg.seed, 0xa09, 3),
    )?;
    let exec = stage2_exec(cfg, &train, &data.join("repos"))?;
    let rl = crate::rft::rl_run::run_rl_exec(
        be,
        &RlRun {
            model: sft_dir.clone(),
            out: stage2_out,
            resume,
            device: Some(dev.clone()),
            ptx_data: Some(s1_data.clone()),
        },
        &rl_cfg,
        &rl_items,
        stop,
        &mut |m| {
            status.detail(format!(
                "stage 2: step {}/{} reward {:.3} kl {:.4} entropy {:.2}",
                m.step, cfg.stage2.steps, m.reward_mean, m.kl, m.entropy
            ))
        },
        exec,
    )?;
    for m in &rl.metrics {
        let mut v = serde_json::to_value(m)?;
        v["stage"] = "stage2".into();
        writeln!(metrics, "{v}")?;
    }
    metrics.flush()?;
    let rl_metrics = rl.metrics;
    let Some(rl_dir) = rl.final_dir else {
        anyhow::bail!("stage 2 interrupted; run again with --resume to continue");
    };
    seconds.insert("stage2".to_string(), t.elapsed().as_secs_f64());

    // ---- evaluation ----
    let t = Instant::now();
    status.phase("evaluation: three checkpoints on the test repositories");
    let ctx = EvalCtx {
        cfg,
        probe: &probe,
        test: &held,
        test_records: &held_records,
        dev_records: &dev_records,
        repos: &data.join("repos"),
        out,
        status: &status,
        dev,
    };
    let mut stages = Vec::new();
    for (name, dir) in [("initial", &warm), ("sft", &sft_dir), ("sft+rl", &rl_dir)] {
        let r = evaluate_cached(be, &ctx, name, dir, resume)?;
        let mut v = serde_json::to_value(&r)?;
        v["stage"] = format!("eval:{name}").into();
        writeln!(metrics, "{v}")?;
        stages.push(r);
    }
    seconds.insert("eval".to_string(), t.elapsed().as_secs_f64());
    let named: Vec<(&str, &StageScores)> = stages
        .iter()
        .map(|s| (s.stage.as_str(), &s.scores))
        .collect();
    let deltas = scores_deltas(&named, cfg.seed);
    for d in &deltas {
        let mut v = serde_json::to_value(d)?;
        v["stage"] = "delta".into();
        writeln!(metrics, "{v}")?;
    }
    metrics.flush()?;

    // ---- report ----
    status.phase("report");
    let summary = ReproSummary {
        stages,
        acceptance,
        rl: rl_metrics,
        seconds,
        instances: (train.len(), dev_set.len(), held.len()),
        deltas,
    };
    write_report(cfg, dev, out, &summary)?;
    crate::pipeline::failforge::append_to_report(out, &failforge_md)?;
    crate::pipeline::p2t_stage1::append(&out.join("report.md"), &curation_md)?;
    status.bar.finish_and_clear();
    Ok(summary)
}

/// Stage-1 edit acceptance by execution (`stage1.edit_acceptance = "execution"`): which teacher
/// samples resolve their training instance in the sandbox; `None` with the overlap filter only.
pub(crate) fn stage1_execution(
    cfg: &ReproConfig,
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    train: &[Instance],
    repos: &Path,
) -> anyhow::Result<Option<Vec<Vec<bool>>>> {
    if cfg.stage1.edit_acceptance != EditAcceptance::Execution {
        return Ok(None);
    }
    let recs: Vec<&SubtaskRecord> = items.iter().map(|i| i.record).collect();
    let sb = crate::rft::eval::sandbox_config(cfg.data.test_timeout)
        .context("stage1.edit_acceptance = \"execution\" needs the sandbox")?;
    Ok(Some(execution_passes(
        &recs,
        samples,
        train,
        repos,
        &sb,
        cfg.eval.workers,
    )?))
}

/// The stage-2 execution scorer of edit answers (`stage2.edit_exec` other than `rule`).
fn stage2_exec(
    cfg: &ReproConfig,
    train: &[Instance],
    repos: &Path,
) -> anyhow::Result<Option<std::sync::Arc<crate::rft::exec_reward::ExecReward>>> {
    use crate::rft::exec_reward::{EditExec, ExecReward};
    if cfg.stage2.edit_exec == EditExec::Rule {
        return Ok(None);
    }
    let sb = crate::rft::eval::sandbox_config(cfg.data.test_timeout)
        .context("stage2.edit_exec = \"execution\" or \"mixed\" needs the sandbox")?;
    Ok(Some(std::sync::Arc::new(ExecReward::new(
        cfg.stage2.edit_exec,
        train,
        repos.to_path_buf(),
        sb,
        cfg.eval.workers,
    ))))
}

/// What evaluating a checkpoint needs.
struct EvalCtx<'a> {
    cfg: &'a ReproConfig,
    probe: &'a [Vec<Message>],
    test: &'a [Instance],
    test_records: &'a [SubtaskRecord],
    dev_records: &'a [SubtaskRecord],
    repos: &'a Path,
    out: &'a Path,
    status: &'a Status,
    dev: &'a DeviceInfo,
}

/// Mean subtask rewards on the dev split: free greedy, constrained greedy and sampled (the
/// latter two empty when not measured; all three empty without a dev split).
type DevRewards = (
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
);

/// [`DevRewards`] of one checkpoint.
fn dev_rewards<B: Backend>(
    model: &Model<B>,
    tok: &Tokenizer,
    ctx: &EvalCtx<'_>,
    name: &str,
) -> anyhow::Result<DevRewards> {
    let (cfg, recs) = (ctx.cfg, ctx.dev_records);
    if recs.is_empty() {
        return Ok(Default::default());
    }
    ctx.status
        .detail(format!("evaluation: {name}: dev subtask rewards"));
    let mut r = subtask_rewards(model, tok, recs, cfg, &decodings(cfg))?.into_iter();
    let free = r.next().map(|e| e.means).unwrap_or_default();
    let constrained = if cfg.eval.constrain {
        r.next().map(|e| e.means).unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let sampled = if cfg.eval.reward_samples > 0 {
        r.next().map(|e| e.means).unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    Ok((free, constrained, sampled))
}

/// [`evaluate_stage`], or with `resume` the saved evaluation of the same checkpoint and settings
/// (`pipeline::eval_cache`).
fn evaluate_cached<B: Backend>(
    be: &B,
    ctx: &EvalCtx<'_>,
    name: &str,
    dir: &Path,
    resume: bool,
) -> anyhow::Result<StageResult> {
    let cfg = ctx.cfg;
    // The first element names what an evaluation measures; raise it when that changes.
    let settings = (
        "eval-3",
        cfg.seed,
        // The backend that computes (not the `auto` choice), its GPU and dtype.
        (&ctx.dev.device, &ctx.dev.gpu, &ctx.dev.dtype),
        &cfg.data,
        &cfg.model,
        &cfg.eval,
        // Sampled rewards decode at the stage-2 temperature and score with its edit reward.
        cfg.stage2.temperature,
        &cfg.stage2.edit_reward,
    );
    let fp = crate::pipeline::eval_cache::fingerprint(dir, &settings)?;
    if resume {
        let cached = crate::pipeline::eval_cache::load::<StageResult>(ctx.out, name, &fp);
        let scores = crate::pipeline::scores::load(ctx.out, name).ok();
        if let (Some(mut r), Some(s)) = (cached, scores) {
            ctx.status.detail(format!(
                "evaluation: {name}: reused (same checkpoint and settings)"
            ));
            r.scores = s.scores;
            return Ok(r);
        }
    }
    // A stale cache must not pair with the scores this evaluation writes if it is interrupted.
    let stale = crate::pipeline::eval_cache::cache_path(ctx.out, name);
    if stale.exists() {
        std::fs::remove_file(&stale).with_context(|| stale.display().to_string())?;
    }
    let r = evaluate_stage(be, ctx, name, dir)?;
    crate::pipeline::eval_cache::store(ctx.out, name, &fp, &r)?;
    Ok(r)
}

/// One checkpoint on the test split: subtask rewards (free greedy, constrained greedy, sampled),
/// dev rewards, and the Agentless pipeline (its predictions written beside the report).
fn evaluate_stage<B: Backend>(
    be: &B,
    ctx: &EvalCtx<'_>,
    name: &str,
    dir: &Path,
) -> anyhow::Result<StageResult> {
    let (cfg, status) = (ctx.cfg, ctx.status);
    let (model, tok) = load_dir(be, dir)?;
    let tok = tok.with_context(|| format!("{}: no tokenizer", dir.display()))?;
    status.detail(format!(
        "evaluation: {name}: subtask rewards (free, constrained, sampled)"
    ));
    let mut r = subtask_rewards(&model, &tok, ctx.test_records, cfg, &decodings(cfg))?.into_iter();
    let free = r
        .next()
        .context("subtask rewards: no free decoding result")?;
    let constrained = if cfg.eval.constrain { r.next() } else { None };
    let sampled = if cfg.eval.reward_samples > 0 {
        r.next()
    } else {
        None
    };
    let induction_probe_loss = probe_loss(&model, &tok, ctx.probe)?;
    let (dev_subtask_reward, dev_constrained_subtask_reward, dev_sampled_subtask_reward) =
        dev_rewards(&model, &tok, ctx, name)?;
    let mut ecfg = cfg.eval.clone();
    ecfg.seed = cfg.seed;
    let mut ans = ModelAnswerer {
        model: &model,
        tok: &tok,
        cfg: &ecfg,
    };
    // Regression suites (tests passing at each base commit) are found once per run.
    let mut suites = RegressionSuites::new(Some(ctx.out.join("regression-cache")));
    let (outcomes, pipeline) = evaluate_with(
        &mut ans,
        ctx.test,
        ctx.repos,
        &ecfg,
        &mut suites,
        &mut |s| status.detail(format!("evaluation: {name}: {s}")),
    )?;
    let preds = ctx
        .out
        .join(format!("predictions_{}.jsonl", name.replace('+', "_")));
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&preds).with_context(|| preds.display().to_string())?,
    );
    for o in &outcomes {
        writeln!(
            f,
            "{}",
            serde_json::json!({"instance_id": o.instance_id, "model_name_or_path": format!("sorft-{name}"), "model_patch": o.patch, "rewards": o.rewards, "resolved": o.resolved, "answer_chars": o.answers.values().map(String::len).sum::<usize>()})
        )?;
    }
    f.flush()?;
    let mut hits: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for st in Subtask::ALL {
        hits.insert(
            st.name().to_string(),
            outcomes
                .iter()
                .map(|o| o.rewards.get(st.name()).is_some_and(|&r| r > 0.0))
                .collect(),
        );
    }
    hits.insert(
        "resolved".to_string(),
        outcomes.iter().map(|o| o.resolved).collect(),
    );
    let mean = |m: &BTreeMap<String, f64>| m.values().sum::<f64>() / m.len().max(1) as f64;
    let (sampled_subtask_reward, sampled_clusters) = match sampled {
        Some(s) => (s.means, Some(s.clusters)),
        None => (BTreeMap::new(), None),
    };
    let (constrained_subtask_reward, constrained_zero_reasons, constrained_clusters) =
        match constrained {
            Some(c) => (c.means, c.zeros, Some(c.clusters)),
            None => (BTreeMap::new(), BTreeMap::new(), None),
        };
    let scores = StageScores {
        free: free.clusters,
        constrained: constrained_clusters,
        sampled: sampled_clusters,
        hits,
        answer_chars: outcomes
            .iter()
            .map(|o| o.answers.values().map(String::len).sum::<usize>() as f64)
            .collect(),
    };
    let (cluster_instances, cluster_sizes) = cluster_ids(ctx.test_records);
    crate::pipeline::scores::save(
        ctx.out,
        &SavedScores {
            stage: name.to_string(),
            cluster_instances,
            cluster_sizes,
            pipeline_instances: outcomes.iter().map(|o| o.instance_id.clone()).collect(),
            scores: scores.clone(),
        },
    )?;
    Ok(StageResult {
        stage: name.to_string(),
        induction_probe_loss,
        mean_reward: mean(&free.means),
        subtask_reward: free.means,
        zero_reasons: free.zeros,
        constrained_subtask_reward,
        constrained_zero_reasons,
        sampled_mean_reward: mean(&sampled_subtask_reward),
        sampled_subtask_reward,
        dev_subtask_reward,
        dev_constrained_subtask_reward,
        dev_sampled_subtask_reward,
        pipeline,
        scores,
    })
}

/// The table of %Resolved against edit samples (and resolved_curve.svg); empty without tests.
fn resolved_curve_section(out: &Path, stages: &[StageResult]) -> anyhow::Result<String> {
    let curves: Vec<(String, Vec<(usize, f64)>)> = stages
        .iter()
        .filter(|r| !r.pipeline.resolved_curve.is_empty())
        .map(|r| (r.stage.clone(), r.pipeline.resolved_curve.clone()))
        .collect();
    let Some((_, first)) = curves.first() else {
        return Ok(String::new());
    };
    write_text(
        &out.join("resolved_curve.svg"),
        &crate::pipeline::plot::resolved_curve_chart(&curves),
    )?;
    let mut md = String::from("\n## %Resolved against edit samples\n\nThe patch selected among the first k samples (greedy first; one set of samples, prefixes), regression tests found by running each repository's tests at its base commit. Plot: resolved_curve.svg.\n\n| stage |");
    for (k, _) in first {
        md.push_str(&format!(" {k} |"));
    }
    md.push_str(&format!("\n|---|{}\n", "---|".repeat(first.len())));
    for (stage, pts) in &curves {
        md.push_str(&format!("| {stage} |"));
        for (_, r) in pts {
            md.push_str(&format!(" {r:.1} |"));
        }
        md.push('\n');
    }
    Ok(md)
}

fn write_report(
    cfg: &ReproConfig,
    dev: &DeviceInfo,
    out: &Path,
    s: &ReproSummary,
) -> anyhow::Result<()> {
    let steps: Vec<f64> = s.rl.iter().map(|m| m.step as f64).collect();
    let series = |name: &str, f: &dyn Fn(&RlMetrics) -> f64| Series {
        name: name.into(),
        points: steps.iter().copied().zip(s.rl.iter().map(f)).collect(),
    };
    let mut reward = vec![series("mean", &|m| m.reward_mean)];
    for st in Subtask::ALL {
        let n = st.name();
        reward.push(series(n, &|m| {
            m.reward_by_subtask.get(n).copied().unwrap_or(f64::NAN)
        }));
    }
    // Timeline: the steps where the RL monitor raised an event, on the mean reward.
    reward.push(Series {
        name: "monitor event".into(),
        points: s
            .rl
            .iter()
            .filter(|m| !m.monitor.is_empty())
            .map(|m| (m.step as f64, m.reward_mean))
            .collect(),
    });
    write_text(
        &out.join("rl_reward.svg"),
        &line_chart("Stage 2: reward per step", "step", "reward", &reward),
    )?;
    write_text(
        &out.join("rl_kl.svg"),
        &line_chart(
            "Stage 2: KL to the reference",
            "step",
            "KL (nats/token)",
            &[
                series("kl", &|m| m.kl),
                series("approx kl (update)", &|m| m.approx_kl),
            ],
        ),
    )?;
    write_text(
        &out.join("rl_entropy.svg"),
        &line_chart(
            "Stage 2: entropy",
            "step",
            "nats/token",
            &[series("entropy", &|m| m.entropy)],
        ),
    )?;
    let mut cut: Vec<Series> = Subtask::ALL
        .iter()
        .map(|st| {
            let n = st.name();
            series(n, &|m| m.override_mass.get(n).copied().unwrap_or(f64::NAN))
        })
        .collect();
    cut.push(series("-log pi(allowed) / 10 (updated rows)", &|m| {
        m.distill_loss / 10.0
    }));
    write_text(
        &out.join("rl_override.svg"),
        &line_chart(
            "Stage 2: share of the policy's probability the grammar banned",
            "step",
            "share",
            &cut,
        ),
    )?;
    write_text(
        &out.join("rl_response_length.svg"),
        &line_chart(
            "Stage 2: response length",
            "step",
            "tokens",
            &[series("length", &|m| m.response_len)],
        ),
    )?;
    let cats: Vec<String> = Subtask::ALL.iter().map(|s| s.name().to_string()).collect();
    let groups: Vec<String> = s.stages.iter().map(|r| r.stage.clone()).collect();
    let hits: Vec<Vec<f64>> = s
        .stages
        .iter()
        .map(|r| {
            cats.iter()
                .map(|c| r.pipeline.hit_rate.get(c).copied().unwrap_or(0.0))
                .collect()
        })
        .collect();
    write_text(
        &out.join("hit_rates.svg"),
        &bar_chart(
            "Test hit rates per stage (Agentless chain)",
            "% of instances",
            &cats,
            &groups,
            &hits,
        ),
    )?;
    let rewards: Vec<Vec<f64>> = s
        .stages
        .iter()
        .map(|r| {
            cats.iter()
                .map(|c| r.subtask_reward.get(c).copied().unwrap_or(0.0))
                .collect()
        })
        .collect();
    write_text(
        &out.join("subtask_rewards.svg"),
        &bar_chart(
            "Test mean subtask reward per stage (free decoding)",
            "reward",
            &cats,
            &groups,
            &rewards,
        ),
    )?;

    let mut md = String::new();
    md.push_str("# sorft repro report\n\n");
    md.push_str(&format!(
        "Seed {}, model: {}, {} training, {} dev and {} test instances (split by repository; tune on dev, results on test), stage 2: {:?}, {} steps.\n\n",
        cfg.seed,
        if cfg.model.base.is_empty() {
            format!("new {:?} preset", cfg.model.preset)
        } else {
            cfg.model.base.clone()
        }, s.instances.0, s.instances.1, s.instances.2, cfg.stage2.algorithm, cfg.stage2.steps
    ));
    md.push_str(&format!("Device: {}.\n\n", dev.summary()));
    md.push_str(&format!(
        "Decoding: subtask rewards are reported with free decoding first (the primary metric); the Agentless pipeline and the constrained rows use: {}.\n\n",
        match (cfg.eval.constrain, cfg.eval.ground, cfg.eval.faithful) {
            (false, _, _) => "free (answers not constrained)",
            (true, false, _) => "answers constrained to what each prompt showed (paths, definitions, line numbers, SEARCH lines); the chain of thought is free",
            (true, true, false) => "answers constrained to what each prompt showed (paths, definitions, line numbers, SEARCH lines); quotes in localization thoughts must copy the prompt",
            (true, true, true) => "answers constrained to what each prompt showed (paths, definitions, line numbers, SEARCH lines); quotes in localization thoughts must copy the prompt, and a localization answer may only name what its thought quoted (when the thought quoted any shown target)",
        }
    ));
    md.push_str(
        "## Test mean subtask reward (ground-truth prompts, free decoding, greedy; primary)\n",
    );
    reward_table(&mut md, &s.stages, |r| &r.subtask_reward);
    md.push_str(
        "\n## Stage-to-stage deltas on the test split\n\nPaired cluster bootstrap 95% intervals (",
    );
    md.push_str(&format!(
        "{} resamples of whole instances with all their subtasks); McNemar's exact test for the pipeline's hit rates and %Resolved.\n\n",
        crate::pipeline::compare::RESAMPLES
    ));
    md.push_str(&delta_section(&s.deltas));
    md.push_str("\n## Test results (Agentless pipeline, end to end)\n\nThe edit hit is the selected patch's; edit hit@n is an oracle (the best of the samples).\n\n| stage | file hit % | function hit % | line hit % | edit hit % | edit hit@n % | %Applied | %Resolved |\n|---|---|---|---|---|---|---|---|\n");
    for r in &s.stages {
        let h = |k: &str| r.pipeline.hit_rate.get(k).copied().unwrap_or(0.0);
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            r.stage,
            h("file"),
            h("function"),
            h("line"),
            h("edit"),
            h(crate::rft::eval::ORACLE_EDIT),
            r.pipeline.applied_pct,
            r.pipeline.resolved_pct
        ));
    }
    md.push_str(&resolved_curve_section(out, &s.stages)?);
    let probe: Vec<(String, f64)> = s
        .stages
        .iter()
        .map(|r| (r.stage.clone(), r.induction_probe_loss))
        .collect();
    md.push_str(&crate::pipeline::curriculum::report_section(out, &probe)?);
    if s.stages
        .iter()
        .any(|r| !r.constrained_subtask_reward.is_empty())
    {
        md.push_str("\n## Test mean subtask reward, grammar-constrained decoding (greedy)\n");
        reward_table(&mut md, &s.stages, |r| &r.constrained_subtask_reward);
    }
    if s.stages
        .iter()
        .any(|r| !r.sampled_subtask_reward.is_empty())
    {
        md.push_str(&format!(
            "\nThe same, sampled: the mean over {} responses per prompt at temperature {} (what stage 2 maximises; less noisy than one greedy answer):\n",
            cfg.eval.reward_samples, cfg.stage2.temperature
        ));
        reward_table(&mut md, &s.stages, |r| &r.sampled_subtask_reward);
    }
    if s.stages.iter().any(|r| !r.dev_subtask_reward.is_empty()) {
        md.push_str("\nDev split (free, greedy; the numbers to tune on):\n");
        reward_table(&mut md, &s.stages, |r| &r.dev_subtask_reward);
    }
    if s.stages
        .iter()
        .any(|r| !r.dev_constrained_subtask_reward.is_empty())
    {
        md.push_str("\nDev split (constrained, greedy):\n");
        reward_table(&mut md, &s.stages, |r| &r.dev_constrained_subtask_reward);
    }
    if s.stages
        .iter()
        .any(|r| !r.dev_sampled_subtask_reward.is_empty())
    {
        md.push_str("\nDev split (sampled as in stage 2):\n");
        reward_table(&mut md, &s.stages, |r| &r.dev_sampled_subtask_reward);
    }
    md.push_str("\nWhy test answers scored zero (counts over all subtasks):\n\n");
    for r in &s.stages {
        let z: Vec<String> = r
            .zero_reasons
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let free: Vec<String> = r
            .constrained_zero_reasons
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        md.push_str(&format!(
            "- {}: {}{}\n",
            r.stage,
            if z.is_empty() {
                "none".to_string()
            } else {
                z.join(", ")
            },
            if free.is_empty() {
                String::new()
            } else {
                format!(" (constrained decoding: {})", free.join(", "))
            }
        ));
    }
    md.push_str(&format!(
        "\n## Stage 1 rejection sampling\n\nEdit acceptance: {}.\n\n| subtask | sampled | passed | failed execution | kept |\n|---|---|---|---|---|\n",
        match cfg.stage1.edit_acceptance {
            EditAcceptance::Execution => "positive rule reward and the patch resolves the training instance in the sandbox (FAIL_TO_PASS pass, PASS_TO_PASS kept)",
            EditAcceptance::Overlap => "positive rule reward (applies and touches a ground-truth line; SoRFT's filter)",
        }
    ));
    for (k, a) in &s.acceptance {
        md.push_str(&format!(
            "| {k} | {} | {} | {} | {} |\n",
            a.sampled, a.passed, a.failed_execution, a.kept
        ));
    }
    md.push_str("\n## Stage 2 (per step)\n\n| step | reward | kl | entropy | clip frac | response len | updated seqs | rollout s | reward s | train s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for m in &s.rl {
        md.push_str(&format!(
            "| {} | {:.3} | {:.4} | {:.3} | {:.3} | {:.1} | {} | {:.1} | {:.2} | {:.1} |\n",
            m.step,
            m.reward_mean,
            m.kl,
            m.entropy,
            m.clip_frac,
            m.response_len,
            m.trained_sequences,
            m.time_rollout,
            m.time_reward,
            m.time_train
        ));
    }
    md.push_str(&format!(
        "\n## RL monitor (RFT-FM, {:?})\n\n",
        cfg.stage2.monitor
    ));
    let events: Vec<String> =
        s.rl.iter()
            .flat_map(|m| m.monitor.iter().map(|e| format!("- {}\n", e.describe())))
            .collect();
    md.push_str(&if events.is_empty() {
        "No anomaly detected.\n".to_string()
    } else {
        events.concat()
    });
    md.push_str("\n## Wall time (seconds)\n\n");
    for (k, v) in &s.seconds {
        md.push_str(&format!("- {k}: {v:.1}\n"));
    }
    md.push_str(&format!(
        "\nPlots: rl_reward.svg, rl_kl.svg, rl_entropy.svg, rl_override.svg, rl_response_length.svg, hit_rates.svg, subtask_rewards.svg{}. Metrics: metrics.jsonl. Configuration: config.toml.\n",
        if out.join("induction.svg").exists() { ", induction.svg" } else { "" }
    ));
    write_text(&out.join("report.md"), &md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::config::DataConfig;

    #[test]
    fn drill_files_are_two_renamed_copies_of_each_repository() {
        let mut code = BTreeMap::new();
        for (repo, path, text) in [
            (
                "synth/umber3",
                "umber3/graph.py",
                "from umber3 import util\n",
            ),
            ("synth/umber3", "tests/test_graph.py", "import umber3\n"),
            ("synth/wicket4", "wicket4/text.py", "x = 1\n"),
        ] {
            code.insert(
                format!("{repo}/{path}"),
                (repo.to_string(), text.to_string()),
            );
        }
        let files = drill_files(&code, 5);
        assert_eq!(files.len(), 6);
        for (p, t) in &files {
            assert!(!p.contains("umber3") && !t.contains("umber3"), "{p}: {t}");
            assert!(!p.contains("wicket4") && !p.starts_with("synth/"), "{p}");
        }
        let graph: Vec<&(String, String)> = files
            .iter()
            .filter(|(p, _)| p.ends_with("/graph.py"))
            .collect();
        assert_eq!(graph.len(), 2);
        assert_ne!(graph[0].0, graph[1].0, "each copy has its own package name");
        let pkg = graph[0].0.split('/').next().unwrap_or("");
        assert_eq!(graph[0].1, format!("from {pkg} import util\n"));
        assert_eq!(files, drill_files(&code, 5));
    }

    #[test]
    fn one_generate_call_scores_each_decoding_as_its_own_call_would() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let synth_cfg = SynthConfig {
            n: 2,
            seed: 3,
            per_repo: 2,
            ..SynthConfig::default()
        };
        let insts = synth(&synth_cfg, &data, &|_| {}).unwrap().instances;
        let store = RepoStore::new(data.join("repos"));
        let mut recs = Vec::new();
        for inst in &insts {
            let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
            let gt = ground_truth(&inst.patch, &snap).unwrap();
            recs.extend(training_records(inst, &snap, &gt));
        }
        let mdir = dir.path().join("model");
        init_model(
            crate::model::init::Preset::Tiny,
            &mdir,
            5,
            &[EMBEDDED_CORPUS.to_string()],
        )
        .unwrap();
        let (model, tok) = load_dir(&crate::engine::Cpu, &mdir).unwrap();
        let tok = tok.unwrap();
        let mut cfg = ReproConfig::default();
        cfg.eval.max_new_tokens = 12;
        cfg.eval.batch = 3;
        cfg.eval.reward_samples = 2;
        let all = decodings(&cfg);
        assert_eq!(all.len(), 3);
        let together = subtask_rewards(&model, &tok, &recs, &cfg, &all).unwrap();
        for (d, dec) in all.iter().enumerate() {
            let alone = subtask_rewards(&model, &tok, &recs, &cfg, &[*dec]).unwrap();
            assert_eq!(together[d].means, alone[0].means, "decoding {d}");
            assert_eq!(together[d].zeros, alone[0].zeros, "decoding {d}");
            assert_eq!(together[d].clusters, alone[0].clusters, "decoding {d}");
        }
        // The decodings answer differently (a mix-up of outputs would show).
        assert_ne!(together[0].zeros, together[1].zeros);
    }

    #[test]
    fn training_repositories_get_more_instances_and_the_others_keep_per_repo() {
        let d = |instances, per_repo, train_per_repo| DataConfig {
            instances,
            per_repo,
            train_per_repo,
            ..DataConfig::default()
        };
        assert_eq!(generated_counts(&d(168, 3, 0)), (168, 3));
        assert_eq!(generated_counts(&d(168, 3, 3)), (168, 3));
        assert_eq!(generated_counts(&d(168, 3, 9)), (504, 9));
        assert_eq!(generated_counts(&d(10, 3, 4)), (16, 4));
        let inst = |repo: &str, k: usize| Instance {
            repo: repo.into(),
            instance_id: format!("{repo}-{k}"),
            ..Instance::default()
        };
        let all = [
            inst("a", 1),
            inst("a", 2),
            inst("a", 3),
            inst("b", 1),
            inst("b", 2),
        ];
        let ids = |v: Vec<Instance>| v.into_iter().map(|i| i.instance_id).collect::<Vec<_>>();
        assert_eq!(
            ids(first_per_repo(all.iter(), 2)),
            ["a-1", "a-2", "b-1", "b-2"]
        );
        assert_eq!(ids(first_per_repo(all.iter(), 1)), ["a-1", "b-1"]);
    }
}
