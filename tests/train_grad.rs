//! Finite-difference checks of every backward operation and of the whole model's gradient.

mod train_util;

use sorft::engine::backend::{AttentionShape, IGNORE_TARGET};
use sorft::engine::rng::SplitMix;
use sorft::engine::{Backend, Cpu, DType, HostData, Tensor};
use sorft::train::backward::backward;
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::params::{model_params, model_params_mut};
use sorft::train::Grads;
use train_util::*;

fn up(v: &[f32], shape: &[usize]) -> Tensor<Cpu> {
    Cpu.upload(HostData::F32(v), shape).unwrap()
}

fn upu(v: &[u32]) -> Tensor<Cpu> {
    Cpu.upload(HostData::U32(v), &[v.len()]).unwrap()
}

fn host(t: &Tensor<Cpu>) -> Vec<f32> {
    Cpu.to_host_f32(t).unwrap()
}

fn dotv(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Checks `grad` against central differences of `f` along random directions (f64 loss).
fn check_directional(
    name: &str,
    x: &[f32],
    grad: &[f32],
    f: &dyn Fn(&[f32]) -> f64,
    eps: f32,
    rtol: f64,
    seed: u64,
) {
    check_directional_atol(name, x, grad, f, eps, rtol, 0.0, seed)
}

/// As [`check_directional`], with an absolute tolerance for the f32 rounding of the loss.
#[allow(clippy::too_many_arguments)]
fn check_directional_atol(
    name: &str,
    x: &[f32],
    grad: &[f32],
    f: &dyn Fn(&[f32]) -> f64,
    eps: f32,
    rtol: f64,
    atol: f64,
    seed: u64,
) {
    let mut r = SplitMix::new(seed);
    for trial in 0..3 {
        let u = randn(&mut r, x.len());
        let xp: Vec<f32> = x.iter().zip(&u).map(|(&a, &b)| a + eps * b).collect();
        let xm: Vec<f32> = x.iter().zip(&u).map(|(&a, &b)| a - eps * b).collect();
        let fd = (f(&xp) - f(&xm)) / (2.0 * eps as f64);
        let an = dotv(grad, &u);
        let scale = an.abs().max(fd.abs()).max(1e-3);
        assert!(
            (fd - an).abs() <= rtol * scale + atol,
            "{name} trial {trial}: finite difference {fd} vs analytic {an}"
        );
    }
}

#[test]
fn rms_norm_backward_matches_finite_differences() {
    let mut r = SplitMix::new(1);
    let (t, d) = (5, 12);
    let x = randn(&mut r, t * d);
    let w: Vec<f32> = randn(&mut r, d).iter().map(|v| 1.0 + 0.2 * v).collect();
    let dy = randn(&mut r, t * d);
    let loss = |x: &[f32], w: &[f32]| {
        let y = Cpu.rms_norm(&up(x, &[t, d]), &up(w, &[d]), 1e-6).unwrap();
        dotv(&host(&y), &dy)
    };
    let mut dw = Cpu.zeros(&[d], DType::F32).unwrap();
    let dx = Cpu
        .rms_norm_backward(
            &up(&x, &[t, d]),
            &up(&w, &[d]),
            &up(&dy, &[t, d]),
            1e-6,
            Some(&mut dw),
        )
        .unwrap();
    check_directional("rms dx", &x, &host(&dx), &|v| loss(v, &w), 1e-2, 2e-3, 2);
    check_directional("rms dw", &w, &host(&dw), &|v| loss(&x, v), 1e-2, 2e-3, 3);
}

#[test]
fn swiglu_and_rope_backward_match_finite_differences() {
    let mut r = SplitMix::new(4);
    let n = 40;
    let (g, u, dm) = (randn(&mut r, n), randn(&mut r, n), randn(&mut r, n));
    let loss =
        |g: &[f32], u: &[f32]| dotv(&host(&Cpu.swiglu(&up(g, &[n]), &up(u, &[n])).unwrap()), &dm);
    let (dg, du) = Cpu
        .swiglu_backward(&up(&g, &[n]), &up(&u, &[n]), &up(&dm, &[n]))
        .unwrap();
    check_directional("swiglu dg", &g, &host(&dg), &|v| loss(v, &u), 1e-2, 2e-3, 5);
    check_directional("swiglu du", &u, &host(&du), &|v| loss(&g, v), 1e-2, 2e-3, 6);

    let (t, f, hd) = (6, 16, 8);
    let x = randn(&mut r, t * f);
    let dy = randn(&mut r, t * f);
    let pos = upu(&[0, 1, 2, 7, 30, 3]);
    let loss = |x: &[f32]| {
        let mut y = up(x, &[t, f]);
        Cpu.rope(&mut y, &pos, hd, 10_000.0).unwrap();
        dotv(&host(&y), &dy)
    };
    let mut dx = up(&dy, &[t, f]);
    Cpu.rope_backward(&mut dx, &pos, hd, 10_000.0).unwrap();
    check_directional("rope", &x, &host(&dx), &loss, 1e-2, 2e-3, 7);
}

#[test]
fn packed_attention_matches_per_sequence_kv_cache_attention_and_its_backward_is_exact() {
    let mut r = SplitMix::new(8);
    let sh = AttentionShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 4,
        scale: 0.5,
    };
    let cu = [0u32, 3, 3, 8];
    let t = 8;
    let (qf, kf) = (16, 8);
    let q = randn(&mut r, t * qf);
    let k = randn(&mut r, t * kf);
    let v = randn(&mut r, t * kf);
    let dout = randn(&mut r, t * qf);
    let cut = upu(&cu);
    let run = |q: &[f32], k: &[f32], v: &[f32]| {
        Cpu.attention_train(
            &up(q, &[t, qf]),
            &up(k, &[t, kf]),
            &up(v, &[t, kf]),
            &cut,
            sh,
        )
        .unwrap()
    };
    // Forward: equal to the KV-cache attention of each sequence alone.
    let (out, lse) = run(&q, &k, &v);
    let out_h = host(&out);
    for &(s, e) in &[(0usize, 3usize), (3, 8)] {
        let n = e - s;
        let mut kc = Cpu.zeros(&[1, n, kf], DType::F32).unwrap();
        let mut vc = Cpu.zeros(&[1, n, kf], DType::F32).unwrap();
        let pos: Vec<u32> = (0..n as u32).collect();
        let slots = vec![0u32; n];
        Cpu.kv_write(
            &mut kc,
            &up(&k[s * kf..e * kf], &[n, kf]),
            &upu(&slots),
            &upu(&pos),
        )
        .unwrap();
        Cpu.kv_write(
            &mut vc,
            &up(&v[s * kf..e * kf], &[n, kf]),
            &upu(&slots),
            &upu(&pos),
        )
        .unwrap();
        let want = Cpu
            .attention(
                &up(&q[s * qf..e * qf], &[n, qf]),
                &kc,
                &vc,
                &upu(&slots),
                &upu(&pos),
                sh,
            )
            .unwrap();
        for (a, b) in out_h[s * qf..e * qf].iter().zip(host(&want)) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
    let (dq, dk, dv) = Cpu
        .attention_backward(
            &up(&q, &[t, qf]),
            &up(&k, &[t, kf]),
            &up(&v, &[t, kf]),
            &out,
            &lse,
            &up(&dout, &[t, qf]),
            &cut,
            sh,
        )
        .unwrap();
    let loss = |q: &[f32], k: &[f32], v: &[f32]| dotv(&host(&run(q, k, v).0), &dout);
    check_directional(
        "attn dq",
        &q,
        &host(&dq),
        &|x| loss(x, &k, &v),
        1e-2,
        3e-3,
        9,
    );
    check_directional(
        "attn dk",
        &k,
        &host(&dk),
        &|x| loss(&q, x, &v),
        1e-2,
        3e-3,
        10,
    );
    check_directional(
        "attn dv",
        &v,
        &host(&dv),
        &|x| loss(&q, &k, x),
        1e-2,
        3e-3,
        11,
    );
}

#[test]
fn chunked_token_loss_matches_log_softmax_and_finite_differences() {
    let mut r = SplitMix::new(12);
    let (t, d, v) = (7, 6, 11);
    let h = randn(&mut r, t * d);
    let w = randn(&mut r, v * d);
    let targets = [3u32, IGNORE_TARGET, 0, 10, 5, IGNORE_TARGET, 2];
    let tg = upu(&targets);
    let a = randn(&mut r, t);
    let b = randn(&mut r, t);
    // Forward against a plain log-softmax of full logits, for two chunk sizes.
    let logits = Cpu
        .linear(&up(&h, &[t, d]), &up(&w, &[v, d]), None)
        .unwrap();
    let lsm = host(&Cpu.log_softmax(&logits).unwrap());
    for chunk in [1, 3, 100] {
        let (lp, ent) = Cpu
            .token_logprobs(&up(&h, &[t, d]), &up(&w, &[v, d]), &tg, chunk)
            .unwrap();
        let (lp, ent) = (host(&lp), host(&ent));
        for i in 0..t {
            if targets[i] == IGNORE_TARGET {
                assert_eq!((lp[i], ent[i]), (0.0, 0.0));
                continue;
            }
            let row = &lsm[i * v..(i + 1) * v];
            assert!((lp[i] - row[targets[i] as usize]).abs() < 1e-5);
            let e: f32 = -row.iter().map(|&l| l.exp() * l).sum::<f32>();
            assert!((ent[i] - e).abs() < 1e-5, "{} vs {e}", ent[i]);
        }
    }
    let loss = |h: &[f32], w: &[f32]| {
        let (lp, ent) = Cpu
            .token_logprobs(&up(h, &[t, d]), &up(w, &[v, d]), &tg, 3)
            .unwrap();
        dotv(&host(&lp), &a) + dotv(&host(&ent), &b)
    };
    let mut dw = Cpu.zeros(&[v, d], DType::F32).unwrap();
    let dh = Cpu
        .token_logprobs_backward(
            &up(&h, &[t, d]),
            &up(&w, &[v, d]),
            &tg,
            &up(&a, &[t]),
            &up(&b, &[t]),
            3,
            Some(&mut dw),
        )
        .unwrap();
    check_directional("loss dh", &h, &host(&dh), &|x| loss(x, &w), 1e-2, 3e-3, 13);
    check_directional(
        "loss dhead",
        &w,
        &host(&dw),
        &|x| loss(&h, x),
        1e-2,
        3e-3,
        14,
    );
}

#[test]
fn matmul_transposes_sum_rows_and_embedding_backward_match_naive_loops() {
    let mut r = SplitMix::new(15);
    let (m, k, n) = (5, 7, 3);
    let a = randn(&mut r, m * k);
    let b = randn(&mut r, k * n);
    let naive = |a: &[f32], b: &[f32]| {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    };
    let want = naive(&a, &b);
    let tr = |x: &[f32], r: usize, c: usize| {
        let mut o = vec![0.0f32; r * c];
        for i in 0..r {
            for j in 0..c {
                o[j * r + i] = x[i * c + j];
            }
        }
        o
    };
    let (at, bt) = (tr(&a, m, k), tr(&b, k, n));
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let av = if ta {
            up(&at, &[k, m])
        } else {
            up(&a, &[m, k])
        };
        let bv = if tb {
            up(&bt, &[n, k])
        } else {
            up(&b, &[k, n])
        };
        let mut c = up(&vec![1.0; m * n], &[m, n]);
        Cpu.matmul(&av, ta, &bv, tb, &mut c, true).unwrap();
        for (x, y) in host(&c).iter().zip(&want) {
            assert!(
                (x - (y + 1.0)).abs() < 1e-4,
                "{ta} {tb}: {x} vs {}",
                y + 1.0
            );
        }
    }
    let mut bad = Cpu.zeros(&[m, m], DType::F32).unwrap();
    assert!(Cpu
        .matmul(
            &up(&a, &[m, k]),
            false,
            &up(&b, &[k, n]),
            false,
            &mut bad,
            false
        )
        .is_err());

    let mut s = up(&[1.0, 2.0, 3.0], &[3]);
    Cpu.sum_rows(&up(&b, &[k, n]), &mut s, true).unwrap();
    for (j, got) in host(&s).iter().enumerate() {
        let want = (j + 1) as f32 + (0..k).map(|p| b[p * n + j]).sum::<f32>();
        assert!((got - want).abs() < 1e-5);
    }

    let mut table = Cpu.zeros(&[4, 2], DType::F32).unwrap();
    Cpu.embedding_backward(
        &mut table,
        &upu(&[1, 3, 1]),
        &up(&[1., 2., 3., 4., 5., 6.], &[3, 2]),
    )
    .unwrap();
    assert_eq!(host(&table), vec![0., 0., 6., 8., 0., 0., 3., 4.]);
    assert!(Cpu
        .embedding_backward(&mut table, &upu(&[9]), &up(&[1., 2.], &[1, 2]))
        .is_err());
}

