// Fallback GEMM for machines without cuBLAS: C[m, n] = alpha * op(A) op(B) + beta * C, row-major,
// op = optional transpose, fp32 accumulation. 64x64 output tile per 256-thread block, 4x4 per thread,
// K in steps of 16 through shared memory. Simple and correct; cuBLAS is used when present.
#include "common.cuh"

#define TM 64
#define TN 64
#define TK 16

template <typename TA, typename TC>
__device__ void gemm_impl(const TA* a, const TA* b, TC* c, u32 m, u32 n, u32 k, u32 lda, u32 ldb, u32 ldc,
                          int trans_a, int trans_b, float alpha, float beta) {
    __shared__ float as[TK][TM + 1];
    __shared__ float bs[TK][TN + 1];
    u32 row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (u32 k0 = 0; k0 < k; k0 += TK) {
        for (int e = threadIdx.x; e < TK * TM; e += 256) {
            int kk = e / TM, i = e % TM;
            u32 r = row0 + i, kc = k0 + kk;
            float va = 0.f;
            if (r < m && kc < k) va = to_f32(trans_a ? a[(u64)kc * lda + r] : a[(u64)r * lda + kc]);
            as[kk][i] = va;
            u32 cc = col0 + i;
            float vb = 0.f;
            if (cc < n && kc < k) vb = to_f32(trans_b ? b[(u64)cc * ldb + kc] : b[(u64)kc * ldb + cc]);
            bs[kk][i] = vb;
        }
        __syncthreads();
        for (int kk = 0; kk < TK; kk++) {
            float ra[4], rb[4];
            for (int i = 0; i < 4; i++) ra[i] = as[kk][ty * 4 + i];
            for (int j = 0; j < 4; j++) rb[j] = bs[kk][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        u32 r = row0 + ty * 4 + i;
        if (r >= m) continue;
        for (int j = 0; j < 4; j++) {
            u32 cc = col0 + tx * 4 + j;
            if (cc >= n) continue;
            u64 at = (u64)r * ldc + cc;
            float prev = beta != 0.f ? to_f32(c[at]) * beta : 0.f;
            c[at] = from_f32<TC>(alpha * acc[i][j] + prev);
        }
    }
}

#define GEMM(TA, TC, S)                                                                            \
    extern "C" __global__ void __launch_bounds__(256) gemm_##S(const TA* a, const TA* b, TC* c, u32 m, u32 n, u32 k, \
                                                               u32 lda, u32 ldb, u32 ldc, int ta, int tb, float alpha, \
                                                               float beta) {                       \
        gemm_impl<TA, TC>(a, b, c, m, n, k, lda, ldb, ldc, ta, tb, alpha, beta);                   \
    }
GEMM(float, float, f32_f32)
GEMM(bf16, bf16, bf16_bf16)
GEMM(bf16, float, bf16_f32)
