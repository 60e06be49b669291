//! Selftest checks of restricted (allowed-set) log-probabilities (`Backend::masked_logprobs` /
//! `Backend::masked_dlogits`, kernels `masked_logprobs_*` / `masked_dlogits_*` of
//! `kernels/restrict.cu`) against the host reference (the CPU backend, `engine::restricted`) on
//! the same logits, in f32 and bf16, over vocabularies of 1,000 and 1,057 tokens (not a multiple
//! of 32): one batch of rows with different masks (everything, nothing, a random third, one
//! token, the partial last word with the bits past the vocabulary set, a target outside the
//! mask, -inf logits inside the mask, a -inf target, no finite allowed logit, a short, an empty
//! and a long mask) and different upstream gradients (both, log-probability only, entropy only,
//! none). Log-probabilities and entropies agree within 2e-3 (non-finite ones exactly: the same
//! infinity or both NaN), logit gradients within 1e-4 (bf16 outputs: 1e-2) of each row's largest,
//! and are exactly 0 outside each row's allowed set. Also: bad input is an error on both backends,
//! and the forward copies one `[2c]` buffer back while the backward copies nothing.

use anyhow::Result;

use sorft::engine::backend::{Backend, HostData};
use sorft::engine::rng::SplitMix;
use sorft::engine::sampling::mask_bit;
use sorft::engine::{Cpu, Cuda, DType, EngineError};

use super::Checks;

/// Absolute tolerance of log-probabilities and entropies (f32 outputs for both dtypes).
const LOGP_TOL: f64 = 2e-3;

/// The rows whose every 7th logit is -inf.
const MINUS_INF: [&str; 3] = [
    "-inf logits in the mask",
    "-inf target",
    "no finite allowed logit",
];

/// One row of the batch: its mask as passed to the backend, target and upstream gradients.
struct Row {
    what: &'static str,
    mask: Vec<u32>,
    target: u32,
    g: f32,
    g_ent: f32,
}

/// Runs every restricted log-probability check on `gpu`, in f32 and bf16.
pub fn checks(gpu: &Cuda, seed: u64, c: &mut Checks) -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let be = gpu.with_dtype(dtype)?;
        be.set_poison(true);
        for vocab in [1000usize, 1057] {
            agreement(&be, vocab, seed, c)?;
        }
    }
    bad_input(gpu, c)?;
    transfers(gpu, c)
}

/// One bitset of `words` words from a predicate over token ids (ids past the vocabulary too).
fn bits(words: usize, f: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut w = vec![0u32; words];
    for i in (0..words * 32).filter(|&i| f(i)) {
        w[i / 32] |= 1 << (i % 32);
    }
    w
}

