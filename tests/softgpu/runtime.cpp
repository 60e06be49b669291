// The sorft software GPU: a stand-in for libcuda.so that runs the kernels of kernels/*.cu, compiled
// as host C++ (shim.h), on the CPU. Test infrastructure only: it claims correctness, not speed.
//
// * Device memory is host memory with guard zones on both sides; fresh allocations are filled
//   with 0xff bytes (NaN in f32 and bf16) and carry a per-byte "initialised" shadow.
// * A launch runs its blocks one after another; the threads of a block are fibers switched
//   cooperatively at __syncthreads (a block barrier) and at warp shuffles (a warp barrier).
// * Every global and shared access of kernel code arrives here through the -fsanitize=thread
//   callbacks (__tsan_readN/__tsan_writeN, implemented below, no TSan runtime is linked) and is
//   checked: out-of-bounds device accesses, reads of uninitialised device or shared memory, and
//   (race mode) two threads of a block touching one shared word between barriers, one writing.
//   A failure names the kernel, the block, the thread, the offset and the code location, is
//   printed to stderr, and makes the launch (and, like a real GPU, the context) fail.
//
// Environment: SOFTGPU_CHECKS (comma list of mem,init,race; default all; "none" disables),
// SOFTGPU_ORDER=reverse (runs blocks and threads in reverse order, to expose order dependence),
// SOFTGPU_TRACE=1 (prints every launch and its CPU time), SOFTGPU_PROFILE=1 (per-kernel launches,
// blocks and CPU time, printed at exit).
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUmemoryPool;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

#define SG_EXPORT extern "C" __attribute__((visibility("default")))

struct dim3 {
    unsigned x, y, z;
};

