//! Subcommands of the `sorft` binary, one file each.

pub mod bench;
pub mod data;
pub mod device;
pub mod doctor;
pub mod eval;
pub mod export;
pub mod failforge;
pub mod faultbench;
pub mod generate;
pub mod interrupt;
pub mod kernel_bench;
pub mod model;
pub mod monitor;
pub mod plan;
pub mod render;
pub mod repro;
pub mod rl;
pub mod sandbox;
pub mod score;
pub mod selftest;
#[cfg(feature = "serve")]
pub mod serve_reward;
pub mod sft;

use clap::{Parser, Subcommand};

/// sorft: subtask-oriented reinforcement fine-tuning of code LLMs, on one machine.
#[derive(Parser, Debug)]
#[command(name = "sorft", version, about, long_about = None)]
pub struct Cli {
    /// Worker threads for the CPU backend (default: all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// The whole SoRFT reproduction on the embedded default (data, SFT, RL, evaluation, report).
    Repro(repro::ReproArgs),
    /// Evaluate a model with the Agentless pipeline end to end.
    Eval(eval::EvalArgs),
    /// Generate text from a model.
    Generate(generate::GenerateArgs),
    /// Per-token log-probabilities of a text.
    Score(score::ScoreArgs),
    /// Create or describe models.
    Model(model::ModelArgs),
    /// Memory budget of one RL step on a GPU (per component) and whether it fits.
    Plan(plan::PlanArgs),
    /// Measure speed (prefill and decode tokens/s).
    Bench(bench::BenchArgs),
    /// Datasets: generate synthetic instances, build subtask records, summarise files.
    Data(data::DataArgs),
    /// Supervised fine-tuning on chat JSONL (full or LoRA).
    Sft(sft::SftArgs),
    /// Stage 2 alone: RL with rule-based rewards from a stage-1 model, with exact resume.
    Rl(rl::RlArgs),
    /// Apply patches and run repository tests isolated, graded like SWE-bench.
    Sandbox(sandbox::SandboxArgs),
    /// CUDA on this machine: driver, GPUs, libraries, kernels, the backend a run would use.
    Doctor(doctor::DoctorArgs),
    /// Check a backend's kernels against references (`--device cuda|cpu`).
    Selftest(selftest::SelftestArgs),
    /// RFT-FM's detector and diagnosis on an external RL run's step or trajectory JSONL.
    Monitor(monitor::MonitorArgs),
    /// The fault-injection benchmark of the RL monitor (RFT-FaultBench on sorft).
    Faultbench(faultbench::FaultbenchArgs),
    /// FailForge over a finished rejection-sampling run: diagnose failed prompts, retry with
    /// skills, add the successes without the skill; optionally compare corpora on held-out data.
    Failforge(failforge::FailforgeArgs),
    /// Subtask prompts with ground truth as a veRL (parquet) or OpenRLHF (JSONL) dataset.
    Export(export::ExportArgs),
    /// Serve sorft's rewards over HTTP (OpenRLHF remote reward model protocol).
    #[cfg(feature = "serve")]
    ServeReward(serve_reward::ServeRewardArgs),
}

/// Sets up `tracing` output on stderr at the level the `-v` flags ask for.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SORFT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// An error and its causes joined into one line; a cause whose text the line already ends with
/// (an error that prints its source itself) is not repeated.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for c in e.chain() {
        let c = c.to_string();
        if msg.ends_with(&c) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&c);
    }
    msg
}

/// Writes `text` to stdout at once. A closed pipe comes back as an error (never a panic, as
/// `println!` would); `main` ends such a run quietly.
pub fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut w = std::io::stdout().lock();
    w.write_all(text.as_bytes())?;
    w.flush()?;
    Ok(())
}

/// Whether an error comes from writing to a closed pipe (the reader went away).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Runs one subcommand.
pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Repro(a) => repro::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Score(a) => score::run(a),
        Command::Model(a) => model::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Data(a) => data::run(a),
        Command::Sft(a) => sft::run(a),
        Command::Rl(a) => rl::run(a),
        Command::Sandbox(a) => sandbox::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Monitor(a) => monitor::run(a),
        Command::Faultbench(a) => faultbench::run(a),
        Command::Failforge(a) => failforge::run(a),
        Command::Export(a) => export::run(a),
        #[cfg(feature = "serve")]
        Command::ServeReward(a) => serve_reward::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_shows_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found");
        let e = sorft::model::error::ModelError::io("m", io);
        let e = anyhow::Error::new(e).context("loading");
        assert_eq!(one_line(&e), "loading: m: model directory not found");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }

    #[test]
    fn broken_pipes_are_recognised_through_context() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "closed");
        let e = anyhow::Error::new(io).context("writing");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
