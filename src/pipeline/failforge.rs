//! FailForge as a stage of the stage-1 data pipeline: the hook `sorft repro` calls after the
//! rejection filter (`stage1.failforge = true`), and `sorft failforge` over a finished
//! rejection-sampling run (its `config.toml`, `data/` and `stage1_sft.jsonl`), optionally with the
//! held-out comparison of training corpora (plain rejection sampling, + FailForge, + FailForge with
//! the skill kept, + a plain second attempt).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::Context;

use crate::engine::rng::{random_u64, SplitMix};
use crate::engine::{Backend, SamplingParams};
use crate::model::chat::{self, Message};
use crate::model::generate::{generate, GenOptions, GenRequest};
use crate::model::load_dir;
use crate::pipeline::augment::{package_name, package_of, Renamer};
use crate::pipeline::config::ReproConfig;
use crate::pipeline::config::ReproConfig as Cfg;
use crate::rft::accept::EditAcceptance;
use crate::rft::failforge::diagnose::Diagnoser;
use crate::rft::failforge::exec::{EditExecutor, SandboxExecutor};
use crate::rft::failforge::follow::SkillFollowingTeacher;
use crate::rft::failforge::report::{ArmResult, HeldoutComparison};
use crate::rft::failforge::skills::SkillLibrary;
use crate::rft::failforge::RetryTeacher;
use crate::rft::failforge::{run_stage, Example, Round, StageOutput};
use crate::rft::stats::paired_cluster_bootstrap;
use crate::rft::teacher::{BuiltinTeacher, Teacher, TeacherItem};
use crate::swe::instance::{read_jsonl, Instance};
use crate::swe::repo::RepoStore;
use crate::swe::subtask::{training_records, SubtaskRecord};
use crate::swe::truth::ground_truth;
use crate::train::sft::{run_sft, Resume, SftConfig};

fn write_convs(path: &Path, convs: &[Example]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| path.display().to_string())?,
    );
    for (_, c) in convs {
        writeln!(f, "{}", serde_json::json!({ "messages": c }))?;
    }
    f.flush()?;
    Ok(())
}

/// The stage-1 execution context of a round: which samples passed execution, and the sandbox
/// that runs failed and recovered edits.
pub struct Execution<'a> {
    /// `executed[i][k]`: sample `k` of prompt `i` passed execution acceptance.
    pub executed: &'a [Vec<bool>],
    /// The sandbox.
    pub executor: &'a mut dyn EditExecutor,
}

/// The sandbox executor of a run whose stage 1 accepts edits by execution (`None` otherwise).
pub fn executor_for(
    cfg: &Cfg,
    train: &[Instance],
    repos: &Path,
) -> anyhow::Result<Option<SandboxExecutor>> {
    if cfg.stage1.edit_acceptance != EditAcceptance::Execution {
        return Ok(None);
    }
    let sb = crate::rft::eval::sandbox_config(cfg.data.test_timeout)
        .context("FailForge's execution feedback needs the sandbox")?;
    Ok(Some(SandboxExecutor::new(
        sb,
        repos,
        train,
        cfg.eval.workers,
    )))
}

/// The retry teacher `kind` with the run's stage-1 teacher temperature.
pub fn config_teacher(cfg: &Cfg, kind: RetryTeacher) -> Box<dyn Teacher> {
    let temperature = cfg.stage1.teacher_temperature;
    match kind {
        RetryTeacher::Follow => Box::new(SkillFollowingTeacher { temperature }),
        RetryTeacher::Builtin => Box::new(BuiltinTeacher { temperature }),
    }
}

/// Runs the stage with `diagnoser` on a rejection-sampling round and writes its outputs into
/// `dir`: `skills.jsonl` (the library: `start`'s skills, if given, and the new ones),
/// `recovered.jsonl`, `skill_kept.jsonl`, `plain_retry.jsonl`, `report.json` and `report.md`.
#[allow(clippy::too_many_arguments)]
pub fn forge(
    cfg: &ReproConfig,
    teacher: &mut dyn Teacher,
    diagnoser: &mut dyn Diagnoser,
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    exec: Option<Execution<'_>>,
    dir: &Path,
    start: Option<&Path>,
) -> anyhow::Result<StageOutput> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let lib_path = dir.join("skills.jsonl");
    let mut library = match start {
        Some(p) if !p.exists() => anyhow::bail!("{}: no such skill library", p.display()),
        Some(p) => SkillLibrary::load(p)?,
        None => SkillLibrary::new(),
    };
    let (executed, executor) = match exec {
        Some(e) => (Some(e.executed), Some(e.executor)),
        None => (None, None),
    };
    let round = Round {
        items,
        samples,
        edit_reward: cfg.stage2.edit_reward,
        seed: cfg.seed,
        executed,
    };
    let out = run_stage(
        teacher,
        diagnoser,
        &round,
        &mut library,
        &cfg.failforge,
        executor,
    )?;
    library.save(&lib_path)?;
    write_convs(&dir.join("recovered.jsonl"), &out.recovered)?;
    write_convs(&dir.join("skill_kept.jsonl"), &out.skill_kept)?;
    write_convs(&dir.join("plain_retry.jsonl"), &out.plain_retry)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&out.report)?,
    )?;
    std::fs::write(dir.join("report.md"), out.report.markdown())?;
    Ok(out)
}

