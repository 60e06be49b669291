// RMSNorm forward and backward. One block per row; the weight gradient is a second, column-wise
// pass over the saved per-row reciprocal RMS (deterministic, no atomics).
#include "common.cuh"

template <typename T>
__device__ void rms_norm_impl(T* out, const T* x, const T* w, u32 d, float eps) {
    __shared__ float scratch[32];
    const T* xr = x + (u64)blockIdx.x * d;
    T* orow = out + (u64)blockIdx.x * d;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        float v = to_f32(xr[i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / (float)d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) orow[i] = from_f32<T>(to_f32(xr[i]) * r * to_f32(w[i]));
}

// dx = dy*w*r - x * (sum(dy*w*x) * r^3 / d); saves r per row for the weight gradient.
template <typename T>
__device__ void rms_norm_bwd_impl(T* dx, float* rstd, const T* x, const T* w, const T* dy, u32 d, float eps) {
    __shared__ float scratch[32];
    u64 base = (u64)blockIdx.x * d;
    float ss = 0.f, c = 0.f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        float v = to_f32(x[base + i]);
        ss += v * v;
        c += to_f32(dy[base + i]) * to_f32(w[i]) * v;
    }
    ss = block_sum(ss, scratch);
    c = block_sum(c, scratch);
    float r = rsqrtf(ss / (float)d + eps);
    float k = c * r * r * r / (float)d;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x)
        dx[base + i] = from_f32<T>(to_f32(dy[base + i]) * to_f32(w[i]) * r - to_f32(x[base + i]) * k);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

// dw[i] += sum_t dy[t, i] * x[t, i] * rstd[t]; one thread per column, into an f32 gradient (never
// through a bf16 temporary, which would round the whole column sum).
template <typename T>
__device__ void rms_norm_dw_impl(float* dw, const T* x, const T* dy, const float* rstd, u32 rows, u32 d) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d) return;
    float s = 0.f;
    for (u32 t = 0; t < rows; t++) s += to_f32(dy[(u64)t * d + i]) * to_f32(x[(u64)t * d + i]) * rstd[t];
    dw[i] += s;
}

#define NORM(T, S)                                                                                 \
    extern "C" __global__ void rms_norm_##S(T* o, const T* x, const T* w, u32 d, float eps) {      \
        rms_norm_impl<T>(o, x, w, d, eps);                                                         \
    }                                                                                              \
    extern "C" __global__ void rms_norm_backward_##S(T* dx, float* r, const T* x, const T* w, const T* dy, u32 d, \
                                                     float eps) {                                  \
        rms_norm_bwd_impl<T>(dx, r, x, w, dy, d, eps);                                             \
    }                                                                                              \
    extern "C" __global__ void rms_norm_dweight_##S(float* dw, const T* x, const T* dy, const float* r, u32 rows, u32 d) { \
        rms_norm_dw_impl<T>(dw, x, dy, r, rows, d);                                                \
    }

NORM(float, f32)
NORM(bf16, bf16)
