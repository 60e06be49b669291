// Tensor-core causal attention forward (FlashAttention-2 class, sm_80 and newer), bf16 inputs,
// f32 accumulation, head dims 64 and 128, packed variable-length sequences, grouped-query heads.
//
// * GQA packing: a block owns one kv head and 64 "M rows" of one sequence, an M row being a
//   (query row, query head of the group) pair, flattened as (row - seq_start) * G + head-in-group.
//   Every K/V tile loaded into shared memory thus serves all query heads of its group.
// * Each of the 4 warps owns 16 M rows. Q fragments are loaded once with ldmatrix and stay in
//   registers; S = Q K^T and O += P V are mma.sync.m16n8k16 (bf16 in, f32 accumulators); P never
//   leaves registers (the S accumulator layout is the A-fragment layout of the P V product).
// * K/V tiles stream through two shared-memory stages filled with cp.async (the next tile is in
//   flight while the current one is computed); 16-byte chunks are XOR-swizzled by row so that
//   ldmatrix reads are free of bank conflicts.
// * Causal: key tiles after the block's last query row are never loaded; the mask is applied only
//   on tiles that straddle the diagonal. Online softmax in base 2; the log-sum-exp (natural log)
//   of every (row, head) is saved for the backward.
// The host (src/engine/cuda/attention.rs) builds the tile list: (seq_start, seq_end, first M row).
#include "common.cuh"
#include "ptx.cuh"

#define AM_BM 64        // M rows per block (16 per warp)
#define AM_THREADS 128  // 4 warps

typedef unsigned short u16;

// A block's work: M rows [first, first + AM_BM) of the sequence [seq_start, seq_end).
struct MmaTile {
    u32 seq_start, seq_end, first;
};

// Keys per K/V tile: two stages of K and V plus the Q tile fill 48 KB of static shared memory at
// head dim 128 (16 + 2 * 2 * 8 KB) and 40 KB at 64.
template <int HD> struct AmCfg {
    static const int BN = HD == 128 ? 32 : 64;
};

