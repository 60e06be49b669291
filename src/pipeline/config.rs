//! The configuration of `sorft repro`: every knob, with defaults embedded in the binary, read
//! from one TOML file (partial files are fine) and overridden by `--set key=value` flags. The
//! effective configuration is printed at start and saved beside the outputs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::engine::device::{DTypeChoice, DeviceChoice};
use crate::model::init::Preset;
use crate::rft::eval::EvalConfig;
use crate::rft::rl::RlConfig;

/// The synthetic task set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Instances in repositories of `per_repo` each: sets how many repositories are generated.
    pub instances: usize,
    /// Instances per repository (all of the dev and test repositories' instances).
    pub per_repo: usize,
    /// Instances per training repository: more bugs in the same training code for stages 1
    /// and 2 (the dev and test splits keep `per_repo`); at most `per_repo`: `per_repo`.
    pub train_per_repo: usize,
    /// Fraction of repositories held out as the test split (the reported results; the default
    /// holds out most of them so that the test split has over 100 instances).
    pub heldout_fraction: f64,
    /// Fraction of repositories held out as the dev split (for tuning; 0: none).
    pub dev_fraction: f64,
    /// Time limit of one validation test run, seconds.
    pub test_timeout: f64,
    /// Mix of issue styles: `{import = .., traceback = .., behaviour = ..}` (relative weights;
    /// traceback and behaviour issues carry no `from pkg import mod` line).
    pub issue_styles: crate::swe::synth::issue::IssueStyles,
    /// Share of instances whose bug spans two files (the gold patch touches both).
    pub multi_file_fraction: f64,
    /// Distractor modules per repository (near-duplicate copies under similar names).
    pub distractors: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            instances: 168,
            per_repo: 3,
            train_per_repo: 9,
            heldout_fraction: 0.65,
            dev_fraction: 0.07,
            test_timeout: 20.0,
            issue_styles: crate::swe::synth::issue::IssueStyles::mixed(),
            multi_file_fraction: 0.15,
            distractors: 1,
        }
    }
}

/// The model and its warm-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// Size preset of the model created from scratch.
    pub preset: Preset,
    /// A model directory (Hugging Face layout, e.g. a pretrained Qwen2.5-Coder) to start from
    /// instead of a new `preset` model; empty: create one.
    pub base: String,
    /// Warm-up epochs of causal language modelling on the training repositories' code (0: none).
    pub warmup_epochs: u64,
    /// Warm-up learning rate.
    pub warmup_lr: f32,
    /// Tokens per warm-up micro-batch (and longest warm-up window).
    pub warmup_batch_tokens: usize,
    /// Package-renamed copies of each warm-up document (see `pipeline::augment`).
    pub warmup_renames: usize,
    /// Training prompts whose text joins the new tokenizer's training corpus (with the
    /// embedded English corpus and the training repositories' code).
    pub tokenizer_prompts: usize,
    /// Package-renamed copies of each code file in the new tokenizer's corpus (0: none).
    pub tokenizer_renames: usize,
    /// Copy exercises whose text joins the new tokenizer's training corpus (0: none).
    pub tokenizer_exercises: usize,
    /// Copy / induction exercises trained before the warm-up, one epoch at a constant learning
    /// rate (0: none; see `pipeline::curriculum`). Only for a model created from scratch
    /// (`base` empty).
    pub curriculum_exercises: usize,
    /// The curriculum's module and function names are invented words (as many as the
    /// repositories have, fixed for the run) instead of the repositories' own: the run's
    /// tokenizer has one token for each of those, and with them the curriculum stalled before
    /// the copy phase transition (notes/learn.md, session 37). The replays in the warm-up and
    /// stage 1 use the repositories' names either way.
    pub curriculum_invented_names: bool,
    /// Learning rate of the curriculum.
    pub curriculum_lr: f32,
    /// Tokens per curriculum micro-batch.
    pub curriculum_batch_tokens: usize,
    /// The curriculum ends early once the induction probe's loss falls under this (checked
    /// every 100 steps): the model copies, so the rest of its budget goes to the later stages.
    /// 0: train every exercise.
    pub curriculum_stop_probe: f64,
    /// A curriculum whose probe loss is still above `curriculum_stall_probe` at step
    /// `curriculum_patience` starts again from a new random initialisation, at most
    /// `curriculum_restarts` times (see `pipeline::curriculum_run`; patience 0: never).
    pub curriculum_patience: u64,
    /// See `curriculum_patience`.
    pub curriculum_stall_probe: f64,
    /// See `curriculum_patience`.
    pub curriculum_restarts: usize,
    /// Copy exercises mixed into the warm-up's documents when a curriculum ran, so that the
    /// warm-up keeps the copying it taught.
    pub warmup_replay: usize,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            preset: Preset::Small,
            base: String::new(),
            warmup_epochs: 2,
            warmup_lr: 3e-3,
            warmup_batch_tokens: 1024,
            warmup_renames: 1,
            tokenizer_prompts: 64,
            tokenizer_renames: 0,
            tokenizer_exercises: 0,
            curriculum_exercises: 40_000,
            curriculum_invented_names: true,
            curriculum_lr: 1e-3,
            curriculum_batch_tokens: 2048,
            curriculum_stop_probe: 0.8,
            curriculum_patience: 800,
            curriculum_stall_probe: 2.5,
            curriculum_restarts: 0,
            warmup_replay: 2000,
        }
    }
}