namespace {

const char* const DEVICE_NAME = "sorft software GPU";
const size_t TOTAL_MEM = 16ull << 30;
const size_t GUARD = 256;
const unsigned char POISON = 0xff;
const unsigned char GUARD_BYTE = 0xa5;

std::recursive_mutex g_mu;
int g_sticky = CUDA_SUCCESS;  // a failed launch poisons the context, as on a real GPU
bool g_check_mem = true, g_check_init = true, g_check_race = true, g_reverse = false, g_trace = false;
bool g_profile = false;
bool g_any_check = true;  // any of mem, init, race
void print_profile();

void configure() {
    static bool done = false;
    if (done) return;
    done = true;
    if (const char* c = getenv("SOFTGPU_CHECKS")) {
        std::string s = c;
        g_check_mem = s.find("mem") != std::string::npos;
        g_check_init = s.find("init") != std::string::npos;
        g_check_race = s.find("race") != std::string::npos;
        g_any_check = g_check_mem || g_check_init || g_check_race;
    }
    if (const char* o = getenv("SOFTGPU_ORDER")) g_reverse = strcmp(o, "reverse") == 0;
    if (const char* t = getenv("SOFTGPU_TRACE")) g_trace = t[0] == '1';
    if (const char* t = getenv("SOFTGPU_PROFILE")) g_profile = t[0] == '1';
    if (g_profile) atexit(print_profile);
}

// ---------------------------------------------------------------- device memory

struct Alloc {
    uintptr_t base;
    size_t size;
    unsigned char* raw;
    std::vector<unsigned char> init;  // 1 = written since allocation
};
std::map<uintptr_t, Alloc*> g_allocs;
size_t g_used = 0;
Alloc* g_last = nullptr;

Alloc* find_alloc(uintptr_t a) {
    if (g_last && a >= g_last->base && a < g_last->base + g_last->size) return g_last;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    Alloc* al = it->second;
    if (a >= al->base && a < al->base + al->size) return g_last = al;
    return nullptr;
}

// The allocation whose guard zone or neighbourhood `a` lies in, for messages.
std::string describe_near(uintptr_t a) {
    auto it = g_allocs.upper_bound(a);
    char buf[256];
    if (it != g_allocs.begin()) {
        Alloc* al = std::prev(it)->second;
        if (a >= al->base + al->size && a < al->base + al->size + 1024 * 1024) {
            snprintf(buf, sizeof buf, "%zu bytes past the end of a %zu-byte allocation (offset %zu)",
                     (size_t)(a - al->base - al->size), al->size, (size_t)(a - al->base));
            return buf;
        }
    }
    if (it != g_allocs.end() && it->first > a && it->first - a <= 1024 * 1024) {
        snprintf(buf, sizeof buf, "%zu bytes before the start of a %zu-byte allocation", (size_t)(it->first - a),
                 it->second->size);
        return buf;
    }
    snprintf(buf, sizeof buf, "not in any device allocation (address 0x%lx)", (unsigned long)a);
    return buf;
}

CUresult do_alloc(CUdeviceptr* p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    if (n > TOTAL_MEM - g_used) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t total = (n + 2 * GUARD + 255) & ~(size_t)255;
    unsigned char* raw = (unsigned char*)aligned_alloc(256, total);
    if (!raw) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(raw, GUARD_BYTE, total);
    memset(raw + GUARD, POISON, n);
    Alloc* a = new Alloc{(uintptr_t)(raw + GUARD), n, raw, std::vector<unsigned char>(n, 0)};
    g_allocs[a->base] = a;
    g_used += n;
    *p = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

bool guards_intact(const Alloc* a) {
    size_t total = (a->size + 2 * GUARD + 255) & ~(size_t)255;
    for (size_t i = 0; i < GUARD; i++)
        if (a->raw[i] != GUARD_BYTE) return false;
    for (size_t i = GUARD + a->size; i < total; i++)
        if (a->raw[i] != GUARD_BYTE) return false;
    return true;
}

CUresult do_free(CUdeviceptr p) {
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) {
        fprintf(stderr, "softgpu: free of 0x%llx, which is not a live allocation\n", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    Alloc* a = it->second;
    CUresult r = CUDA_SUCCESS;
    if (!guards_intact(a)) {
        fprintf(stderr, "softgpu: the guard zone of a %zu-byte allocation was overwritten\n", a->size);
        r = g_sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    g_used -= a->size;
    g_allocs.erase(it);
    if (g_last == a) g_last = nullptr;
    free(a->raw);
    delete a;
    return r;
}

// A host-side copy into or out of device memory: the range must lie in one allocation.
Alloc* checked_range(CUdeviceptr p, size_t n, const char* what) {
    Alloc* a = find_alloc((uintptr_t)p);
    if (!a || (uintptr_t)p + n > a->base + a->size) {
        fprintf(stderr, "softgpu: %s of %zu bytes at 0x%llx: %s\n", what, n, p,
                a ? "runs past the end of its allocation" : describe_near((uintptr_t)p).c_str());
        return nullptr;
    }
    return a;
}
void mark_init(Alloc* a, uintptr_t p, size_t n) { memset(a->init.data() + (p - a->base), 1, n); }

// ---------------------------------------------------------------- fibers and blocks

const size_t STACK = 256 * 1024;
const int MAX_THREADS = 1024;

enum FiberState { RUNNABLE, AT_BARRIER, AT_WARP, EXITED };
struct Fiber {
    void* sp;
    FiberState state;
};
struct Warp {
    int arrived;
    unsigned gen;
    int lanes;
    int exited;
    unsigned exited_mask;  // lanes that have returned from the kernel
    uint64_t vals[2][32];
};

typedef void (*Launcher)(void** params);
struct Kernel {
    std::string module;
    std::string name;
    Launcher launch;
    int n_params;
};

unsigned char* g_stacks = nullptr;
Fiber g_fibers[MAX_THREADS];
Warp g_warps[MAX_THREADS / 32];
void* g_sched_sp = nullptr;
int g_cur = -1;  // the running thread's index in the block, -1 outside kernels
int g_nthreads = 0, g_arrived = 0, g_exited = 0;
uint32_t g_epoch = 0;        // barriers passed by the current block
uint32_t g_block_serial = 0;  // blocks run since start (tags the shared-memory shadow)
dim3 g_block_idx, g_block_dim, g_grid_dim;
const Kernel* g_kernel = nullptr;
void** g_params = nullptr;
bool g_abort = false;
CUresult g_launch_error = CUDA_SUCCESS;
uintptr_t g_shared_lo = 0, g_shared_hi = 0;  // the writable segment of this library (kernel statics)

}  // namespace

extern "C" void sg_switch_ctx(void** save, void* to);
asm(R"(
.text
.globl sg_switch_ctx
.hidden sg_switch_ctx
.type sg_switch_ctx,@function
sg_switch_ctx:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size sg_switch_ctx,.-sg_switch_ctx
)");

namespace {

// The next runnable thread after `from` in this pass's order (reverse with SOFTGPU_ORDER=reverse), or -1.
int next_runnable(int from) {
    if (g_reverse) {
        for (int i = from - 1; i >= 0; i--)
            if (g_fibers[i].state == RUNNABLE) return i;
    } else {
        for (int i = from + 1; i < g_nthreads; i++)
            if (g_fibers[i].state == RUNNABLE) return i;
    }
    return -1;
}

// Suspends the running thread and switches straight to the next runnable thread of this pass
// (one context switch, no trip through the scheduler), or to the scheduler at the pass's end.
void yield_to_scheduler() {
    int me = g_cur;
    int n = next_runnable(me);
    if (n < 0) {
        sg_switch_ctx(&g_fibers[me].sp, g_sched_sp);
    } else {
        g_cur = n;
        sg_switch_ctx(&g_fibers[me].sp, g_fibers[n].sp);
    }
    g_cur = me;
}

// file:line of a code address, through addr2line (binutils) when it is installed.
std::string source_line(void* pc) {
    Dl_info info;
    if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "";
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "addr2line -e '%s' 0x%lx 2>/dev/null", info.dli_fname,
             (unsigned long)((char*)pc - (char*)info.dli_fbase - 1));
    FILE* f = popen(cmd, "r");
    if (!f) return "";
    char line[1024] = {0};
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    pclose(f);
    line[strcspn(line, "\n")] = 0;
    if (line[0] == '?' || !line[0]) return "";
    const char* k = strstr(line, "/kernels/");
    return std::string(" ") + (k ? k + 1 : line);
}

std::string code_location(void* pc) {
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_sname) {
        int st = 0;
        char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
        std::string s = st == 0 && d ? d : info.dli_sname;
        free(d);
        char buf[64];
        snprintf(buf, sizeof buf, "+0x%lx", (unsigned long)((char*)pc - (char*)info.dli_saddr));
        return s + buf + source_line(pc);
    }
    return "?" + source_line(pc);
}

// Reports a failure of the running kernel and abandons the launch (never returns to the kernel).
__attribute__((noreturn)) void kernel_fail(CUresult code, void* pc, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "softgpu: kernel %s, block (%u,%u,%u), thread %d (warp %d, lane %d): %s [at %s]\n",
            g_kernel ? g_kernel->name.c_str() : "?", g_block_idx.x, g_block_idx.y, g_block_idx.z, g_cur,
            g_cur / 32, g_cur % 32, msg, code_location(pc).c_str());
    g_abort = true;
    g_launch_error = code;
    sg_switch_ctx(&g_fibers[g_cur].sp, g_sched_sp);
    abort();  // an abandoned fiber is never resumed
}

void release_barrier() {
    g_arrived = 0;
    g_epoch++;
    for (int i = 0; i < g_nthreads; i++)
        if (g_fibers[i].state == AT_BARRIER) g_fibers[i].state = RUNNABLE;
}

void complete_warp(Warp& w, int warp) {
    w.arrived = 0;
    w.gen++;
    for (int l = 0; l < w.lanes; l++) {
        Fiber& f = g_fibers[warp * 32 + l];
        if (f.state == AT_WARP) f.state = RUNNABLE;
    }
}

void fiber_main() {
    g_kernel->launch(g_params);
    int t = g_cur;
    Warp& w = g_warps[t / 32];
    if (w.arrived > 0)
        kernel_fail(CUDA_ERROR_LAUNCH_FAILED, __builtin_return_address(0),
                    "exited while %d lane(s) of its warp wait in a warp shuffle (divergent shuffle)", w.arrived);
    g_fibers[t].state = EXITED;
    w.exited++;
    w.exited_mask |= 1u << (t % 32);
    g_exited++;
    if (g_arrived > 0 && g_arrived + g_exited == g_nthreads) release_barrier();
    yield_to_scheduler();  // an exited thread is never resumed
    abort();
}

void init_fiber(int i) {
    // Stack tops staggered by a few cache lines per thread: at one 256 KiB stride every thread's
    // live frames would map to the same cache sets and evict each other at every switch.
    uintptr_t top = ((uintptr_t)g_stacks + (size_t)(i + 1) * STACK - (size_t)(i % 64) * 576) & ~(uintptr_t)63;
    void** sp = (void**)top;
    *--sp = nullptr;
    *--sp = (void*)&fiber_main;
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    g_fibers[i].sp = sp;
    g_fibers[i].state = RUNNABLE;
}

std::string deadlock_report() {
    int bar = 0, warp = 0;
    for (int i = 0; i < g_nthreads; i++) {
        bar += g_fibers[i].state == AT_BARRIER;
        warp += g_fibers[i].state == AT_WARP;
    }
    char buf[256];
    snprintf(buf, sizeof buf,
             "deadlock: %d thread(s) wait at __syncthreads, %d in a warp shuffle, %d exited "
             "(a barrier or shuffle in divergent code)",
             bar, warp, g_exited);
    return buf;
}

// The cp.async copies a thread has issued and not yet waited for (kernels/ptx.cuh).
struct AsyncCopy {
    unsigned char* dst;
    const unsigned char* src;
    unsigned bytes, src_bytes;
    void* pc;
};
struct AsyncQueue {
    std::vector<AsyncCopy> open;               // issued since the last commit
    std::deque<std::vector<AsyncCopy>> groups;  // committed, oldest first
};
AsyncQueue g_async[MAX_THREADS];

// Runs one block to completion; false when the launch failed.
bool run_block() {
    g_block_serial++;
    g_epoch = 0;
    g_arrived = g_exited = 0;
    for (int w = 0; w < (g_nthreads + 31) / 32; w++) {
        g_warps[w].arrived = 0;
        g_warps[w].gen = 0;
        g_warps[w].exited = 0;
        g_warps[w].exited_mask = 0;
        g_warps[w].lanes = g_nthreads - w * 32 < 32 ? g_nthreads - w * 32 : 32;
    }
    for (int i = 0; i < g_nthreads; i++) {
        init_fiber(i);
        g_async[i].open.clear();  // copies never waited for are never visible
        g_async[i].groups.clear();
    }
    // A pass starts at the first runnable thread; the threads hand over to each other in order
    // (yield_to_scheduler) and the last one of the pass returns here.
    for (;;) {
        int first = next_runnable(g_reverse ? g_nthreads : -1);
        if (first >= 0) {
            g_cur = first;
            sg_switch_ctx(&g_sched_sp, g_fibers[first].sp);
            g_cur = -1;
            if (g_abort) return false;
            continue;
        }
        if (g_exited == g_nthreads) return true;
        {
            fprintf(stderr, "softgpu: kernel %s, block (%u,%u,%u): %s\n", g_kernel->name.c_str(), g_block_idx.x,
                    g_block_idx.y, g_block_idx.z, deadlock_report().c_str());
            g_launch_error = CUDA_ERROR_LAUNCH_FAILED;
            return false;
        }
    }
}

// ---------------------------------------------------------------- access checks


struct SharedWord {
    uint32_t serial;   // block that last touched the word (older: the word is fresh)
    uint32_t wepoch;   // barrier epoch of the last write
    uint32_t repoch;   // barrier epoch of the recorded reads
    uint16_t writer;   // thread of the last write
    uint16_t reader;   // a thread that read in `repoch`
    uint8_t written;   // written by this block
    uint8_t multi;     // more than one thread read in `repoch`
    uint8_t atomic;    // the last write was atomic
};
std::vector<SharedWord> g_shadow;

int segment_cb(struct dl_phdr_info* info, size_t, void* data) {
    uintptr_t me = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
        if (me >= lo && me < hi && (ph.p_flags & PF_W)) {
            g_shared_lo = lo;
            g_shared_hi = hi;
            return 1;
        }
    }
    return 0;
}