/// A batch of two sequences with partial masks.
fn batch() -> Batch {
    Batch::pack(&[
        Sequence {
            ids: vec![2, 5, 7, 11, 3, 9],
            mask: vec![0, 0, 1, 1, 1, 1],
            weight: 1.0,
        },
        Sequence {
            ids: vec![4, 8, 15, 16, 23],
            mask: vec![0, 1, 1, 0, 1],
            weight: 0.5,
        },
    ])
    .unwrap()
}

/// `L = sum_t a_t logp_t + b_t entropy_t` for fixed random `a`, `b`.
fn model_loss(
    model: &sorft::model::Model<Cpu>,
    batch: &Batch,
    a: &[f32],
    b: &[f32],
    temperature: f32,
) -> f64 {
    let opts = ForwardOptions {
        temperature,
        ..ForwardOptions::default()
    };
    let fwd = forward(model, None, batch, opts).unwrap();
    dotv(&host(&fwd.logp), a) + dotv(&host(&fwd.entropy), b)
}

fn whole_model_check(tied: bool, recompute: bool, temperature: f32, restrict: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut model = tiny_model(dir.path(), tied, 21);
    let mut batch = batch();
    if restrict {
        restrict_some(&mut batch, model.config.vocab_size);
    }
    let t = batch.len();
    let mut r = SplitMix::new(22);
    let a: Vec<f32> = batch.weights.iter().map(|&w| -w).collect();
    // The restricted check weighs log-probabilities only (the restricted entropy's gradient is
    // checked in `train::restrict`; with both, f32 rounding of the loss swamps some directions).
    let b: Vec<f32> = if restrict {
        vec![0.0; t]
    } else {
        randn(&mut r, t).iter().map(|x| 0.3 * x).collect()
    };
    let opts = ForwardOptions {
        recompute,
        chunk_rows: 3,
        temperature,
    };
    let fwd = forward(&model, None, &batch, opts).unwrap();
    let mut grads = Grads::new(&model, None).unwrap();
    backward(&model, None, fwd, &up(&a, &[t]), &up(&b, &[t]), &mut grads).unwrap();
    let gm = grads.full.as_ref().unwrap();
    let names: Vec<(String, Vec<f32>)> = model_params(gm)
        .into_iter()
        .map(|(n, g)| (n, host(g)))
        .collect();
    assert_eq!(names.len(), model_params(&model).len());
    for (i, (name, g)) in names.iter().enumerate() {
        assert!(g.iter().any(|&x| x != 0.0), "{name}: zero gradient");
        let x0 = host(model_params(&model)[i].1);
        let shape = model_params(&model)[i].1.shape().to_vec();
        let f = |v: &[f32]| {
            let mut m2 = sorft::model::Model::load(&Cpu, dir.path()).unwrap();
            *model_params_mut(&mut m2)[i].1 = up(v, &shape);
            model_loss(&m2, &batch, &a, &b, temperature)
        };
        // f32 forward: the loss (|L| ~ 30) rounds at ~2e-6, i.e. ~1e-3 on the difference quotient.
        check_directional_atol(name, &x0, g, &f, 2e-3, 1e-2, 2e-3, 100 + i as u64);
    }
    // The model itself is untouched by backward.
    let _ = &mut model;
}

