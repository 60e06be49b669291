//! `sorft sandbox`: run predictions or gold patches in the sandbox, or list isolation layers.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use sorft::sandbox::integrity::{IntegrityMode, IntegrityRule};
use sorft::sandbox::isolation::{HostSupport, Policy};
use sorft::sandbox::pool::{run_all, Job, Summary};
use sorft::sandbox::predictions::read_predictions;
use sorft::sandbox::python;
use sorft::sandbox::runner::{MirrorRepos, RunResult, SandboxConfig};
use sorft::sandbox::testcmd::CommandTable;
use sorft::sandbox::workspace;
use sorft::sandbox::Limits;
use sorft::swe::instance::read_jsonl;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `sorft sandbox`.
#[derive(Args, Debug)]
pub struct SandboxArgs {
    #[command(subcommand)]
    cmd: SandboxCmd,
}

#[derive(Subcommand, Debug)]
enum SandboxCmd {
    /// Evaluate predictions (SWE-bench JSONL) against instances.
    Run(RunArgs),
    /// Check that every instance's gold patch resolves it.
    Gold(GoldArgs),
    /// List the isolation layers available on this host and the ones a run activates.
    Check,
}

#[derive(Args, Debug)]
struct Common {
    /// Instances (SWE-bench JSONL).
    #[arg(long)]
    instances: PathBuf,
    /// Folder of git mirrors, one per repository as `owner__name`.
    #[arg(long)]
    repos: PathBuf,
    /// Python interpreter or virtualenv running the tests (default: python3 on PATH).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Test command table (JSON, `{"entries": [...]}`) on top of the built-in one.
    #[arg(long)]
    commands: Option<PathBuf>,
    /// Runs at once (default: number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Wall-clock limit per run, in seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Memory limit in MiB: of the whole run with a memory cgroup, else RLIMIT_AS per process.
    #[arg(long, default_value_t = 4096)]
    memory_mb: u64,
    /// Folder for the scratch workspaces (default: /var/tmp/sorft-sandbox).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Refuse to run unless every isolation layer is available.
    #[arg(long)]
    require_all_layers: bool,
    /// Model changes to test infrastructure (conftest.py, test config, test files, start-up
    /// hooks, runner shadows, config-named plugins): refuse the run, strip them back to the base
    /// commit, or only report (off).
    #[arg(long, default_value = "strip")]
    integrity: IntegrityMode,
    /// Path prefix exempt from the integrity rule (repeatable); paths the gold patch touches are
    /// always exempt.
    #[arg(long)]
    integrity_allow: Vec<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Predictions (SWE-bench JSONL: instance_id, model_name_or_path, model_patch).
    #[arg(long)]
    predictions: PathBuf,
    /// Per-instance results (JSONL); the summary goes to FILE.summary.json.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct GoldArgs {
    #[command(flatten)]
    common: Common,
    /// Per-instance results (JSONL), optional.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `sorft sandbox ...`.
pub fn run(args: SandboxArgs) -> Result<()> {
    match args.cmd {
        SandboxCmd::Check => check(),
        SandboxCmd::Run(a) => run_predictions(a),
        SandboxCmd::Gold(a) => gold(a),
    }
}

fn check() -> Result<()> {
    let h = HostSupport::get();
    let line = |name: &str, r: Result<String, &String>| match r {
        Ok(detail) => println!("{name:<12} available  {detail}"),
        Err(e) => println!("{name:<12} MISSING    {e}"),
    };
    println!("always       active     own session/process group, wall-clock kill of the tree, rlimits, env allow-list, stdin closed, output cap");
    limits_layers();
    line(
        "uid-drop",
        h.uid_drop
            .as_ref()
            .map(|_| "dedicated uid per run (61000+slot)".to_string()),
    );
    line(
        "namespaces",
        h.namespaces.as_ref().map(|_| {
            if h.root {
                "mount, pid, net, ipc, uts (private /tmp, no network)".to_string()
            } else {
                "user, mount, pid, net, ipc, uts (private /tmp, no network)".to_string()
            }
        }),
    );
    line(
        "landlock",
        h.landlock.as_ref().map(|v| {
            format!(
                "ABI {v}: fs writes only in the workspace{}{}",
                if *v >= 4 { ", no TCP" } else { "" },
                if *v >= 6 { ", no signals outside" } else { "" }
            )
        }),
    );
    line(
        "seccomp",
        h.seccomp
            .as_ref()
            .map(|_| "socket() only for AF_UNIX".to_string()),
    );
    let missing = [
        h.uid_drop.is_err(),
        h.namespaces.is_err(),
        h.landlock.is_err(),
        h.seccomp.is_err(),
    ]
    .iter()
    .filter(|m| **m)
    .count();
    println!(
        "active by default: {} of 4 optional layers{}",
        4 - missing,
        if missing > 0 {
            " (runs continue without the missing ones unless --require-all-layers)"
        } else {
            ""
        }
    );
    match python::resolve(None, h.root) {
        Ok(i) => println!("python       {}", i.program.display()),
        Err(e) => println!("python       MISSING    {e}"),
    }
    Ok(())
}

/// Prints what a run with the default limits gets from the cgroup and rlimit layers on this
/// host, by creating (and removing) one run's cgroups.
fn limits_layers() {
    use sorft::sandbox::isolation::cgroup::{find, RunCgroup};
    let l = Limits::default();
    let (cg, got) = RunCgroup::create(l.nproc, l.address_space);
    drop(cg);
    let where_ = |c: &str| {
        find(c)
            .map(|h| format!(" (cgroup v{} under {})", h.version, h.dir.display()))
            .unwrap_or_default()
    };
    let reason = |c: &str| {
        got.unavailable
            .iter()
            .find(|u| u.starts_with(c))
            .cloned()
            .unwrap_or_else(|| "unavailable".into())
    };
    match got.pids_max {
        Some(n) => println!(
            "pids-cgroup  available  pids.max {n} per run (processes and threads){}",
            where_("pids")
        ),
        None => println!(
            "pids-cgroup  MISSING    {}; RLIMIT_NPROC {} of the run's dedicated uid and the PID namespace bound it",
            reason("pids"),
            l.nproc
        ),
    }
    match got.memory_max {
        Some(m) => println!(
            "memory-cgroup available memory used by the run <= {} MiB, no RLIMIT_AS{}",
            m >> 20,
            where_("memory")
        ),
        None => println!(
            "memory-cgroup MISSING   {}; RLIMIT_AS {} MiB per process instead",
            reason("memory"),
            l.address_space >> 20
        ),
    }
    println!(
        "rlimits      active     cpu {} s, nproc {}, fsize {} MiB per file, nofile {}, core 0{}",
        l.cpu_secs,
        l.nproc,
        l.file_size >> 20,
        l.open_files,
        if got.memory_max.is_some() {
            String::new()
        } else {
            format!(", as {} MiB", l.address_space >> 20)
        }
    );
    let q = sorft::sandbox::quota::probe(&sorft::sandbox::workspace::default_base(), &l.quota());
    match (q.tmpfs, q.missing) {
        (Some(t), _) => println!(
            "workspace    available  its own tmpfs per run: {} MiB, {} files (repository copy, writes and /tmp); RLIMIT_FSIZE {} MiB per file",
            t.bytes >> 20,
            t.files,
            l.file_size >> 20
        ),
        (None, why) => println!(
            "workspace    MISSING    {}; only RLIMIT_FSIZE {} MiB bounds each file, total bytes and files are not bounded",
            why.unwrap_or_default(),
            l.file_size >> 20
        ),
    }
}

fn config(c: &Common) -> Result<SandboxConfig> {
    if !(c.timeout.is_finite() && c.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let host = HostSupport::get();
    let python = python::resolve(c.python.as_deref(), host.root && host.uid_drop.is_ok())?;
    let commands = match &c.commands {
        Some(p) => CommandTable::load(p)?,
        None => CommandTable::default(),
    };
    let limits = Limits {
        wall: Duration::from_secs_f64(c.timeout),
        cpu_secs: c.timeout.ceil() as u64 + 1,
        address_space: c.memory_mb << 20,
        ..Limits::default()
    };
    let policy = Policy {
        require_all: c.require_all_layers,
        ..Policy::default()
    };
    Ok(SandboxConfig {
        limits,
        policy,
        python,
        commands,
        work_dir: c.work_dir.clone().unwrap_or_else(workspace::default_base),
        integrity: IntegrityRule {
            mode: c.integrity,
            allow: c.integrity_allow.clone(),
            ..IntegrityRule::default()
        },
    })
}

fn jobs(c: &Common) -> usize {
    c.jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

fn run_jobs(
    c: &Common,
    jobs_list: Vec<Job>,
    out: Option<&Path>,
) -> Result<(Vec<RunResult>, Summary)> {
    let cfg = config(c)?;
    let repos = MirrorRepos::new(&c.repos);
    let mut writer = match out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut write_err = None;
    let total = jobs_list.len();
    let mut done = 0usize;
    let results = run_all(&cfg, &repos, &jobs_list, jobs(c), |r| {
        done += 1;
        eprintln!(
            "[{done}/{total}] {} {:?}{}",
            r.instance_id,
            r.status,
            r.error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        );
        if let Some(w) = writer.as_mut() {
            let line = serde_json::to_string(r).unwrap_or_default();
            if let Err(e) = writeln!(w, "{line}") {
                write_err.get_or_insert(e);
            }
        }
    });
    if sorft::sandbox::cleanup::interrupted() {
        bail!("interrupted: runs stopped and workspaces removed");
    }
    if let Some(e) = write_err {
        return Err(e).context("writing results");
    }
    if let Some(mut w) = writer {
        w.flush().context("writing results")?;
    }
    let summary = Summary::of(&results);
    Ok((results, summary))
}

fn print_summary(s: &Summary) {
    println!(
        "{} instances: {:.1}% applied ({}), {:.1}% resolved ({}), {} stopped by limits, {} errors; integrity rule fired {} times ({} stripped, {} refused)",
        s.total,
        s.pct_applied,
        s.applied,
        s.pct_resolved,
        s.resolved,
        s.limit_hit,
        s.errors,
        s.integrity_stripped + s.integrity_refused,
        s.integrity_stripped,
        s.integrity_refused
    );
}

fn run_predictions(a: RunArgs) -> Result<()> {
    let instances = read_jsonl(&a.common.instances)?;
    let preds = read_predictions(&a.predictions)?;
    let by_id: std::collections::HashMap<&str, _> = instances
        .iter()
        .map(|i| (i.instance_id.as_str(), i))
        .collect();
    let mut jobs_list = vec![];
    for p in preds {
        let Some(inst) = by_id.get(p.instance_id.as_str()) else {
            bail!(
                "{}: prediction for unknown instance_id {:?}",
                a.predictions.display(),
                p.instance_id
            );
        };
        jobs_list.push(Job {
            instance: (*inst).clone(),
            model: p.model_name_or_path,
            patch: p.model_patch.unwrap_or_default(),
        });
    }
    let (_, summary) = run_jobs(&a.common, jobs_list, Some(&a.out))?;
    let spath = PathBuf::from(format!("{}.summary.json", a.out.display()));
    std::fs::write(&spath, serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", spath.display()))?;
    print_summary(&summary);
    Ok(())
}

fn gold(a: GoldArgs) -> Result<()> {
    let instances = read_jsonl(&a.common.instances)?;
    let jobs_list = instances
        .into_iter()
        .map(|i| Job {
            model: "gold".into(),
            patch: i.patch.clone(),
            instance: i,
        })
        .collect();
    let (_, summary) = run_jobs(&a.common, jobs_list, a.out.as_deref())?;
    print_summary(&summary);
    if summary.resolved != summary.total {
        bail!(
            "{} of {} gold patches do not resolve their instance (first: {})",
            summary.total - summary.resolved,
            summary.total,
            summary
                .unresolved_ids
                .first()
                .map(String::as_str)
                .unwrap_or("?")
        );
    }
    Ok(())
}
