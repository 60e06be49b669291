//! Sandbox overhead and throughput.
//!
//! - per run: the same unittest command run bare (plain `Command`, no isolation) vs inside the
//!   jail (all layers the host has) vs a whole instance run (workspace, apply, jail, grade,
//!   cleanup); the overhead is jailed - bare.
//! - throughput: 100 generated instances (gold patches) at parallelism = cores, against the
//!   same 100 test commands run bare at the same parallelism.
//!
//! `cargo bench --bench sandbox`. Numbers are reported as ratios to the bare reference
//! measured in the same run.

use criterion::Criterion;
use sorft::sandbox::isolation::{HostSupport, Policy};
use sorft::sandbox::pool::{run_all, Job, Summary};
use sorft::sandbox::process::{run_jailed, JailCommand};
use sorft::sandbox::python;
use sorft::sandbox::runner::{run_instance, MirrorRepos, RepoProvider, SandboxConfig};
use sorft::sandbox::testcmd::CommandTable;
use sorft::sandbox::workspace::{default_base, Workspace};
use sorft::sandbox::Limits;
use sorft::swe::instance::Instance;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const N: usize = 100;

/// 100 instances from the task generator (`sorft::swe::synth`), with their git mirrors.
fn generate(out: &Path) -> Vec<Instance> {
    let cfg = sorft::swe::synth::SynthConfig {
        n: N,
        seed: 1,
        ..Default::default()
    };
    sorft::swe::synth::generate(&cfg, out, &|_| {})
        .expect("task generator (needs python3 and git)")
        .instances
}

