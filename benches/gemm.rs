//! GEMM throughput at the `small` preset's shapes: the `gemm` crate against `matrixmultiply`,
//! and the backend's `linear` (matrixmultiply for large products, a row-independent dot-product
//! kernel for decode-sized inputs). Criterion reports elements/s; GFLOP/s = 2 * that
//! / 1e9 since one element here is one multiply-add.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sorft::engine::rng::SplitMix;
use sorft::engine::{Backend, Cpu, HostData};

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix::new(seed);
    (0..n).map(|_| r.next_normal() as f32).collect()
}

fn bench(c: &mut Criterion) {
    // (tokens, out, in): q/o projection, MLP up, MLP down, LM head at hidden 256 / mlp 704.
    let shapes = [
        (512, 256, 256),
        (512, 704, 256),
        (512, 256, 704),
        (512, 832, 256),
        (8, 704, 256),
        (1, 704, 256),
    ];
    let mut g = c.benchmark_group("gemm");
    g.sample_size(20);
    for &(m, n, k) in &shapes {
        let x = rand(m * k, 1);
        let w = rand(n * k, 2);
        let mut out = vec![0.0f32; m * n];
        let id = format!("{m}x{n}x{k}");
        g.throughput(Throughput::Elements((m * n * k) as u64));
        g.bench_with_input(BenchmarkId::new("gemm_crate", &id), &(), |b, _| {
            b.iter(|| unsafe {
                // SAFETY: the strides address elements inside `x`, `w` and `out`.
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(rayon::current_num_threads()),
                )
            })
        });
        g.bench_with_input(BenchmarkId::new("matrixmultiply", &id), &(), |b, _| {
            b.iter(|| unsafe {
                // SAFETY: the strides address elements inside `x`, `w` and `out`.
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    w.as_ptr(),
                    1,
                    k as isize,
                    0.0,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                )
            })
        });
        let xt = Cpu.upload(HostData::F32(&x), &[m, k]).unwrap();
        let wt = Cpu.upload(HostData::F32(&w), &[n, k]).unwrap();
        g.bench_with_input(BenchmarkId::new("backend_linear", &id), &(), |b, _| {
            b.iter(|| Cpu.linear(&xt, &wt, None).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
