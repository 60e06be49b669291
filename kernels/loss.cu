// Token losses over vocabulary chunks. The host computes one chunk of logits [rows, V] at a time
// with a GEMM (never [tokens, V]); these kernels turn a chunk into per-token log-probability and
// entropy, or into the logits gradient of a loss with dL/dlogp and dL/dentropy coefficients.
// Also: row log-softmax, and the element-wise PPO clipped-surrogate + KL loss on token log-probs.
#include "common.cuh"

#define IGNORE 0xffffffffu

// Per-row max, sum exp(z - max), sum exp(z - max) * (z - max) over `v` logits.
__device__ void row_stats(const float* z, u32 v, float* scratch, float& m, float& s, float& sz) {
    float lm = NEG_INF;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) lm = fmaxf(lm, z[i]);
    m = block_max(lm, scratch);
    float ls = 0.f, lz = 0.f;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) {
        float d = z[i] - m;
        float e = __expf(d);
        ls += e;
        if (e > 0.f) lz += e * d;  // a -inf logit: exp(-inf) * -inf would be NaN; its term is 0
    }
    s = block_sum(ls, scratch);
    sz = block_sum(lz, scratch);
}

// logp[r] = z[target] - lse, entropy[r] = log s - E[z - m]; ignored rows get 0 and 0.
extern "C" __global__ void token_stats(const float* logits, const u32* targets, float* logp, float* entropy, u32 v) {
    __shared__ float scratch[32];
    u32 r = blockIdx.x;
    u32 t = targets[r];
    if (t == IGNORE) {
        if (threadIdx.x == 0) logp[r] = entropy[r] = 0.f;
        return;
    }
    const float* z = logits + (u64)r * v;
    float m, s, sz;
    row_stats(z, v, scratch, m, s, sz);
    if (threadIdx.x == 0) {
        float ls = logf(s);
        logp[r] = z[t] - (m + ls);
        entropy[r] = ls - sz / s;
    }
}

// dlogits = a (onehot - p) - b p (log p + H), written as T (may alias the f32 logits when T is f32).
template <typename T>
__device__ void token_grad_impl(const float* logits, T* dlogits, const u32* targets, const float* g_logp,
                                const float* g_ent, u32 v) {
    __shared__ float scratch[32];
    u32 r = blockIdx.x;
    u32 t = targets[r];
    const float* z = logits + (u64)r * v;
    T* dz = dlogits + (u64)r * v;
    if (t == IGNORE) {
        for (u32 i = threadIdx.x; i < v; i += blockDim.x) dz[i] = from_f32<T>(0.f);
        return;
    }
    float m, s, sz;
    row_stats(z, v, scratch, m, s, sz);
    float ls = logf(s);
    float h = ls - sz / s;
    float a = g_logp[r], b = g_ent[r];
    __syncthreads();
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) {
        float logp = z[i] - m - ls;
        float p = __expf(logp);
        float d = -a * p;
        if (b != 0.f && p > 0.f) d -= b * p * (logp + h);
        if (i == t) d += a;
        dz[i] = from_f32<T>(d);
    }
}
extern "C" __global__ void token_grad_f32(const float* z, float* dz, const u32* t, const float* a, const float* b, u32 v) {
    token_grad_impl<float>(z, dz, t, a, b, v);
}
extern "C" __global__ void token_grad_bf16(const float* z, bf16* dz, const u32* t, const float* a, const float* b, u32 v) {
    token_grad_impl<bf16>(z, dz, t, a, b, v);
}

template <typename T> __device__ void log_softmax_impl(const T* x, T* out, u32 v) {
    __shared__ float scratch[32];
    const T* z = x + (u64)blockIdx.x * v;
    T* o = out + (u64)blockIdx.x * v;
    float lm = NEG_INF;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) lm = fmaxf(lm, to_f32(z[i]));
    float m = block_max(lm, scratch);
    float ls = 0.f;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) ls += __expf(to_f32(z[i]) - m);
    float lse = m + logf(block_sum(ls, scratch));
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) o[i] = from_f32<T>(to_f32(z[i]) - lse);
}
extern "C" __global__ void log_softmax_f32(const float* x, float* o, u32 v) { log_softmax_impl<float>(x, o, v); }
extern "C" __global__ void log_softmax_bf16(const bf16* x, bf16* o, u32 v) { log_softmax_impl<bf16>(x, o, v); }

// PPO per token: ratio = exp(logp - old), surrogate = -min(ratio A, clip(ratio) A), KL (k3
// estimator) to the reference, loss = (surrogate + kl_coef * kl) * weight; g_logp = dloss/dlogp.
extern "C" __global__ void ppo_token_loss(const float* logp, const float* old_logp, const float* ref_logp,
                                          const float* adv, const float* weight, float* loss, float* g_logp,
                                          u32 n, float clip_eps, float kl_coef) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float w = weight[i];
    float ratio = __expf(logp[i] - old_logp[i]);
    float a = adv[i];
    float unclipped = ratio * a;
    float clipped = fminf(fmaxf(ratio, 1.f - clip_eps), 1.f + clip_eps) * a;
    float surr = -fminf(unclipped, clipped);
    float g = unclipped <= clipped ? -ratio * a : 0.f;  // gradient flows only through the unclipped term
    float dr = ref_logp[i] - logp[i];
    float kl = __expf(dr) - dr - 1.f;
    float gkl = -__expf(dr) + 1.f;
    loss[i] = (surr + kl_coef * kl) * w;
    g_logp[i] = (g + kl_coef * gkl) * w;
}