// Element offset of (row, col) in a [rows][HD] bf16 tile whose 16-byte chunks are XOR-swizzled
// with the row (HD / 8 >= 8 chunks per row, so the swizzle stays inside the row).
template <int HD> __device__ __forceinline__ int am_swz(int row, int col) {
    return row * HD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// Issues the cp.async copies of BN key (and value) rows starting at `kt` into one stage; rows at
// or after `kend` are zero-filled (their source address stays in bounds).
template <int HD, int BN>
__device__ __forceinline__ void am_load_kv(u16* ks, u16* vs, const bf16* k, const bf16* v, u32 kt, u32 kend,
                                           u32 kvh, u32 kf) {
    const int CH = HD / 8;
    for (int c = threadIdx.x; c < BN * CH; c += AM_THREADS) {
        int r = c / CH, ch = c % CH;
        u32 j = kt + r;
        u64 off = j < kend ? (u64)j * kf + kvh * HD + ch * 8 : 0;
        u32 bytes = j < kend ? 16 : 0;
        cp_async_16(ks + am_swz<HD>(r, ch * 8), k + off, bytes);
        cp_async_16(vs + am_swz<HD>(r, ch * 8), v + off, bytes);
    }
}

// Issues the cp.async copies of the block's Q tile (M rows past the sequence zero-filled).
template <int HD>
__device__ __forceinline__ void am_load_q(u16* qs, const bf16* q, const MmaTile& tile, u32 n, u32 G, u32 kvh,
                                          u32 qf) {
    const int CH = HD / 8;
    for (int c = threadIdx.x; c < AM_BM * CH; c += AM_THREADS) {
        int m = c / CH, ch = c % CH;
        u32 idx = tile.first + m;
        u64 off = idx < n ? (u64)(tile.seq_start + idx / G) * qf + (kvh * G + idx % G) * HD + ch * 8 : 0;
        cp_async_16(qs + am_swz<HD>(m, ch * 8), q + off, idx < n ? 16 : 0);
    }
}

// s[NT][4] = Q K^T for this warp's 16 M rows and the stage's BN keys.
template <int HD, int BN>
__device__ __forceinline__ void am_qk(float s[][4], const u32 qa[][4], const u16* ks) {
    const int lane = threadIdx.x & 31;
    for (int nt = 0; nt < BN / 8; nt++)
        for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
    for (int kk = 0; kk < HD / 16; kk += 2) {
        for (int nt = 0; nt < BN / 8; nt++) {
            // Matrix j: keys 8 nt .. +7, features 8 (2 kk + j) .. +7 = b[0..1] of k-steps kk, kk+1.
            u32 b[4];
            ldmatrix_x4(b, ks + am_swz<HD>(nt * 8 + (lane & 7), (2 * kk + (lane >> 3)) * 8));
            mma_16816_bf16(s[nt], qa[kk], b);
            mma_16816_bf16(s[nt], qa[kk + 1], b + 2);
        }
    }
}

// o[HD / 8][4] += P V, P given as A fragments (one per 16 keys).
template <int HD, int BN>
__device__ __forceinline__ void am_pv(float o[][4], const u32 pa[][4], const u16* vs) {
    const int lane = threadIdx.x & 31;
    for (int kk = 0; kk < BN / 16; kk++) {
        for (int dt = 0; dt < HD / 8; dt += 2) {
            // Transposed matrix j: keys 16 kk + 8 (j & 1) .. +7, features 8 (dt + j / 2) .. +7.
            u32 b[4];
            int row = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            ldmatrix_x4_trans(b, vs + am_swz<HD>(row, (dt + (lane >> 4)) * 8));
            mma_16816_bf16(o[dt], pa[kk], b);
            mma_16816_bf16(o[dt + 1], pa[kk], b + 2);
        }
    }
}

// Online softmax over one tile of scores (already scaled to base 2 and masked): updates the row
// maxima m and partial sums l (this lane's share; the 4 lanes of a row are summed at the end),
// rescales o, and returns P as bf16 A fragments in pa.
template <int HD, int BN>
__device__ __forceinline__ void am_softmax(float s[][4], float m[2], float l[2], float o[][4], u32 pa[][4]) {
    float mx[2] = {m[0], m[1]};
    for (int nt = 0; nt < BN / 8; nt++)
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    float corr[2];
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL_MASK, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL_MASK, mx[i], 2));
        // The first key of the sequence is visible to every row, so mx is finite from tile 0 on.
        corr[i] = exp2f(m[i] - mx[i]);
        m[i] = mx[i];
        l[i] *= corr[i];
    }
    for (int dt = 0; dt < HD / 8; dt++)
        for (int e = 0; e < 4; e++) o[dt][e] *= corr[e >> 1];
    for (int nt = 0; nt < BN / 8; nt++) {
        float p[4];
        for (int e = 0; e < 4; e++) {
            p[e] = exp2f(s[nt][e] - mx[e >> 1]);
            l[e >> 1] += p[e];
        }
        // n-tile nt holds keys 8 nt .. +7: registers 0-1 (nt even) or 2-3 (odd) of k-step nt / 2.
        pa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(p[0], p[1]);
        pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(p[2], p[3]);
    }
}

