//! `sorft failforge`: FailForge over a finished rejection-sampling run (a `sorft repro` output).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::model::load_dir;
use sorft::pipeline::failforge::{standalone, Standalone};
use sorft::rft::failforge::diagnose::{Diagnoser, RuleDiagnoser, TeacherDiagnoser};
use sorft::rft::failforge::RetryTeacher;
use sorft::rft::openai::{ChatClient, ClientConfig};
use sorft::rft::teacher::{EndpointTeacher, ModelTeacher, Teacher};

use super::device::{run_on, DeviceArgs, Job};

/// Which diagnoser writes the skills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiagnoserKind {
    /// Built-in rules over the feedback.
    Rules,
    /// A local model directory (`--diagnoser-model`).
    Model,
    /// An OpenAI-compatible endpoint (`--endpoint-url`, `--endpoint-model`).
    Endpoint,
}

/// Who answers the guided retries and the plain second attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RetryTeacherKind {
    /// The simulated skill-following teacher (reads the skill section of its prompt).
    Follow,
    /// The built-in stage-1 teacher (ignores the skill).
    Builtin,
    /// An OpenAI-compatible endpoint (`--retry-endpoint-url`, `--retry-endpoint-model`).
    Endpoint,
}

/// Arguments of `sorft failforge`.
#[derive(Args, Debug)]
pub struct FailforgeArgs {
    /// The finished run (`sorft repro --out DIR`): its config.toml, data/ and stage1_sft.jsonl.
    #[arg(long)]
    pub run: PathBuf,
    /// Output folder (default: RUN/failforge).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Who diagnoses the failures.
    #[arg(long, value_enum, default_value_t = DiagnoserKind::Rules)]
    pub diagnoser: DiagnoserKind,
    /// Model directory of `--diagnoser model`.
    #[arg(long, required_if_eq("diagnoser", "model"))]
    pub diagnoser_model: Option<PathBuf>,
    /// Base URL of `--diagnoser endpoint`, e.g. http://host:8000/v1.
    #[arg(long, required_if_eq("diagnoser", "endpoint"))]
    pub endpoint_url: Option<String>,
    /// Model name sent to the endpoint.
    #[arg(long, default_value = "default")]
    pub endpoint_model: String,
    /// Who answers the retries (default: `[failforge] retry_teacher` of the run, `follow`).
    #[arg(long, value_enum)]
    pub retry_teacher: Option<RetryTeacherKind>,
    /// Base URL of `--retry-teacher endpoint`, e.g. http://host:8000/v1.
    #[arg(long, required_if_eq("retry_teacher", "endpoint"))]
    pub retry_endpoint_url: Option<String>,
    /// Model name sent to the retry endpoint.
    #[arg(long, default_value = "default")]
    pub retry_endpoint_model: String,
    /// Also fine-tune the run's warm-up checkpoint on each corpus (plain, + FailForge, + skill
    /// kept, + plain second attempt) and compare them on the held-out instances.
    #[arg(long)]
    pub heldout: bool,
    /// Bootstrap resamples of the held-out intervals.
    #[arg(long, default_value_t = 2000)]
    pub resamples: usize,
    /// Start from this skill library (JSONL) instead of an empty one.
    #[arg(long)]
    pub library: Option<PathBuf>,
    /// Device.
    #[command(flatten)]
    pub device: DeviceArgs,
}

fn endpoint(url: String, model: &str, max_tokens: usize) -> EndpointTeacher {
    EndpointTeacher {
        client: ChatClient::new(ClientConfig {
            base_url: url,
            model: model.to_string(),
            api_key: std::env::var("OPENAI_API_KEY").ok(),
            timeout_secs: 120.0,
            retries: 2,
        }),
        temperature: 0.0,
        max_tokens,
    }
}

/// Sampling temperature of an endpoint retry teacher.
const ENDPOINT_TEMPERATURE: f32 = 0.7;

/// The endpoint retry teacher, when the arguments ask for one.
fn retry_endpoint(a: &FailforgeArgs) -> Result<Option<EndpointTeacher>> {
    if a.retry_teacher != Some(RetryTeacherKind::Endpoint) {
        return Ok(None);
    }
    let url = a
        .retry_endpoint_url
        .clone()
        .context("--retry-teacher endpoint needs --retry-endpoint-url URL")?;
    let mut t = endpoint(url, &a.retry_endpoint_model, 512);
    t.temperature = ENDPOINT_TEMPERATURE;
    Ok(Some(t))
}

fn opts<'d>(
    a: &FailforgeArgs,
    out: &std::path::Path,
    d: &'d mut dyn Diagnoser,
    t: Option<&'d mut dyn Teacher>,
) -> Standalone<'d> {
    Standalone {
        diagnoser: d,
        teacher: t,
        retry_teacher: match a.retry_teacher {
            Some(RetryTeacherKind::Follow) => Some(RetryTeacher::Follow),
            Some(RetryTeacherKind::Builtin) => Some(RetryTeacher::Builtin),
            _ => None,
        },
        out: out.to_path_buf(),
        heldout: a.heldout,
        resamples: a.resamples,
        library: a.library.clone(),
    }
}

struct Forge {
    args: FailforgeArgs,
}

impl Job for Forge {
    type Output = String;
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<String> {
        let a = &self.args;
        eprintln!("failforge: on {}", dev.summary());
        let out = a.out.clone().unwrap_or_else(|| a.run.join("failforge"));
        let stop = &super::interrupt::STOP;
        let mut progress = |m: String| eprintln!("failforge: {m}");
        let mut ep = retry_endpoint(a)?;
        let t = ep.as_mut().map(|e| e as &mut dyn Teacher);
        match a.diagnoser {
            DiagnoserKind::Rules => standalone(
                be,
                &a.run,
                opts(a, &out, &mut RuleDiagnoser, t),
                stop,
                &mut progress,
            ),
            DiagnoserKind::Model => {
                let dir = a
                    .diagnoser_model
                    .as_ref()
                    .context("--diagnoser model needs --diagnoser-model DIR")?;
                let (model, tok) = load_dir(be, dir).with_context(|| dir.display().to_string())?;
                let tok = tok.with_context(|| format!("{}: no tokenizer.json", dir.display()))?;
                let mut mt = ModelTeacher {
                    model: &model,
                    tokenizer: &tok,
                    temperature: 0.0,
                    max_new_tokens: 96,
                    batch: 8,
                };
                let mut d = TeacherDiagnoser { teacher: &mut mt };
                standalone(be, &a.run, opts(a, &out, &mut d, t), stop, &mut progress)
            }
            DiagnoserKind::Endpoint => {
                let url = a
                    .endpoint_url
                    .clone()
                    .context("--diagnoser endpoint needs --endpoint-url URL")?;
                let mut et = endpoint(url, &a.endpoint_model, 160);
                let mut d = TeacherDiagnoser { teacher: &mut et };
                standalone(be, &a.run, opts(a, &out, &mut d, t), stop, &mut progress)
            }
        }
    }
}

/// Runs `sorft failforge`.
pub fn run(a: FailforgeArgs) -> Result<()> {
    super::interrupt::install();
    let device = a.device;
    let md = run_on(device, Forge { args: a })?;
    super::print_out(&md)?;
    Ok(())
}