/// Stage 1: rejection-sampled fine-tuning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stage1Config {
    /// Teacher samples per subtask prompt.
    pub samples_per_prompt: usize,
    /// Teacher samples per edit prompt (0: `samples_per_prompt`). Edits are the rarest accepted
    /// answers (a right line and a right change, checked in the sandbox), so they get more tries.
    pub edit_samples: usize,
    /// Softness of the built-in teacher.
    pub teacher_temperature: f64,
    /// SFT epochs.
    pub epochs: u64,
    /// SFT learning rate.
    pub lr: f32,
    /// Tokens per packed micro-batch.
    pub batch_tokens: usize,
    /// Longest example in tokens.
    pub max_len: usize,
    /// Package-renamed copies of each accepted example (see `pipeline::augment`).
    pub renames: usize,
    /// Also train on the accepted examples under their real package names (memorisable); off,
    /// only renamed copies are trained on, so copying the name from the prompt is the only way
    /// to name a file right.
    pub keep_originals: bool,
    /// How a teacher's edit is accepted: `execution` (default: its patch must resolve the
    /// training instance in the sandbox, so no edit that merely touches the right line becomes
    /// SFT data) or `overlap` (SoRFT's rule filter only).
    pub edit_acceptance: crate::rft::accept::EditAcceptance,
    /// FailForge after the rejection filter: diagnose the prompts whose samples all failed, retry
    /// them with a skill, add the successes with the skill removed (knobs in `[failforge]`).
    pub failforge: bool,
    /// How teacher samples become SFT data: `rejection` (built-in teacher, outcome filter),
    /// `outcome` (flawed multi-step teacher, outcome filter) or `p2t` (the same teacher curated
    /// against the gold patch's process graph; see `rft::p2t`).
    pub curation: crate::rft::p2t::Curation,
    /// The flawed teacher and the P2T forward phase.
    pub p2t: crate::rft::p2t::P2tConfig,
    /// Copy exercises mixed into the stage-1 data when a curriculum ran
    /// (`model.curriculum_exercises`), so that fine-tuning keeps the copying it taught.
    pub replay_exercises: usize,
    /// Edit drills mixed into the stage-1 data (`pipeline::edit_drill`): the edit prompt with
    /// an explicit instruction, answered by copying the named code line into a SEARCH/REPLACE
    /// block; built from the training repositories' code, each under fresh package names.
    pub edit_drills: usize,
}

