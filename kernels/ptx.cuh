// Inline PTX of the tensor-core kernels, kept behind these few device helpers. Each helper is the
// PTX instruction when compiled for a GPU (nvcc / NVRTC) and, beside it, an emulation that follows
// the PTX ISA's semantics and fragment layouts when compiled for the software GPU (tests/softgpu,
// which defines SORFT_SOFTGPU). The emulations are tested lane by lane against plain matrix
// products (tests/softgpu/ptx_test.cu).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 and t = lane % 4; a register holds two 16-bit elements, the lower column (or row)
// in its low half:
//   A (16x16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
//                         a[3] = A[g+8][2t+8..]
//   B (16x8, column-major): b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   C, D (16x8, f32): d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
// ldmatrix .m8n8 .b16: lanes 8j..8j+7 give the row addresses of matrix j (16-byte aligned, shared
// memory); register j of a lane gets M_j[g][2t..2t+1], or with .trans M_j[2t..2t+1][g].
#pragma once

#ifdef SORFT_SOFTGPU
extern "C" {
void sg_warp_all(unsigned long long v, unsigned mask, unsigned long long* out);
void sg_ptx_fail(const char* what);
int sg_is_shared(const void* p);
void sg_cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes);
void sg_cp_async_commit(void);
void sg_cp_async_wait(int pending);
}

// A 16-bit float's value: bf16 (the high half of an f32) or IEEE half.
__device__ __forceinline__ float ptx_emu_b16_to_f32(unsigned h, bool bf) {
    if (bf) return __uint_as_float(h << 16);
    unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e != 0) return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
    float v = (float)m * (1.0f / 16777216.0f);  // subnormal: m * 2^-24, exact in f32
    return sign ? -v : v;
}

// The element of register `reg` (half `hi`) in a lane's gathered fragment words.
__device__ __forceinline__ float ptx_emu_elem(const unsigned long long* words, int lane, int reg, int hi, bool bf) {
    unsigned long long w = words[lane];
    unsigned r = (unsigned)(w >> (32 * (reg & 1)));
    return ptx_emu_b16_to_f32(hi ? r >> 16 : r & 0xffffu, bf);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: every lane gathers the warp's
// A and B fragments and computes its four D elements (exact products, summed in f32 over k, then
// added to C; the hardware's internal order of additions is not specified).
__device__ __forceinline__ void ptx_emu_mma_16816(float d[4], const u32 a[4], const u32 b[2], bool bf) {
    unsigned long long a01[32], a23[32], bw[32];
    sg_warp_all((unsigned long long)a[0] | ((unsigned long long)a[1] << 32), FULL_MASK, a01);
    sg_warp_all((unsigned long long)a[2] | ((unsigned long long)a[3] << 32), FULL_MASK, a23);
    sg_warp_all((unsigned long long)b[0] | ((unsigned long long)b[1] << 32), FULL_MASK, bw);
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float sum = 0.f;
        for (int k = 0; k < 16; k++) {
            // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8).
            int areg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const unsigned long long* aw = areg < 2 ? a01 : a23;
            float av = ptx_emu_elem(aw, (row & 7) * 4 + (k & 7) / 2, areg, k & 1, bf);
            // B[k][col]: lane col * 4 + (k % 8) / 2, register (k >= 8).
            float bv = ptx_emu_elem(bw, col * 4 + (k & 7) / 2, k >= 8 ? 1 : 0, k & 1, bf);
            sum += av * bv;
        }
        d[i] += sum;
    }
}

// ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16
__device__ __forceinline__ void ptx_emu_ldmatrix(u32* r, int nmat, const void* row, bool trans) {
    unsigned long long addr[32];
    if (((unsigned long long)row & 15) != 0) sg_ptx_fail("ldmatrix: a row address is not 16-byte aligned");
    if (!sg_is_shared(row)) sg_ptx_fail("ldmatrix: a row address is not in shared memory");
    sg_warp_all((unsigned long long)row, FULL_MASK, addr);
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < nmat; j++) {
        unsigned lo, hi;
        if (trans) {
            lo = ((const unsigned short*)addr[8 * j + 2 * t])[g];
            hi = ((const unsigned short*)addr[8 * j + 2 * t + 1])[g];
        } else {
            const unsigned short* p = (const unsigned short*)addr[8 * j + g];
            lo = p[2 * t];
            hi = p[2 * t + 1];
        }
        r[j] = lo | (hi << 16);
    }
}
#else
// The shared-state-space address of a generic pointer to shared memory.
__device__ __forceinline__ u32 ptx_smem_addr(const void* p) {
    u32 a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
#endif

// D += A * B on one 16x8x16 tile, bf16 inputs, f32 accumulators (layouts above).
__device__ __forceinline__ void mma_16816_bf16(float d[4], const u32 a[4], const u32 b[2]) {
#ifdef SORFT_SOFTGPU
    ptx_emu_mma_16816(d, a, b, true);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// D += A * B on one 16x8x16 tile, f16 inputs, f32 accumulators (layouts above).
__device__ __forceinline__ void mma_16816_f16(float d[4], const u32 a[4], const u32 b[2]) {
#ifdef SORFT_SOFTGPU
    ptx_emu_mma_16816(d, a, b, false);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// ldmatrix x1 / x2 / x4 (row: this lane's row address in shared memory; lanes 8j..8j+7 address
// matrix j), plain or transposed.
__device__ __forceinline__ void ldmatrix_x1(u32 r[1], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 1, row, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(ptx_smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(u32 r[2], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 2, row, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(ptx_smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 4, row, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ptx_smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(u32 r[1], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 1, row, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(ptx_smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32 r[2], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 2, row, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(ptx_smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const void* row) {
#ifdef SORFT_SOFTGPU
    ptx_emu_ldmatrix(r, 4, row, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ptx_smem_addr(row)));
#endif
}

// cp.async.cg.shared.global: copies 16 bytes from global to shared memory asynchronously; only the
// first `src_bytes` (0..16) are read, the rest of the 16 are zero-filled. The copy is complete
// (visible to this thread; to the block after a __syncthreads) only after a cp_async_wait that
// covers its group. The emulation performs each group's copies at that wait, so a read before
// it sees stale (or, on fresh memory, uninitialised) data, which the software GPU reports.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, u32 src_bytes) {
#ifdef SORFT_SOFTGPU
    sg_cp_async(smem, gmem, 16, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ptx_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
#endif
}
// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef SORFT_SOFTGPU
    sg_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef SORFT_SOFTGPU
    sg_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// cvt.rn.bf16x2.f32: two f32 rounded to nearest even bf16, packed (lo in the low half, as the mma
// fragments hold a lower column). The emulation is common.cuh's from_f32 (NaN bits may differ:
// the hardware writes the canonical 0x7fff).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
#ifdef SORFT_SOFTGPU
    return (u32)from_f32<bf16>(lo).bits | ((u32)from_f32<bf16>(hi).bits << 16);
#else
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// shfl.sync.idx / .bfly over the full warp, 32-bit values.
__device__ __forceinline__ u32 shfl_idx(u32 v, int src) {
#ifdef SORFT_SOFTGPU
    return __shfl_sync(FULL_MASK, v, src);
#else
    u32 r;
    asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(src));
    return r;
#endif
}
__device__ __forceinline__ u32 shfl_xor(u32 v, int lane_mask) {
#ifdef SORFT_SOFTGPU
    return __shfl_xor_sync(FULL_MASK, v, lane_mask);
#else
    u32 r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(lane_mask));
    return r;
#endif
}
