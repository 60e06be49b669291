// Test kernels for the device helpers of kernels/ptx.cuh (compiled only for the tests: on the
// software GPU by scripts/softgpu.sh into ptx_test, with nvcc by scripts/check-kernels.sh). Each
// kernel runs one warp and writes what every lane holds, so the host (ptx_test_main.cpp) checks
// the fragments lane by lane against plain matrix products.
#include "common.cuh"
#include "ptx.cuh"

typedef unsigned short u16;

__device__ __forceinline__ u32 pack2(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }

// mma from fragments built in registers from the documented layout: a is 16x16 row-major, b is
// 16x8 with b[k * 8 + n], c is 16x8 row-major; frag[lane * 4 + i] = d[i].
extern "C" __global__ void ptx_mma_regs(const u16* a, const u16* b, const float* c, float* frag, int bf) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    u32 ar[4], br[2];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        ar[i] = pack2(a[row * 16 + col], a[row * 16 + col + 1]);
    }
    for (int i = 0; i < 2; i++) {
        int k = 2 * t + 8 * i;
        br[i] = pack2(b[k * 8 + g], b[(k + 1) * 8 + g]);
    }
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    if (bf)
        mma_16816_bf16(d, ar, br);
    else
        mma_16816_f16(d, ar, br);
    for (int i = 0; i < 4; i++) frag[lane * 4 + i] = d[i];
}

// The tensor-core path of a real kernel: a (16x16 row-major) and b (16x8, b[k * 8 + n]) copied to
// shared memory with cp.async, fragments loaded with ldmatrix (A plain x4, B transposed x2),
// then mma; frag as above.
extern "C" __global__ void ptx_mma_smem(const u16* a, const u16* b, float* frag) {
    __shared__ __attribute__((aligned(16))) u16 as[16][24];  // padded rows: 48 bytes apart
    __shared__ __attribute__((aligned(16))) u16 bs[16][8];
    int lane = threadIdx.x & 31;
    // 16 rows x 2 chunks of 8 elements for A, 16 rows x 1 chunk for B: 48 copies of 16 bytes.
    for (int i = lane; i < 48; i += 32) {
        if (i < 32)
            cp_async_16(&as[i >> 1][8 * (i & 1)], a + (i >> 1) * 16 + 8 * (i & 1), 16);
        else
            cp_async_16(&bs[i - 32][0], b + (i - 32) * 8, 16);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    // Matrix j of x4: rows 8 (j & 1) .. +7, columns 8 (j >> 1) .. +7: a[0..3] of the A layout.
    int j = lane >> 3, r = lane & 7;
    u32 ar[4], br[2];
    ldmatrix_x4(ar, &as[8 * (j & 1) + r][8 * (j >> 1)]);
    // B is stored k-major; the transposed load of rows k = 8 j .. 8 j + 7 gives b[j].
    ldmatrix_x2_trans(br, &bs[8 * (j & 1) + r][0]);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma_16816_bf16(d, ar, br);
    for (int i = 0; i < 4; i++) frag[lane * 4 + i] = d[i];
}

// ldmatrix of four 8x8 matrices m[j][row][col] (row stride 8 elements, copied to shared memory
// with padded rows): out[((v * 32) + lane) * 4 + reg], v = 0..5 for x1, x2, x4, x1.trans,
// x2.trans, x4.trans (unused registers left 0).
extern "C" __global__ void ptx_ldmatrix(const u16* m, u32* out) {
    __shared__ __attribute__((aligned(16))) u16 ms[4][8][16];
    int lane = threadIdx.x & 31;
    // Written as 32-bit pairs: the software GPU's race check works on 4-byte words.
    for (int p = lane; p < 4 * 8 * 4; p += 32) {
        *(u32*)&ms[p / 32][(p / 4) % 8][2 * (p % 4)] = pack2(m[2 * p], m[2 * p + 1]);
        *(u32*)&ms[p / 32][(p / 4) % 8][8 + 2 * (p % 4)] = 0;
    }
    __syncthreads();
    const void* row = &ms[lane >> 3][lane & 7][0];
    u32 r[6][4] = {{0}};
    ldmatrix_x1(r[0], row);
    ldmatrix_x2(r[1], row);
    ldmatrix_x4(r[2], row);
    ldmatrix_x1_trans(r[3], row);
    ldmatrix_x2_trans(r[4], row);
    ldmatrix_x4_trans(r[5], row);
    for (int v = 0; v < 6; v++)
        for (int k = 0; k < 4; k++) out[(v * 32 + lane) * 4 + k] = r[v][k];
}

// cp.async groups: lane copies chunk `lane` (16 bytes, src-size 16 - lane % 17 > 0 zero-filled
// tail) in group 0 and chunk 32 + lane in group 1; after wait_group 1 the block reads group 0,
// after wait_group 0 group 1. out[0..1023] = the 64 chunks as 16 bytes each.
extern "C" __global__ void ptx_cp_async(const unsigned char* src, unsigned char* out, int early) {
    __shared__ __attribute__((aligned(16))) unsigned char s[64][16];
    int lane = threadIdx.x & 31;
    u32 n0 = 16 - (u32)(lane % 17);
    cp_async_16(s[lane], src + 16 * lane, n0);
    cp_async_commit();
    cp_async_16(s[32 + lane], src + 16 * (32 + lane), 16);
    cp_async_commit();
    if (early) {
        // Planted misuse: reads group 1 with no wait that covers it.
        __syncthreads();
        for (int i = 0; i < 16; i++) out[16 * (32 + lane) + i] = s[32 + (lane + 1) % 32][i];
    }
    cp_async_wait<1>();
    __syncthreads();
    for (int i = 0; i < 16; i++) out[16 * lane + i] = s[(lane + 1) % 32][i];
    cp_async_wait<0>();
    __syncthreads();
    for (int i = 0; i < 16; i++) out[16 * (32 + lane) + i] = s[32 + (lane + 1) % 32][i];
}

// shfl: out[lane] = value of lane (lane + 7) % 32, out[32 + lane] = value of lane ^ 5, where lane
// l's value is 1000 + 3 l.
extern "C" __global__ void ptx_shfl(u32* out) {
    int lane = threadIdx.x & 31;
    u32 v = 1000u + 3u * (u32)lane;
    out[lane] = shfl_idx(v, (lane + 7) % 32);
    out[32 + lane] = shfl_xor(v, 5);
}

// cvt.rn.bf16x2.f32: out[lane] = pack_bf16x2(in[2 lane], in[2 lane + 1]).
extern "C" __global__ void ptx_cvt_bf16x2(const float* in, u32* out) {
    int lane = threadIdx.x & 31;
    out[lane] = pack_bf16x2(in[2 * lane], in[2 * lane + 1]);
}
