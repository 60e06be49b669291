//! Restricted log-probabilities (`masked_logprobs_*` / `masked_dlogits_*` in
//! `kernels/restrict.cu`) on the software GPU of `tests/softgpu/`: the selftest's restricted
//! checks (`sorft selftest --only restrict`) pass against the CPU backend, and planted kernel bugs
//! fail them: a mask bit read for the neighbouring token, the entropy summed over the whole row
//! instead of the allowed set, logit gradients without the softmax term of the log-probability,
//! without the `+ H_c` of the entropy term, or with -inf allowed logits not skipped. The last
//! three leave the log-probabilities right (a check of the forward alone misses them) and two of
//! them only show with non-zero entropy gradients or -inf logits in the mask.
//!
//! Needs g++ and python3. Where they are missing the tests say so and pass, unless
//! `SORFT_REQUIRE_SOFTGPU=1` (set by `.ci/run`, which builds the software GPU first).

mod softgpu_common;
use softgpu_common::{build, repo, sorft, text};

const ARGS: [&str; 7] = [
    "selftest",
    "--device",
    "cuda",
    "--quick",
    "--no-model",
    "--only",
    "restrict",
];

#[test]
fn restricted_logprobs_match_the_host_reference() {
    let Some(lib) = build(None, None) else { return };
    let o = sorft(&lib, &ARGS, &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for op in ["masked_logprobs", "masked_dlogits"] {
        for dtype in ["F32", "BF16"] {
            for vocab in [1000, 1057] {
                let name = format!("ok   {op} V={vocab} {dtype}");
                assert!(t.contains(&name), "{name} missing:\n{t}");
            }
        }
    }
    assert!(
        t.contains("ok   masked_logprobs/dlogits bad input is an error"),
        "{t}"
    );
    assert!(
        t.contains("ok   device-to-host transfers per restricted call"),
        "{t}"
    );
    assert!(t.contains("10 passed, 0 failed"), "{t}");
}

/// Runs the restricted selftest on `restrict.cu` with `from` replaced by `to`; returns its
/// output, which must report a failed `failing` check.
fn run_planted(from: &str, to: &str, failing: &str) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo().join("kernels")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("restrict.cu");
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "planted pattern: {from}");
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let lib = build(Some(dir.path()), Some(out.path()))?;
    let o = sorft(&lib, &ARGS, &[("SOFTGPU_MATCH", "name")]);
    let t = text(&o);
    assert!(!o.status.success(), "a planted bug went unnoticed:\n{t}");
    assert!(t.contains(&format!("FAIL {failing}")), "{t}");
    Some(t)
}

/// Asserts that every forward (log-probability) check passed: the bug is in the backward only.
fn forward_passes(t: Option<String>) {
    let Some(t) = t else { return };
    let oks = t
        .lines()
        .filter(|l| l.starts_with("ok   masked_logprobs V="))
        .count();
    assert_eq!(oks, 4, "{t}");
}

#[test]
fn a_mask_bit_read_for_the_neighbouring_token_fails() {
    run_planted(
        "return (m[i >> 5] >> (i & 31)) & 1u;",
        "return (m[i >> 5] >> ((i + 1) & 31)) & 1u;",
        "masked_logprobs",
    );
}

#[test]
fn an_entropy_over_the_whole_row_fails() {
    run_planted(
        "if (!in_set(m, i)) continue;\n        float x = to_f32(z[i]);\n        if (x == NEG_INF) continue;  //",
        "float x = to_f32(z[i]);\n        if (x == NEG_INF) continue;  //",
        "masked_logprobs",
    );
}

#[test]
fn logit_gradients_without_the_softmax_term_fail() {
    forward_passes(run_planted(
        "out = -gl * p - ge * p * (lp + h);",
        "out = -ge * p * (lp + h);",
        "masked_dlogits",
    ));
}

#[test]
fn an_entropy_gradient_without_the_entropy_fails() {
    forward_passes(run_planted(
        "out = -gl * p - ge * p * (lp + h);",
        "out = -gl * p - ge * p * lp;",
        "masked_dlogits",
    ));
}

#[test]
fn allowed_minus_infinity_logits_not_skipped_in_the_gradient_fail() {
    forward_passes(run_planted(
        "if (in_set(m, i) && x != NEG_INF) {",
        "if (in_set(m, i)) {",
        "masked_dlogits",
    ));
}