/// The hook of `sorft repro`: the stage with the configured retry teacher and the rule
/// diagnoser, outputs in `<out>/failforge/`; with stage-1 execution results (`executed`), failed
/// edits get execution feedback and recovered edits must resolve their `train` instance in the
/// sandbox. Returns the examples to add (skill removed) and the report section.
pub fn repro_stage(
    cfg: &ReproConfig,
    items: &[TeacherItem<'_>],
    samples: &[Vec<String>],
    executed: Option<&[Vec<bool>]>,
    train: &[Instance],
    repos: &Path,
    out: &Path,
) -> anyhow::Result<(Vec<Example>, String)> {
    let mut teacher = config_teacher(cfg, cfg.failforge.retry_teacher);
    let dir = out.join("failforge");
    let mut diagnoser = crate::rft::failforge::diagnose::RuleDiagnoser;
    let mut sandbox = match executed {
        Some(_) => executor_for(cfg, train, repos)?,
        None => None,
    };
    let exec = executed
        .zip(sandbox.as_mut())
        .map(|(executed, ex)| Execution {
            executed,
            executor: ex as &mut dyn EditExecutor,
        });
    let res = forge(
        cfg,
        teacher.as_mut(),
        &mut diagnoser,
        items,
        samples,
        exec,
        &dir,
        None,
    )?;
    Ok((res.recovered, res.report.markdown()))
}

/// Appends a section to `<out>/report.md` (nothing when `section` is empty).
pub fn append_to_report(out: &Path, section: &str) -> anyhow::Result<()> {
    if section.is_empty() {
        return Ok(());
    }
    let p = out.join("report.md");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .with_context(|| p.display().to_string())?;
    writeln!(f, "\n{section}")?;
    Ok(())
}

/// A finished rejection-sampling run read back from disk.
pub struct Run {
    /// Its directory.
    pub dir: PathBuf,
    /// Its configuration.
    pub cfg: ReproConfig,
    /// Training prompts with their issue texts.
    pub train: Vec<(SubtaskRecord, String)>,
    /// Held-out instances.
    pub heldout: Vec<Instance>,
    /// Held-out ground-truth records, per instance (same order).
    pub heldout_records: Vec<Vec<SubtaskRecord>>,
}

/// Reads `dir/config.toml`, `dir/data/{train,heldout}.jsonl` and the repositories in `dir/data/repos`.
pub fn load_run(dir: &Path) -> anyhow::Result<Run> {
    let cfg_path = dir.join("config.toml");
    let cfg = ReproConfig::load(false, Some(&cfg_path), &[])
        .with_context(|| format!("{}: not a `sorft repro` run", dir.display()))?;
    let data = dir.join("data");
    let store = RepoStore::new(data.join("repos"));
    let mut train = Vec::new();
    for inst in read_jsonl(&data.join("train.jsonl"))? {
        let snap = store.snapshot(&inst.repo, &inst.base_commit)?;
        let gt = ground_truth(&inst.patch, &snap)?;
        for r in training_records(&inst, &snap, &gt) {
            train.push((r, inst.problem_statement.clone()));
        }
    }
    // The test split (runs made before the three-way split call it heldout.jsonl).
    let test = data.join("test.jsonl");
    let heldout = read_jsonl(&if test.exists() {
        test
    } else {
        data.join("heldout.jsonl")
    })?;
    let mut heldout_records = Vec::new();
    for inst in &heldout {
        let snap = store.snapshot(&inst.repo, &inst.base_commit)?;
        let gt = ground_truth(&inst.patch, &snap)?;
        heldout_records.push(training_records(inst, &snap, &gt));
    }
    Ok(Run {
        dir: dir.to_path_buf(),
        cfg,
        train,
        heldout,
        heldout_records,
    })
}

/// Reads a chat JSONL corpus as raw lines.
fn corpus_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// Examples expanded with package renames the way `sorft repro` expands its stage-1 corpus.
fn with_renames(cfg: &ReproConfig, repos: &[&str], examples: &[Example], salt: u64) -> Vec<String> {
    let mut rng = SplitMix::new(random_u64(cfg.seed, 0xf0f, salt));
    let mut out = Vec::new();
    for (i, conv) in examples {
        let renamer = Renamer::new(package_of(repos[*i]));
        if let Some(r) = &renamer {
            for _ in 0..cfg.stage1.renames {
                let to = package_name(&mut rng);
                let c: Vec<Message> = conv
                    .iter()
                    .map(|m| Message::new(&m.role, &r.apply(&m.content, &to)))
                    .collect();
                out.push(serde_json::json!({ "messages": c }).to_string());
            }
        }
        if cfg.stage1.keep_originals || renamer.is_none() || cfg.stage1.renames == 0 {
            out.push(serde_json::json!({ "messages": conv }).to_string());
        }
    }
    out
}

/// Options of [`standalone`].
pub struct Standalone<'d> {
    /// The diagnoser.
    pub diagnoser: &'d mut dyn Diagnoser,
    /// A teacher of the retries given from outside (an endpoint); it wins over `retry_teacher`.
    pub teacher: Option<&'d mut dyn Teacher>,
    /// The kind of retry teacher (`None`: the run's `[failforge] retry_teacher`).
    pub retry_teacher: Option<RetryTeacher>,
    /// Where to write (default `<run>/failforge`).
    pub out: PathBuf,
    /// Also train and evaluate the corpora on the held-out instances.
    pub heldout: bool,
    /// Bootstrap resamples of the held-out intervals.
    pub resamples: usize,
    /// A skill library to start from (default: an empty one).
    pub library: Option<PathBuf>,
}