void check_shared(uintptr_t a, size_t n, bool write, bool atomic, void* pc) {
    if (!g_check_init && !g_check_race) return;
    for (uintptr_t w = (a - g_shared_lo) / 4; w <= (a + n - 1 - g_shared_lo) / 4; w++) {
        SharedWord& e = g_shadow[w];
        if (e.serial != g_block_serial) {
            e = SharedWord{g_block_serial, 0, UINT32_MAX, 0, 0, 0, 0, 0};
        }
        uint16_t t = (uint16_t)g_cur;
        uintptr_t off = w * 4 + g_shared_lo;
        if (!write || atomic) {
            if (g_check_init && !e.written)
                kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                            "%zu-byte read of shared memory at 0x%lx that no thread of this block has written",
                            n, (unsigned long)off);
        }
        if (!write) {
            if (g_check_race && e.written && e.wepoch == g_epoch && e.writer != t)
                kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                            "race on shared memory at 0x%lx: read of the word thread %u wrote with no "
                            "__syncthreads between",
                            (unsigned long)off, e.writer);
            if (e.repoch != g_epoch) {
                e.repoch = g_epoch;
                e.reader = t;
                e.multi = 0;
            } else if (e.reader != t) {
                e.multi = 1;
            }
            continue;
        }
        if (g_check_race) {
            if (e.written && e.wepoch == g_epoch && e.writer != t && !(atomic && e.atomic))
                kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                            "race on shared memory at 0x%lx: write to the word thread %u wrote with no "
                            "__syncthreads between",
                            (unsigned long)off, e.writer);
            if (!atomic && e.repoch == g_epoch && (e.multi || e.reader != t))
                kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                            "race on shared memory at 0x%lx: write to a word thread %u read with no "
                            "__syncthreads between",
                            (unsigned long)off, e.reader == t ? 65535u : e.reader);
        }
        e.written = 1;
        e.wepoch = g_epoch;
        e.writer = t;
        e.atomic = atomic;
    }
}