template <int HD>
__device__ void attn_mma_fwd_impl(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                                  const MmaTile* tiles, u32 n_heads, u32 n_kv_heads, float scale) {
    const int BN = AmCfg<HD>::BN;
    __shared__ __attribute__((aligned(16))) u16 qs[AM_BM * HD];
    __shared__ __attribute__((aligned(16))) u16 ks[2][BN * HD];
    __shared__ __attribute__((aligned(16))) u16 vs[2][BN * HD];
    const MmaTile tile = tiles[blockIdx.x];
    const u32 kvh = blockIdx.y, G = n_heads / n_kv_heads;
    const u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    const u32 n = (tile.seq_end - tile.seq_start) * G;  // M rows of the sequence
    const u32 last = min(tile.first + AM_BM, n) - 1;    // the block's last valid M row
    const u32 row_lo = tile.seq_start + tile.first / G, row_hi = tile.seq_start + last / G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 n_kt = (row_hi - tile.seq_start) / BN + 1;  // later key tiles are fully masked

    am_load_q<HD>(qs, q, tile, n, G, kvh, qf);
    am_load_kv<HD, BN>(ks[0], vs[0], k, v, tile.seq_start, row_hi + 1, kvh, kf);
    cp_async_commit();

    u32 row[2];  // query rows of this lane's M rows g and g + 8 (rows past the end: the last row)
    for (int i = 0; i < 2; i++) row[i] = tile.seq_start + min(tile.first + warp * 16 + g + 8 * i, last) / G;
    float o[HD / 8][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    for (int dt = 0; dt < HD / 8; dt++)
        for (int e = 0; e < 4; e++) o[dt][e] = 0.f;
    u32 qa[HD / 16][4];
    const float sl2 = scale * 1.4426950408889634f;  // scale * log2(e)

    for (u32 it = 0; it < n_kt; it++) {
        const int st = it & 1;
        const u32 kt = tile.seq_start + it * BN;
        if (it + 1 < n_kt) {
            am_load_kv<HD, BN>(ks[st ^ 1], vs[st ^ 1], k, v, kt + BN, row_hi + 1, kvh, kf);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
            // Matrix j of x4: M rows 8 (j & 1) .. +7, features 8 (2 kk + j / 2) .. +7 = a[j].
            for (int kk = 0; kk < HD / 16; kk++)
                ldmatrix_x4(qa[kk], qs + am_swz<HD>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                    (2 * kk + (lane >> 4)) * 8));
        }
        float s[BN / 8][4];
        am_qk<HD, BN>(s, qa, ks[st]);
        const bool diag = kt + BN - 1 > row_lo;  // some key of the tile is after some row
        for (int nt = 0; nt < BN / 8; nt++)
            for (int e = 0; e < 4; e++) {
                u32 j = kt + nt * 8 + 2 * t + (e & 1);
                s[nt][e] = diag && j > row[e >> 1] ? NEG_INF : s[nt][e] * sl2;
            }
        u32 pa[BN / 16][4];
        am_softmax<HD, BN>(s, m, l, o, pa);
        am_pv<HD, BN>(o, pa, vs[st]);
        __syncthreads();  // the next iteration refills this stage
    }

    for (int i = 0; i < 2; i++) {
        float li = l[i];
        li += __shfl_xor_sync(FULL_MASK, li, 1);
        li += __shfl_xor_sync(FULL_MASK, li, 2);
        u32 idx = tile.first + warp * 16 + g + 8 * i;
        if (idx >= n) continue;
        u32 h = kvh * G + idx % G;
        u32* dst = (u32*)(out + (u64)row[i] * qf + h * HD + 2 * t);  // 4-byte aligned: 2 t, HD even
        float inv = 1.f / li;
        for (int dt = 0; dt < HD / 8; dt++) dst[dt * 4] = pack_bf16x2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
        if (t == 0) lse[(u64)row[i] * n_heads + h] = m[i] * 0.6931471805599453f + logf(li);
    }
}


// s[BN / 8][4] = A B^T for the warp's 16 rows of `as` (from row `arow`) and BN rows of `bs`, A
// fragments loaded from shared memory two k-steps at a time (the dK/dV kernel's K and V tiles).
template <int HD, int BN>
__device__ __forceinline__ void am_qk_smem(float s[][4], const u16* as, int arow, const u16* bs) {
    const int lane = threadIdx.x & 31;
    for (int nt = 0; nt < BN / 8; nt++)
        for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
    const int r = arow + (lane & 7) + ((lane >> 3) & 1) * 8;
    for (int kk = 0; kk < HD / 16; kk += 2) {
        u32 a0[4], a1[4];
        ldmatrix_x4(a0, as + am_swz<HD>(r, (2 * kk + (lane >> 4)) * 8));
        ldmatrix_x4(a1, as + am_swz<HD>(r, (2 * kk + 2 + (lane >> 4)) * 8));
        for (int nt = 0; nt < BN / 8; nt++) {
            u32 b[4];
            ldmatrix_x4(b, bs + am_swz<HD>(nt * 8 + (lane & 7), (2 * kk + (lane >> 3)) * 8));
            mma_16816_bf16(s[nt], a0, b);
            mma_16816_bf16(s[nt], a1, b + 2);
        }
    }
}

