// Lane-by-lane test of the PTX emulations of kernels/ptx.cuh on the software GPU: runs the test
// kernels of ptx_test.cu through the driver API and compares every lane's registers with plain
// matrix products (double precision references) and with the fragment layouts of the PTX ISA.
// Built by scripts/softgpu.sh as bin/ptx_test; tests/softgpu_selftest.rs runs it.
//
// Usage: ptx_test [cp-async-early]   (the argument runs the planted misuse: it must fail)
#include "shim.h"

#include "ptx_test.cu"

SG_KERNEL("ptx_test", ptx_mma_regs)
SG_KERNEL("ptx_test", ptx_mma_smem)
SG_KERNEL("ptx_test", ptx_ldmatrix)
SG_KERNEL("ptx_test", ptx_cp_async)
SG_KERNEL("ptx_test", ptx_shfl)
SG_KERNEL("ptx_test", ptx_cvt_bf16x2)

#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

extern "C" {
int cuInit(unsigned);
int cuMemAlloc_v2(unsigned long long*, size_t);
int cuMemcpyHtoD_v2(unsigned long long, const void*, size_t);
int cuMemcpyDtoH_v2(void*, unsigned long long, size_t);
int cuModuleLoadData(void**, const void*);
int cuModuleGetFunction(void**, void*, const char*);
int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**);
}

namespace {
int g_failures = 0, g_checks = 0;
std::map<std::string, int> g_failed_by_check;  // the first 3 failures of each check are printed
void* g_module = nullptr;

void check(bool ok, const char* what, int lane, int reg, double got, double want) {
    g_checks++;
    if (ok) return;
    g_failures++;
    if (g_failed_by_check[what]++ < 3) fprintf(stderr, "FAIL %s lane %d reg %d: got %.9g, want %.9g\n", what, lane, reg, got, want);
}

unsigned long long upload(const void* p, size_t n) {
    unsigned long long d = 0;
    if (cuMemAlloc_v2(&d, n) || cuMemcpyHtoD_v2(d, p, n)) {
        fprintf(stderr, "ptx_test: device allocation failed\n");
        exit(1);
    }
    return d;
}
unsigned long long alloc(size_t n) {
    unsigned long long d = 0;
    if (cuMemAlloc_v2(&d, n)) exit(1);
    return d;
}
// Runs a one-warp launch of `name`; false when the launch failed.
bool run(const char* name, std::vector<void*> args) {
    void* f = nullptr;
    if (cuModuleGetFunction(&f, g_module, name)) {
        fprintf(stderr, "ptx_test: kernel %s not found\n", name);
        exit(1);
    }
    return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args.data(), nullptr) == 0;
}

// Deterministic small values, exactly representable in bf16 and f16 (multiples of 1/8 in +-4).
u16 bf16_bits(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return (u16)(u >> 16);
}
u16 f16_bits(float x) {  // |x| in [1/8, 4] or 0, multiples of 1/8: exact
    if (x == 0) return 0;
    unsigned u;
    memcpy(&u, &x, 4);
    unsigned sign = (u >> 16) & 0x8000u, e = ((u >> 23) & 0xff) - 112, m = (u >> 13) & 0x3ffu;
    return (u16)(sign | (e << 10) | m);
}
float value(int i, int salt) { return (float)(((i * 7 + salt * 13) % 57) - 28) / 8.0f; }

