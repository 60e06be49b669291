// Attention kernels, fp32 accumulation over f32 or bf16 inputs, head dims 16/32/64/128.
//
// * flash_fwd: causal attention over packed variable-length sequences (cu_seqlens), online softmax,
//   grouped-query heads, saves the log-sum-exp of every (row, head). A block owns a tile of query
//   rows of one sequence and one head (the host builds the tile list); keys stream through shared
//   memory 32 at a time, one key per lane.
// * flash_bwd_*: dQ, dK, dV from the saved log-sum-exp: a D = rowsum(dO * O) pass, a dQ kernel
//   shaped like the forward, and a dK/dV kernel with the roles of queries and keys swapped. No
//   atomics, so results are deterministic.
// * decode_*: attention of query rows over a slot KV cache up to each row's position, split along
//   the keys (split-K) for long contexts, then a combine pass.
#include "common.cuh"

#define BK 32  // keys (or queries in dK/dV) per shared-memory tile: one per lane

// A tile: (sequence start, sequence end, first row of the tile); rows of the tile are
// [first, min(first + rows_per_tile, end)).
struct Tile {
    u32 seq_start, seq_end, first;
};

template <int HD> struct Dims {
    static const int DPL = (HD + 31) / 32;  // features per lane
};

template <typename T, int HD, int RPW>
__device__ void flash_fwd_impl(const T* q, const T* k, const T* v, T* out, float* lse, const Tile* tiles,
                               u32 n_heads, u32 n_kv_heads, float scale) {
    const int DPL = Dims<HD>::DPL;
    const int BQ = 4 * RPW;
    __shared__ float qs[BQ][HD];
    __shared__ float ks[BK][HD + 1];
    __shared__ float vs[BK][HD];
    Tile tile = tiles[blockIdx.x];
    u32 h = blockIdx.y;
    u32 kvh = h / (n_heads / n_kv_heads);
    u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    u32 q_end = min(tile.first + BQ, tile.seq_end);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int i = threadIdx.x; i < BQ * HD; i += blockDim.x) {
        u32 r = tile.first + i / HD;
        qs[i / HD][i % HD] = r < q_end ? to_f32(q[(u64)r * qf + h * HD + i % HD]) : 0.f;
    }
    float m[RPW], l[RPW], acc[RPW][DPL];
    for (int r = 0; r < RPW; r++) {
        m[r] = NEG_INF;
        l[r] = 0.f;
        for (int c = 0; c < DPL; c++) acc[r][c] = 0.f;
    }
    for (u32 kt = tile.seq_start; kt < q_end; kt += BK) {
        __syncthreads();
        for (int i = threadIdx.x; i < BK * HD; i += blockDim.x) {
            u32 j = kt + i / HD;
            bool ok = j < q_end;
            ks[i / HD][i % HD] = ok ? to_f32(k[(u64)j * kf + kvh * HD + i % HD]) : 0.f;
            vs[i / HD][i % HD] = ok ? to_f32(v[(u64)j * kf + kvh * HD + i % HD]) : 0.f;
        }
        __syncthreads();
        for (int r = 0; r < RPW; r++) {
            int qi = warp * RPW + r;
            u32 row = tile.first + qi;
            if (row >= q_end) break;
            u32 j = kt + lane;
            bool valid = j <= row;
            float s = 0.f;
            if (valid) {
                for (int d = 0; d < HD; d++) s += qs[qi][d] * ks[lane][d];
                s *= scale;
            } else {
                s = NEG_INF;
            }
            float mt = warp_max(s);
            if (mt == NEG_INF) continue;
            float mn = fmaxf(m[r], mt);
            float p = valid ? __expf(s - mn) : 0.f;
            float corr = m[r] == NEG_INF ? 0.f : __expf(m[r] - mn);
            l[r] = l[r] * corr + warp_sum(p);
            for (int c = 0; c < DPL; c++) acc[r][c] *= corr;
            for (int jj = 0; jj < BK; jj++) {
                float pj = __shfl_sync(FULL_MASK, p, jj);
                for (int c = 0; c < DPL; c++) {
                    int d = lane + 32 * c;
                    if (d < HD) acc[r][c] += pj * vs[jj][d];
                }
            }
            m[r] = mn;
        }
    }
    for (int r = 0; r < RPW; r++) {
        u32 row = tile.first + warp * RPW + r;
        if (row >= q_end) break;
        float inv = 1.f / l[r];
        for (int c = 0; c < DPL; c++) {
            int d = lane + 32 * c;
            if (d < HD) out[(u64)row * qf + h * HD + d] = from_f32<T>(acc[r][c] * inv);
        }
        if (lane == 0) lse[(u64)row * n_heads + h] = m[r] + logf(l[r]);
    }
}

