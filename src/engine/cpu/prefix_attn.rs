//! Decode attention of sequences that share a prompt kept once in the KV cache: the rows of a
//! group read the prompt's keys and values together (each block of keys once from memory for all
//! of them), then each its own generated positions. Every output has the bits of attending the
//! row alone over a private copy of the prompt ([`super::attention::attend_row`]): the same dots,
//! the same softmax and the same weighted sum in the same order.

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::attention::softmax_weights;
use super::kv_rows::{axpy_rows, dot_rows, dot_rows_multi};
use crate::engine::backend::{AttentionShape, SharedPrefix};
use crate::engine::error::{EngineError, Result};

/// Value rows summed per pass over a group's queries (they stay in the L1 cache meanwhile).
const VALUE_BLOCK: usize = 32;

/// Rows whose positions `0..len` are read from slot `slot`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// The slot holding the shared positions.
    pub slot: usize,
    /// Shared positions.
    pub len: usize,
    /// Query rows of the step (each sees all `len` shared positions).
    pub rows: Vec<usize>,
}

/// The rows of a step that read a shared prefix, grouped by (slot, length); a row that holds the
/// prefix in its own slot joins the group of that slot. Rows in `skip` (prefill runs) must not
/// have a prefix. `slots` is the cache's slot count.
pub(crate) fn groups(
    prefix: &[Option<SharedPrefix>],
    sl: &[u32],
    ps: &[u32],
    skip: &[bool],
    slots: usize,
) -> Result<Vec<Group>> {
    let mut by_key: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (t, p) in prefix.iter().enumerate() {
        let Some(p) = p else { continue };
        if p.slot as usize >= slots {
            return Err(EngineError::Index {
                op: "attention",
                index: p.slot as usize,
                limit: slots,
            });
        }
        if skip[t] {
            return Err(EngineError::Shape {
                op: "attention",
                detail: format!("row {t} is part of a prefill but reads a shared prefix"),
            });
        }
        let len = (p.len as usize).min(ps[t] as usize + 1);
        by_key.entry((p.slot as usize, len)).or_default().push(t);
    }
    let keys: Vec<(usize, usize)> = by_key.keys().copied().collect();
    for (t, p) in prefix.iter().enumerate() {
        if p.is_some() || skip[t] {
            continue;
        }
        let own = sl[t] as usize;
        let seen = ps[t] as usize + 1;
        if let Some(&key) = keys.iter().find(|&&(s, len)| s == own && len <= seen) {
            by_key.entry(key).or_default().push(t);
        }
    }
    Ok(by_key
        .into_iter()
        .map(|((slot, len), mut rows)| {
            rows.sort_unstable();
            Group { slot, len, rows }
        })
        .collect())
}

/// The step's queries and the cache, as the attention kernels see them.
pub(crate) struct Cache<'a> {
    /// Queries `[rows, n_heads * head_dim]`.
    pub qs: &'a [f32],
    /// Keys `[slots, max_seq, n_kv_heads * head_dim]`.
    pub kc: &'a [f32],
    /// Values, laid out as the keys.
    pub vc: &'a [f32],
    /// Slot of each row.
    pub sl: &'a [u32],
    /// Position of each row.
    pub ps: &'a [u32],
    /// Positions per slot.
    pub max_seq: usize,
    /// Head layout.
    pub shape: AttentionShape,
}

/// Attention outputs `(row, head, values)` of every row of every group.
pub(crate) fn attend_groups(c: &Cache, groups: &[Group]) -> Vec<(usize, usize, Vec<f32>)> {
    let tasks: Vec<(usize, usize)> = (0..groups.len())
        .flat_map(|g| (0..c.shape.n_kv_heads).map(move |h| (g, h)))
        .collect();
    tasks
        .into_par_iter()
        .flat_map_iter(|(g, kvh)| attend_group(c, &groups[g], kvh))
        .collect()
}

