//! SWE layer throughput on a generated set: ground-truth extraction (patches/s) and skeleton
//! building (files/s). Needs python3 and git (the set is generated once, offline, seed 7).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sorft::swe::codemap::{skeleton, Lang};
use sorft::swe::instance::Instance;
use sorft::swe::repo::{RepoStore, Snapshot};
use sorft::swe::synth::{self, SynthConfig};
use sorft::swe::truth::ground_truth;
use std::time::Duration;

fn dataset() -> (tempfile::TempDir, Vec<(Instance, Snapshot)>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = SynthConfig {
        n: 30,
        seed: 7,
        per_repo: 3,
        test_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let report = synth::generate(&cfg, dir.path(), &|_| {}).expect("generate the benchmark set");
    let store = RepoStore::new(dir.path().join("repos"));
    let set = report
        .instances
        .into_iter()
        .map(|i| {
            let s = store.snapshot(&i.repo, &i.base_commit).expect("snapshot");
            (i, s)
        })
        .collect();
    (dir, set)
}

fn bench(c: &mut Criterion) {
    let (_dir, set) = dataset();
    let mut g = c.benchmark_group("swe");
    g.throughput(Throughput::Elements(set.len() as u64));
    g.bench_function("ground_truth_patches", |b| {
        b.iter(|| {
            for (inst, snap) in &set {
                let gt = ground_truth(&inst.patch, snap).expect("ground truth");
                std::hint::black_box(gt);
            }
        })
    });
    let files: Vec<(Lang, String)> = set
        .iter()
        .flat_map(|(_, s)| {
            s.files
                .keys()
                .filter_map(|p| Some((Lang::from_path(p)?, s.text(p)?.to_string())))
                .collect::<Vec<_>>()
        })
        .collect();
    g.throughput(Throughput::Elements(files.len() as u64));
    g.bench_function("skeleton_files", |b| {
        b.iter(|| {
            for (lang, src) in &files {
                std::hint::black_box(skeleton(*lang, src));
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