#[test]
fn whole_model_gradient_matches_finite_differences_untied() {
    whole_model_check(false, false, 1.0, false);
}

#[test]
fn whole_model_gradient_matches_finite_differences_tied_with_recompute() {
    whole_model_check(true, true, 1.0, false);
}

/// RL rollouts sampled at a temperature train `softmax(logits / T)`: the gradient of that
/// distribution's log-probabilities and entropies (scaled head input, scaled `dh`).
#[test]
fn whole_model_gradient_matches_finite_differences_at_temperature() {
    whole_model_check(false, true, 0.7, false);
}

/// Restricts two rows of [`batch`] to small sets holding their targets (as constrained
/// decoding would) and one to a set holding all but one token.
fn restrict_some(batch: &mut Batch, vocab: usize) {
    use sorft::model::constraint::TokenSet;
    // Sequence 0 token 3 (target 11), sequence 1 token 4 (target 23), sequence 0 token 5 (9).
    batch
        .restrict(0, 3, TokenSet::from_fn(vocab, |i| [11, 4, 30].contains(&i)))
        .unwrap();
    batch
        .restrict(1, 4, TokenSet::from_fn(vocab, |i| i == 23 || i % 7 == 1))
        .unwrap();
    batch
        .restrict(0, 5, TokenSet::from_fn(vocab, |i| i != 2))
        .unwrap();
}

