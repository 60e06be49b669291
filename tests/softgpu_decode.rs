//! The GQA decode attention (`kernels/decode.cu`) on the software GPU of `tests/softgpu/`: the
//! decode checks of `sorft selftest --attention ci` (GQA 4:1 and 7:1, lengths 1 to 4096 in one
//! batch, split-K) match the CPU backend with the new kernel, `SORFT_DECODE_KERNEL=scalar` still
//! selects the per-head kernel, and planted bugs (a wrong merge of the row groups' softmax
//! states, a query head read from the wrong row of its group) are caught.
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

use std::path::Path;
use std::process::{Command, Output};

mod softgpu_common;
use softgpu_common::{build, repo};

fn selftest(lib: &Path, envs: &[(&str, &str)]) -> (bool, String) {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sorft"));
    cmd.args(["selftest", "--attention", "ci"])
        .env("LD_LIBRARY_PATH", lib)
        .env("SORFT_KERNEL_CACHE", cache.path())
        .env("SOFTGPU_PROFILE", "1")
        .env_remove("SORFT_ATTN_KERNEL")
        .env_remove("SORFT_DECODE_KERNEL");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let o: Output = cmd.output().expect("sorft runs");
    let t = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), t)
}

const CASES: [&str; 5] = [
    "ok   decode hd128 h28/4 lens [1, 37, 700, 4096] out",
    "ok   decode hd128 h7/1 lens [4096, 700] out",
    "ok   decode hd64 h8/2 lens [4096] out",
    "ok   decode hd64 h8/2 lens [4096, 1, 700, 37] out",
    "ok   decode hd128 h2/2 lens [37, 5] out",
];

#[test]
fn the_gqa_decode_kernel_matches_the_cpu_backend_on_the_software_gpu() {
    let Some(lib) = build(None, None) else { return };
    let (ok, t) = selftest(&lib, &[]);
    assert!(ok, "{t}");
    for name in CASES {
        assert!(t.contains(name), "{name}:\n{t}");
    }
    for k in ["decode_gqa_bf16_hd128", "decode_gqa_bf16_hd64"] {
        assert!(t.contains(k), "{k}:\n{t}");
    }
    // Split-K ran: the merge kernel follows the GQA kernel.
    assert!(t.contains("decode_combine_bf16_hd128"), "{t}");
    assert!(!t.contains("decode_partial_bf16"), "{t}");
    assert!(!t.contains("softgpu: kernel"), "{t}");
}

#[test]
fn the_scalar_decode_kernel_stays_selectable() {
    let Some(lib) = build(None, None) else { return };
    let (ok, t) = selftest(&lib, &[("SORFT_DECODE_KERNEL", "scalar")]);
    assert!(ok, "{t}");
    for name in CASES {
        assert!(t.contains(name), "{name}:\n{t}");
    }
    assert!(t.contains("decode_partial_bf16_hd128"), "{t}");
    assert!(!t.contains("decode_gqa_bf16"), "{t}");
}

/// Copies kernels/ to a temporary folder with `from` replaced by `to` in decode.cu (once).
fn planted(from: &str, to: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("decode.cu");
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "planted pattern: {from}");
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
    dir
}

/// Runs the selftest on kernels with a planted bug; returns its output (it must fail).
fn run_planted(from: &str, to: &str) -> Option<String> {
    let k = planted(from, to);
    let out = tempfile::tempdir().unwrap();
    let lib = build(Some(k.path()), Some(out.path()))?;
    // The binary embeds the unplanted source: match the software GPU's kernels by name.
    let (ok, t) = selftest(&lib, &[("SOFTGPU_MATCH", "name")]);
    assert!(!ok, "a planted bug went unnoticed:\n{t}");
    Some(t)
}

#[test]
fn a_merge_that_skips_the_rescaling_of_the_row_groups_fails() {
    let Some(t) = run_planted(
        "float f = dg_rescale(sm[w][h], mm);",
        "float f = sm[w][h] == NEG_INF ? 0.f : 1.f;",
    ) else {
        return;
    };
    assert!(t.contains("FAIL decode hd"), "{t}");
}

#[test]
fn a_query_head_read_from_the_wrong_head_of_its_group_fails() {
    let Some(t) = run_planted(
        "+ kvh * g + h) * HD + part * 8",
        "+ kvh * g) * HD + part * 8",
    ) else {
        return;
    };
    assert!(t.contains("FAIL decode hd"), "{t}");
}