void test_mma_regs(bool bf) {
    std::vector<float> a(256), b(128), c(128);
    std::vector<u16> ab(256), bb(128);
    for (int i = 0; i < 256; i++) ab[i] = bf ? bf16_bits(a[i] = value(i, 1)) : f16_bits(a[i] = value(i, 1));
    for (int i = 0; i < 128; i++) bb[i] = bf ? bf16_bits(b[i] = value(i, 2)) : f16_bits(b[i] = value(i, 2));
    for (int i = 0; i < 128; i++) c[i] = value(i, 3) * 0.5f;
    unsigned long long da = upload(ab.data(), 512), db = upload(bb.data(), 256), dc = upload(c.data(), 512),
                       dd = alloc(512);
    int flag = bf ? 1 : 0;
    if (!run("ptx_mma_regs", {&da, &db, &dc, &dd, &flag})) exit(1);
    std::vector<float> frag(128);
    cuMemcpyDtoH_v2(frag.data(), dd, 512);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
            double want = c[row * 8 + col];
            for (int k = 0; k < 16; k++) want += (double)a[row * 16 + k] * b[k * 8 + col];
            check(fabs(frag[lane * 4 + i] - want) <= 1e-5 * (1 + fabs(want)), bf ? "mma bf16 (registers)" : "mma f16 (registers)",
                  lane, i, frag[lane * 4 + i], want);
        }
}

void test_mma_smem() {
    std::vector<float> a(256), b(128);
    std::vector<u16> ab(256), bb(128);
    for (int i = 0; i < 256; i++) ab[i] = bf16_bits(a[i] = value(i, 4));
    for (int i = 0; i < 128; i++) bb[i] = bf16_bits(b[i] = value(i, 5));
    unsigned long long da = upload(ab.data(), 512), db = upload(bb.data(), 256), dd = alloc(512);
    if (!run("ptx_mma_smem", {&da, &db, &dd})) exit(1);
    std::vector<float> frag(128);
    cuMemcpyDtoH_v2(frag.data(), dd, 512);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
            double want = 0;
            for (int k = 0; k < 16; k++) want += (double)a[row * 16 + k] * b[k * 8 + col];
            check(fabs(frag[lane * 4 + i] - want) <= 1e-5 * (1 + fabs(want)), "cp.async + ldmatrix + mma", lane, i,
                  frag[lane * 4 + i], want);
        }
}

void test_ldmatrix() {
    std::vector<u16> m(256);
    for (int i = 0; i < 256; i++) m[i] = (u16)(i * 37 + 11);
    unsigned long long dm = upload(m.data(), 512), dout = alloc(6 * 32 * 4 * 4);
    if (!run("ptx_ldmatrix", {&dm, &dout})) exit(1);
    std::vector<unsigned> out(6 * 32 * 4);
    cuMemcpyDtoH_v2(out.data(), dout, out.size() * 4);
    const char* names[6] = {"ldmatrix x1", "ldmatrix x2", "ldmatrix x4", "ldmatrix x1.trans", "ldmatrix x2.trans",
                            "ldmatrix x4.trans"};
    for (int v = 0; v < 6; v++) {
        int nmat = 1 << (v % 3);
        bool trans = v >= 3;
        for (int lane = 0; lane < 32; lane++)
            for (int j = 0; j < 4; j++) {
                int g = lane / 4, t = lane % 4;
                unsigned want = 0;
                if (j < nmat) {
                    u16 lo = trans ? m[j * 64 + (2 * t) * 8 + g] : m[j * 64 + g * 8 + 2 * t];
                    u16 hi = trans ? m[j * 64 + (2 * t + 1) * 8 + g] : m[j * 64 + g * 8 + 2 * t + 1];
                    want = lo | ((unsigned)hi << 16);
                }
                check(out[(v * 32 + lane) * 4 + j] == want, names[v], lane, j, out[(v * 32 + lane) * 4 + j], want);
            }
    }
}

bool test_cp_async(int early) {
    std::vector<unsigned char> src(1024);
    for (int i = 0; i < 1024; i++) src[i] = (unsigned char)(i * 29 + 3);
    unsigned long long ds = upload(src.data(), 1024), dout = alloc(1024);
    if (!run("ptx_cp_async", {&ds, &dout, &early})) return false;
    std::vector<unsigned char> out(1024);
    cuMemcpyDtoH_v2(out.data(), dout, 1024);
    for (int lane = 0; lane < 32; lane++) {
        int from = (lane + 1) % 32;  // the chunk the lane reads back was copied by the next lane
        int n0 = 16 - from % 17;
        for (int i = 0; i < 16; i++) {
            int want0 = i < n0 ? src[16 * from + i] : 0;
            check(out[16 * lane + i] == want0, "cp.async group 0 (zero-filled tail)", lane, i, out[16 * lane + i], want0);
            int want1 = src[16 * (32 + from) + i];
            check(out[16 * (32 + lane) + i] == want1, "cp.async group 1", lane, i, out[16 * (32 + lane) + i], want1);
        }
    }
    return true;
}

