//! The GPU hot path on the software GPU of `tests/softgpu/` (built by `scripts/softgpu.sh`):
//! fp32 master weights for bf16 training, device-to-host transfers per decode and training step,
//! empty batches, the realistic-shape cases (shrunk) and `selftest --gemm`; a planted fault in
//! the master-weight kernel is caught.
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

mod softgpu_common;
use softgpu_common::{build, repo, sorft, text};

/// The first number after `key` on the line of check `name`.
fn number_after(t: &str, name: &str, key: &str) -> Option<u64> {
    let line = t.lines().find(|l| l.contains(name))?;
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn hot_path_checks_pass_with_the_builtin_gemm_and_transfers_stay_bounded() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(
        &lib,
        &[
            "selftest", "--device", "cuda", "--quick", "--gemm", "builtin",
        ],
        &[],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("GEMM by the built-in kernel"), "{t}");
    for check in [
        "adamw bf16 fp32 master weights: tiny updates accumulate",
        "empty batch (0 rows) through every row op f32",
        "empty batch (0 rows) through every row op bf16",
        "realistic (shrunk) f32 attention logits reach +-20",
        "realistic (shrunk) bf16 attention_train out",
        "realistic (shrunk) bf16 attention_backward dq",
        "realistic (shrunk) f32 attention (kv cache)",
        "realistic (shrunk) bf16 token_logprobs logp (vocab 4096)",
        "device-to-host transfers per decode step",
        "device-to-host transfers per train step",
    ] {
        assert!(
            t.contains(&format!("ok   {check}")),
            "{check} not passed:\n{t}"
        );
    }
    // Per step, not per layer or per tensor: the tiny model has several layers and dozens of
    // trained tensors.
    let decode = number_after(&t, "transfers per decode step", ") ").unwrap();
    let train = number_after(&t, "transfers per train step", ") ").unwrap();
    assert!(decode <= 1, "{decode} transfers per decode step:\n{t}");
    assert!(train <= 2, "{train} transfers per train step:\n{t}");
    eprintln!("software GPU: {decode} D2H per decode step, {train} per train step");
}

#[test]
fn gemm_cublas_without_cublas_is_a_one_line_error() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(
        &lib,
        &[
            "selftest", "--device", "cuda", "--quick", "--gemm", "cublas",
        ],
        &[],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("--gemm cublas: libcublas is not loaded"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
}

#[test]
fn a_master_weight_kernel_that_drops_the_master_update_is_caught() {
    // The kernel writes the rounded weight but forgets to keep the fp32 master: tiny updates are
    // lost again, as before master weights.
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("elementwise.cu");
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches("        master[i] = w;\n").count(), 1);
    std::fs::write(&path, src.replacen("        master[i] = w;\n", "", 1)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let Some(lib) = build(Some(dir.path()), Some(out.path())) else {
        return;
    };
    let o = sorft(
        &lib,
        &["selftest", "--device", "cuda", "--quick", "--no-model"],
        &[("SOFTGPU_MATCH", "name")],
    );
    let t = text(&o);
    assert!(!o.status.success(), "a planted bug went unnoticed:\n{t}");
    assert!(
        t.contains("FAIL adamw bf16 fp32 master weights: tiny updates accumulate"),
        "{t}"
    );
}