// D[t, h] = sum_d dout[t, h, d] * out[t, h, d]; one warp per (row, head).
template <typename T, int HD>
__device__ void flash_bwd_pre_impl(const T* out, const T* dout, float* dsum, u32 rows, u32 n_heads) {
    u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (u64)rows * n_heads) return;
    u64 base = w * HD;  // rows are [T, H * HD]: (t, h) is at (t * H + h) * HD
    float s = 0.f;
    for (int d = lane; d < HD; d += 32) s += to_f32(out[base + d]) * to_f32(dout[base + d]);
    s = warp_sum(s);
    if (lane == 0) dsum[w] = s;
}

template <typename T, int HD, int RPW>
__device__ void flash_bwd_dq_impl(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                  const float* dsum, T* dq, const Tile* tiles, u32 n_heads, u32 n_kv_heads,
                                  float scale) {
    const int DPL = Dims<HD>::DPL;
    const int BQ = 4 * RPW;
    __shared__ float qs[BQ][HD];
    __shared__ float dos[BQ][HD];
    __shared__ float ks[BK][HD + 1];
    __shared__ float vs[BK][HD + 1];
    Tile tile = tiles[blockIdx.x];
    u32 h = blockIdx.y;
    u32 kvh = h / (n_heads / n_kv_heads);
    u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    u32 q_end = min(tile.first + BQ, tile.seq_end);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < BQ * HD; i += blockDim.x) {
        u32 r = tile.first + i / HD;
        bool ok = r < q_end;
        qs[i / HD][i % HD] = ok ? to_f32(q[(u64)r * qf + h * HD + i % HD]) : 0.f;
        dos[i / HD][i % HD] = ok ? to_f32(dout[(u64)r * qf + h * HD + i % HD]) : 0.f;
    }
    float acc[RPW][DPL], li[RPW], di[RPW];
    for (int r = 0; r < RPW; r++) {
        u32 row = tile.first + warp * RPW + r;
        li[r] = row < q_end ? lse[(u64)row * n_heads + h] : 0.f;
        di[r] = row < q_end ? dsum[(u64)row * n_heads + h] : 0.f;
        for (int c = 0; c < DPL; c++) acc[r][c] = 0.f;
    }
    for (u32 kt = tile.seq_start; kt < q_end; kt += BK) {
        __syncthreads();
        for (int i = threadIdx.x; i < BK * HD; i += blockDim.x) {
            u32 j = kt + i / HD;
            bool ok = j < q_end;
            ks[i / HD][i % HD] = ok ? to_f32(k[(u64)j * kf + kvh * HD + i % HD]) : 0.f;
            vs[i / HD][i % HD] = ok ? to_f32(v[(u64)j * kf + kvh * HD + i % HD]) : 0.f;
        }
        __syncthreads();
        for (int r = 0; r < RPW; r++) {
            int qi = warp * RPW + r;
            u32 row = tile.first + qi;
            if (row >= q_end) break;
            u32 j = kt + lane;
            float ds = 0.f;
            if (j <= row) {
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < HD; d++) {
                    s += qs[qi][d] * ks[lane][d];
                    dp += dos[qi][d] * vs[lane][d];
                }
                float p = __expf(s * scale - li[r]);
                ds = p * (dp - di[r]) * scale;
            }
            for (int jj = 0; jj < BK; jj++) {
                float dsj = __shfl_sync(FULL_MASK, ds, jj);
                for (int c = 0; c < DPL; c++) {
                    int d = lane + 32 * c;
                    if (d < HD) acc[r][c] += dsj * ks[jj][d];
                }
            }
        }
    }
    for (int r = 0; r < RPW; r++) {
        u32 row = tile.first + warp * RPW + r;
        if (row >= q_end) break;
        for (int c = 0; c < DPL; c++) {
            int d = lane + 32 * c;
            if (d < HD) dq[(u64)row * qf + h * HD + d] = from_f32<T>(acc[r][c]);
        }
    }
}