// Issues the cp.async copies of R rows [first, first + R) of a [rows][stride] matrix at column
// `col` into a swizzled tile; rows at or after `end` are zero-filled.
template <int HD, int R>
__device__ __forceinline__ void am_load_rows(u16* dst, const bf16* src, u32 first, u32 end, u32 col, u32 stride) {
    const int CH = HD / 8;
    for (int c = threadIdx.x; c < R * CH; c += AM_THREADS) {
        int r = c / CH, ch = c % CH;
        u32 j = first + r;
        u64 off = j < end ? (u64)j * stride + col + ch * 8 : 0;
        cp_async_16(dst + am_swz<HD>(r, ch * 8), src + off, j < end ? 16 : 0);
    }
}

// dQ = scale * dS K with dS = P (dP - D), P = exp(S - lse), dP = dO V^T, D = rowsum(dO O): the
// forward's grid and M-row tiles; Q and dO fragments stay in registers, K/V tiles stream through
// two cp.async stages (the second first holds the Q and dO tiles).
template <int HD>
__device__ void attn_mma_bwd_dq_impl(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                     const float* lse, const float* dsum, bf16* dq, const MmaTile* tiles,
                                     u32 n_heads, u32 n_kv_heads, float scale) {
    const int BN = AmCfg<HD>::BN;
    const int ST = 2 * BN * HD, QD = 2 * AM_BM * HD;  // elements of a K + V stage, of Q + dO
    __shared__ __attribute__((aligned(16))) u16 sm[ST + (QD > ST ? QD : ST)];
    u16 *qs = sm + ST, *dos = sm + ST + AM_BM * HD;
    const MmaTile tile = tiles[blockIdx.x];
    const u32 kvh = blockIdx.y, G = n_heads / n_kv_heads;
    const u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    const u32 n = (tile.seq_end - tile.seq_start) * G;
    const u32 last = min(tile.first + AM_BM, n) - 1;
    const u32 row_lo = tile.seq_start + tile.first / G, row_hi = tile.seq_start + last / G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 n_kt = (row_hi - tile.seq_start) / BN + 1;

    am_load_q<HD>(qs, q, tile, n, G, kvh, qf);
    am_load_q<HD>(dos, dout, tile, n, G, kvh, qf);
    am_load_kv<HD, BN>(sm, sm + BN * HD, k, v, tile.seq_start, row_hi + 1, kvh, kf);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    u32 qa[HD / 16][4], da[HD / 16][4];
    for (int kk = 0; kk < HD / 16; kk++) {
        int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = (2 * kk + (lane >> 4)) * 8;
        ldmatrix_x4(qa[kk], qs + am_swz<HD>(r, c));
        ldmatrix_x4(da[kk], dos + am_swz<HD>(r, c));
    }
    __syncthreads();  // stage 1 (holding Q and dO) may be refilled now

    u32 row[2], hh[2];
    float lse2[2], dd[2];
    const float L2E = 1.4426950408889634f, sl2 = scale * L2E;
    for (int i = 0; i < 2; i++) {
        u32 idx = min(tile.first + warp * 16 + g + 8 * i, last);
        row[i] = tile.seq_start + idx / G;
        hh[i] = kvh * G + idx % G;
        lse2[i] = lse[(u64)row[i] * n_heads + hh[i]] * L2E;
        dd[i] = dsum[(u64)row[i] * n_heads + hh[i]];
    }
    float acc[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++)
        for (int e = 0; e < 4; e++) acc[dt][e] = 0.f;

    for (u32 it = 0; it < n_kt; it++) {
        u16* cur = sm + (it & 1) * ST;  // K then V of this tile
        u16* next = sm + ((it + 1) & 1) * ST;
        const u32 kt = tile.seq_start + it * BN;
        if (it + 1 < n_kt) {
            am_load_kv<HD, BN>(next, next + BN * HD, k, v, kt + BN, row_hi + 1, kvh, kf);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[BN / 8][4], dp[BN / 8][4];
        am_qk<HD, BN>(s, qa, cur);
        am_qk<HD, BN>(dp, da, cur + BN * HD);
        const bool diag = kt + BN - 1 > row_lo;
        u32 dsa[BN / 16][4];
        for (int nt = 0; nt < BN / 8; nt++) {
            float ds[4];
            for (int e = 0; e < 4; e++) {
                u32 j = kt + nt * 8 + 2 * t + (e & 1);
                float p = diag && j > row[e >> 1] ? 0.f : exp2f(s[nt][e] * sl2 - lse2[e >> 1]);
                ds[e] = p * (dp[nt][e] - dd[e >> 1]);
            }
            dsa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(ds[0], ds[1]);
            dsa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(ds[2], ds[3]);
        }
        am_pv<HD, BN>(acc, dsa, cur);  // dS K: K read like V (transposed fragments)
        __syncthreads();
    }
    for (int i = 0; i < 2; i++) {
        u32 idx = tile.first + warp * 16 + g + 8 * i;
        if (idx >= n) continue;
        u32* dst = (u32*)(dq + (u64)row[i] * qf + hh[i] * HD + 2 * t);
        for (int dt = 0; dt < HD / 8; dt++)
            dst[dt * 4] = pack_bf16x2(acc[dt][2 * i] * scale, acc[dt][2 * i + 1] * scale);
    }
}

// Query rows per dK/dV pipeline step: K, V (64 keys each) and two stages of Q and dO fill 48 KB
// at head dim 128 (32 + 2 * 2 * 4 KB), 32 KB at 64.
template <int HD> struct AmBwdCfg {
    static const int BQ = HD == 128 ? 16 : 32;
};

// dK = scale * dS^T Q and dV = P^T dO for a tile of 64 keys of one kv head (16 per warp, the
// accumulators in registers): every query head of the group and every query row of the sequence
// from the tile's first key on stream through two cp.async stages. Each key's sums are owned by
// one thread: no atomics, deterministic.
template <int HD>
__device__ void attn_mma_bwd_dkdv_impl(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                       const float* lse, const float* dsum, bf16* dk, bf16* dv,
                                       const MmaTile* tiles, u32 n_heads, u32 n_kv_heads, float scale) {
    const int BQ = AmBwdCfg<HD>::BQ;
    __shared__ __attribute__((aligned(16))) u16 ks[AM_BM * HD];
    __shared__ __attribute__((aligned(16))) u16 vs[AM_BM * HD];
    __shared__ __attribute__((aligned(16))) u16 qs[2][BQ * HD];
    __shared__ __attribute__((aligned(16))) u16 dos[2][BQ * HD];
    const MmaTile tile = tiles[blockIdx.x];  // first = the tile's first key
    const u32 kvh = blockIdx.y, G = n_heads / n_kv_heads;
    const u32 qf = n_heads * HD, kf = n_kv_heads * HD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 n_qt = (tile.seq_end - tile.first + BQ - 1) / BQ;  // query tiles per head
    const u32 steps = n_qt * G;

    am_load_rows<HD, AM_BM>(ks, k, tile.first, tile.seq_end, kvh * HD, kf);
    am_load_rows<HD, AM_BM>(vs, v, tile.first, tile.seq_end, kvh * HD, kf);
    am_load_rows<HD, BQ>(qs[0], q, tile.first, tile.seq_end, kvh * G * HD, qf);
    am_load_rows<HD, BQ>(dos[0], dout, tile.first, tile.seq_end, kvh * G * HD, qf);
    cp_async_commit();

    u32 key[2];
    for (int i = 0; i < 2; i++) key[i] = tile.first + warp * 16 + g + 8 * i;
    float ak[HD / 8][4], av[HD / 8][4];
    for (int dt = 0; dt < HD / 8; dt++)
        for (int e = 0; e < 4; e++) ak[dt][e] = av[dt][e] = 0.f;
    const float L2E = 1.4426950408889634f, sl2 = scale * L2E;

    for (u32 it = 0; it < steps; it++) {
        const int st = it & 1;
        const u32 h = kvh * G + it / n_qt, qt = tile.first + (it % n_qt) * BQ;
        if (it + 1 < steps) {
            u32 h1 = kvh * G + (it + 1) / n_qt, qt1 = tile.first + ((it + 1) % n_qt) * BQ;
            am_load_rows<HD, BQ>(qs[st ^ 1], q, qt1, tile.seq_end, h1 * HD, qf);
            am_load_rows<HD, BQ>(dos[st ^ 1], dout, qt1, tile.seq_end, h1 * HD, qf);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[BQ / 8][4], dp[BQ / 8][4];
        am_qk_smem<HD, BQ>(s, ks, warp * 16, qs[st]);    // S^T = K Q^T
        am_qk_smem<HD, BQ>(dp, vs, warp * 16, dos[st]);  // dP^T = V dO^T
        u32 pa[BQ / 16][4], dsa[BQ / 16][4];
        for (int nt = 0; nt < BQ / 8; nt++) {
            float p[4], ds[4];
            for (int e = 0; e < 4; e++) {
                u32 r = qt + nt * 8 + 2 * t + (e & 1);  // the query row of this column
                bool ok = r < tile.seq_end && key[e >> 1] <= r;
                u64 at = (u64)min(r, tile.seq_end - 1) * n_heads + h;
                p[e] = ok ? exp2f(s[nt][e] * sl2 - lse[at] * L2E) : 0.f;
                ds[e] = p[e] * (dp[nt][e] - (ok ? dsum[at] : 0.f));
            }
            pa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(p[0], p[1]);
            pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(p[2], p[3]);
            dsa[nt >> 1][(nt & 1) * 2] = pack_bf16x2(ds[0], ds[1]);
            dsa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16x2(ds[2], ds[3]);
        }
        am_pv<HD, BQ>(av, pa, dos[st]);  // dV += P^T dO
        am_pv<HD, BQ>(ak, dsa, qs[st]);  // dK += dS^T Q
        __syncthreads();
    }
    for (int i = 0; i < 2; i++) {
        if (key[i] >= tile.seq_end) continue;
        u32* dkp = (u32*)(dk + (u64)key[i] * kf + kvh * HD + 2 * t);
        u32* dvp = (u32*)(dv + (u64)key[i] * kf + kvh * HD + 2 * t);
        for (int dt = 0; dt < HD / 8; dt++) {
            dkp[dt * 4] = pack_bf16x2(ak[dt][2 * i] * scale, ak[dt][2 * i + 1] * scale);
            dvp[dt * 4] = pack_bf16x2(av[dt][2 * i], av[dt][2 * i + 1]);
        }
    }
}

#define ATTN_MMA(HD)                                                                                          \
    extern "C" __global__ void __launch_bounds__(AM_THREADS)                                                  \
        attn_mma_fwd_bf16_hd##HD(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,         \
                                 const MmaTile* tiles, u32 n_heads, u32 n_kv_heads, float scale) {           \
        attn_mma_fwd_impl<HD>(q, k, v, out, lse, tiles, n_heads, n_kv_heads, scale);                         \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(AM_THREADS)                                                  \
        attn_mma_bwd_dq_bf16_hd##HD(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,           \
                                    const float* lse, const float* dsum, bf16* dq, const MmaTile* tiles,      \
                                    u32 n_heads, u32 n_kv_heads, float scale) {                               \
        attn_mma_bwd_dq_impl<HD>(q, k, v, dout, lse, dsum, dq, tiles, n_heads, n_kv_heads, scale);           \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(AM_THREADS)                                                  \
        attn_mma_bwd_dkdv_bf16_hd##HD(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,         \
                                      const float* lse, const float* dsum, bf16* dk, bf16* dv,                \
                                      const MmaTile* tiles, u32 n_heads, u32 n_kv_heads, float scale) {       \
        attn_mma_bwd_dkdv_impl<HD>(q, k, v, dout, lse, dsum, dk, dv, tiles, n_heads, n_kv_heads, scale);     \
    }
ATTN_MMA(64)
ATTN_MMA(128)
