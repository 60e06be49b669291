//! Prefill and decode throughput of the `small` preset on the CPU backend.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sorft::engine::{Cpu, SamplingParams};
use sorft::model::generate::{generate, GenOptions, GenRequest};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::kv_cache::KvCache;
use sorft::model::transformer::Step;
use sorft::model::Model;

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("sorft-bench-small-{}", std::process::id()));
    init_model(Preset::Small, &dir, 1, &[EMBEDDED_CORPUS.to_string()]).expect("init");
    let m = Model::load(&Cpu, &dir).expect("load");
    let v = m.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..512u32).map(|i| (i * 7919) % v).collect();
    let mut g = c.benchmark_group("inference");
    g.sample_size(10);
    g.throughput(Throughput::Elements(prompt.len() as u64));
    g.bench_function("prefill_512", |b| {
        let n = prompt.len();
        let slots = vec![0u32; n];
        let pos: Vec<u32> = (0..n as u32).collect();
        b.iter(|| {
            let mut cache = KvCache::new(&m.backend, &m.config, 1, n).unwrap();
            m.forward(
                &mut cache,
                &Step {
                    ids: &prompt,
                    slots: &slots,
                    positions: &pos,
                    logit_rows: &[n as u32 - 1],
                },
            )
            .unwrap()
        })
    });
    for batch in [1usize, 8] {
        let reqs: Vec<GenRequest> = (0..batch)
            .map(|i| GenRequest {
                prompt: prompt[i..i + 16].to_vec(),
                params: SamplingParams::greedy(),
                max_new_tokens: 128,
                ..Default::default()
            })
            .collect();
        g.throughput(Throughput::Elements((batch * 128) as u64));
        g.bench_function(format!("decode_128_batch_{batch}"), |b| {
            b.iter(|| {
                generate(
                    &m,
                    None,
                    &reqs,
                    &GenOptions {
                        max_batch: batch,
                        progress: false,
                    },
                )
                .unwrap()
            })
        });
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