void test_shfl() {
    unsigned long long dout = alloc(64 * 4);
    if (!run("ptx_shfl", {&dout})) exit(1);
    std::vector<unsigned> out(64);
    cuMemcpyDtoH_v2(out.data(), dout, 256);
    for (int lane = 0; lane < 32; lane++) {
        check(out[lane] == 1000u + 3u * ((lane + 7) % 32), "shfl.idx", lane, 0, out[lane], 1000 + 3 * ((lane + 7) % 32));
        check(out[32 + lane] == 1000u + 3u * (lane ^ 5), "shfl.bfly", lane, 0, out[32 + lane], 1000 + 3 * (lane ^ 5));
    }
}
// The bf16 nearest to x, ties to the even one, by comparison with its two neighbours.
unsigned short bf16_rne(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    unsigned short down = (unsigned short)(u >> 16), up = (unsigned short)(down + 1);
    float fd, fu;
    unsigned ud = (unsigned)down << 16, uu = (unsigned)up << 16;
    memcpy(&fd, &ud, 4);
    memcpy(&fu, &uu, 4);
    // Past the largest finite bf16 the next value up is 2^128 (the rounding rule's infinity).
    double du = (up & 0x7fffu) == 0x7f80u ? copysign(ldexp(1.0, 128), (double)x) : (double)fu;
    double ed = fabs((double)x - fd), eu = fabs((double)x - du);
    if (ed != eu) return ed < eu ? down : up;
    return (down & 1) ? up : down;
}

void test_cvt_bf16x2() {
    // Exact values, ties (both directions of even), negatives, values that round up across a
    // power of two, the largest finite bf16 neighbourhood and tiny values.
    std::vector<float> in(64);
    for (int i = 0; i < 64; i++) {
        unsigned u = 0x3f800000u + ((unsigned)i << 15) + (i % 3 == 0 ? 0x8000u : (unsigned)(i * 977) % 0x8000u);
        if (i % 4 == 1) u |= 0x80000000u;
        if (i == 62) u = 0x7f7f8000u;  // tie below FLT_MAX's bf16 neighbourhood
        if (i == 63) u = 0x00012345u;  // subnormal
        memcpy(&in[i], &u, 4);
    }
    unsigned long long din = upload(in.data(), 64 * 4), dout = alloc(32 * 4);
    if (!run("ptx_cvt_bf16x2", {&din, &dout})) exit(1);
    std::vector<unsigned> out(32);
    cuMemcpyDtoH_v2(out.data(), dout, 128);
    for (int lane = 0; lane < 32; lane++) {
        unsigned want = bf16_rne(in[2 * lane]) | ((unsigned)bf16_rne(in[2 * lane + 1]) << 16);
        check(out[lane] == want, "cvt.rn.bf16x2.f32", lane, 0, out[lane], want);
    }
}
}  // namespace

int main(int argc, char** argv) {
    cuInit(0);
    if (cuModuleLoadData(&g_module, "// sorft software GPU module ptx_test\n")) {
        fprintf(stderr, "ptx_test: module not found\n");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "cp-async-early") == 0) {
        bool ok = test_cp_async(1);
        printf("ptx_test: cp.async read before its wait: launch %s\n", ok ? "succeeded" : "failed");
        return ok ? 0 : 1;
    }
    test_mma_regs(true);
    test_mma_regs(false);
    test_mma_smem();
    test_ldmatrix();
    if (!test_cp_async(0)) return 1;
    test_shfl();
    test_cvt_bf16x2();
    printf("ptx_test: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
