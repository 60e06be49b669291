//! Exact resume of bf16 training on the software GPU of `tests/softgpu/`: a run stopped after
//! two steps and resumed ends with the same weights, bit for bit, as one that never stopped.
//! That needs the fp32 master weights in the checkpoint (`master.<param>` in
//! `optimizer.safetensors`) and the moments restored as f32, not narrowed to the bf16 compute
//! dtype; without either, the resumed run's weights drift.
//!
//! Needs g++ and python3. Where they are missing the test says so and passes, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

mod softgpu_common;
mod train_util;

use std::path::Path;

use softgpu_common::{build, sorft, text};
use sorft::model::weights::WeightFiles;
use train_util::{animal_jsonl, tiny_preset};

fn sft(lib: &Path, root: &Path, out: &str, extra: &[&str]) -> String {
    let out = root.join(out);
    let (base, data) = (root.join("base"), root.join("train.jsonl"));
    let mut args = vec![
        "sft",
        "--device",
        "cuda",
        "--dtype",
        "bf16",
        "--model",
        base.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--epochs",
        "1",
        "--batch-tokens",
        "128",
        "--lr",
        "2e-4",
        "--seed",
        "5",
        "--save-every",
        "0",
        "--eval-fraction",
        "0",
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    let o = sorft(lib, &args, &[]);
    let t = text(&o);
    assert!(o.status.success(), "sft {extra:?} failed:\n{t}");
    t
}

fn final_weights(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("final").join("model.safetensors")).unwrap()
}

#[test]
fn bf16_training_resumes_exactly_from_fp32_master_weights() {
    let Some(lib) = build(None, None) else { return };
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    tiny_preset(&r.join("base"), 1);
    std::fs::write(r.join("train.jsonl"), animal_jsonl(32, 10)).unwrap();

    sft(&lib, r, "whole", &[]);
    sft(&lib, r, "split", &["--max-steps", "2"]);
    // The checkpoint of the stopped run carries the fp32 state of every trained weight.
    let ckpts = sorft::train::checkpoint::list(&r.join("split").join("checkpoints")).unwrap();
    let (_, dir) = ckpts.last().expect("a checkpoint after --max-steps");
    let state = WeightFiles::open_file(&dir.join("optimizer.safetensors")).unwrap();
    let masters: Vec<&String> = state
        .tensors
        .keys()
        .filter(|k| k.starts_with("master."))
        .collect();
    assert!(!masters.is_empty(), "no master weights in the checkpoint");
    assert!(
        state
            .tensors
            .values()
            .all(|e| e.dtype == sorft::engine::DType::F32),
        "optimizer state must be f32"
    );
    sft(&lib, r, "split", &["--resume"]);
    assert!(
        final_weights(&r.join("whole")) == final_weights(&r.join("split")),
        "resumed bf16 run differs from the uninterrupted one"
    );
}