// dK, dV for a tile of key rows of one kv head: every query head of the group, every query row
// of the sequence at or after the key.
template <typename T, int HD, int RPW>
__device__ void flash_bwd_dkdv_impl(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                    const float* dsum, T* dk, T* dv, const Tile* tiles, u32 n_heads,
                                    u32 n_kv_heads, float scale) {
    const int DPL = Dims<HD>::DPL;
    const int BKV = 4 * RPW;
    __shared__ float kw[BKV][HD];
    __shared__ float vw[BKV][HD];
    __shared__ float qs[BK][HD + 1];
    __shared__ float dos[BK][HD + 1];
    __shared__ float ls[BK], dss[BK];
    Tile tile = tiles[blockIdx.x];
    u32 g = blockIdx.y;
    u32 group = n_heads / n_kv_heads;
    u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    u32 k_end = min(tile.first + BKV, tile.seq_end);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < BKV * HD; i += blockDim.x) {
        u32 j = tile.first + i / HD;
        bool ok = j < k_end;
        kw[i / HD][i % HD] = ok ? to_f32(k[(u64)j * kf + g * HD + i % HD]) : 0.f;
        vw[i / HD][i % HD] = ok ? to_f32(v[(u64)j * kf + g * HD + i % HD]) : 0.f;
    }
    float dka[RPW][DPL], dva[RPW][DPL];
    for (int r = 0; r < RPW; r++)
        for (int c = 0; c < DPL; c++) dka[r][c] = dva[r][c] = 0.f;
    for (u32 hh = 0; hh < group; hh++) {
        u32 h = g * group + hh;
        for (u32 qt = tile.first; qt < tile.seq_end; qt += BK) {
            __syncthreads();
            for (int i = threadIdx.x; i < BK * HD; i += blockDim.x) {
                u32 r = qt + i / HD;
                bool ok = r < tile.seq_end;
                qs[i / HD][i % HD] = ok ? to_f32(q[(u64)r * qf + h * HD + i % HD]) : 0.f;
                dos[i / HD][i % HD] = ok ? to_f32(dout[(u64)r * qf + h * HD + i % HD]) : 0.f;
            }
            for (int i = threadIdx.x; i < BK; i += blockDim.x) {
                u32 r = qt + i;
                bool ok = r < tile.seq_end;
                ls[i] = ok ? lse[(u64)r * n_heads + h] : 0.f;
                dss[i] = ok ? dsum[(u64)r * n_heads + h] : 0.f;
            }
            __syncthreads();
            for (int r = 0; r < RPW; r++) {
                int kj = warp * RPW + r;
                u32 key = tile.first + kj;
                if (key >= k_end) break;
                u32 i = qt + lane;
                float p = 0.f, ds = 0.f;
                if (i < tile.seq_end && i >= key) {
                    float s = 0.f, dp = 0.f;
                    for (int d = 0; d < HD; d++) {
                        s += qs[lane][d] * kw[kj][d];
                        dp += dos[lane][d] * vw[kj][d];
                    }
                    p = __expf(s * scale - ls[lane]);
                    ds = p * (dp - dss[lane]) * scale;
                }
                for (int ii = 0; ii < BK; ii++) {
                    float pi = __shfl_sync(FULL_MASK, p, ii);
                    float dsi = __shfl_sync(FULL_MASK, ds, ii);
                    for (int c = 0; c < DPL; c++) {
                        int d = lane + 32 * c;
                        if (d < HD) {
                            dva[r][c] += pi * dos[ii][d];
                            dka[r][c] += dsi * qs[ii][d];
                        }
                    }
                }
            }
        }
    }
    for (int r = 0; r < RPW; r++) {
        u32 key = tile.first + warp * RPW + r;
        if (key >= k_end) break;
        for (int c = 0; c < DPL; c++) {
            int d = lane + 32 * c;
            if (d < HD) {
                dk[(u64)key * kf + g * HD + d] = from_f32<T>(dka[r][c]);
                dv[(u64)key * kf + g * HD + d] = from_f32<T>(dva[r][c]);
            }
        }
    }
}