/// Rounds to the dtype so that both backends see the same values.
fn round(x: f32, dtype: DType) -> f32 {
    if dtype == DType::BF16 {
        half::bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

/// The batch: logits `[rows, vocab]` (normal, scale 2; every 7th token -inf in the rows that
/// say so) and its rows.
fn batch(vocab: usize, dtype: DType, rng: &mut SplitMix) -> (Vec<f32>, Vec<Row>) {
    let words = vocab.div_ceil(32);
    let third: Vec<bool> = (0..vocab).map(|_| rng.below(3) == 0).collect();
    let other: Vec<bool> = (0..vocab).map(|_| rng.below(3) == 0).collect();
    let half: Vec<bool> = (0..vocab).map(|_| rng.below(2) == 0).collect();
    let inside = |set: &[bool], rng: &mut SplitMix| loop {
        let t = rng.below(vocab as u64) as usize;
        if set[t] && t % 7 != 0 {
            return t as u32;
        }
    };
    let t_third = inside(&third, rng);
    let t_half = inside(&half, rng);
    let t_out = loop {
        let t = rng.below(vocab as u64) as usize;
        if !other[t] {
            break t as u32;
        }
    };
    let last = (words - 1) * 32;
    let long: Vec<u32> = (0..words + 3).map(|_| rng.next_u64() as u32).collect();
    let t_long = loop {
        let t = rng.below(vocab as u64) as usize;
        if mask_bit(&long, t) {
            break t as u32;
        }
    };
    let rows = vec![
        Row {
            what: "all allowed",
            mask: vec![u32::MAX; words],
            target: rng.below(vocab as u64) as u32,
            g: 1.0,
            g_ent: 0.3,
        },
        Row {
            what: "nothing allowed",
            mask: vec![0; words],
            target: 11,
            g: 0.5,
            g_ent: -0.2,
        },
        Row {
            what: "random third",
            mask: bits(words, |i| i < vocab && third[i]),
            target: t_third,
            g: -1.3,
            g_ent: 0.7,
        },
        Row {
            what: "one token",
            mask: bits(words, |i| i == vocab / 2 + 1),
            target: (vocab / 2 + 1) as u32,
            g: 0.9,
            g_ent: 0.4,
        },
        Row {
            what: "partial last word",
            mask: bits(words, |i| i + 8 >= last),
            target: vocab as u32 - 1,
            g: 1.1,
            g_ent: 0.0,
        },
        Row {
            what: "target outside the mask",
            mask: bits(words, |i| i < vocab && other[i]),
            target: t_out,
            g: 0.6,
            g_ent: 0.5,
        },
        Row {
            what: "-inf logits in the mask",
            mask: bits(words, |i| i < vocab && half[i]),
            target: t_half,
            g: 1.0,
            g_ent: -0.8,
        },
        Row {
            what: "-inf target",
            mask: bits(words, |i| i % 3 == 0),
            target: 21,
            g: 0.4,
            g_ent: 0.1,
        },
        Row {
            what: "no finite allowed logit",
            mask: bits(words, |i| i % 7 == 0),
            target: 8,
            g: 0.3,
            g_ent: 0.2,
        },
        Row {
            what: "short mask (2 words)",
            mask: bits(2, |i| i % 2 == 1),
            target: 3,
            g: -0.5,
            g_ent: 0.25,
        },
        Row {
            what: "empty mask",
            mask: Vec::new(),
            target: 5,
            g: 0.2,
            g_ent: 0.0,
        },
        Row {
            what: "long mask (3 extra words)",
            mask: long,
            target: t_long,
            g: 0.0,
            g_ent: 0.6,
        },
        Row {
            what: "zero gradients",
            mask: bits(words, |i| i < vocab && third[i]),
            target: t_third,
            g: 0.0,
            g_ent: 0.0,
        },
    ];
    let minus_inf = |r: usize| MINUS_INF.contains(&rows[r].what);
    let logits = (0..rows.len() * vocab)
        .map(|i| {
            let x = round(2.0 * rng.next_normal() as f32, dtype);
            if (i % vocab) % 7 == 0 && minus_inf(i / vocab) {
                f32::NEG_INFINITY
            } else {
                x
            }
        })
        .collect();
    (logits, rows)
}

/// Whether a device value agrees with the host's: within `tol` when the host's is finite,
/// else the same infinity or both NaN.
fn agrees(got: f32, want: f32, tol: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        got.is_finite() && (got as f64 - want as f64).abs() <= tol
    }
}

/// Device against host for both operations on one batch.
fn agreement(be: &Cuda, vocab: usize, seed: u64, c: &mut Checks) -> Result<()> {
    let dtype = be.dtype();
    let mut rng = SplitMix::new(seed ^ 0x7265_7374 ^ vocab as u64);
    let (host, rows) = batch(vocab, dtype, &mut rng);
    let n = rows.len();
    let dev = be.upload(HostData::F32(&host), &[n, vocab])?;
    let cpu = Cpu.upload(HostData::F32(&host), &[n, vocab])?;
    let masks: Vec<&[u32]> = rows.iter().map(|r| r.mask.as_slice()).collect();
    let targets: Vec<u32> = rows.iter().map(|r| r.target).collect();
    let g: Vec<f32> = rows.iter().map(|r| r.g).collect();
    let g_ent: Vec<f32> = rows.iter().map(|r| r.g_ent).collect();

    let (lp, ent) = be.masked_logprobs(&dev, &masks, &targets)?;
    let (lp_w, ent_w) = Cpu.masked_logprobs(&cpu, &masks, &targets)?;
    let mut bad = Vec::new();
    let (mut e_lp, mut e_ent) = (0.0f64, 0.0f64);
    if lp.len() != n || ent.len() != n {
        bad.push(format!(
            "{} log-probs, {} entropies for {n} rows",
            lp.len(),
            ent.len()
        ));
    }
    for (r, row) in rows.iter().enumerate().take(lp.len().min(ent.len())) {
        for (name, got, want, worst) in [
            ("log-prob", lp[r], lp_w[r], &mut e_lp),
            ("entropy", ent[r], ent_w[r], &mut e_ent),
        ] {
            if !agrees(got, want, LOGP_TOL) {
                bad.push(format!("row {r} ({}): {name} {got} vs {want}", row.what));
            } else if want.is_finite() {
                *worst = worst.max((got as f64 - want as f64).abs());
            }
        }
    }
    c.push(
        format!("masked_logprobs V={vocab} {}", dtype.name()),
        bad.is_empty(),
        if bad.is_empty() {
            format!("{n} rows agree: log-probs within {e_lp:.1e}, entropies within {e_ent:.1e}")
        } else {
            bad.join("; ")
        },
    );

    let dl = be.masked_dlogits(&dev, &masks, &targets, &g, &g_ent)?;
    let got = be.to_host_f32(&dl)?;
    let want = Cpu.to_host_f32(&Cpu.masked_dlogits(&cpu, &masks, &targets, &g, &g_ent)?)?;
    let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-4 };
    let (bad, worst) = dlogit_errors(&host, &rows, vocab, &got, &want, tol);
    c.push(
        format!("masked_dlogits V={vocab} {}", dtype.name()),
        bad.is_empty(),
        if bad.is_empty() {
            format!("{n} rows agree: max err {worst:.1e} of the row's largest (tol {tol:.0e})")
        } else {
            bad.join("; ")
        },
    );
    Ok(())
}