/// `sorft failforge`: the stage over the run in `run_dir` (the teacher's rejection-sampling round
/// is drawn again with the run's seed and checked against its `stage1_sft.jsonl`), then, with
/// `heldout`, the comparison of training corpora. Returns the markdown written to `out/report.md`.
pub fn standalone<B: Backend>(
    be: &B,
    run_dir: &Path,
    mut opts: Standalone<'_>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(String),
) -> anyhow::Result<String> {
    let run = load_run(run_dir)?;
    let cfg = &run.cfg;
    if cfg.stage1.failforge {
        anyhow::bail!(
            "{}: this run already used FailForge (stage1.failforge = true); run `sorft failforge` on a plain rejection-sampling run",
            run_dir.display()
        );
    }
    let items: Vec<TeacherItem<'_>> = run
        .train
        .iter()
        .map(|(r, p)| TeacherItem {
            record: r,
            problem: p,
        })
        .collect();
    let mut teacher = BuiltinTeacher {
        temperature: cfg.stage1.teacher_temperature,
    };
    progress(format!("rejection sampling again: {} prompts", items.len()));
    let samples = cfg.stage1.teacher_samples(&mut teacher, &items, cfg.seed)?;
    // The same acceptance as the run's stage 1 (execution in the sandbox by default).
    let data = run.dir.join("data");
    let train_instances = read_jsonl(&data.join("train.jsonl"))?;
    let executed = crate::pipeline::repro::stage1_execution(
        cfg,
        &items,
        &samples,
        &train_instances,
        &data.join("repos"),
    )?;
    let (kept, _) = crate::rft::teacher::rejection_filter_checked(
        &items,
        &samples,
        cfg.stage2.edit_reward,
        executed.as_deref(),
    );
    let repos: Vec<&str> = run.train.iter().map(|(r, _)| r.repo.as_str()).collect();
    let plain_path = run.dir.join("stage1_sft.jsonl");
    let plain = corpus_lines(&plain_path)?;
    let expected = with_renames(cfg, &repos, &kept, 0).len();
    if plain.len() != expected {
        anyhow::bail!(
            "{}: {} examples, but the teacher drawn again with the run's configuration gives {expected}; \
the run was made with another teacher or configuration",
            plain_path.display(),
            plain.len()
        );
    }
    progress("diagnosing failures and retrying".into());
    let mut sandbox = match &executed {
        Some(_) => executor_for(cfg, &train_instances, &data.join("repos"))?,
        None => None,
    };
    let exec = executed
        .as_deref()
        .zip(sandbox.as_mut())
        .map(|(executed, ex)| Execution {
            executed,
            executor: ex as &mut dyn EditExecutor,
        });
    let mut own = config_teacher(
        cfg,
        opts.retry_teacher.unwrap_or(cfg.failforge.retry_teacher),
    );
    let retry_teacher: &mut dyn Teacher = match opts.teacher.as_deref_mut() {
        Some(t) => t,
        None => own.as_mut(),
    };
    let res = forge(
        cfg,
        retry_teacher,
        opts.diagnoser,
        &items,
        &samples,
        exec,
        &opts.out,
        opts.library.as_deref(),
    )?;
    let mut md = res.report.markdown();
    if opts.heldout {
        let arms = [
            ("plain rejection sampling", plain.clone()),
            ("+ FailForge (skill removed)", {
                let mut c = plain.clone();
                c.extend(with_renames(cfg, &repos, &res.recovered, 1));
                c
            }),
            ("+ FailForge, skill kept in the prompt", {
                let mut c = plain.clone();
                c.extend(with_renames(cfg, &repos, &res.skill_kept, 1));
                c
            }),
            ("+ plain second attempt", {
                let mut c = plain.clone();
                c.extend(with_renames(cfg, &repos, &res.plain_retry, 1));
                c
            }),
        ];
        let cmp = heldout_comparison(be, &run, &arms, &opts, stop, progress)?;
        std::fs::write(
            opts.out.join("heldout.json"),
            serde_json::to_string_pretty(&cmp)?,
        )?;
        md.push_str(&cmp.markdown());
    }
    std::fs::write(opts.out.join("report.md"), &md)?;
    Ok(md)
}