// Split-K decode attention: block (row * H + head, split) attends to cache positions
// [split * chunk, min((split + 1) * chunk, pos + 1)) and writes an unnormalised partial
// (max, sum, acc[HD]) that decode_combine merges.
template <typename T, int HD>
__device__ void decode_partial_impl(const T* q, const T* kc, const T* vc, const u32* slots, const u32* pos,
                                    float* pm, float* pl, float* pacc, u32 n_heads, u32 n_kv_heads,
                                    u32 max_seq, u32 chunk, float scale) {
    const int DPL = Dims<HD>::DPL;
    __shared__ float qv[HD];
    __shared__ float wm[4], wl[4];
    __shared__ float wacc[4][HD];
    u32 rh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y;
    u32 row = rh / n_heads, h = rh % n_heads;
    u32 kvh = h / (n_heads / n_kv_heads);
    u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    u32 n = pos[row] + 1;
    u32 start = split * chunk, end = min(start + chunk, n);
    u64 cache_base = (u64)slots[row] * max_seq * kf + kvh * HD;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) qv[d] = to_f32(q[(u64)row * qf + h * HD + d]);
    __syncthreads();
    float m = NEG_INF, l = 0.f, acc[DPL];
    for (int c = 0; c < DPL; c++) acc[c] = 0.f;
    for (u32 base = start + warp * 32; base < end; base += 4 * 32) {
        u32 j = base + lane;
        float s = NEG_INF;
        if (j < end) {
            const T* kr = kc + cache_base + (u64)j * kf;
            float t = 0.f;
            for (int d = 0; d < HD; d++) t += qv[d] * to_f32(kr[d]);
            s = t * scale;
        }
        float mt = warp_max(s);
        float mn = fmaxf(m, mt);
        float p = j < end ? __expf(s - mn) : 0.f;
        float corr = m == NEG_INF ? 0.f : __expf(m - mn);
        l = l * corr + warp_sum(p);
        for (int c = 0; c < DPL; c++) acc[c] *= corr;
        u32 cnt = min(32u, end - base);
        for (u32 jj = 0; jj < cnt; jj++) {
            float pj = __shfl_sync(FULL_MASK, p, jj);
            const T* vr = vc + cache_base + (u64)(base + jj) * kf;
            for (int c = 0; c < DPL; c++) {
                int d = lane + 32 * c;
                if (d < HD) acc[c] += pj * to_f32(vr[d]);
            }
        }
        m = mn;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    for (int c = 0; c < DPL; c++) {
        int d = lane + 32 * c;
        if (d < HD) wacc[warp][d] = acc[c];
    }
    __syncthreads();
    if (warp == 0) {
        float mm = NEG_INF;
        for (int w = 0; w < 4; w++) mm = fmaxf(mm, wm[w]);
        float ll = 0.f;
        float f[4];
        for (int w = 0; w < 4; w++) {
            f[w] = wm[w] == NEG_INF ? 0.f : __expf(wm[w] - mm);
            ll += wl[w] * f[w];
        }
        u64 slot = (u64)rh * nsplit + split;
        for (int d = lane; d < HD; d += 32) {
            float a = 0.f;
            for (int w = 0; w < 4; w++) a += wacc[w][d] * f[w];
            pacc[slot * HD + d] = a;
        }
        if (lane == 0) {
            pm[slot] = mm;
            pl[slot] = ll;
        }
    }
}

