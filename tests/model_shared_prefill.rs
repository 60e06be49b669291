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
    // The CPU keeps a shared prompt in one slot; when that slot is reused while others still
    // read the prompt there, they get their own copy first (outputs above would differ if not).
    assert!(stats.prefix_copies > 0, "{stats:?}");
    // The samples of a group differ (they share the prompt, not the randomness).
    assert!(shared[..group].windows(2).any(|w| w[0].ids != w[1].ids));
}

/// The slot that keeps a shared prompt is reused for a new prompt while the group's other
/// sequences still decode: they must get their own copy of the prompt before it is overwritten.
#[test]
fn a_reused_slot_copies_the_prompt_for_sequences_still_reading_it() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen2_gqa_tied");
    let model = Model::load(&Cpu, &dir).unwrap();
    let v = model.config.vocab_size as u32;
    let a: Vec<u32> = (0..12u32).map(|j| (5 * j + 3) % v).collect();
    let b: Vec<u32> = (0..10u32).map(|j| (9 * j + 2) % v).collect();
    let req = |prompt: &Vec<u32>, seed: u64, max_new_tokens: usize| GenRequest {
        prompt: prompt.clone(),
        params: SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            seed,
        },
        max_new_tokens,
        ..Default::default()
    };
    // Slot 0 keeps `a` for slots 1 and 2, finishes first and takes `b` (a prefill over it).
    let reqs = vec![req(&a, 0, 2), req(&a, 1, 20), req(&a, 2, 20), req(&b, 3, 6)];
    let opts = GenOptions {
        max_batch: 3,
        progress: false,
    };
    let (own, _) = generate_with_stats(&model, None, &reqs, &opts, false).unwrap();
    let (shared, stats) = generate_with_stats(&model, None, &reqs, &opts, true).unwrap();
    assert_eq!(
        own, shared,
        "the reused slot's new prompt leaked into the others"
    );
    assert_eq!(stats.prefix_copies, 2, "{stats:?}");
}