/// Greedy reward of `model` on each record (0 for prompts over the length limit).
fn record_rewards<B: Backend>(
    be: &B,
    model_dir: &Path,
    recs: &[&SubtaskRecord],
    cfg: &ReproConfig,
) -> anyhow::Result<Vec<f64>> {
    let (model, tok) = load_dir(be, model_dir)?;
    let tok = tok.with_context(|| format!("{}: no tokenizer", model_dir.display()))?;
    let mut reqs = Vec::new();
    let mut which = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let (ids, _) = chat::encode(&tok, &[Message::new("user", &r.prompt)], true)?;
        if ids.len() > cfg.eval.max_prompt_tokens {
            continue;
        }
        reqs.push(GenRequest {
            prompt: ids,
            params: SamplingParams::greedy(),
            max_new_tokens: cfg.eval.max_new_tokens,
            stop_ids: tok.stop_ids(),
            stop_strings: Vec::new(),
            constraint: crate::swe::grammar::constraint_for(
                r,
                cfg.eval.max_new_tokens,
                cfg.eval.constrain,
                cfg.eval.ground,
                cfg.eval.faithful,
            ),
            min_allowed_mass: 0.0,
        });
        which.push(i);
    }
    let outs = generate(
        &model,
        Some(&tok),
        &reqs,
        &GenOptions {
            max_batch: cfg.eval.batch,
            progress: false,
        },
    )?;
    let mut scores = vec![0.0; recs.len()];
    for (o, &i) in outs.iter().zip(&which) {
        scores[i] = recs[i].reward(&o.text, cfg.stage2.edit_reward).reward;
    }
    Ok(scores)
}

/// Difficulty of each held-out instance: the fraction of built-in teacher samples (8 per prompt)
/// that pass its ground-truth filter, binned into hard (< 1/3), medium and easy (>= 2/3).
fn difficulty(run: &Run) -> anyhow::Result<Vec<&'static str>> {
    let mut teacher = BuiltinTeacher {
        temperature: run.cfg.stage1.teacher_temperature,
    };
    let mut out = Vec::new();
    for (i, (inst, recs)) in run.heldout.iter().zip(&run.heldout_records).enumerate() {
        let items: Vec<TeacherItem<'_>> = recs
            .iter()
            .map(|r| TeacherItem {
                record: r,
                problem: &inst.problem_statement,
            })
            .collect();
        let samples = teacher.sample(&items, 8, random_u64(run.cfg.seed, 0xd1f, i as u64))?;
        let (mut pass, mut n) = (0usize, 0usize);
        for (r, outs) in recs.iter().zip(&samples) {
            for t in outs {
                n += 1;
                pass += usize::from(r.reward(t, run.cfg.stage2.edit_reward).reward > 0.0);
            }
        }
        let rate = pass as f64 / n.max(1) as f64;
        out.push(if rate < 1.0 / 3.0 {
            "hard"
        } else if rate < 2.0 / 3.0 {
            "medium"
        } else {
            "easy"
        });
    }
    Ok(out)
}