/// The renormalised log-probabilities RL uses on constrained tokens: exact gradients of
/// `logit_a - logsumexp over the allowed set`, through the head and the whole trunk, with the
/// untied head and at a rollout temperature.
#[test]
fn restricted_rows_gradient_matches_finite_differences() {
    whole_model_check(false, false, 0.7, true);
    whole_model_check(true, true, 1.0, true);
}

#[test]
fn restricted_log_probabilities_renormalise_on_the_allowed_set() {
    use sorft::model::constraint::TokenSet;
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), true, 41);
    let v = model.config.vocab_size;
    let lp = |b: &Batch| {
        host(
            &forward(&model, None, b, ForwardOptions::default())
                .unwrap()
                .logp,
        )
    };
    let full = lp(&batch());
    // Everything allowed: the full distribution. Only the target: probability 1.
    let mut all = batch();
    all.restrict(0, 3, TokenSet::from_fn(v, |_| true)).unwrap();
    let mut only = batch();
    only.restrict(0, 3, TokenSet::from_fn(v, |i| i == 11))
        .unwrap();
    // The restricted rows' entropy is the renormalised distribution's: the full one's with
    // everything allowed, 0 with one token, at most ln 3 with three.
    let ent = |b: &Batch| forward(&model, None, b, ForwardOptions::default()).unwrap();
    let full_ent = host(&ent(&batch()).entropy);
    assert!((ent(&all).restricted_entropy[0].1 - full_ent[2]).abs() < 1e-4);
    assert!(ent(&only).restricted_entropy[0].1.abs() < 1e-6);
    let mut three = batch();
    three
        .restrict(0, 3, TokenSet::from_fn(v, |i| [11, 4, 30].contains(&i)))
        .unwrap();
    let h3 = ent(&three).restricted_entropy;
    assert_eq!(h3[0].0, 2);
    assert!(h3[0].1 > 0.0 && h3[0].1 <= 3f32.ln() + 1e-6, "{h3:?}");
    let (a, o) = (lp(&all), lp(&only));
    assert!((a[2] - full[2]).abs() < 1e-5, "{} vs {}", a[2], full[2]);
    assert!(o[2].abs() < 1e-6, "{}", o[2]);
    // A subset: more probable than under the full distribution, other rows untouched.
    let mut some = batch();
    some.restrict(0, 3, TokenSet::from_fn(v, |i| i < 64))
        .unwrap();
    let s = lp(&some);
    assert!(s[2] > full[2] && s[2] < 0.0, "{} vs {}", s[2], full[2]);
    for r in (0..full.len()).filter(|&r| r != 2) {
        assert_eq!(s[r], full[r], "row {r}");
    }
    // Bad restrictions are errors: a target outside its set, no such token or sequence.
    let mut bad = batch();
    bad.restrict(0, 3, TokenSet::from_fn(v, |i| i == 12))
        .unwrap();
    let e = forward(&model, None, &bad, ForwardOptions::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("not in its allowed set"), "{e}");
    let mut b = batch();
    assert!(b.restrict(0, 6, TokenSet::from_fn(v, |_| true)).is_err());
    assert!(b.restrict(0, 0, TokenSet::from_fn(v, |_| true)).is_err());
    assert!(b.restrict(2, 1, TokenSet::from_fn(v, |_| true)).is_err());
    // A masked-out token (sequence 1 token 3 has mask 0) is left alone.
    b.restrict(1, 3, TokenSet::from_fn(v, |_| false)).unwrap();
    assert!(b.restricted.is_empty());
}