// Merges the split partials of one (row, head): one warp each.
template <typename T, int HD>
__device__ void decode_combine_impl(const float* pm, const float* pl, const float* pacc, T* out, u32 rows_heads,
                                    u32 nsplit) {
    u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= rows_heads) return;
    float mm = NEG_INF;
    for (u32 s = 0; s < nsplit; s++) mm = fmaxf(mm, pm[w * nsplit + s]);
    float ll = 0.f;
    for (u32 s = 0; s < nsplit; s++) {
        float m = pm[w * nsplit + s];
        if (m != NEG_INF) ll += pl[w * nsplit + s] * __expf(m - mm);
    }
    float inv = 1.f / ll;
    for (int d = lane; d < HD; d += 32) {
        float a = 0.f;
        for (u32 s = 0; s < nsplit; s++) {
            float m = pm[w * nsplit + s];
            if (m != NEG_INF) a += pacc[(w * nsplit + s) * HD + d] * __expf(m - mm);
        }
        out[w * HD + d] = from_f32<T>(a * inv);
    }
}

#define ATTN(T, S, HD)                                                                             \
    extern "C" __global__ void __launch_bounds__(128) flash_fwd_##S##_hd##HD(                      \
        const T* q, const T* k, const T* v, T* out, float* lse, const Tile* tiles, u32 nh, u32 nkv, float scale) { \
        flash_fwd_impl<T, HD, 4>(q, k, v, out, lse, tiles, nh, nkv, scale);                        \
    }                                                                                              \
    extern "C" __global__ void flash_bwd_pre_##S##_hd##HD(const T* o, const T* d, float* ds, u32 rows, u32 nh) { \
        flash_bwd_pre_impl<T, HD>(o, d, ds, rows, nh);                                             \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_##S##_hd##HD(                   \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dsum, T* dq, \
        const Tile* tiles, u32 nh, u32 nkv, float scale) {                                         \
        flash_bwd_dq_impl<T, HD, 2>(q, k, v, dout, lse, dsum, dq, tiles, nh, nkv, scale);          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkdv_##S##_hd##HD(                 \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dsum, T* dk, T* dv, \
        const Tile* tiles, u32 nh, u32 nkv, float scale) {                                         \
        flash_bwd_dkdv_impl<T, HD, 2>(q, k, v, dout, lse, dsum, dk, dv, tiles, nh, nkv, scale);    \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) decode_partial_##S##_hd##HD(                 \
        const T* q, const T* kc, const T* vc, const u32* slots, const u32* pos, float* pm, float* pl, float* pacc, \
        u32 nh, u32 nkv, u32 max_seq, u32 chunk, float scale) {                                    \
        decode_partial_impl<T, HD>(q, kc, vc, slots, pos, pm, pl, pacc, nh, nkv, max_seq, chunk, scale); \
    }                                                                                              \
    extern "C" __global__ void decode_combine_##S##_hd##HD(const float* pm, const float* pl, const float* pacc, \
                                                           T* out, u32 rows_heads, u32 nsplit) {   \
        decode_combine_impl<T, HD>(pm, pl, pacc, out, rows_heads, nsplit);                         \
    }

#define ATTN_ALL(T, S) ATTN(T, S, 16) ATTN(T, S, 32) ATTN(T, S, 64) ATTN(T, S, 128)
ATTN_ALL(float, f32)
ATTN_ALL(bf16, bf16)
