// Element-wise and gather/scatter kernels: fill, scale, axpy, residual add, casts, SwiGLU forward
// and backward, AdamW (fp32 moments; fp32 master weights for bf16), sum of squares, column sums,
// embedding forward/backward, KV-cache writes and rotary embedding (half-split layout). Each
// kernel is a grid-stride loop.
#include "common.cuh"

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)

template <typename T> __device__ void fill_impl(T* x, u64 n, float v) {
    T t = from_f32<T>(v);
    GRID_STRIDE(i, n) x[i] = t;
}
template <typename T> __device__ void scale_impl(T* x, u64 n, float s) {
    GRID_STRIDE(i, n) x[i] = from_f32<T>(to_f32(x[i]) * s);
}
template <typename T> __device__ void axpy_impl(T* y, const T* x, u64 n, float a) {
    GRID_STRIDE(i, n) y[i] = from_f32<T>(to_f32(y[i]) + a * to_f32(x[i]));
}
template <typename T> __device__ void add_impl(T* y, const T* x, u64 n) {
    GRID_STRIDE(i, n) y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i]));
}
template <typename T> __device__ void swiglu_impl(T* out, const T* gate, const T* up, u64 n) {
    GRID_STRIDE(i, n) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g / (1.f + expf(-g)) * to_f32(up[i]));
    }
}
template <typename T>
__device__ void swiglu_bwd_impl(T* dg, T* du, const T* gate, const T* up, const T* dout, u64 n) {
    GRID_STRIDE(i, n) {
        float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dout[i]);
        float sig = 1.f / (1.f + expf(-g));
        du[i] = from_f32<T>(d * g * sig);
        dg[i] = from_f32<T>(d * u * sig * (1.f + g * (1.f - sig)));
    }
}
// AdamW with decoupled weight decay; `step_size = lr / bc1`, `bc2_sqrt = sqrt(bc2)`.
template <typename T>
__device__ void adamw_impl(T* p, const float* g, float* m, float* v, u64 n, float beta1, float beta2,
                           float eps, float decay, float step_size, float bc2_sqrt) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.f - beta1) * gi;
        float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = from_f32<T>(to_f32(p[i]) * decay - step_size * mi / denom);
    }
}
// AdamW on an fp32 master copy of a bf16 weight: the update is applied to `master` (so updates
// below the bf16 resolution of the weight accumulate there) and the weight is its rounding. A
// master element that no longer rounds to the weight (the weight was reloaded or rolled back
// outside the optimizer) restarts from the weight.
extern "C" __global__ void adamw_master_bf16(bf16* p, float* master, const float* g, float* m, float* v, u64 n,
                                             float beta1, float beta2, float eps, float decay, float step_size,
                                             float bc2_sqrt) {
    GRID_STRIDE(i, n) {
        float w0 = master[i];
        if (from_f32<bf16>(w0).bits != p[i].bits) w0 = to_f32(p[i]);
        float gi = g[i];
        float mi = beta1 * m[i] + (1.f - beta1) * gi;
        float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        float w = w0 * decay - step_size * mi / denom;
        master[i] = w;
        p[i] = from_f32<bf16>(w);
    }
}
// One f64 partial sum of squares per block (the host adds them in order: deterministic).
template <typename T> __device__ void sum_squares_impl(const T* x, u64 n, double* partial) {
    __shared__ double s[32];
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)to_f32(x[i]);
        acc += v * v;
    }
    acc = warp_sum_d(acc);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) s[w] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int k = 0; k < (int)((blockDim.x + 31) >> 5); k++) t += s[k];
        partial[blockIdx.x] = t;
    }
}
// out[c] (+)= sum_r x[r, c]; one thread per column, rows in order (deterministic).
template <typename T> __device__ void sum_rows_impl(const T* x, T* out, u32 rows, u32 cols, int acc) {
    u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = acc ? to_f32(out[c]) : 0.f;
    for (u32 r = 0; r < rows; r++) s += to_f32(x[(u64)r * cols + c]);
    out[c] = from_f32<T>(s);
}
// out[t, :] = table[ids[t], :] (ids validated on the host).
template <typename T> __device__ void embedding_impl(T* out, const T* table, const u32* ids, u32 rows, u32 d) {
    GRID_STRIDE(i, (u64)rows * d) {
        u64 r = i / d, c = i % d;
        out[i] = table[(u64)ids[r] * d + c];
    }
}
// dtable[ids[t], :] += dx[t, :] (f32 table). One thread per column adds the tokens in order: no
// atomics, so the sums (and their rounding) are the same on every run and equal the CPU backend's.
template <typename T> __device__ void embedding_bwd_impl(float* dtable, const T* dx, const u32* ids, u32 rows, u32 d) {
    GRID_STRIDE(c, d) {
        for (u32 r = 0; r < rows; r++) dtable[(u64)ids[r] * d + c] += to_f32(dx[(u64)r * d + c]);
    }
}
// out[r, c] += bias[c].
template <typename T> __device__ void add_bias_impl(T* out, const T* bias, u32 rows, u32 cols) {
    GRID_STRIDE(i, (u64)rows * cols) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % cols]));
}
// cache[slots[t], pos[t], :] = src[t, :].
template <typename T>
__device__ void kv_write_impl(T* cache, const T* src, const u32* slots, const u32* pos, u32 rows, u32 max_seq, u32 f) {
    GRID_STRIDE(i, (u64)rows * f) {
        u64 r = i / f, c = i % f;
        cache[((u64)slots[r] * max_seq + pos[r]) * f + c] = src[i];
    }
}
// Rotary embedding in place on rows of `f` features, half-split layout; `sign` -1 for backward.
template <typename T>
__device__ void rope_impl(T* x, const u32* pos, u32 rows, u32 f, u32 head_dim, float theta, float sign) {
    u32 half = head_dim / 2;
    u32 pairs_per_row = f / 2;
    GRID_STRIDE(i, (u64)rows * pairs_per_row) {
        u64 r = i / pairs_per_row;
        u32 k = (u32)(i % pairs_per_row);
        u32 h = k / half, j = k % half;
        float w = (float)(1.0 / pow((double)theta, 2.0 * (double)j / (double)head_dim));
        float a = (float)pos[r] * w;
        float sn = sign * sinf(a), cs = cosf(a);
        T* row = x + r * f + (u64)h * head_dim;
        float x1 = to_f32(row[j]), x2 = to_f32(row[j + half]);
        row[j] = from_f32<T>(x1 * cs - x2 * sn);
        row[j + half] = from_f32<T>(x2 * cs + x1 * sn);
    }
}