inline bool in_stacks(uintptr_t a) {
    return a >= (uintptr_t)g_stacks && a < (uintptr_t)g_stacks + (size_t)MAX_THREADS * STACK;
}

void check_access(const void* p, size_t n, bool write, bool atomic, void* pc) {
    if (!g_any_check || g_cur < 0) return;  // checks off, or not kernel code (static initialisers)
    uintptr_t a = (uintptr_t)p;
    if (in_stacks(a)) return;
    if (a >= g_shared_lo && a < g_shared_hi) {
        check_shared(a, n, write, atomic, pc);
        return;
    }
    Alloc* al = find_alloc(a);
    if (!al || a + n > al->base + al->size) {
        if (!g_check_mem) return;
        kernel_fail(CUDA_ERROR_ILLEGAL_ADDRESS, pc, "out-of-bounds %zu-byte %s: %s", n, write ? "write" : "read",
                    al ? "runs past the end of its allocation" : describe_near(a).c_str());
    }
    unsigned char* s = al->init.data() + (a - al->base);
    if (write) {
        memset(s, 1, n);
        return;
    }
    if (!g_check_init || atomic) {
        if (atomic) memset(s, 1, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (!s[i])
            kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                        "%zu-byte read of uninitialised device memory at offset %zu of a %zu-byte allocation", n,
                        (size_t)(a - al->base + i), al->size);
}

std::map<std::string, Kernel*>& kernels() {
    static auto* k = new std::map<std::string, Kernel*>;  // never destroyed: read at exit
    return *k;
}

// A hardware trap inside kernel code (integer division by zero, which a GPU answers with garbage
// but the host traps on; a wild access the instrumentation does not see, as in a struct copy)
// fails the launch with the kernel and thread named. Traps elsewhere go to the previous handler.
struct sigaction g_old_segv, g_old_fpe, g_old_bus;

void fault_handler(int sig, siginfo_t* si, void* uc) {
    if (g_cur >= 0 && g_kernel) {
        void* pc = (void*)((ucontext_t*)uc)->uc_mcontext.gregs[REG_RIP];
        if (sig == SIGFPE)
            kernel_fail(CUDA_ERROR_LAUNCH_FAILED, (char*)pc + 1,
                        "integer division by zero (a GPU returns an unspecified value; the host traps)");
        kernel_fail(CUDA_ERROR_ILLEGAL_ADDRESS, (char*)pc + 1, "invalid memory access at %p", si->si_addr);
    }
    struct sigaction* old = sig == SIGFPE ? &g_old_fpe : sig == SIGBUS ? &g_old_bus : &g_old_segv;
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
        old->sa_sigaction(sig, si, uc);
        return;
    }
    if (old->sa_handler == SIG_IGN) return;
    if (old->sa_handler != SIG_DFL && old->sa_handler) {
        old->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);  // returning re-executes the fault with the default action
}

