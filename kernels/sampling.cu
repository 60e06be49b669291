// Fused temperature / top-k / top-p sampling over the full vocabulary, one 1024-thread block per
// row, without sorting the vocabulary:
//   pass 1: max, log-sum-exp and argmax of logits / T (greedy rows stop here);
//   untruncated rows: pass 2 is Gumbel-max with counter-based noise (exact distribution; the
//   host reference draws them the same way, rounding by rounding, so both pick the same token);
//   truncated rows: pass 2 builds a histogram of (max - x) in 1/32-nat bins (count and mass) and
//   collects the tokens within 12 nats of the max into shared memory. The histogram gives the
//   bin that holds the top-k / top-p boundary; if every token up to that bin was collected, the
//   candidates are sorted in shared memory (bitonic, at most 2048) and sampled by inverse CDF
//   exactly as the host reference does. Otherwise (very flat rows) a third pass collects the
//   tokens up to the boundary bin, and if they still do not fit, samples them by Gumbel-max (the
//   boundary then has bin resolution).
// Log-probabilities are those of the full temperature-scaled distribution.
// Masked variants (grammar-constrained decoding) take one bitset row per block (bit i%32 of word
// i/32 allows token i): disallowed tokens read as -inf in every pass, so the row is sampled
// exactly as the unmasked kernel samples the masked logits; pass 1 also keeps the full row's
// log-sum-exp, so the log-probability is the unconstrained one and the allowed set's log-mass
// (allowed LSE - full LSE) comes back beside it. A row that allows no finite logit returns id
// 0xffffffff.
#include "common.cuh"

#define THREADS 1024
#define NBINS 2048
#define BINS_PER_NAT 32.f
#define FLOOR_BIN 384  // 12 nats
#define CAP 2048

struct SampleParams {
    float temperature;
    float top_p;
    u32 top_k;
    u32 pad;
    u64 seed;
    u64 counter;
};

__device__ __forceinline__ bool before(float xa, u32 ia, float xb, u32 ib) {
    return xa > xb || (xa == xb && ia < ib);
}

