//! `sorft serve-reward`: sorft's rewards over HTTP, in OpenRLHF's remote reward-model protocol.

use anyhow::{bail, Context, Result};
use clap::Args;
use sorft::pipeline::reward_service::{Executor, Scorer};
use sorft::swe::subtask::EditReward;
use std::path::PathBuf;

/// Arguments of `sorft serve-reward`.
#[derive(Args, Debug)]
pub struct ServeRewardArgs {
    /// TCP port (0: any free port; the bound address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to listen on (0.0.0.0 to serve other machines).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Instance JSONL: with --repos, edit answers also run in the sandbox (execution reward).
    #[arg(long, requires = "repos")]
    pub instances: Option<PathBuf>,
    /// Folder of git mirrors (`owner__name`) of the instances.
    #[arg(long, requires = "instances")]
    pub repos: Option<PathBuf>,
    /// Worker threads scoring requests (default: the machine's cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Requests that may wait for a worker; more get 503 at once.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Largest request body in MiB (413 above).
    #[arg(long, default_value_t = 64)]
    pub max_body_mb: usize,
    /// Seconds allowed to receive a request (408 after).
    #[arg(long, default_value_t = 10.0)]
    pub read_timeout: f64,
    /// Seconds allowed from a request's arrival to its answer (504 after).
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout: f64,
    /// Open connections at most (503 above).
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds one sandboxed test run may take (execution reward).
    #[arg(long, default_value_t = 60.0)]
    pub test_timeout: f64,
    /// Edit rule reward: SoRFT's `line_fbeta` or SWE-RL's `patch_similarity`.
    #[arg(long, default_value = "line_fbeta", value_parser = ["line_fbeta", "patch_similarity"])]
    pub edit_reward: String,
}

fn positive(name: &str, secs: f64) -> Result<std::time::Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        bail!("--{name} must be a positive number of seconds, not {secs}");
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Runs `sorft serve-reward` until SIGTERM or SIGINT.
pub fn run(a: ServeRewardArgs) -> Result<()> {
    use sorft::pipeline::reward_service::http::{serve, ServeConfig};
    let edit_reward = match a.edit_reward.as_str() {
        "patch_similarity" => EditReward::PatchSimilarity,
        _ => EditReward::LineFbeta,
    };
    let executor = match (&a.instances, &a.repos) {
        (Some(i), Some(r)) => {
            if !r.is_dir() {
                bail!("--repos {}: not a folder", r.display());
            }
            let list = sorft::swe::instance::read_jsonl(i)?;
            let sb = sorft::rft::eval::sandbox_config(a.test_timeout)
                .context("setting up the sandbox for execution rewards")?;
            Some(Executor::new(list, r, sb))
        }
        _ => None,
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let request_timeout = positive("request-timeout", a.request_timeout)?;
    let cfg = ServeConfig {
        addr: std::net::SocketAddr::new(a.host, a.port),
        workers: a.workers.unwrap_or(cores).max(1),
        queue: a.queue.max(1),
        max_body: a.max_body_mb.max(1) << 20,
        read_timeout: positive("read-timeout", a.read_timeout)?,
        request_timeout,
        max_connections: a.max_connections.max(1),
        shutdown_grace: request_timeout + std::time::Duration::from_secs(5),
        io_threads: 2,
    };
    let mode = match &executor {
        Some(e) => format!(
            "rule rewards + sandbox execution for edits ({} instances)",
            e.len()
        ),
        None => "rule rewards".to_string(),
    };
    let (workers, queue) = (cfg.workers, cfg.queue);
    let scorer = Scorer {
        edit_reward,
        executor,
    };
    let m = serve(cfg, scorer, |addr| {
        // One line on stdout, flushed: scripts and tests read the bound port from it.
        let _ = super::print_out(&format!(
            "sorft serve-reward listening on http://{addr} ({mode}; {workers} workers, queue {queue})\n"
        ));
    })?;
    use std::sync::atomic::Ordering::Relaxed;
    super::print_out(&format!(
        "stopped: {} requests, {} answered, {} rewards; 400={} 408={} 413={} 503={} 504={}\n",
        m.requests.load(Relaxed),
        m.ok.load(Relaxed),
        m.rewards.load(Relaxed),
        m.bad_request.load(Relaxed),
        m.read_timeout.load(Relaxed),
        m.too_large.load(Relaxed),
        m.unavailable.load(Relaxed),
        m.timed_out.load(Relaxed),
    ))
}