#[test]
fn training_temperature_gives_the_log_softmax_of_scaled_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), true, 31);
    let batch = batch();
    let at = |temperature: f32| {
        let opts = ForwardOptions {
            temperature,
            ..ForwardOptions::default()
        };
        let f = forward(&model, None, &batch, opts).unwrap();
        (host(&f.logp), host(&f.entropy))
    };
    let (lp1, _) = at(1.0);
    let (lp_half, ent_half) = at(0.5);
    let (_, ent2) = at(2.0);
    let mut sharper = 0;
    for (i, &w) in batch.weights.iter().enumerate() {
        if w == 0.0 {
            assert_eq!((lp_half[i], ent_half[i]), (0.0, 0.0));
            continue;
        }
        // Cooling makes every distribution sharper: lower entropy than at T = 2.
        assert!(
            ent_half[i] < ent2[i],
            "row {i}: {} vs {}",
            ent_half[i],
            ent2[i]
        );
        assert!(lp_half[i] <= 0.0 && lp_half[i].is_finite());
        if lp_half[i] != lp1[i] {
            sharper += 1;
        }
    }
    assert!(sharper > 0, "temperature changed nothing");
    // A non-positive temperature is refused with an error, not a panic or NaNs.
    let bad = ForwardOptions {
        temperature: 0.0,
        ..ForwardOptions::default()
    };
    let e = forward(&model, None, &batch, bad)
        .err()
        .expect("T = 0 refused");
    assert!(e.to_string().contains("temperature"), "{e}");
}

