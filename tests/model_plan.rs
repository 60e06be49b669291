//! The RL memory plan checked against numbers worked out by hand for Qwen2.5-Coder-7B
//! (28 layers, hidden 3584, 28 query / 4 KV heads of 128, intermediate 18944, vocab 152064,
//! untied embeddings, q/k/v biases), and `sorft plan` stopping a run that cannot fit.

use std::path::PathBuf;
use std::process::Command;

use sorft::model::config::ModelConfig;
use sorft::model::plan::{lora_params, Plan, PlanInput, RESERVE_BYTES};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2.5-coder-7b")
}

fn config() -> ModelConfig {
    ModelConfig::from_file(&dir().join("config.json")).unwrap()
}

fn input(lora_rank: usize, recompute: bool) -> PlanInput {
    PlanInput {
        lora_rank,
        seq: 4096,
        rollout_seqs: 8,
        train_seqs: 8,
        dtype_bytes: 2,
        chunk_rows: 256,
        recompute,
        gpu_bytes: 80 << 30,
    }
}

fn bytes(p: &Plan, name: &str) -> u64 {
    p.components
        .iter()
        .find(|c| c.name.starts_with(name))
        .unwrap_or_else(|| panic!("no {name}"))
        .bytes
}

#[test]
fn the_7b_plan_matches_the_hand_computed_budget() {
    let c = config();
    // Parameters: embeddings and head 2 * 152064 * 3584 = 1_089_994_752; per layer q 3584*3584
    // + 3584, k and v 512*3584 + 512 each, o 3584*3584, MLP 3 * 3584 * 18944, two norms:
    // 233_236_480; 28 layers = 6_530_621_440; final norm 3584.
    assert_eq!(c.num_params(), 7_615_616_512);
    // LoRA rank 64 on seven projections: 64 * ((3584+3584) + 2*(512+3584) + (3584+3584)
    // + 2*(18944+3584) + (3584+18944)) = 64 * 90_112 per layer, 28 layers.
    assert_eq!(lora_params(&c, 64), 161_480_704);

    let p = Plan::new(&c, &input(64, false));
    assert_eq!(bytes(&p, "weights"), 15_231_233_024); // bf16
    assert_eq!(bytes(&p, "reference"), 0); // adapters off, no copy
    assert_eq!(bytes(&p, "LoRA"), 2_583_691_264); // 16 bytes per LoRA value
                                                  // 32768 tokens * 28 layers * (k + v) * 512 * 2 bytes.
    assert_eq!(bytes(&p, "KV cache"), 1_879_048_192);
    // Per token and layer: (4*3584 + 2*3584 + 2*512 + 3*18944) bf16 values + 28 fp32 lse
    // = 158_832 bytes; 28 layers + final norm in/out (14_336) = 4_461_632 per token.
    assert_eq!(bytes(&p, "activations (no"), 32_768 * 4_461_632);
    // Block inputs only (28 * 7168) + one layer recomputed + final norm.
    assert_eq!(
        bytes(&p, "activations (recompute)"),
        32_768 * (28 * 7_168 + 158_832 + 14_336)
    );
    assert_eq!(bytes(&p, "sampler logits"), 8 * 152_064 * 4);
    assert_eq!(bytes(&p, "logits chunks"), 256 * 152_064 * 4 * 2);
    assert_eq!(
        bytes(&p, "workspace"),
        32_768 * (2 * 18_944 + 3_584) * 2 + (32 << 20)
    );
    let resident = 15_231_233_024 + 2_583_691_264 + bytes(&p, "workspace");
    assert_eq!(p.resident, resident);
    assert_eq!(p.update, 32_768 * 4_461_632 + 256 * 152_064 * 8);
    assert_eq!(p.peak, resident + p.update);
    assert_eq!(p.usable, (80u64 << 30) - RESERVE_BYTES);
    assert!(!p.fits(), "146 GB of activations do not fit in 80 GB");

    let r = Plan::new(&c, &input(64, true));
    assert!(r.fits(), "{}", r.table());
    assert!(r.table().contains("fits: peak"));

    // Full fine-tuning holds a reference copy and fp32 master weights, grads and moments.
    let f = Plan::new(&c, &input(0, true));
    assert_eq!(bytes(&f, "reference"), 15_231_233_024);
    assert_eq!(bytes(&f, "master"), 7_615_616_512 * 16);
    assert!(!f.fits());
}

fn cpu_bytes(p: &Plan, name: &str) -> u64 {
    p.components
        .iter()
        .find(|c| c.name.starts_with(name))
        .unwrap_or_else(|| panic!("no {name}"))
        .cpu_bytes
}

#[test]
fn the_cpu_column_is_host_memory_of_the_step_on_the_cpu_backend() {
    let c = config();
    let p = 7_615_616_512u64;
    // Full fine-tuning on the CPU: f32 weights trained in place (no master copy), fp32 grads and
    // two moments, the reference mapped once.
    let f = Plan::new(&c, &input(0, true));
    assert_eq!(cpu_bytes(&f, "weights"), p * 4);
    assert_eq!(cpu_bytes(&f, "reference"), p * 4);
    assert_eq!(cpu_bytes(&f, "master"), p * 12);
    assert_eq!(
        cpu_bytes(&f, "workspace"),
        32_768 * (2 * 18_944 + 3_584) * 4
    );
    // Activations in f32: twice the bf16 ones apart from the fp32 log-sum-exps.
    assert_eq!(
        cpu_bytes(&f, "activations (recompute)"),
        32_768 * (28 * 7_168 * 2 + (158_832 - 28 * 4) * 2 + 28 * 4 + 14_336 * 2)
    );
    let resident = p * 20 + cpu_bytes(&f, "workspace");
    let update = cpu_bytes(&f, "activations (recompute)") + 256 * 152_064 * 8;
    let rollout = 32_768 * 28 * 2 * 512 * 4 + 8 * 152_064 * 4;
    assert_eq!(f.cpu_peak, resident + update.max(rollout));
    // LoRA: the reference is the base weights with adapters off, no copy.
    let l = Plan::new(&c, &input(64, true));
    assert_eq!(cpu_bytes(&l, "reference"), 0);
    assert_eq!(cpu_bytes(&l, "LoRA"), 2_583_691_264);
    assert!(l.table().contains("CPU GiB"));
}

#[test]
fn sorft_plan_prints_the_table_and_fails_when_it_does_not_fit() {
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sorft"));
        cmd.args(["plan", "--model"]).arg(dir()).args(extra);
        cmd.output().unwrap()
    };
    let o = run(&["--lora", "64", "--recompute", "--gpu-mem", "80"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for line in [
        "weights",
        "reference",
        "LoRA",
        "KV cache",
        "workspace",
        "peak",
        "fits:",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    // Without --gpu-mem: the visible GPU's memory, else 80 GiB, and no device note.
    let o = run(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("note:"), "{err}");
    let o = run(&["--gpu-mem", "80"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("one RL step needs"), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("does not fit"));
    let o = run(&["--gpu-mem=0"]);
    assert_eq!(o.status.code(), Some(1));
}
