//! Decode attention checks of `sorft selftest --attention`: cache attention (`Backend::attention`)
//! of rows of different lengths in one batch over a bf16 slot KV cache against the CPU backend.
//! On bf16 at head dim 64/128 this runs the GQA decode kernel of `kernels/decode.cu` (all query
//! heads of a group from one read of each K/V row, split-K with the merge of `attention.cu`).

use std::time::Instant;

use anyhow::Result;

use sorft::engine::backend::{AttentionShape, Backend, HostData};
use sorft::engine::rng::SplitMix;
use sorft::engine::{Cpu, Cuda, DType};

use super::{tolerance, Checks};

/// One decode batch: a row per entry of `lens`, each in its own cache slot, attending to
/// `len` cached positions.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeCase {
    /// Context length of each row (its position + 1).
    pub lens: Vec<u32>,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl DecodeCase {
    fn name(&self) -> String {
        format!(
            "decode hd{} h{}/{} lens {:?}",
            self.head_dim, self.n_heads, self.n_kv_heads, self.lens
        )
    }
}

/// The decode shapes: GQA 4:1 and 7:1 (and 1:1), lengths 1, 37, 700 and 4096 in one batch,
/// with and without split-K.
pub fn decode_cases() -> Vec<DecodeCase> {
    let c = |lens: &[u32], n_heads, n_kv_heads, head_dim| DecodeCase {
        lens: lens.to_vec(),
        n_heads,
        n_kv_heads,
        head_dim,
    };
    vec![
        c(&[1, 37, 700, 4096], 28, 4, 128),
        // Few (row, kv head) blocks: split-K (4 splits of 1024 on the software GPU's 4 SMs),
        // with splits past the end of the shorter row.
        c(&[4096, 700], 7, 1, 128),
        c(&[4096], 8, 2, 64),
        c(&[4096, 1, 700, 37], 8, 2, 64),
        c(&[37, 5], 2, 2, 128),
    ]
}

/// Checks one decode case (cache values ~ N(0, 1), queries scaled for logits of std 3).
pub fn check_decode(gpu: &Cuda, case: &DecodeCase, seed: u64, c: &mut Checks) -> Result<()> {
    let hd = case.head_dim;
    let sh = AttentionShape {
        n_heads: case.n_heads,
        n_kv_heads: case.n_kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let rows = case.lens.len();
    let max_seq = case.lens.iter().copied().max().unwrap_or(1) as usize;
    let (qf, kf) = (case.n_heads * hd, case.n_kv_heads * hd);
    let mut rng = SplitMix::new(seed ^ 0xdec0de);
    let mut vals = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| half::bf16::from_f32(rng.next_normal() as f32 * scale).to_f32())
            .collect()
    };
    let q = vals(rows * qf, 3.0);
    let k = vals(rows * max_seq * kf, 1.0);
    let v = vals(rows * max_seq * kf, 1.0);
    // Slots in reverse row order, so that a kernel mixing up rows and slots is caught.
    let slots: Vec<u32> = (0..rows as u32).rev().collect();
    let pos: Vec<u32> = case.lens.iter().map(|&l| l.max(1) - 1).collect();
    let cache = [rows, max_seq, kf];
    let q_g = gpu.upload(HostData::F32(&q), &[rows, qf])?;
    let k_g = gpu.upload(HostData::F32(&k), &cache)?;
    let v_g = gpu.upload(HostData::F32(&v), &cache)?;
    let s_g = gpu.upload(HostData::U32(&slots), &[rows])?;
    let p_g = gpu.upload(HostData::U32(&pos), &[rows])?;
    let q_c = Cpu.upload(HostData::F32(&q), &[rows, qf])?;
    let k_c = Cpu.upload(HostData::F32(&k), &cache)?;
    let v_c = Cpu.upload(HostData::F32(&v), &cache)?;
    let s_c = Cpu.upload(HostData::U32(&slots), &[rows])?;
    let p_c = Cpu.upload(HostData::U32(&pos), &[rows])?;
    let started = Instant::now();
    let o_g = gpu.attention(&q_g, &k_g, &v_g, &s_g, &p_g, sh)?;
    let got = gpu.to_host_f32(&o_g)?;
    let gpu_s = started.elapsed().as_secs_f64();
    let want = Cpu.to_host_f32(&Cpu.attention(&q_c, &k_c, &v_c, &s_c, &p_c, sh)?)?;
    let name = case.name();
    c.close(format!("{name} out"), &got, &want, tolerance(DType::BF16));
    println!("     {name}: gpu {gpu_s:.2} s");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_cases_cover_the_issue_groups_and_lengths() {
        let cs = decode_cases();
        for g in [4, 7] {
            assert!(
                cs.iter().any(|c| c.n_heads / c.n_kv_heads == g),
                "group {g}"
            );
        }
        for len in [1, 37, 700, 4096] {
            assert!(cs.iter().any(|c| c.lens.contains(&len)), "length {len}");
        }
        for hd in [64, 128] {
            assert!(cs.iter().any(|c| c.head_dim == hd), "hd {hd}");
        }
    }
}