/// What is wrong with each device row of logit gradients against the host's, and the largest
/// error relative to its row's largest value.
fn dlogit_errors(
    logits: &[f32],
    rows: &[Row],
    vocab: usize,
    got: &[f32],
    want: &[f32],
    tol: f64,
) -> (Vec<String>, f64) {
    if got.len() != want.len() || want.len() != rows.len() * vocab {
        let e = format!(
            "{} values vs {} ({} rows)",
            got.len(),
            want.len(),
            rows.len()
        );
        return (vec![e], f64::INFINITY);
    }
    let mut bad = Vec::new();
    let mut worst = 0.0f64;
    for (r, row) in rows.iter().enumerate() {
        let span = r * vocab..(r + 1) * vocab;
        let (z, g, w) = (&logits[span.clone()], &got[span.clone()], &want[span]);
        let scale = w.iter().fold(0.0f64, |a, &x| a.max((x as f64).abs()));
        let mut row_bad = None;
        for b in 0..vocab {
            let in_set = mask_bit(&row.mask, b) && z[b] != f32::NEG_INFINITY;
            let exact = !in_set && b != row.target as usize;
            if exact && g[b] != 0.0 {
                row_bad = Some(format!(
                    "{} at {b}, outside the mask or -inf (want 0)",
                    g[b]
                ));
                break;
            }
            if !g[b].is_finite() {
                row_bad = Some(format!("{} at {b}", g[b]));
                break;
            }
            let e = (g[b] as f64 - w[b] as f64).abs() / scale.max(1e-30);
            if e > tol || (scale == 0.0 && g[b] != 0.0) {
                row_bad = Some(format!("{} vs {} at {b}", g[b], w[b]));
                break;
            }
            worst = worst.max(if scale == 0.0 { 0.0 } else { e });
        }
        if let Some(e) = row_bad {
            bad.push(format!("row {r} ({}): {e}", row.what));
        }
    }
    (bad, worst)
}

/// Whether a call failed on both backends (the device's result, then the host's).
fn both_fail<A, B>(dev: Result<A, EngineError>, host: Result<B, EngineError>) -> bool {
    dev.is_err() && host.is_err()
}