/// Trains the warm-up checkpoint of `run` on each corpus with the run's stage-1 settings and scores
/// the held-out prompts; intervals against the first arm.
fn heldout_comparison<B: Backend>(
    be: &B,
    run: &Run,
    arms: &[(&str, Vec<String>)],
    opts: &Standalone<'_>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(String),
) -> anyhow::Result<HeldoutComparison> {
    let cfg = &run.cfg;
    let base = if cfg.model.warmup_epochs == 0 {
        run.dir.join("models").join("random")
    } else {
        run.dir.join("warmup").join("final")
    };
    if !base.join("model.safetensors").exists() {
        anyhow::bail!("{}: no warm-up checkpoint to train from", base.display());
    }
    let recs: Vec<&SubtaskRecord> = run.heldout_records.iter().flatten().collect();
    let bins = difficulty(run)?;
    let mut per_arm: Vec<Vec<Vec<f64>>> = Vec::new();
    let corpora = opts.out.join("corpora");
    std::fs::create_dir_all(&corpora)?;
    for (k, (name, lines)) in arms.iter().enumerate() {
        progress(format!(
            "held-out: training on {name} ({} examples)",
            lines.len()
        ));
        let data = corpora.join(format!("arm{k}.jsonl"));
        std::fs::write(&data, lines.join("\n") + "\n")?;
        let batch = cfg.stage1.batch_tokens.max(cfg.stage1.max_len);
        let mut sc = SftConfig {
            model: base.clone(),
            data,
            out: corpora.join(format!("arm{k}")),
            epochs: cfg.stage1.epochs,
            batch_tokens: batch,
            max_len: cfg.stage1.max_len.min(batch),
            eval_fraction: 0.05,
            save_every: 0,
            keep_last: 1,
            seed: cfg.seed,
            ..SftConfig::default()
        };
        sc.optim.lr = cfg.stage1.lr;
        if sc.out.exists() {
            std::fs::remove_dir_all(&sc.out)?;
        }
        let res = run_sft(be, &sc, Resume::No, stop, &mut |_| {})?;
        let dir = res
            .final_dir
            .with_context(|| format!("{name}: training exported no model"))?;
        progress(format!("held-out: scoring {name}"));
        let scores = record_rewards(be, &dir, &recs, cfg)?;
        let mut it = scores.into_iter();
        per_arm.push(
            run.heldout_records
                .iter()
                .map(|r| it.by_ref().take(r.len()).collect())
                .collect(),
        );
    }
    let mut bin_counts: BTreeMap<String, usize> = BTreeMap::new();
    for b in &bins {
        *bin_counts.entry(b.to_string()).or_default() += 1;
    }
    let level = 0.95;
    let mean = |v: &[Vec<f64>]| {
        let all: Vec<f64> = v.iter().flatten().copied().collect();
        all.iter().sum::<f64>() / all.len().max(1) as f64
    };
    let mut results = Vec::new();
    for (k, ((name, lines), scores)) in arms.iter().zip(&per_arm).enumerate() {
        let plain = &per_arm[0];
        let interval = |keep: &dyn Fn(usize) -> bool| {
            let idx: Vec<usize> = (0..plain.len()).filter(|&i| keep(i)).collect();
            let a: Vec<Vec<f64>> = idx.iter().map(|&i| plain[i].clone()).collect();
            let b: Vec<Vec<f64>> = idx.iter().map(|&i| scores[i].clone()).collect();
            paired_cluster_bootstrap(
                &a,
                &b,
                opts.resamples,
                level,
                random_u64(cfg.seed, 0xb00, 0),
            )
            .ok()
        };
        let by_difficulty = bin_counts
            .iter()
            .map(|(b, n)| (b.clone(), (*n, interval(&|i| bins[i] == b.as_str()))))
            .collect();
        results.push(ArmResult {
            name: name.to_string(),
            examples: lines.len(),
            mean: mean(scores),
            delta: if k == 0 { None } else { interval(&|_| true) },
            by_difficulty: if k == 0 {
                BTreeMap::new()
            } else {
                by_difficulty
            },
        });
    }
    Ok(HeldoutComparison {
        instances: run.heldout.len(),
        difficulty: "share of 8 built-in teacher samples per held-out prompt that pass the ground-truth filter: hard < 1/3 <= medium < 2/3 <= easy".into(),
        bins: bin_counts,
        arms: results,
        resamples: opts.resamples,
        level,
    })
}