void install_fault_handlers() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // on the fiber's own (large) stack
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGFPE, &sa, &g_old_fpe);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

void restore_fault_handlers() {
    sigaction(SIGSEGV, &g_old_segv, nullptr);
    sigaction(SIGFPE, &g_old_fpe, nullptr);
    sigaction(SIGBUS, &g_old_bus, nullptr);
}

bool ensure_runtime() {
    if (g_stacks) return true;
    configure();
    void* m = mmap(nullptr, (size_t)MAX_THREADS * STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) return false;
    g_stacks = (unsigned char*)m;
    static int anchor = 0;
    dl_iterate_phdr(segment_cb, &anchor);
    g_shadow.assign((g_shared_hi - g_shared_lo) / 4 + 1, SharedWord{0, 0, 0, 0, 0, 0, 0, 0});
    return true;
}

}  // namespace

// ---------------------------------------------------------------- the device-side API (shim.h)

extern "C" {
SG_EXPORT void sg_register_kernel(const char* module, const char* name, Launcher launch, int n_params) {
    kernels()[name] = new Kernel{module, name, launch, n_params};
}
SG_EXPORT dim3 sg_thread_idx(void) { return dim3{(unsigned)g_cur, 0, 0}; }
SG_EXPORT dim3 sg_block_idx(void) { return g_block_idx; }
SG_EXPORT dim3 sg_block_dim(void) { return g_block_dim; }
SG_EXPORT dim3 sg_grid_dim(void) { return g_grid_dim; }

SG_EXPORT void sg_syncthreads(void) {
    g_fibers[g_cur].state = AT_BARRIER;
    g_arrived++;
    if (g_arrived + g_exited == g_nthreads) {
        release_barrier();
        return;
    }
    yield_to_scheduler();
}

}  // extern "C"

namespace {
// Every live lane of the running thread's warp contributes `v`; returns the warp's values, valid
// until this thread's next warp operation.
const uint64_t* warp_exchange(uint64_t v, unsigned mask, void* pc) {
    int t = g_cur, wi = t / 32, lane = t % 32;
    Warp& w = g_warps[wi];
    unsigned lanes_mask = w.lanes == 32 ? 0xffffffffu : ((1u << w.lanes) - 1);
    unsigned live = (lanes_mask & ~w.exited_mask) | (1u << lane);
    if ((mask & lanes_mask) != live)
        kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc,
                    "warp-synchronous operation with mask 0x%08x but live lanes 0x%08x (exited lanes or a "
                    "partial mask, which the software GPU does not emulate)",
                    mask, live);
    unsigned g = w.gen & 1;
    w.vals[g][lane] = v;
    w.arrived++;
    if (w.arrived == w.lanes - w.exited) {
        complete_warp(w, wi);
    } else {
        g_fibers[t].state = AT_WARP;
        yield_to_scheduler();
    }
    return w.vals[g];
}
}  // namespace

extern "C" {
SG_EXPORT uint64_t sg_shfl(uint64_t v, int src, unsigned mask) {
    const uint64_t* vals = warp_exchange(v, mask, __builtin_return_address(0));
    if (src < 0 || src >= g_warps[g_cur / 32].lanes) return v;
    return vals[src];
}

// Every lane of the warp gets every lane's `v` (the PTX emulations of kernels/ptx.cuh).
SG_EXPORT void sg_warp_all(unsigned long long v, unsigned mask, unsigned long long* out) {
    const uint64_t* vals = warp_exchange(v, mask, __builtin_return_address(0));
    int lanes = g_warps[g_cur / 32].lanes;
    for (int l = 0; l < 32; l++) out[l] = l < lanes ? vals[l] : 0;
}

// A PTX emulation found an operand the instruction does not allow: fails the launch.
SG_EXPORT void sg_ptx_fail(const char* what) {
    kernel_fail(CUDA_ERROR_LAUNCH_FAILED, __builtin_return_address(0), "%s", what);
}

SG_EXPORT int sg_is_shared(const void* p) {
    return (uintptr_t)p >= g_shared_lo && (uintptr_t)p < g_shared_hi;
}

// cp.async: copies queue per thread until a wait covers their group (see kernels/ptx.cuh).
SG_EXPORT void sg_cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
    void* pc = __builtin_return_address(0);
    if (((uintptr_t)dst | (uintptr_t)src) % bytes != 0)
        kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc, "cp.async of %u bytes from %p to %p: addresses not %u-byte aligned",
                    bytes, src, dst, bytes);
    if (src_bytes > bytes)
        kernel_fail(CUDA_ERROR_LAUNCH_FAILED, pc, "cp.async with src-size %u larger than cp-size %u", src_bytes, bytes);
    if (!sg_is_shared(dst))
        kernel_fail(CUDA_ERROR_ILLEGAL_ADDRESS, pc, "cp.async destination %p is not in shared memory", dst);
    g_async[g_cur].open.push_back(AsyncCopy{(unsigned char*)dst, (const unsigned char*)src, bytes, src_bytes, pc});
}
SG_EXPORT void sg_cp_async_commit(void) {
    AsyncQueue& q = g_async[g_cur];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}