impl Stage1Config {
    /// The teacher's samples for `items`: `samples_per_prompt` each, `edit_samples` per edit
    /// prompt ([`crate::rft::teacher::sample_per_subtask`]).
    pub fn teacher_samples(
        &self,
        teacher: &mut dyn crate::rft::teacher::Teacher,
        items: &[crate::rft::teacher::TeacherItem<'_>],
        seed: u64,
    ) -> anyhow::Result<Vec<Vec<String>>> {
        crate::rft::teacher::sample_per_subtask(
            teacher,
            items,
            self.samples_per_prompt,
            self.edit_samples,
            seed,
        )
    }
}

impl Default for Stage1Config {
    fn default() -> Self {
        Self {
            samples_per_prompt: 4,
            edit_samples: 0,
            teacher_temperature: 0.7,
            epochs: 4,
            lr: 2e-3,
            batch_tokens: 2048,
            max_len: 2048,
            renames: 2,
            keep_originals: false,
            edit_acceptance: crate::rft::accept::EditAcceptance::Execution,
            failforge: false,
            curation: crate::rft::p2t::Curation::default(),
            p2t: crate::rft::p2t::P2tConfig::default(),
            replay_exercises: 400,
            edit_drills: 400,
        }
    }
}

/// Every knob of `sorft repro`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReproConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Where to compute: `auto` (the GPU when usable, else the CPU), `cpu` or `cuda`.
    pub device: DeviceChoice,
    /// The GPU's compute dtype, `bf16` or `f32` (the CPU computes in f32).
    pub dtype: DTypeChoice,
    /// The task set.
    pub data: DataConfig,
    /// The model.
    pub model: ModelSection,
    /// Stage 1.
    pub stage1: Stage1Config,
    /// Stage 2.
    pub stage2: RlConfig,
    /// Evaluation.
    pub eval: EvalConfig,
    /// FailForge (used when `stage1.failforge` is on, and by `sorft failforge`).
    pub failforge: crate::rft::failforge::FailForgeConfig,
}

impl Default for ReproConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            device: DeviceChoice::Auto,
            dtype: DTypeChoice::Bf16,
            data: DataConfig::default(),
            model: ModelSection::default(),
            stage1: Stage1Config::default(),
            stage2: RlConfig {
                steps: 12,
                prompts_per_step: 8,
                group_size: 4,
                lr: 1e-4,
                temperature: 0.7,
                max_new_tokens: 128,
                max_prompt_tokens: 2048,
                prompt_renames: 2,
                // Stage 2 stops costing free decoding (notes/learn.md, session 40).
                positive_full: true,
                // PPO-ptx: stage 2 no longer loses free decoding (notes/learn.md, session 49).
                ptx_coef: 1.0,
                ..RlConfig::default()
            },
            eval: EvalConfig {
                edit_samples: 2,
                max_new_tokens: 128,
                reward_samples: 2,
                ..EvalConfig::default()
            },
            failforge: Default::default(),
        }
    }
}

impl ReproConfig {
    /// The 2-minute variant for CI: the tiny model and a handful of instances.
    pub fn quick() -> Self {
        let mut c = Self::default();
        c.data.instances = 12;
        c.data.train_per_repo = 4;
        c.data.heldout_fraction = 0.25;
        c.model.preset = Preset::Tiny;
        c.model.warmup_epochs = 1;
        c.model.curriculum_exercises = 64;
        c.stage1.samples_per_prompt = 2;
        c.stage1.epochs = 1;
        c.stage1.edit_drills = 8;
        c.stage1.max_len = 1536;
        c.stage2.steps = 2;
        c.stage2.prompts_per_step = 4;
        c.stage2.group_size = 2;
        c.stage2.max_new_tokens = 48;
        c.stage2.max_prompt_tokens = 1536;
        c.eval.edit_samples = 1;
        c.eval.reward_samples = 1;
        c.eval.max_new_tokens = 64;
        c.eval.max_prompt_tokens = 1536;
        c
    }