#[test]
fn recompute_gives_the_same_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), false, 5);
    let batch = batch();
    let t = batch.len();
    let a: Vec<f32> = batch.weights.iter().map(|&w| -w).collect();
    let zero = vec![0.0f32; t];
    let mut out = Vec::new();
    for recompute in [false, true] {
        let fwd = forward(
            &model,
            None,
            &batch,
            ForwardOptions {
                recompute,
                chunk_rows: 4,
                temperature: 1.0,
            },
        )
        .unwrap();
        let mut g = Grads::new(&model, None).unwrap();
        backward(&model, None, fwd, &up(&a, &[t]), &up(&zero, &[t]), &mut g).unwrap();
        out.push(g.named().iter().map(|(_, t)| host(t)).collect::<Vec<_>>());
    }
    assert_eq!(out[0], out[1]);
}

#[test]
fn accumulating_micro_batches_equals_one_packed_batch() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), true, 9);
    let seqs = [
        Sequence {
            ids: vec![2, 5, 7, 11, 3, 9],
            mask: vec![0, 0, 1, 1, 1, 1],
            weight: 1.0,
        },
        Sequence {
            ids: vec![4, 8, 15, 16, 23],
            mask: vec![0, 1, 1, 0, 1],
            weight: 2.0,
        },
    ];
    let grads_of = |batches: Vec<Batch>| {
        let n: usize = batches.iter().map(|b| b.trained_tokens()).sum();
        let mut g = Grads::new(&model, None).unwrap();
        for b in &batches {
            let fwd = forward(&model, None, b, ForwardOptions::default()).unwrap();
            let lg = sorft::train::loss::cross_entropy(&Cpu, &fwd, &b.weights, n as f64).unwrap();
            backward(&model, None, fwd, &lg.g_logp, &lg.g_entropy, &mut g).unwrap();
        }
        g.named().iter().map(|(_, t)| host(t)).collect::<Vec<_>>()
    };
    let one = grads_of(vec![Batch::pack(&seqs).unwrap()]);
    let two = grads_of(vec![
        Batch::pack(&seqs[..1]).unwrap(),
        Batch::pack(&seqs[1..]).unwrap(),
    ]);
    for (a, b) in one.iter().zip(&two) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{x} vs {y}");
        }
    }
}