// Block-wide arg-max of (key, id), lowest id on ties; every thread gets the result.
__device__ void block_argmax(float& key, u32& id, float* sk, u32* si) {
    for (int o = 16; o > 0; o >>= 1) {
        float k2 = __shfl_xor_sync(FULL_MASK, key, o);
        u32 i2 = __shfl_xor_sync(FULL_MASK, id, o);
        if (before(k2, i2, key, id)) { key = k2; id = i2; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { sk[w] = key; si[w] = id; }
    __syncthreads();
    key = sk[lane];
    id = si[lane];
    for (int o = 16; o > 0; o >>= 1) {
        float k2 = __shfl_xor_sync(FULL_MASK, key, o);
        u32 i2 = __shfl_xor_sync(FULL_MASK, id, o);
        if (before(k2, i2, key, id)) { key = k2; id = i2; }
    }
}

// Histogram bin of x (1/32 nat below the max m), clamped in float first: a float-to-int
// conversion of an out-of-range value saturates on the GPU but is undefined in C++.
__device__ __forceinline__ int bin_of(float m, float x) {
    float fb = (m - x) * BINS_PER_NAT;
    return fb < (float)(NBINS - 1) ? (int)fb : NBINS - 1;
}

__device__ __forceinline__ float gumbel(u64 seed, u32 i, u64 counter) {
    double u = uniform01(seed, (u64)i + 1, counter);
    if (u <= 0.0) u = 1e-300;
    return (float)(-log(-log(u)));
}

__device__ __forceinline__ bool allowed(const u32* mrow, u32 i) {
    return mrow == nullptr || ((mrow[i >> 5] >> (i & 31)) & 1u);
}

// x = z / T, or -inf where the row's mask (if any) disallows the token.
template <typename T>
__device__ __forceinline__ float scaled(const T* z, const u32* mrow, u32 i, float inv_t) {
    return allowed(mrow, i) ? __fmul_rn(to_f32(z[i]), inv_t) : NEG_INF;
}

template <typename T>
__device__ void sample_impl(const T* logits, const SampleParams* params, u32* out_id, float* out_logp, u32 v,
                            const u32* mask, u32 words, float* out_logmass) {
    __shared__ float scratch[32];
    __shared__ float sk[32];
    __shared__ u32 si[32];
    __shared__ float cz[CAP];
    __shared__ u32 cid[CAP];
    __shared__ u32 hcount[NBINS];
    __shared__ float hmass[NBINS];
    __shared__ u32 ncand;
    __shared__ int cutoff;

    const T* z = logits + (u64)blockIdx.x * v;
    const u32* mrow = mask ? mask + (u64)blockIdx.x * words : nullptr;
    SampleParams p = params[blockIdx.x];
    bool greedy = !(p.temperature > 0.f);
    float inv_t = greedy ? 1.f : 1.f / p.temperature;

    // pass 1: max, sum of exp, argmax of x = z / T (allowed tokens); with a mask, also the
    // max and sum of exp of the whole row (fm, fs)
    float lm = NEG_INF, ls = 0.f, bk = NEG_INF, fm = NEG_INF, fs = 0.f;
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < v; i += THREADS) {
        float raw = to_f32(z[i]) * inv_t;
        float x = allowed(mrow, i) ? raw : NEG_INF;
        if (x > lm) { ls = ls * __expf(lm - x); lm = x; }
        if (x != NEG_INF) ls += __expf(x - lm);  // masked tokens: exp(-inf - -inf) would be NaN
        if (before(x, i, bk, bi)) { bk = x; bi = i; }
        if (mrow) {
            if (raw > fm) { fs = fs * __expf(fm - raw); fm = raw; }
            if (raw != NEG_INF) fs += __expf(raw - fm);
        }
    }
    float m = block_max(lm, scratch);
    float s = block_sum(lm == NEG_INF ? 0.f : ls * __expf(lm - m), scratch);
    float lse = m + logf(s);
    block_argmax(bk, bi, sk, si);
    // lse_out: the log-probabilities' normaliser (the whole row's, masked or not)
    float lse_out = lse;
    if (mrow) {
        float gm = block_max(fm, scratch);
        float gs = block_sum(fm == NEG_INF ? 0.f : fs * __expf(fm - gm), scratch);
        lse_out = gm + logf(gs);
        if (threadIdx.x == 0) out_logmass[blockIdx.x] = lse - lse_out;
        if (!(m > NEG_INF)) {  // nothing allowed (or every allowed logit is -inf / NaN)
            if (threadIdx.x == 0) { out_id[blockIdx.x] = 0xffffffffu; out_logp[blockIdx.x] = NEG_INF; }
            return;
        }
    }
    if (greedy) {
        if (threadIdx.x == 0) { out_id[blockIdx.x] = bi; out_logp[blockIdx.x] = to_f32(z[bi]) - lse_out; }
        return;
    }
    bool top_k_on = p.top_k > 0 && p.top_k < v;
    bool top_p_on = p.top_p < 1.f;
    if (!top_k_on && !top_p_on) {
        float gk = NEG_INF;
        u32 gi = 0xffffffffu;
        for (u32 i = threadIdx.x; i < v; i += THREADS) {
            float x = scaled(z, mrow, i, inv_t);
            if (x == NEG_INF) continue;
            float key = __fadd_rn(x, gumbel(p.seed, i, p.counter));
            if (before(key, i, gk, gi)) { gk = key; gi = i; }
        }
        block_argmax(gk, gi, sk, si);
        if (gi == 0xffffffffu) gi = 0;  // no key is a number (an all -inf / NaN row)
        if (threadIdx.x == 0) { out_id[blockIdx.x] = gi; out_logp[blockIdx.x] = to_f32(z[gi]) * inv_t - lse_out; }
        return;
    }

    // pass 2: histogram + optimistic candidates
    for (int b = threadIdx.x; b < NBINS; b += THREADS) { hcount[b] = 0; hmass[b] = 0.f; }
    if (threadIdx.x == 0) ncand = 0;
    __syncthreads();
    for (u32 i = threadIdx.x; i < v; i += THREADS) {
        float x = scaled(z, mrow, i, inv_t);
        if (x == NEG_INF) continue;  // masked: never sampled
        int b = bin_of(m, x);
        atomicAdd(&hcount[b], 1u);
        atomicAdd(&hmass[b], __expf(x - m));
        if (b < FLOOR_BIN) {
            u32 at = atomicAdd(&ncand, 1u);
            if (at < CAP) { cz[at] = to_f32(z[i]); cid[at] = i; }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 k = top_k_on ? p.top_k : v;
        u32 cnt = 0;
        float mass = 0.f;
        int kbin = NBINS - 1;
        for (int b = 0; b < NBINS; b++) {
            cnt += hcount[b];
            mass += hmass[b];
            if (cnt >= k) { kbin = b; break; }
        }
        int pbin = kbin;
        if (top_p_on) {
            float target = p.top_p * mass, cum = 0.f;
            for (int b = 0; b <= kbin; b++) {
                cum += hmass[b];
                if (cum >= target) { pbin = b; break; }
            }
        }
        // With top-k, the candidates are the whole top-k set: the exact step below applies top-p
        // to it renormalised (cutting at the top-p bin here would apply top-p twice).
        cutoff = top_k_on ? kbin : pbin;
    }
    __syncthreads();
    u32 n = ncand;
    bool exact = n <= CAP && cutoff < FLOOR_BIN;
    float gk = NEG_INF;
    u32 gi = 0xffffffffu;
    if (!exact) {
        // pass 3: collect everything up to the boundary bin, Gumbel-max over it alongside
        __syncthreads();
        if (threadIdx.x == 0) ncand = 0;
        __syncthreads();
        for (u32 i = threadIdx.x; i < v; i += THREADS) {
            float x = scaled(z, mrow, i, inv_t);
            if (x == NEG_INF) continue;
            int b = bin_of(m, x);
            if (b <= cutoff) {
                u32 at = atomicAdd(&ncand, 1u);
                if (at < CAP) { cz[at] = to_f32(z[i]); cid[at] = i; }
                float key = __fadd_rn(x, gumbel(p.seed, i, p.counter));
                if (before(key, i, gk, gi)) { gk = key; gi = i; }
            }
        }
        block_argmax(gk, gi, sk, si);
        __syncthreads();
        n = ncand;
        if (n > CAP) {
            if (threadIdx.x == 0) { out_id[blockIdx.x] = gi; out_logp[blockIdx.x] = to_f32(z[gi]) * inv_t - lse_out; }
            return;
        }
    }
    // exact: bitonic sort of the n candidates (padded to a power of two), then inverse CDF
    u32 size = 1;
    while (size < n) size <<= 1;
    for (u32 i = n + threadIdx.x; i < size; i += THREADS) { cz[i] = NEG_INF; cid[i] = 0xffffffffu; }
    __syncthreads();
    for (u32 k = 2; k <= size; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 i = threadIdx.x; i < size; i += THREADS) {
                u32 l = i ^ j;
                if (l > i) {
                    bool first_before = before(cz[i], cid[i], cz[l], cid[l]);
                    bool want_first_before = (i & k) == 0;
                    if (first_before != want_first_before) {
                        float tz = cz[i]; cz[i] = cz[l]; cz[l] = tz;
                        u32 ti = cid[i]; cid[i] = cid[l]; cid[l] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        double dlse = (double)lse;
        u32 keep = top_k_on ? min(p.top_k, n) : n;
        double total = 0.0;
        if (top_k_on) {
            for (u32 i = 0; i < keep; i++) total += exp((double)cz[i] * (double)inv_t - dlse);
        } else {
            total = 1.0;
        }
        if (top_p_on) {
            double cum = 0.0;
            u32 kp = keep;
            for (u32 i = 0; i < keep; i++) {
                cum += exp((double)cz[i] * (double)inv_t - dlse) / total;
                if (cum >= (double)p.top_p) { kp = i + 1; break; }
            }
            keep = kp > 0 ? kp : 1;
            total = 0.0;
            for (u32 i = 0; i < keep; i++) total += exp((double)cz[i] * (double)inv_t - dlse);
        }
        double u = uniform01(p.seed, 0, p.counter);
        double cum = 0.0;
        u32 pick = cid[keep - 1];
        for (u32 i = 0; i < keep; i++) {
            cum += exp((double)cz[i] * (double)inv_t - dlse) / total;
            if (u < cum) { pick = cid[i]; break; }
        }
        out_id[blockIdx.x] = pick;
        out_logp[blockIdx.x] = to_f32(z[pick]) * inv_t - lse_out;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) sample_f32(const float* x, const SampleParams* p, u32* id, float* lp, u32 v) {
    sample_impl<float>(x, p, id, lp, v, nullptr, 0, nullptr);
}
extern "C" __global__ void __launch_bounds__(THREADS) sample_bf16(const bf16* x, const SampleParams* p, u32* id, float* lp, u32 v) {
    sample_impl<bf16>(x, p, id, lp, v, nullptr, 0, nullptr);
}
// mask [B, words] u32 bitsets; logmass [B]: the allowed set's log-mass at the temperature
extern "C" __global__ void __launch_bounds__(THREADS) sample_masked_f32(const float* x, const SampleParams* p, u32* id, float* lp, u32 v,
                                                                        const u32* mask, u32 words, float* logmass) {
    sample_impl<float>(x, p, id, lp, v, mask, words, logmass);
}
extern "C" __global__ void __launch_bounds__(THREADS) sample_masked_bf16(const bf16* x, const SampleParams* p, u32* id, float* lp, u32 v,
                                                                         const u32* mask, u32 words, float* logmass) {
    sample_impl<bf16>(x, p, id, lp, v, mask, words, logmass);
}