    /// Defaults (or the quick variant), then a TOML file, then `key=value` overrides.
    pub fn load(quick: bool, file: Option<&Path>, sets: &[String]) -> anyhow::Result<Self> {
        let base = if quick {
            Self::quick()
        } else {
            Self::default()
        };
        let mut v = toml::Value::try_from(&base)?;
        if let Some(p) = file {
            let text =
                std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            let user: toml::Value = toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), one_line(&e.to_string())))?;
            merge(&mut v, user);
        }
        for s in sets {
            let (key, val) = s
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--set {s:?}: expected key=value"))?;
            let parsed: toml::Value = toml::from_str(&format!("x = {val}"))
                .ok()
                .and_then(|t: toml::Table| t.get("x").cloned())
                .unwrap_or_else(|| toml::Value::String(val.to_string()));
            set_path(&mut v, key.trim(), parsed)
                .map_err(|e| anyhow::anyhow!("--set {s:?}: {e}"))?;
        }
        let cfg: ReproConfig = v.try_into().map_err(|e: toml::de::Error| {
            anyhow::anyhow!("configuration: {}", one_line(&e.to_string()))
        })?;
        Ok(cfg)
    }

    /// The configuration as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn set_path(v: &mut toml::Value, key: &str, val: toml::Value) -> Result<(), String> {
    let mut cur = v;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        let table = cur
            .as_table_mut()
            .ok_or_else(|| format!("{} is not a section", parts[..i].join(".")))?;
        if i + 1 == parts.len() {
            if !table.contains_key(*p) {
                return Err(format!("unknown key {key}"));
            }
            table.insert(p.to_string(), val);
            return Ok(());
        }
        cur = table
            .get_mut(*p)
            .ok_or_else(|| format!("unknown section {}", parts[..=i].join(".")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_flags_override_defaults_and_typos_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "seed = 9\n[stage2]\nalgorithm = \"ppo\"\nsteps = 3\n").unwrap();
        let c = ReproConfig::load(
            false,
            Some(&p),
            &["stage1.epochs=7".into(), "eval.temperature=0.5".into()],
        )
        .unwrap();
        assert_eq!(c.seed, 9);
        assert_eq!(c.device, DeviceChoice::Auto);
        let d =
            ReproConfig::load(false, None, &["device=\"cpu\"".into(), "dtype=f32".into()]).unwrap();
        assert_eq!((d.device, d.dtype), (DeviceChoice::Cpu, DTypeChoice::F32));
        assert!(ReproConfig::load(false, None, &["device=tpu".into()]).is_err());
        assert_eq!(c.stage2.steps, 3);
        assert_eq!(c.stage2.algorithm, crate::rft::rl::Algorithm::Ppo);
        assert_eq!(c.stage1.epochs, 7);
        assert_eq!(c.eval.temperature, 0.5);
        assert_eq!(
            c.stage2.group_size,
            ReproConfig::default().stage2.group_size
        );
        let back = ReproConfig::load(false, None, &[]).unwrap();
        assert_eq!(back, ReproConfig::default());
        assert!(ReproConfig::load(false, None, &["stage2.stepz=1".into()]).is_err());
        std::fs::write(&p, "[stage2]\nstepz = 3\n").unwrap();
        let e = ReproConfig::load(false, Some(&p), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("stepz"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn stage2_lora_and_rescore_read_from_toml_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[stage2]\nlora = 8\nlora_alpha = 32.0\nrescore = \"on\"\ntis_cap = 3.0\n",
        )
        .unwrap();
        let c = ReproConfig::load(false, Some(&p), &[]).unwrap();
        assert_eq!((c.stage2.lora, c.stage2.lora_alpha), (8, 32.0));
        assert_eq!(c.stage2.rescore, crate::rft::mismatch::Rescore::On);
        assert_eq!(c.stage2.tis_cap, 3.0);
        let d = ReproConfig::default();
        assert_eq!((d.stage2.lora, d.stage2.tis_cap), (0, 2.0));
        assert_eq!(d.stage2.rescore, crate::rft::mismatch::Rescore::Auto);
        assert!(d.stage2.positive_full && !RlConfig::default().positive_full);
        assert_eq!(
            (d.stage2.ptx_coef, RlConfig::default().ptx_coef),
            (1.0, 0.0)
        );
        let f = ReproConfig::load(false, None, &["stage2.lora=4".into()]).unwrap();
        assert_eq!(f.stage2.lora, 4);
        assert!(ReproConfig::load(false, None, &["stage2.rescore=\"maybe\"".into()]).is_err());
    }

    #[test]
    fn the_effective_configuration_round_trips_through_toml() {
        let c = ReproConfig::quick();
        let text = c.to_toml();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(ReproConfig::load(false, Some(&p), &[]).unwrap(), c);
    }
}
