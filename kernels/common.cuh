// Shared helpers of the sorft kernels. Self-contained: no CUDA headers, so the same text compiles
// with nvcc and with NVRTC (build.rs and the runtime paste it in place of the #include line).
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

// bfloat16 as its raw bits; converted with bit manipulation (round to nearest even, NaN kept).
struct bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    u32 u = __float_as_uint(x);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    } else {
        u32 rounding = 0x7fffu + ((u >> 16) & 1u);
        r.bits = (unsigned short)((u + rounding) >> 16);
    }
    return r;
}

#define NEG_INF (__int_as_float(0xff800000))
#define WARP 32
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over a block of at most 1024 threads; `scratch` holds 32 floats. All threads get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.f;
    v = warp_sum(v);
    return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : NEG_INF;
    v = warp_max(v);
    return v;
}

// Online softmax state merge: (m, s) with s = sum exp(x - m).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) { m = m2; s = s2; return; }
    float mn = fmaxf(m, m2);
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

// Counter-based random numbers, bit-identical to src/engine/rng.rs.
__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ u64 random_u64(u64 seed, u64 stream, u64 counter) {
    return mix64(mix64(seed ^ mix64(stream)) ^ (counter * 0xD6E8FEB86659FD93ull));
}
__device__ __forceinline__ double uniform01(u64 seed, u64 stream, u64 counter) {
    return (double)(random_u64(seed, stream, counter) >> 11) * (1.0 / 9007199254740992.0);
}
