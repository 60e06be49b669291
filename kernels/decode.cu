// GQA decode attention over a slot KV cache (bf16, head dims 64 and 128), issue 17.
//
// Block (row * n_kv_heads + kv head, split) computes ALL query heads of the GQA group (up to
// DG_MAX_GROUP) from one read of each K/V row of positions [split * chunk, min(.., pos + 1)):
// a key row of HD bf16 is read by HD / 8 threads with one 16-byte load each (8 bf16), so a warp
// covers 32 / (HD / 8) rows per step and the block's 4 warps 4x that. Each such row group keeps
// an online softmax (max, sum, acc) per query head in f32 registers; the block merges its row
// groups in shared memory and writes the same unnormalised split partials (max, sum, acc[HD]) as
// decode_partial of attention.cu, so decode_combine of attention.cu merges the splits.
#include "common.cuh"

#define DG_MAX_GROUP 8
#define DG_WARPS 4
#define DG_UNROLL 4

// 8 bf16 (16 bytes): one vector load.
struct alignas(16) Bf16x8 {
    u32 w[4];
};

__device__ __forceinline__ void dg_unpack(const Bf16x8& v, float* f) {
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(v.w[i] << 16);
        f[2 * i + 1] = __uint_as_float(v.w[i] & 0xffff0000u);
    }
}

// exp(a - b) with exp(-inf - x) = 0 (the first row of an online softmax).
__device__ __forceinline__ float dg_rescale(float a, float b) { return a == NEG_INF ? 0.f : __expf(a - b); }

template <int HD>
__device__ void decode_gqa_impl(const bf16* q, const bf16* kc, const bf16* vc, const u32* slots, const u32* pos,
                                float* pm, float* pl, float* pacc, u32 n_heads, u32 n_kv_heads, u32 max_seq,
                                u32 chunk, float scale) {
    const int TPR = HD / 8;             // threads per key row
    const int RPW = 32 / TPR;           // rows per warp and step
    const int NG = DG_WARPS * RPW;      // row groups per block
    __shared__ float sm[NG][DG_MAX_GROUP], sl[NG][DG_MAX_GROUP];
    __shared__ float sacc[NG][DG_MAX_GROUP][HD];
    u32 g = n_heads / n_kv_heads;
    u32 row = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    u32 split = blockIdx.y, nsplit = gridDim.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int sub = lane / TPR, part = lane % TPR;
    int grp = warp * RPW + sub;
    u32 n = pos[row] + 1;
    u32 start = split * chunk, end = min(start + chunk, n);
    u64 kf = (u64)n_kv_heads * HD;
    u64 base = (u64)slots[row] * max_seq * kf + kvh * HD + part * 8;
    float qr[DG_MAX_GROUP][8], m[DG_MAX_GROUP], l[DG_MAX_GROUP], acc[DG_MAX_GROUP][8];
    for (int h = 0; h < DG_MAX_GROUP; h++) {
        m[h] = NEG_INF;
        l[h] = 0.f;
        for (int c = 0; c < 8; c++) acc[h][c] = 0.f;
        if ((u32)h < g) {
            Bf16x8 v = *(const Bf16x8*)(q + ((u64)row * n_heads + kvh * g + h) * HD + part * 8);
            dg_unpack(v, qr[h]);
            for (int c = 0; c < 8; c++) qr[h][c] *= scale;
        } else {
            for (int c = 0; c < 8; c++) qr[h][c] = 0.f;
        }
    }
    // jb is uniform across the warp, so the shuffles below see every lane. DG_UNROLL rows per
    // row group and step: their 2 * DG_UNROLL 16-byte loads are in flight together.
    for (u32 jb = start + warp * RPW; jb < end; jb += NG * DG_UNROLL) {
        Bf16x8 kv[DG_UNROLL], vv[DG_UNROLL];
#pragma unroll
        for (int u = 0; u < DG_UNROLL; u++) {
            u32 j = jb + u * NG + sub;
            kv[u] = Bf16x8{};
            vv[u] = Bf16x8{};
            if (j < end) {
                kv[u] = *(const Bf16x8*)(kc + base + (u64)j * kf);
                vv[u] = *(const Bf16x8*)(vc + base + (u64)j * kf);
            }
        }
#pragma unroll
        for (int u = 0; u < DG_UNROLL; u++) {
            // A step past the end is skipped by the whole warp (jb is uniform).
            bool valid = jb + u * NG + sub < end;
            if (jb + u * NG >= end) continue;
            float kr[8], vr[8];
            dg_unpack(kv[u], kr);
            dg_unpack(vv[u], vr);
            for (int h = 0; h < DG_MAX_GROUP; h++) {
                if ((u32)h >= g) break;
                float s = 0.f;
                for (int c = 0; c < 8; c++) s += qr[h][c] * kr[c];
                for (int o = TPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
                if (valid) {
                    float mn = fmaxf(m[h], s);
                    float corr = dg_rescale(m[h], mn);
                    float p = __expf(s - mn);
                    l[h] = l[h] * corr + p;
                    for (int c = 0; c < 8; c++) acc[h][c] = acc[h][c] * corr + p * vr[c];
                    m[h] = mn;
                }
            }
        }
    }
    for (int h = 0; h < DG_MAX_GROUP; h++) {
        if ((u32)h >= g) break;
        if (part == 0) {
            sm[grp][h] = m[h];
            sl[grp][h] = l[h];
        }
        for (int c = 0; c < 8; c++) sacc[grp][h][part * 8 + c] = acc[h][c];
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < g * HD; i += blockDim.x) {
        u32 h = i / HD, d = i % HD;
        float mm = NEG_INF;
        for (int w = 0; w < NG; w++) mm = fmaxf(mm, sm[w][h]);
        float ll = 0.f, a = 0.f;
        for (int w = 0; w < NG; w++) {
            float f = dg_rescale(sm[w][h], mm);
            ll += sl[w][h] * f;
            a += sacc[w][h][d] * f;
        }
        u64 slot = ((u64)row * n_heads + kvh * g + h) * nsplit + split;
        pacc[slot * HD + d] = a;
        if (d == 0) {
            pm[slot] = mm;
            pl[slot] = ll;
        }
    }
}

#define DECODE_GQA(HD)                                                                                 \
    extern "C" __global__ void __launch_bounds__(DG_WARPS * 32) decode_gqa_bf16_hd##HD(                \
        const bf16* q, const bf16* kc, const bf16* vc, const u32* slots, const u32* pos, float* pm, float* pl, \
        float* pacc, u32 nh, u32 nkv, u32 max_seq, u32 chunk, float scale) {                           \
        decode_gqa_impl<HD>(q, kc, vc, slots, pos, pm, pl, pacc, nh, nkv, max_seq, chunk, scale);     \
    }

DECODE_GQA(64)
DECODE_GQA(128)
