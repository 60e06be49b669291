// Log-probabilities under a distribution restricted to an allowed set of tokens (grammar-
// constrained RL rows; see src/train/restrict.rs): one 1024-thread block per row of logits
// [c, V], the row's allowed set a bitset (bit i%32 of word i/32), so the logits never leave the
// device.
//   masked_logprobs: logp_c(target) = z[target] - logsumexp_{b in A} z[b] and the restricted
//     entropy H_c = -sum_{b in A} pi_c(b) log pi_c(b); out [2c] = logp then entropy.
//   masked_dlogits: dL/dz for dL/dlogp_c = g[r], dL/dH_c = g[c + r]:
//     g (onehot - pi_c) - g_ent pi_c (log pi_c + H_c) on A, 0 elsewhere (rows with both
//     coefficients 0 are all zeros).
// Accumulation in f32 (the host reference accumulates in f64).
#include "common.cuh"

#define THREADS 1024

__device__ __forceinline__ bool in_set(const u32* m, u32 i) { return (m[i >> 5] >> (i & 31)) & 1u; }

// Block-wide log-sum-exp of the allowed logits of row z (-inf when none is allowed).
template <typename T>
__device__ float set_lse(const T* z, const u32* m, u32 v, float* scratch) {
    float lm = NEG_INF, ls = 0.f;
    for (u32 i = threadIdx.x; i < v; i += THREADS) {
        if (!in_set(m, i)) continue;
        float x = to_f32(z[i]);
        if (x == NEG_INF) continue;
        if (x > lm) { ls = ls * __expf(lm - x); lm = x; }
        ls += __expf(x - lm);
    }
    float gm = block_max(lm, scratch);
    float gs = block_sum(lm == NEG_INF ? 0.f : ls * __expf(lm - gm), scratch);
    return gm + logf(gs);
}

// Block-wide restricted entropy of row z given its allowed log-sum-exp.
template <typename T>
__device__ float set_entropy(const T* z, const u32* m, u32 v, float lse, float* scratch) {
    float h = 0.f;
    for (u32 i = threadIdx.x; i < v; i += THREADS) {
        if (!in_set(m, i)) continue;
        float x = to_f32(z[i]);
        if (x == NEG_INF) continue;  // p = 0: contributes 0, not -inf * 0
        float lp = x - lse;
        h -= lp * __expf(lp);
    }
    return block_sum(h, scratch);
}

template <typename T>
__device__ void logprobs_impl(const T* logits, const u32* masks, u32 words, const u32* targets, float* out, u32 v,
                              u32 c) {
    __shared__ float scratch[32];
    u32 r = blockIdx.x;
    const T* z = logits + (u64)r * v;
    const u32* m = masks + (u64)r * words;
    float lse = set_lse(z, m, v, scratch);
    float h = set_entropy(z, m, v, lse, scratch);
    if (threadIdx.x == 0) {
        out[r] = to_f32(z[targets[r]]) - lse;
        out[c + r] = h;
    }
}

template <typename T>
__device__ void dlogits_impl(const T* logits, const u32* masks, u32 words, const u32* targets, const float* g, T* dl,
                             u32 v, u32 c) {
    __shared__ float scratch[32];
    u32 r = blockIdx.x;
    const T* z = logits + (u64)r * v;
    const u32* m = masks + (u64)r * words;
    T* d = dl + (u64)r * v;
    float gl = g[r], ge = g[c + r];
    if (gl == 0.f && ge == 0.f) {
        for (u32 i = threadIdx.x; i < v; i += THREADS) d[i] = from_f32<T>(0.f);
        return;
    }
    float lse = set_lse(z, m, v, scratch);
    // The entropy costs a pass over the vocabulary: only when its gradient is wanted.
    float h = ge == 0.f ? 0.f : set_entropy(z, m, v, lse, scratch);
    u32 t = targets[r];
    for (u32 i = threadIdx.x; i < v; i += THREADS) {
        float x = to_f32(z[i]);
        float out = 0.f;
        if (in_set(m, i) && x != NEG_INF) {
            float lp = x - lse;
            float p = __expf(lp);
            out = -gl * p - ge * p * (lp + h);
        }
        if (i == t) out += gl;
        d[i] = from_f32<T>(out);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) masked_logprobs_f32(const float* z, const u32* m, u32 words,
                                                                          const u32* t, float* out, u32 v, u32 c) {
    logprobs_impl<float>(z, m, words, t, out, v, c);
}
extern "C" __global__ void __launch_bounds__(THREADS) masked_logprobs_bf16(const bf16* z, const u32* m, u32 words,
                                                                           const u32* t, float* out, u32 v, u32 c) {
    logprobs_impl<bf16>(z, m, words, t, out, v, c);
}
extern "C" __global__ void __launch_bounds__(THREADS) masked_dlogits_f32(const float* z, const u32* m, u32 words,
                                                                         const u32* t, const float* g, float* dl,
                                                                         u32 v, u32 c) {
    dlogits_impl<float>(z, m, words, t, g, dl, v, c);
}
extern "C" __global__ void __launch_bounds__(THREADS) masked_dlogits_bf16(const bf16* z, const u32* m, u32 words,
                                                                          const u32* t, const float* g, bf16* dl,
                                                                          u32 v, u32 c) {
    dlogits_impl<bf16>(z, m, words, t, g, dl, v, c);
}
