// The software GPU's device-side shim: what a kernels/*.cu file needs to compile unchanged as host
// C++. Every thread of a block is a fiber of the runtime (runtime.cpp); the built-in variables and
// the synchronising intrinsics are calls into it. Shared memory is a function-local static in the
// section `sg_shared` (blocks run one after another, so one copy per kernel is exactly "one per
// block"); the runtime knows the section's bounds for the race and initialisation checks.
// Kernel files are compiled with -fsanitize=thread but linked without its runtime: the runtime
// implements the __tsan_* access callbacks itself and checks every global and shared access.
#pragma once

// kernels/ptx.cuh selects its PTX emulations with this.
#define SORFT_SOFTGPU 1

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

struct dim3 {
    unsigned x, y, z;
};

extern "C" {
dim3 sg_thread_idx(void);
dim3 sg_block_idx(void);
dim3 sg_block_dim(void);
dim3 sg_grid_dim(void);
void sg_syncthreads(void);
uint64_t sg_shfl(uint64_t v, int src_lane, unsigned mask);
unsigned sg_ballot(int pred, unsigned mask);
unsigned sg_atomic_add_u32(unsigned* p, unsigned v);
int sg_atomic_add_i32(int* p, int v);
unsigned long long sg_atomic_add_u64(unsigned long long* p, unsigned long long v);
float sg_atomic_add_f32(float* p, float v);
double sg_atomic_add_f64(double* p, double v);
unsigned sg_atomic_max_u32(unsigned* p, unsigned v);
unsigned sg_atomic_cas_u32(unsigned* p, unsigned cmp, unsigned v);
}

#ifdef SG_LIST_KERNELS
#define __global__ SG_GLOBAL_MARK
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static __attribute__((section("sg_shared")))

#define threadIdx (sg_thread_idx())
#define blockIdx (sg_block_idx())
#define blockDim (sg_block_dim())
#define gridDim (sg_grid_dim())
#define warpSize 32

inline void __syncthreads() { sg_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { sg_shfl(0, 0, mask); }

template <typename T> inline T sg_shfl_any(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = sg_shfl(b, src, mask);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
inline int sg_lane() { return (int)(sg_thread_idx().x & 31u); }
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int lane = sg_lane();
    return sg_shfl_any(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int o, int width = 32) {
    int lane = sg_lane();
    int s = lane ^ o;
    if ((s & ~(width - 1)) != (lane & ~(width - 1))) s = lane;
    return sg_shfl_any(mask, v, s);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = sg_lane();
    int s = lane + (int)d;
    if ((s & ~(width - 1)) != (lane & ~(width - 1))) s = lane;
    return sg_shfl_any(mask, v, s);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = sg_lane();
    int s = lane - (int)d;
    if (s < (lane & ~(width - 1))) s = lane;
    return sg_shfl_any(mask, v, s);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return sg_ballot(pred, mask); }
inline int __any_sync(unsigned mask, int pred) { return sg_ballot(pred, mask) != 0; }
inline int __all_sync(unsigned mask, int pred) { return (sg_ballot(pred, mask) & mask) == (mask & sg_ballot(1, mask)); }

inline unsigned atomicAdd(unsigned* p, unsigned v) { return sg_atomic_add_u32(p, v); }
inline int atomicAdd(int* p, int v) { return sg_atomic_add_i32(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return sg_atomic_add_u64(p, v); }
inline float atomicAdd(float* p, float v) { return sg_atomic_add_f32(p, v); }
inline double atomicAdd(double* p, double v) { return sg_atomic_add_f64(p, v); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return sg_atomic_max_u32(p, v); }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { return sg_atomic_cas_u32(p, c, v); }

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline int __float_as_int(float f) {
    int u;
    memcpy(&u, &f, 4);
    return u;
}
// The hardware's fast intrinsics are approximations within a few ulp; the emulation uses the
// correctly rounded library functions (a kernel must not depend on the approximation's bits).
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}

// Kernel registration: the launcher unpacks `void** kernelParams` with the kernel's own
// parameter types (so the argument list cannot drift from the signature).
typedef void (*sg_launcher)(void** params);
extern "C" void sg_register_kernel(const char* module, const char* name, sg_launcher launch, int n_params);

// Not instrumented: the parameter block lives in the caller's host memory, not on the device.
template <typename... A, size_t... I>
__attribute__((no_sanitize_thread)) inline void sg_call_impl(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*(typename std::remove_cv<A>::type*)p[I]...);
}
template <typename... A> inline void sg_call(void (*f)(A...), void** p) {
    sg_call_impl(f, p, std::index_sequence_for<A...>{});
}
template <typename... A> constexpr int sg_arity(void (*)(A...)) { return (int)sizeof...(A); }

#define SG_KERNEL(module, name)                                                            \
    static void sg_launch_##name(void** p) { sg_call(&name, p); }                          \
    static int sg_reg_##name = (sg_register_kernel(module, #name, &sg_launch_##name, sg_arity(&name)), 0);
