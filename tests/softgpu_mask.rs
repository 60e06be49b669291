//! The grammar-masked sampler (`sample_masked_*` in `kernels/sampling.cu`) on the software GPU
//! of `tests/softgpu/`: the selftest's masked-sampler checks pass against the CPU backend, and
//! planted bugs (a mask bit read from the neighbouring token, log-probabilities normalised over
//! the allowed set instead of the whole row) fail them.
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

mod softgpu_common;
use softgpu_common::{build, repo, sorft, text};

const ARGS: [&str; 5] = ["selftest", "--device", "cuda", "--quick", "--no-model"];

#[test]
fn the_masked_sampler_matches_the_host_reference() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(&lib, &ARGS, &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let oks = t
        .lines()
        .filter(|l| l.starts_with("ok") && l.contains("sample_masked"))
        .count();
    // 2 dtypes x (2 vocabularies x 5 modes + 2 chi-square tests)
    assert_eq!(oks, 24, "{t}");
    assert!(
        t.contains("ok   device-to-host transfers per masked sampling call"),
        "{t}"
    );
}

/// Runs the selftest on `sampling.cu` with `from` replaced by `to`; returns its output, which
/// must report a failed masked-sampler check.
fn run_planted(from: &str, to: &str) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("sampling.cu");
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "planted pattern: {from}");
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let lib = build(Some(dir.path()), Some(out.path()))?;
    let o = sorft(&lib, &ARGS, &[("SOFTGPU_MATCH", "name")]);
    let t = text(&o);
    assert!(!o.status.success(), "a planted bug went unnoticed:\n{t}");
    assert!(t.contains("FAIL sample_masked"), "{t}");
    Some(t)
}

#[test]
fn a_mask_bit_read_from_the_neighbouring_token_fails() {
    run_planted(
        "((mrow[i >> 5] >> (i & 31)) & 1u)",
        "((mrow[i >> 5] >> ((i + 1) & 31)) & 1u)",
    );
}

#[test]
fn log_probabilities_over_the_allowed_set_only_fail() {
    run_planted("lse_out = gm + logf(gs);", "lse_out = lse;");
}