fn bare(python: &Path, dir: &Path, args: &[String]) {
    let out = Command::new(python)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    let host = HostSupport::get();
    let interp = python::resolve(None, host.root).expect("python3");
    let base = default_base();
    std::fs::create_dir_all(&base).unwrap();
    let scratch = tempfile::Builder::new()
        .prefix("sorft-bench-")
        .tempdir_in(base.parent().unwrap())
        .unwrap();
    let repos = scratch.path().join("repos");
    let work = scratch.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let t = Instant::now();
    let instances = generate(scratch.path());
    println!(
        "generated {} instances in {:.1} s",
        instances.len(),
        t.elapsed().as_secs_f64()
    );
    let cfg = SandboxConfig {
        limits: Limits {
            wall: Duration::from_secs(60),
            ..Limits::default()
        },
        policy: Policy::default(),
        python: interp.clone(),
        commands: CommandTable::default(),
        work_dir: work.clone(),
        integrity: Default::default(),
    };
    let mirrors = MirrorRepos::new(&repos);
    // A fixed repository state for the per-run comparison: instance 0 with gold + test patch.
    let inst = &instances[0];
    let plain = scratch.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let snap = mirrors.snapshot(&inst.repo, &inst.base_commit).unwrap();
    snap.write_to(&plain).unwrap();
    sorft::sandbox::apply::apply_diff(&plain, &inst.patch, "patch").unwrap();
    sorft::sandbox::apply::apply_diff(&plain, &inst.test_patch, "test patch").unwrap();
    let args = CommandTable::default()
        .lookup(&inst.repo, None)
        .args_for(&sorft::sandbox::apply::test_files(&inst.test_patch));
    let ws = Workspace::create(&work, &plain).unwrap();
    let jcmd = JailCommand {
        program: interp.program.clone(),
        args: args.iter().map(Into::into).collect(),
        env: vec![],
        stdin: None,
    };
    let paths = ws.jail_paths(interp.read_roots.clone());
    println!("layers: {:?}", host);

    let mut c = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let mut g = c.benchmark_group("sandbox_per_run");
    g.bench_function("bare_command", |b| {
        b.iter(|| bare(&interp.program, &plain, &args))
    });
    g.bench_function("jailed_command", |b| {
        b.iter(|| {
            let o = run_jailed(&jcmd, &paths, &cfg.policy, &cfg.limits, ws.ids()).unwrap();
            assert!(o.success(), "{}", o.output.tail);
        })
    });
    g.bench_function("full_instance_run", |b| {
        b.iter(|| {
            let r = run_instance(&cfg, &mirrors, inst, "gold", &inst.patch);
            assert!(r.resolved, "{:?}", r.error);
        })
    });
    g.finish();
    drop(ws);

    // Paired, interleaved measurements for the ratio report: the machine's load drifts, so
    // each jailed (or full) run is compared with a bare run made right next to it.
    let ws = Workspace::create(&work, &plain).unwrap();
    let paths = ws.jail_paths(interp.read_roots.clone());
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut bare_v, mut jail_v, mut full_v, mut d_jail, mut d_full) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut setup_v, mut apply_v, mut tests_v) = (vec![], vec![], vec![]);
    for _ in 0..40 {
        let b = time(&mut || bare(&interp.program, &plain, &args));
        let j = time(&mut || {
            run_jailed(&jcmd, &paths, &cfg.policy, &cfg.limits, ws.ids()).unwrap();
        });
        let mut phases = sorft::sandbox::runner::Timings::default();
        let f = time(&mut || {
            phases = run_instance(&cfg, &mirrors, inst, "gold", &inst.patch).timings;
        });
        setup_v.push(phases.setup);
        apply_v.push(phases.apply);
        tests_v.push(phases.tests);
        bare_v.push(b);
        jail_v.push(j);
        full_v.push(f);
        d_jail.push(j - b);
        d_full.push(f - b);
    }
    drop(ws);
    let (b, j, f) = (
        median(&mut bare_v),
        median(&mut jail_v),
        median(&mut full_v),
    );
    println!(
        "full instance phases (medians): workspace {:.1} ms, apply {:.1} ms, jailed tests {:.1} ms",
        median(&mut setup_v) * 1e3,
        median(&mut apply_v) * 1e3,
        median(&mut tests_v) * 1e3
    );
    println!(
        "per run (medians of 40 interleaved triples): bare {:.1} ms, jailed {:.1} ms (x{:.2}; median paired overhead {:+.1} ms), full instance {:.1} ms (x{:.2}; median paired overhead {:+.1} ms)",
        b * 1e3,
        j * 1e3,
        j / b,
        median(&mut d_jail) * 1e3,
        f * 1e3,
        f / b,
        median(&mut d_full) * 1e3
    );

    // Throughput on the 100 generated instances at parallelism = cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs: Vec<Job> = instances
        .iter()
        .map(|i| Job {
            instance: i.clone(),
            model: "gold".into(),
            patch: i.patch.clone(),
        })
        .collect();
    let t = Instant::now();
    let results = run_all(&cfg, &mirrors, &jobs, cores, |_| {});
    let sandbox_s = t.elapsed().as_secs_f64();
    // The same batch without the namespace layer, to show what it costs.
    let no_ns = SandboxConfig {
        policy: Policy {
            namespaces: false,
            ..Policy::default()
        },
        ..cfg.clone()
    };
    let t = Instant::now();
    run_all(&no_ns, &mirrors, &jobs, cores, |_| {});
    let no_ns_s = t.elapsed().as_secs_f64();
    let s = Summary::of(&results);
    assert_eq!(
        s.resolved, N,
        "every gold patch resolves: {:?}",
        s.unresolved_ids
    );
    // Bare reference: the same 100 test commands in prepared plain copies, same parallelism.
    let dirs: Vec<(PathBuf, Vec<String>)> = instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let d = scratch.path().join(format!("bare-{k}"));
            std::fs::create_dir_all(&d).unwrap();
            mirrors
                .snapshot(&i.repo, &i.base_commit)
                .unwrap()
                .write_to(&d)
                .unwrap();
            sorft::sandbox::apply::apply_diff(&d, &i.patch, "patch").unwrap();
            sorft::sandbox::apply::apply_diff(&d, &i.test_patch, "test patch").unwrap();
            let a = CommandTable::default()
                .lookup(&i.repo, None)
                .args_for(&sorft::sandbox::apply::test_files(&i.test_patch));
            (d, a)
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..cores {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((d, a)) = dirs.get(k) else { break };
                bare(&interp.program, d, a);
            });
        }
    });
    let bare_batch = t.elapsed().as_secs_f64();
    println!(
        "throughput ({N} instances, {cores} workers): sandbox {:.1} runs/s, bare commands {:.1} runs/s (x{:.2} of bare); {}/{} resolved",
        N as f64 / sandbox_s,
        N as f64 / bare_batch,
        bare_batch / sandbox_s,
        s.resolved,
        s.total
    );
    println!(
        "throughput without namespaces: {:.1} runs/s (x{:.2} of bare)",
        N as f64 / no_ns_s,
        bare_batch / no_ns_s
    );
}
