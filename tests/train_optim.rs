//! AdamW with global-norm clipping against torch.optim.AdamW + clip_grad_norm_ (fixture from
//! `scripts/train_optim_fixture.py`).

use sorft::engine::{Backend, Cpu, HostData, Tensor};
use sorft::train::optim::{AdamW, OptimConfig};

fn vecf(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn up(v: &[f32], shape: &[usize]) -> Tensor<Cpu> {
    Cpu.upload(HostData::F32(v), shape).unwrap()
}

#[test]
fn adamw_with_clipping_matches_pytorch() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/train/adamw.json"
    );
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut w = up(&vecf(&f["w"]), &[3, 4]);
    let mut b = up(&vecf(&f["b"]), &[4]);
    let cfg = OptimConfig {
        lr: 0.0,
        beta1: f["beta1"].as_f64().unwrap() as f32,
        beta2: f["beta2"].as_f64().unwrap() as f32,
        eps: f["eps"].as_f64().unwrap() as f32,
        weight_decay: f["weight_decay"].as_f64().unwrap() as f32,
        max_grad_norm: f["max_grad_norm"].as_f64().unwrap() as f32,
        ..OptimConfig::default()
    };
    let mut opt = AdamW::new(&Cpu, cfg, &[("w".into(), &w), ("b".into(), &b)]).unwrap();
    let lrs = vecf(&f["lrs"]);
    let norms = vecf(&f["norms"]);
    let gws = f["grads_w"].as_array().unwrap();
    let gbs = f["grads_b"].as_array().unwrap();
    let mut clipped = 0;
    for i in 0..lrs.len() {
        let mut gw = up(&vecf(&gws[i]), &[3, 4]);
        let mut gb = up(&vecf(&gbs[i]), &[4]);
        let st = opt
            .step_with_lr(
                &Cpu,
                vec![("w".into(), &mut w), ("b".into(), &mut b)],
                vec![("w".into(), &mut gw), ("b".into(), &mut gb)],
                lrs[i],
            )
            .unwrap();
        assert!((st.grad_norm as f32 - norms[i]).abs() < 1e-5 * norms[i]);
        clipped += st.clipped as usize;
    }
    assert!(
        clipped > 0 && clipped < lrs.len(),
        "the fixture exercises clipping both ways"
    );
    for (got, want) in [(&w, &f["final_w"]), (&b, &f["final_b"])] {
        for (a, e) in Cpu.to_host_f32(got).unwrap().iter().zip(vecf(want)) {
            assert!((a - e).abs() <= 1e-6 + 1e-5 * e.abs(), "{a} vs {e}");
        }
    }
}