/// Inputs the backends validate are errors on both (not panics, not garbage): a target at the
/// vocabulary size, fewer masks or targets than rows, gradient coefficients of the wrong length;
/// an empty batch is an empty result on both.
fn bad_input(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    let (rows, vocab) = (3usize, 70usize);
    let mut rng = SplitMix::new(3);
    let host: Vec<f32> = (0..rows * vocab)
        .map(|_| rng.next_normal() as f32)
        .collect();
    let dev = gpu.upload(HostData::F32(&host), &[rows, vocab])?;
    let cpu = Cpu.upload(HostData::F32(&host), &[rows, vocab])?;
    let m = vec![u32::MAX; 3];
    let masks = [m.as_slice(); 3];
    let ok_t = [1u32, 2, 69];
    let gs = [1.0f32; 3];
    let mut failures = Vec::new();
    let lp = |t: &[u32], ms: &[&[u32]]| {
        both_fail(
            gpu.masked_logprobs(&dev, ms, t),
            Cpu.masked_logprobs(&cpu, ms, t),
        )
    };
    let dl = |t: &[u32], ms: &[&[u32]], g: &[f32], ge: &[f32]| {
        both_fail(
            gpu.masked_dlogits(&dev, ms, t, g, ge),
            Cpu.masked_dlogits(&cpu, ms, t, g, ge),
        )
    };
    let cases = [
        ("log-probs: target = V", lp(&[1, 70, 2], &masks)),
        ("log-probs: 2 masks for 3 rows", lp(&ok_t, &masks[..2])),
        ("log-probs: 4 targets for 3 rows", lp(&[1, 2, 3, 4], &masks)),
        ("dlogits: target = V", dl(&[70, 1, 2], &masks, &gs, &gs)),
        ("dlogits: 2 masks", dl(&ok_t, &masks[..2], &gs, &gs)),
        (
            "dlogits: 2 log-prob gradients",
            dl(&ok_t, &masks, &gs[..2], &gs),
        ),
        (
            "dlogits: 4 entropy gradients",
            dl(&ok_t, &masks, &gs, &[0.0; 4]),
        ),
    ];
    for (name, failed) in cases {
        if !failed {
            failures.push(format!("{name}: not an error on both"));
        }
    }
    // The valid call next to them succeeds on both, so the errors above are the inputs'.
    if gpu.masked_logprobs(&dev, &masks, &ok_t).is_err()
        || Cpu.masked_logprobs(&cpu, &masks, &ok_t).is_err()
    {
        failures.push("the valid call failed".into());
    }
    let none = gpu.upload(HostData::F32(&[]), &[0, vocab])?;
    let (lp0, ent0) = gpu.masked_logprobs(&none, &[], &[])?;
    let none = Cpu.upload(HostData::F32(&[]), &[0, vocab])?;
    let (lp1, ent1) = Cpu.masked_logprobs(&none, &[], &[])?;
    if !(lp0.is_empty() && ent0.is_empty() && lp1.is_empty() && ent1.is_empty()) {
        failures.push("an empty batch is not empty".into());
    }
    c.push(
        "masked_logprobs/dlogits bad input is an error",
        failures.is_empty(),
        if failures.is_empty() {
            "7 bad inputs rejected by both backends; an empty batch is empty on both".into()
        } else {
            failures.join("; ")
        },
    );
    Ok(())
}

/// The forward copies the `[2c]` log-probabilities and entropies back; the backward copies
/// nothing (the logit gradients stay on the device for the head GEMMs).
fn transfers(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    let be = gpu.with_dtype(DType::BF16)?;
    let (vocab, rows) = (1057usize, 4usize);
    let mut rng = SplitMix::new(11);
    let host: Vec<f32> = (0..rows * vocab)
        .map(|_| round(rng.next_normal() as f32, DType::BF16))
        .collect();
    let dev = be.upload(HostData::F32(&host), &[rows, vocab])?;
    let mask = bits(vocab.div_ceil(32), |i| i % 3 == 1);
    let masks = vec![mask.as_slice(); rows];
    let targets = vec![1u32; rows];
    let before = gpu.d2h_transfers();
    be.masked_logprobs(&dev, &masks, &targets)?;
    let fwd = gpu.d2h_transfers().since(before);
    let before = gpu.d2h_transfers();
    let dl = be.masked_dlogits(&dev, &masks, &targets, &[1.0; 4], &[0.5; 4])?;
    let bwd = gpu.d2h_transfers().since(before);
    drop(dl);
    c.push(
        "device-to-host transfers per restricted call",
        fwd.count == 1 && fwd.bytes == 8 * rows as u64 && bwd.count == 0,
        format!(
            "log-probs: {} transfers, {} bytes (want 1, {}); dlogits: {} transfers (want 0)",
            fwd.count,
            fwd.bytes,
            8 * rows,
            bwd.count
        ),
    );
    Ok(())
}
