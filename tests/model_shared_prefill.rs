//! Requests with the same prompt (a GRPO group) share one prefill: the outputs are the same bits
//! as with a prefill per request, and far fewer prompt tokens run through the model.

use std::path::PathBuf;

use sorft::engine::{Cpu, SamplingParams};
use sorft::model::generate::{generate_with_stats, GenOptions, GenRequest};
use sorft::model::Model;

#[test]
fn a_group_shares_one_prefill_with_identical_outputs() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen2_gqa_tied");
    let model = Model::load(&Cpu, &dir).unwrap();
    let v = model.config.vocab_size as u32;
    let group = 4;
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|p| (0..9 + 3 * p).map(|j| (7 * j + 11 * p + 1) % v).collect())
        .collect();
    let mut reqs = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        for k in 0..group {
            reqs.push(GenRequest {
                prompt: prompt.clone(),
                params: SamplingParams {
                    temperature: 0.9,
                    top_k: 0,
                    top_p: 1.0,
                    seed: (p * group + k) as u64,
                },
                // Different lengths: slots free up at different times and are refilled.
                max_new_tokens: 3 + 2 * k + p,
                ..Default::default()
            });
        }
    }
    // Five slots: groups straddle refills (copies into freed slots, and reuse in place).
    let opts = GenOptions {
        max_batch: 5,
        progress: false,
    };
    let (own, own_stats) = generate_with_stats(&model, None, &reqs, &opts, false).unwrap();
    let (shared, stats) = generate_with_stats(&model, None, &reqs, &opts, true).unwrap();
    assert_eq!(own, shared, "sharing the prefill changed the outputs");
    let all: usize = reqs.iter().map(|r| r.prompt.len()).sum();
    let distinct: usize = prompts.iter().map(Vec::len).sum();
    assert_eq!(own_stats.prefill_tokens, all);
    assert_eq!(stats.prefill_tokens, distinct, "one prefill per group");
    assert_eq!(stats.shared_prefills, reqs.len() - prompts.len());
    assert_eq!(stats.generated_tokens, own_stats.generated_tokens);
    // The samples of a group differ (they share the prompt, not the randomness).
    assert!(shared[..group].windows(2).any(|w| w[0].ids != w[1].ids));
}