SG_EXPORT void sg_cp_async_wait(int pending) {
    AsyncQueue& q = g_async[g_cur];
    while ((int)q.groups.size() > pending) {
        for (const AsyncCopy& c : q.groups.front()) {
            if (c.src_bytes) check_access(c.src, c.src_bytes, false, false, c.pc);
            check_access(c.dst, c.bytes, true, false, c.pc);
            if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
            memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
        }
        q.groups.pop_front();
    }
}

SG_EXPORT unsigned sg_ballot(int pred, unsigned mask) {
    const uint64_t* vals = warp_exchange(pred ? 1 : 0, mask, __builtin_return_address(0));
    unsigned r = 0;
    int lanes = g_warps[g_cur / 32].lanes;
    for (int l = 0; l < lanes; l++)
        if (vals[l]) r |= 1u << l;
    return r & mask;
}

#define SG_ATOMIC(NAME, T, EXPR)                                                 \
    SG_EXPORT T NAME(T* p, T v) {                                                \
        check_access(p, sizeof(T), true, true, __builtin_return_address(0));     \
        T old = *p;                                                              \
        *p = EXPR;                                                               \
        return old;                                                              \
    }
SG_ATOMIC(sg_atomic_add_u32, unsigned, old + v)
SG_ATOMIC(sg_atomic_add_i32, int, old + v)
SG_ATOMIC(sg_atomic_add_u64, unsigned long long, old + v)
SG_ATOMIC(sg_atomic_add_f32, float, old + v)
SG_ATOMIC(sg_atomic_add_f64, double, old + v)
SG_ATOMIC(sg_atomic_max_u32, unsigned, old > v ? old : v)
SG_EXPORT unsigned sg_atomic_cas_u32(unsigned* p, unsigned c, unsigned v) {
    check_access(p, 4, true, true, __builtin_return_address(0));
    unsigned old = *p;
    if (old == c) *p = v;
    return old;
}

// The access callbacks the compiler's thread-sanitizer instrumentation calls.
SG_EXPORT void __tsan_init(void) {}
SG_EXPORT void __tsan_func_entry(void*) {}
SG_EXPORT void __tsan_func_exit(void) {}
#define SG_TSAN(N)                                                                                     \
    SG_EXPORT void __tsan_read##N(void* p) { check_access(p, N, false, false, __builtin_return_address(0)); } \
    SG_EXPORT void __tsan_write##N(void* p) { check_access(p, N, true, false, __builtin_return_address(0)); } \
    SG_EXPORT void __tsan_unaligned_read##N(void* p) { check_access(p, N, false, false, __builtin_return_address(0)); } \
    SG_EXPORT void __tsan_unaligned_write##N(void* p) { check_access(p, N, true, false, __builtin_return_address(0)); }
SG_TSAN(1)
SG_TSAN(2)
SG_TSAN(4)
SG_TSAN(8)
SG_TSAN(16)
SG_EXPORT void __tsan_read_range(void* p, unsigned long n) {
    if (n) check_access(p, n, false, false, __builtin_return_address(0));
}
SG_EXPORT void __tsan_write_range(void* p, unsigned long n) {
    if (n) check_access(p, n, true, false, __builtin_return_address(0));
}
SG_EXPORT void __tsan_vptr_update(void**, void*) {}
SG_EXPORT void __tsan_vptr_read(void**) {}
}

// ---------------------------------------------------------------- the driver API

namespace {
struct Module {
    std::string name;
};
struct Event {
    double t;
};
int g_ctx_token = 0, g_stream_token = 0;
CUcontext g_current = nullptr;

// SOFTGPU_PROFILE=1: launches, blocks and wall time per kernel, printed at exit.
struct KernelStats {
    uint64_t launches = 0, blocks = 0;
    double ms = 0;
};
std::map<std::string, KernelStats>& profile() {
    static auto* p = new std::map<std::string, KernelStats>;  // never destroyed: read at exit
    return *p;
}
void print_profile() {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& kv : profile()) {
        rows.push_back({kv.second.ms, kv.first});
        total += kv.second.ms;
    }
    std::sort(rows.rbegin(), rows.rend());
    fprintf(stderr, "softgpu profile: %.1f ms of CPU in kernels\n", total);
    for (auto& r : rows) {
        const KernelStats& st = profile()[r.second];
        fprintf(stderr, "softgpu profile: %10.1f ms %8llu launches %10llu blocks  %s\n", st.ms,
                (unsigned long long)st.launches, (unsigned long long)st.blocks, r.second.c_str());
    }
}

// CPU time of this thread: launch timings that a loaded machine does not distort.
double cpu_ms() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double now_ms() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