extern "C" __global__ void cast_f32_bf16(bf16* out, const float* x, u64 n) {
    GRID_STRIDE(i, n) out[i] = from_f32<bf16>(x[i]);
}
extern "C" __global__ void cast_bf16_f32(float* out, const bf16* x, u64 n) {
    GRID_STRIDE(i, n) out[i] = to_f32(x[i]);
}

#define ELEMENTWISE(T, S)                                                                          \
    extern "C" __global__ void fill_##S(T* x, u64 n, float v) { fill_impl<T>(x, n, v); }           \
    extern "C" __global__ void scale_##S(T* x, u64 n, float s) { scale_impl<T>(x, n, s); }         \
    extern "C" __global__ void axpy_##S(T* y, const T* x, u64 n, float a) { axpy_impl<T>(y, x, n, a); } \
    extern "C" __global__ void add_assign_##S(T* y, const T* x, u64 n) { add_impl<T>(y, x, n); }   \
    extern "C" __global__ void swiglu_##S(T* o, const T* g, const T* u, u64 n) { swiglu_impl<T>(o, g, u, n); } \
    extern "C" __global__ void swiglu_backward_##S(T* dg, T* du, const T* g, const T* u, const T* d, u64 n) { \
        swiglu_bwd_impl<T>(dg, du, g, u, d, n);                                                    \
    }                                                                                              \
    extern "C" __global__ void adamw_##S(T* p, const float* g, float* m, float* v, u64 n, float b1, float b2, \
                                         float eps, float decay, float step_size, float bc2_sqrt) { \
        adamw_impl<T>(p, g, m, v, n, b1, b2, eps, decay, step_size, bc2_sqrt);                     \
    }                                                                                              \
    extern "C" __global__ void sum_squares_##S(const T* x, u64 n, double* partial) {               \
        sum_squares_impl<T>(x, n, partial);                                                        \
    }                                                                                              \
    extern "C" __global__ void sum_rows_##S(const T* x, T* out, u32 rows, u32 cols, int acc) {     \
        sum_rows_impl<T>(x, out, rows, cols, acc);                                                 \
    }                                                                                              \
    extern "C" __global__ void embedding_##S(T* o, const T* t, const u32* ids, u32 rows, u32 d) {  \
        embedding_impl<T>(o, t, ids, rows, d);                                                     \
    }                                                                                              \
    extern "C" __global__ void embedding_backward_##S(float* dt, const T* dx, const u32* ids, u32 rows, u32 d) { \
        embedding_bwd_impl<T>(dt, dx, ids, rows, d);                                               \
    }                                                                                              \
    extern "C" __global__ void add_bias_##S(T* o, const T* b, u32 rows, u32 cols) { add_bias_impl<T>(o, b, rows, cols); } \
    extern "C" __global__ void kv_write_##S(T* c, const T* s, const u32* sl, const u32* p, u32 rows, u32 m, u32 f) { \
        kv_write_impl<T>(c, s, sl, p, rows, m, f);                                                 \
    }                                                                                              \
    extern "C" __global__ void rope_##S(T* x, const u32* p, u32 rows, u32 f, u32 hd, float theta, float sign) { \
        rope_impl<T>(x, p, rows, f, hd, theta, sign);                                              \
    }

ELEMENTWISE(float, f32)
ELEMENTWISE(bf16, bf16)