/// One group's query heads of KV head `kvh`.
fn attend_group(c: &Cache, g: &Group, kvh: usize) -> Vec<(usize, usize, Vec<f32>)> {
    let sh = c.shape;
    let d = sh.head_dim;
    let per_kv = sh.n_heads / sh.n_kv_heads;
    let kf = sh.n_kv_heads * d;
    let qf = sh.n_heads * d;
    let queries: Vec<(usize, usize)> = g
        .rows
        .iter()
        .flat_map(|&r| (kvh * per_kv..(kvh + 1) * per_kv).map(move |h| (r, h)))
        .collect();
    let qv: Vec<&[f32]> = queries
        .iter()
        .map(|&(r, h)| &c.qs[r * qf + h * d..r * qf + (h + 1) * d])
        .collect();
    let shared = g.slot * c.max_seq * kf + kvh * d;
    // The generated positions of a row start after the shared ones, in its own slot.
    let own = |r: usize| (c.sl[r] as usize * c.max_seq + g.len) * kf + kvh * d;
    let mut scores = vec![Vec::new(); queries.len()];
    dot_rows_multi(&qv, c.kc, shared, kf, g.len, sh.scale, &mut scores);
    let mut inv = Vec::with_capacity(queries.len());
    for ((&(r, _), q), s) in queries.iter().zip(&qv).zip(scores.iter_mut()) {
        let n = c.ps[r] as usize + 1 - g.len;
        dot_rows(q, c.kc, own(r), kf, n, sh.scale, s);
        let (_, sum) = softmax_weights(s);
        inv.push(1.0 / sum);
    }
    let mut outs = vec![vec![0.0f32; d]; queries.len()];
    for j0 in (0..g.len).step_by(VALUE_BLOCK) {
        let j1 = (j0 + VALUE_BLOCK).min(g.len);
        for ((o, s), &inv) in outs.iter_mut().zip(&scores).zip(&inv) {
            axpy_rows(o, &s[j0..j1], inv, c.vc, shared + j0 * kf, kf);
        }
    }
    for (((o, s), &inv), &(r, _)) in outs.iter_mut().zip(&scores).zip(&inv).zip(&queries) {
        axpy_rows(o, &s[g.len..], inv, c.vc, own(r), kf);
    }
    queries
        .into_iter()
        .zip(outs)
        .map(|((r, h), o)| (r, h, o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::attention::{attention, attention_shared};
    use super::super::{tensor_f32, Cpu};
    use crate::engine::backend::{AttentionShape, HostData, SharedPrefix};
    use crate::engine::rng::SplitMix;
    use crate::engine::Backend;

    fn u32s(x: &[u32]) -> crate::engine::Tensor<Cpu> {
        Cpu.upload(HostData::U32(x), &[x.len()]).unwrap()
    }

    /// Rows reading a prompt kept in another slot give the bits of attending over a private copy
    /// of it; the slot holding the prompt joins their group; an unrelated row is untouched.
    #[test]
    fn shared_prefix_attention_has_the_bits_of_private_copies() {
        let (slots, m, d) = (5usize, 90usize, 64usize);
        let sh = AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: d,
            scale: 0.125,
        };
        let kf = sh.n_kv_heads * d;
        let mut r = SplitMix::new(3);
        let mut rnd =
            |n: usize| -> Vec<f32> { (0..n).map(|_| r.next_f64() as f32 - 0.5).collect() };
        let (mut k, mut v) = (rnd(slots * m * kf), rnd(slots * m * kf));
        let q = rnd(5 * sh.n_heads * d);
        // Slot 1 holds a 37-position prompt; slots 2, 3 and 4 read it there. Row 4 is slot 0.
        let len = 37;
        let sl = [1u32, 2, 3, 4, 0];
        let ps = [40u32, 37, 51, 44, 60];
        let sp = Some(SharedPrefix {
            slot: 1,
            len: len as u32,
        });
        let prefix = [None, sp, sp, sp, None];
        let shared = attention_shared(
            &tensor_f32(q.clone(), &[5, sh.n_heads * d]),
            &tensor_f32(k.clone(), &[slots, m, kf]),
            &tensor_f32(v.clone(), &[slots, m, kf]),
            &u32s(&sl),
            &u32s(&ps),
            &prefix,
            sh,
        )
        .unwrap();
        for s in 2..5 {
            let (src, dst) = (m * kf, s * m * kf);
            k.copy_within(src..src + len * kf, dst);
            v.copy_within(src..src + len * kf, dst);
        }
        let copied = attention(
            &tensor_f32(q, &[5, sh.n_heads * d]),
            &tensor_f32(k, &[slots, m, kf]),
            &tensor_f32(v, &[slots, m, kf]),
            &u32s(&sl),
            &u32s(&ps),
            sh,
        )
        .unwrap();
        let bits = |t: &crate::engine::Tensor<Cpu>| -> Vec<u32> {
            super::super::f32s(t, "test")
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&shared), bits(&copied));
    }
}