CUresult launch(const Kernel* k, dim3 grid, dim3 block, void** params) {
    if (!ensure_runtime()) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned threads = block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
        fprintf(stderr, "softgpu: launch of %s with an empty grid (%u,%u,%u) or block (%u,%u,%u)\n", k->name.c_str(),
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (threads > (unsigned)MAX_THREADS || block.y != 1 || block.z != 1) {
        fprintf(stderr, "softgpu: launch of %s with block (%u,%u,%u): at most 1024 threads, 1-D blocks only\n",
                k->name.c_str(), block.x, block.y, block.z);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (k->n_params > 0 && !params) return CUDA_ERROR_INVALID_VALUE;
    double t0 = cpu_ms();
    g_kernel = k;
    g_params = params;
    g_grid_dim = grid;
    g_block_dim = block;
    g_nthreads = (int)threads;
    g_abort = false;
    g_launch_error = CUDA_SUCCESS;
    install_fault_handlers();  // only while kernel code runs: the host program's stay intact
    uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
    for (uint64_t b = 0; b < nblocks; b++) {
        uint64_t bb = g_reverse ? nblocks - 1 - b : b;
        g_block_idx = dim3{(unsigned)(bb % grid.x), (unsigned)(bb / grid.x % grid.y), (unsigned)(bb / grid.x / grid.y)};
        if (!run_block()) {
            g_sticky = g_launch_error;
            break;
        }
    }
    restore_fault_handlers();
    g_kernel = nullptr;
    double ms = cpu_ms() - t0;
    if (g_trace)
        fprintf(stderr, "softgpu: launch %s grid (%u,%u,%u) block %u: %.3f ms of CPU\n", k->name.c_str(), grid.x, grid.y,
                grid.z, block.x, ms);
    if (g_profile) {
        KernelStats& st = profile()[k->name];
        st.launches++;
        st.blocks += nblocks;
        st.ms += ms;
    }
    return g_sticky;
}
}  // namespace

#define API SG_EXPORT CUresult
#define LOCK std::lock_guard<std::recursive_mutex> lock_(g_mu)

extern "C" {
API cuInit(unsigned) {
    configure();
    return CUDA_SUCCESS;
}
API cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}
API cuDeviceGetCount(int* n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = 1;
    return CUDA_SUCCESS;
}
API cuDeviceGet(CUdevice* d, int ordinal) {
    if (!d || ordinal != 0) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
API cuDeviceGetName(char* name, int len, CUdevice) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", DEVICE_NAME);
    return CUDA_SUCCESS;
}
API cuDeviceTotalMem_v2(size_t* b, CUdevice) {
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    *b = TOTAL_MEM;
    return CUDA_SUCCESS;
}
API cuDeviceGetUuid(unsigned char* u, CUdevice) {
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    memcpy(u, "sorft-softgpu-00", 16);
    return CUDA_SUCCESS;
}
API cuDeviceGetUuid_v2(unsigned char* u, CUdevice d) { return cuDeviceGetUuid(u, d); }
API cuDeviceGetAttribute(int* v, int attr, CUdevice) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
        case 1: *v = MAX_THREADS; break;                  // max threads per block
        case 2: *v = MAX_THREADS; break;                  // max block dim x
        case 3: case 4: *v = 1; break;                    // block dim y, z (1-D blocks only)
        case 5: *v = 2147483647; break;                   // grid dim x
        case 6: case 7: *v = 65535; break;
        case 8: *v = 48 * 1024; break;                    // shared memory per block
        case 10: *v = 32; break;                          // warp size
        case 16: *v = 4; break;                           // multiprocessors
        case 75: *v = 9; break;                           // compute capability
        case 76: *v = 0; break;
        case 97: *v = 227 * 1024; break;                  // opt-in shared memory
        case 115: *v = 1; break;                          // memory pools (async alloc)
        default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}
API cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = &g_ctx_token;
    return CUDA_SUCCESS;
}
API cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
API cuDevicePrimaryCtxReset_v2(CUdevice) { return CUDA_SUCCESS; }
API cuCtxSetCurrent(CUcontext c) {
    g_current = c;
    return CUDA_SUCCESS;
}
API cuCtxGetCurrent(CUcontext* c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = g_current;
    return CUDA_SUCCESS;
}
API cuCtxGetDevice(CUdevice* d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
API cuCtxSynchronize(void) { return g_sticky; }
API cuCtxSetFlags(unsigned) { return CUDA_SUCCESS; }
API cuCtxGetStreamPriorityRange(int* lo, int* hi) {
    if (lo) *lo = 0;
    if (hi) *hi = 0;
    return CUDA_SUCCESS;
}
API cuStreamCreate(CUstream* s, unsigned) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = &g_stream_token;
    return CUDA_SUCCESS;
}
API cuStreamCreateWithPriority(CUstream* s, unsigned f, int) { return cuStreamCreate(s, f); }
API cuStreamDestroy_v2(CUstream) { return CUDA_SUCCESS; }
API cuStreamSynchronize(CUstream) { return g_sticky; }
API cuStreamQuery(CUstream) { return g_sticky; }
API cuStreamWaitEvent(CUstream, CUevent, unsigned) { return g_sticky; }
API cuEventCreate(CUevent* e, unsigned) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = new Event{now_ms()};
    return CUDA_SUCCESS;
}
API cuEventRecord(CUevent e, CUstream) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    ((Event*)e)->t = now_ms();
    return g_sticky;
}
API cuEventSynchronize(CUevent) { return g_sticky; }
API cuEventQuery(CUevent) { return g_sticky; }
API cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    if (!ms || !a || !b) return CUDA_ERROR_INVALID_VALUE;
    *ms = (float)(((Event*)b)->t - ((Event*)a)->t);
    return CUDA_SUCCESS;
}
API cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }
API cuEventDestroy_v2(CUevent e) {
    delete (Event*)e;
    return CUDA_SUCCESS;
}
API cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
    LOCK;
    return do_alloc(p, n);
}
API cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream) {
    LOCK;
    return do_alloc(p, n);
}
API cuMemFree_v2(CUdeviceptr p) {
    LOCK;
    return do_free(p);
}
API cuMemFreeAsync(CUdeviceptr p, CUstream) {
    LOCK;
    return do_free(p);
}
API cuMemGetInfo_v2(size_t* free_b, size_t* total) {
    LOCK;
    if (free_b) *free_b = TOTAL_MEM - g_used;
    if (total) *total = TOTAL_MEM;
    return CUDA_SUCCESS;
}
API cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (n == 0) return CUDA_SUCCESS;
    Alloc* a = checked_range(dst, n, "copy to the device");
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void*)dst, src, n);
    mark_init(a, dst, n);
    return CUDA_SUCCESS;
}
API cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream) { return cuMemcpyHtoD_v2(dst, src, n); }
API cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (n == 0) return CUDA_SUCCESS;
    if (!checked_range(src, n, "copy to the host")) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void*)src, n);
    return CUDA_SUCCESS;
}
API cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream) { return cuMemcpyDtoH_v2(dst, src, n); }
API cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (n == 0) return CUDA_SUCCESS;
    Alloc* d = checked_range(dst, n, "device-to-device copy (destination)");
    Alloc* s = checked_range(src, n, "device-to-device copy (source)");
    if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
    memmove((void*)dst, (const void*)src, n);
    memmove(d->init.data() + (dst - d->base), s->init.data() + (src - s->base), n);
    return CUDA_SUCCESS;
}
API cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream) { return cuMemcpyDtoD_v2(dst, src, n); }
API cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (n == 0) return CUDA_SUCCESS;
    Alloc* a = checked_range(dst, n, "memset");
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    memset((void*)dst, v, n);
    mark_init(a, dst, n);
    return CUDA_SUCCESS;
}
API cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream) { return cuMemsetD8_v2(dst, v, n); }
API cuMemsetD32_v2(CUdeviceptr dst, unsigned v, size_t n) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (n == 0) return CUDA_SUCCESS;
    Alloc* a = checked_range(dst, n * 4, "memset");
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) memcpy((char*)dst + 4 * i, &v, 4);
    mark_init(a, dst, n * 4);
    return CUDA_SUCCESS;
}
API cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, CUstream) { return cuMemsetD32_v2(dst, v, n); }

// Module images: only the marker text that the software GPU's libnvrtc produces names a module
// this library can run. A cubin or PTX from nvcc cannot be executed here.
API cuModuleLoadData(CUmodule* m, const void* image) {
    LOCK;
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    const char* text = (const char*)image;
    const char* tag = "// sorft software GPU module ";
    if (strncmp(text, tag, strlen(tag)) != 0) return CUDA_ERROR_INVALID_IMAGE;
    const char* p = text + strlen(tag);
    size_t n = strcspn(p, "\n");
    std::string name(p, n);
    bool any = false;
    for (auto& kv : kernels()) any |= kv.second->module == name;
    if (!any) return CUDA_ERROR_INVALID_IMAGE;
    *m = new Module{name};
    return CUDA_SUCCESS;
}
API cuModuleUnload(CUmodule m) {
    delete (Module*)m;
    return CUDA_SUCCESS;
}
API cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    LOCK;
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    auto it = kernels().find(name);
    if (it == kernels().end() || it->second->module != ((Module*)m)->name) return CUDA_ERROR_NOT_FOUND;
    *f = it->second;
    return CUDA_SUCCESS;
}
API cuFuncGetAttribute(int* v, int attr, CUfunction) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = attr == 0 ? MAX_THREADS : 0;  // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    return CUDA_SUCCESS;
}
API cuFuncSetAttribute(CUfunction, int, int) { return CUDA_SUCCESS; }
API cuFuncSetCacheConfig(CUfunction, int) { return CUDA_SUCCESS; }
API cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, CUstream, void** params, void** extra) {
    LOCK;
    if (g_sticky) return g_sticky;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;
    if (smem > 48 * 1024) return CUDA_ERROR_INVALID_VALUE;
    return launch((const Kernel*)f, dim3{gx, gy, gz}, dim3{bx, by, bz}, params);
}

API cuGetErrorString(CUresult e, const char** s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
        case CUDA_SUCCESS: *s = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
        case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid (the software GPU runs only its own modules)"; break;
        case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *s = "operation not supported"; break;
        default: *s = "unknown error"; break;
    }
    return CUDA_SUCCESS;
}
API cuGetErrorName(CUresult e, const char** s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
        case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
        case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
        case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
        default: *s = "CUDA_ERROR_UNKNOWN"; break;
    }
    return CUDA_SUCCESS;
}
}
