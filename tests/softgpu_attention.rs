//! The tensor-core attention (`kernels/attn_mma.cu`) on the software GPU of `tests/softgpu/`:
//! `sorft selftest --attention ci` matches the CPU backend (forward and backward), planted bugs
//! in the kernels (a causal mask one key too wide, a dK/dV mask without the diagonal, a cp.async
//! pipeline that reads a tile before waiting for it) are caught, and its SASS keeps its tensor-core instructions (census, where nvcc's
//! tools are installed).
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

use std::path::Path;
use std::process::{Command, Output};

mod softgpu_common;
use softgpu_common::{build, repo, text};

fn required() -> bool {
    std::env::var("SORFT_REQUIRE_SOFTGPU").is_ok_and(|v| v == "1")
}

fn selftest(lib: &Path, envs: &[(&str, &str)]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sorft"));
    cmd.args(["selftest", "--attention", "ci"])
        .env("LD_LIBRARY_PATH", lib)
        .env("SORFT_KERNEL_CACHE", cache.path())
        .env_remove("SORFT_ATTN_KERNEL");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("sorft runs")
}

#[test]
fn the_tensor_core_attention_matches_the_cpu_backend_on_the_software_gpu() {
    let Some(lib) = build(None, None) else { return };
    let o = selftest(&lib, &[("SOFTGPU_PROFILE", "1")]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains(" 0 failed"), "{t}");
    for name in [
        "ok   attn_mma hd64 h4/2 seqs [1, 70, 130]",
        "ok   attn_mma hd128 h28/4 seqs [3, 41]",
        "ok   attn_mma hd128 h2/2 seqs [65, 1]",
    ] {
        assert!(t.contains(&format!("{name} logit std")), "{name}:\n{t}");
    }
    // The checks ran the tensor-core kernel, not the scalar fallback.
    assert!(t.contains("attn_mma_fwd_bf16_hd128"), "{t}");
    assert!(t.contains("attn_mma_fwd_bf16_hd64"), "{t}");
    for name in ["attn_mma_bwd_dq_bf16_hd64", "attn_mma_bwd_dkdv_bf16_hd128"] {
        assert!(t.contains(name), "{name}:\n{t}");
    }
    for scalar in ["flash_fwd_bf16", "flash_bwd_dq_bf16", "flash_bwd_dkdv_bf16"] {
        assert!(!t.contains(scalar), "{scalar}:\n{t}");
    }
    assert!(!t.contains("softgpu: kernel"), "{t}");
}

/// Copies kernels/ to a temporary folder with `from` replaced by `to` in attn_mma.cu (once).
fn planted(from: &str, to: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("attn_mma.cu");
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "planted pattern: {from}");
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
    dir
}

/// Runs the attention selftest on kernels with a planted bug; returns its output (it must fail).
fn run_planted(kernels: &Path) -> Option<String> {
    let out = tempfile::tempdir().unwrap();
    let lib = build(Some(kernels), Some(out.path()))?;
    let o = selftest(&lib, &[("SOFTGPU_MATCH", "name")]);
    let t = text(&o);
    assert!(!o.status.success(), "a planted bug went unnoticed:\n{t}");
    Some(t)
}

#[test]
fn a_causal_mask_one_key_too_wide_fails_the_comparison() {
    let k = planted("j > row[e >> 1] ? NEG_INF", "j > row[e >> 1] + 1 ? NEG_INF");
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("FAIL attn_mma hd"), "{t}");
    assert!(t.contains(" out "), "{t}");
}

#[test]
fn a_dk_dv_kernel_that_drops_the_diagonal_fails_the_gradient_comparison() {
    let k = planted("key[e >> 1] <= r;", "key[e >> 1] < r;");
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("FAIL attn_mma hd"), "{t}");
    assert!(t.contains(" dv "), "{t}");
}

#[test]
fn reading_a_tile_before_its_cp_async_wait_is_caught() {
    // Waiting for all but the two newest groups leaves the current tile in flight.
    let k = planted(
        "vs[st ^ 1], k, v, kt + BN, row_hi + 1, kvh, kf);\n            cp_async_commit();\n            cp_async_wait<1>();",
        "vs[st ^ 1], k, v, kt + BN, row_hi + 1, kvh, kf);\n            cp_async_commit();\n            cp_async_wait<2>();",
    );
    let Some(t) = run_planted(k.path()) else {
        return;
    };
    assert!(t.contains("no thread of this block has written"), "{t}");
    assert!(t.contains("attn_mma_fwd_bf16"), "{t}");
}

#[test]
fn the_census_requires_tensor_core_instructions_in_the_attention_kernel() {
    let spec_text = std::fs::read_to_string(repo().join("kernels/census.txt")).unwrap();
    let line = spec_text
        .lines()
        .find(|l| l.starts_with("attn_mma_"))
        .expect("kernels/census.txt has a line for attn_mma_*");
    assert!(
        line.contains("HMMA,LDSM,LDGSTS") && line.ends_with("nolocal"),
        "{line}"
    );
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("census.txt");
    std::fs::write(&spec, format!("{line}\n")).unwrap();
    let o = Command::new("bash")
        .arg(repo().join("scripts/sass-census.sh"))
        .arg("--spec")
        .arg(&spec)
        .arg(repo().join("kernels/attn_mma.cu"))
        .output()
        .expect("bash runs");
    let t = text(&o);
    if t.contains("not found beside nvcc") {
        assert!(!required(), "{t}");
        eprintln!("SASS census tools not installed here, skipping: {t}");
        return;
    }
    assert!(o.status.success(), "{t}");
    for k in ["fwd", "bwd_dq", "bwd_dkdv"] {
        assert!(t.contains(&format!("attn_mma_{k}_bf16_hd128")), "{k}:\n{t}");
    }
}
