// Test tool, not product code: a CPU stand-in for the part of the CUDA
// driver API the CUDA backend uses, built as libcuda.so. Device memory is
// host memory; a "module" is the table of kernels compiled from the same
// kernels/*.cu sources for the CPU (shim.h); a launch runs each block in
// turn with one fiber per CUDA thread. With it on LD_LIBRARY_PATH the
// whole backend (host code, parameter layouts, kernel logic) runs on a
// machine without a GPU; scripts/cuda-emulator-check.sh builds and uses it.
//
// Environment: EMU_SM (compute capability, default 121), EMU_INTEGRATED and
// EMU_PAGEABLE (0/1), EMU_NO_REGISTER (refuse cuMemHostRegister),
// EMU_FAULT_KERNEL (a kernel name: its first launch faults as an illegal
// address does on a GPU: the launch itself succeeds, the kernel does not
// run, and every later launch, copy and synchronisation fails with
// CUDA_ERROR_ILLEGAL_ADDRESS: the context is dead).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "shim.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUmodule;
typedef void* CUfunction;

static const CUresult OK = 0;
static const CUresult INVALID_VALUE = 1;
static const CUresult OUT_OF_MEMORY = 2;
static const CUresult NOT_FOUND = 500;
static const CUresult NOT_SUPPORTED = 801;
static const CUresult ILLEGAL_ADDRESS = 700;

// The sticky error of EMU_FAULT_KERNEL, once its kernel has launched.
static std::atomic<CUresult> sticky{OK};

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim;
dim3 gridDim;

static EmuKernel* table = nullptr;

void sparkrt_emu_register(EmuKernel* kernel) {
    kernel->next = table;
    table = kernel;
}

// ---- one launch: CUDA threads as fibers ---------------------------------------------
// Every CUDA thread of a block is a fiber on the calling OS thread; a fiber
// runs until it reaches a barrier (__syncthreads, or a warp-synchronous
// intrinsic) or exits, and the scheduler releases a barrier once every
// live thread it concerns has arrived. Switching is a handful of register
// moves (emu_switch below), so thousands of warp shuffles stay cheap.

extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
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
.size emu_switch, .-emu_switch
)");

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Exited };

static const size_t FIBER_STACK = 256 << 10;

struct Fiber {
    std::vector<unsigned char> stack;
    void* sp = nullptr;
    State state = State::Exited;
};

static std::vector<Fiber> fibers;
static void* scheduler_sp = nullptr;
static unsigned current = 0;
static EmuKernel* launch_kernel = nullptr;
static const void* launch_params = nullptr;
static unsigned warp_slots[1024];
static std::vector<float> dynamic_shared;

static int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

static void yield_to_scheduler() { emu_switch(&fibers[current].sp, scheduler_sp); }

[[noreturn]] static void fiber_entry() {
    launch_kernel->run(launch_params);
    fibers[current].state = State::Exited;
    yield_to_scheduler();
    std::abort();  // an exited fiber is never resumed
}

static void start_fiber(Fiber& f) {
    if (f.stack.empty()) {
        f.stack.resize(FIBER_STACK);
    }
    // Top of stack, 16-aligned: a dummy return slot, fiber_entry as the
    // address emu_switch returns to, then six callee-saved registers.
    uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack.data()) + FIBER_STACK) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&fiber_entry);
    for (int i = 0; i < 6; ++i) {
        *--sp = nullptr;
    }
    f.sp = sp;
    f.state = State::Runnable;
}

void sparkrt_emu_syncthreads() {
    fibers[current].state = State::AtBlockBarrier;
    yield_to_scheduler();
}

void sparkrt_emu_syncwarp() {
    fibers[current].state = State::AtWarpBarrier;
    yield_to_scheduler();
}

unsigned sparkrt_emu_exchange(unsigned value, int source_lane) {
    unsigned base = current & ~31u;
    warp_slots[current] = value;
    sparkrt_emu_syncwarp();
    unsigned out = warp_slots[base + (source_lane & 31)];
    sparkrt_emu_syncwarp();
    return out;
}

unsigned sparkrt_emu_match_any(unsigned value) {
    unsigned base = current & ~31u;
    warp_slots[current] = value;
    sparkrt_emu_syncwarp();
    unsigned mask = 0;
    for (unsigned lane = 0; lane < 32 && base + lane < blockDim.x; ++lane) {
        if (warp_slots[base + lane] == value) {
            mask |= 1u << lane;
        }
    }
    sparkrt_emu_syncwarp();
    return mask;
}

// Up to GATHER_WORDS values per thread, for the warp-collectives (mma.h).
static const unsigned GATHER_WORDS = 16;
static unsigned gather_slots[1024 * GATHER_WORDS];

void sparkrt_emu_warp_gather(const unsigned* mine, unsigned words, unsigned* all) {
    unsigned base = current & ~31u;
    if (words > GATHER_WORDS || base + 32 > blockDim.x) {
        // A collective needs a whole warp (the hardware's .aligned rule).
        std::fprintf(stderr, "emulator: %s: a warp-collective in a partial warp\n",
                     launch_kernel->name);
        std::abort();
    }
    std::memcpy(&gather_slots[current * GATHER_WORDS], mine, words * sizeof(unsigned));
    sparkrt_emu_syncwarp();
    for (unsigned lane = 0; lane < 32; ++lane) {
        std::memcpy(all + lane * words, &gather_slots[(base + lane) * GATHER_WORDS],
                    words * sizeof(unsigned));
    }
    sparkrt_emu_syncwarp();
}

float* sparkrt_emu_dynamic_shared() { return dynamic_shared.data(); }

// Releases the barriers every live thread concerned has reached; false when
// nothing can run (a deadlock: a kernel bug).
static bool release_barriers(unsigned threads) {
    bool any = false;
    bool block_ready = true;
    bool someone_at_block = false;
    for (unsigned t = 0; t < threads; ++t) {
        State s = fibers[t].state;
        if (s == State::Runnable) return true;
        if (s != State::Exited && s != State::AtBlockBarrier) block_ready = false;
        if (s == State::AtBlockBarrier) someone_at_block = true;
    }
    if (block_ready && someone_at_block) {
        for (unsigned t = 0; t < threads; ++t) {
            if (fibers[t].state == State::AtBlockBarrier) fibers[t].state = State::Runnable;
        }
        return true;
    }
    for (unsigned w = 0; w < threads; w += 32) {
        unsigned end = std::min(threads, w + 32);
        bool ready = true;
        bool waiting = false;
        for (unsigned t = w; t < end; ++t) {
            State s = fibers[t].state;
            if (s == State::AtWarpBarrier) waiting = true;
            else if (s != State::Exited) ready = false;
        }
        if (ready && waiting) {
            for (unsigned t = w; t < end; ++t) {
                if (fibers[t].state == State::AtWarpBarrier) fibers[t].state = State::Runnable;
            }
            any = true;
        }
    }
    return any;
}

static bool all_exited(unsigned threads) {
    for (unsigned t = 0; t < threads; ++t) {
        if (fibers[t].state != State::Exited) return false;
    }
    return true;
}

static void run_launch(EmuKernel* kernel, dim3 grid, unsigned threads, unsigned shared_bytes,
                       const void* params) {
    gridDim = grid;
    blockDim = dim3{threads, 1, 1};
    dynamic_shared.assign(shared_bytes / 4 + 1, 0.0f);
    launch_kernel = kernel;
    launch_params = params;
    if (fibers.size() < threads) fibers.resize(threads);
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = dim3{x, y, z};
                for (unsigned t = 0; t < threads; ++t) start_fiber(fibers[t]);
                while (!all_exited(threads)) {
                    for (unsigned t = 0; t < threads; ++t) {
                        if (fibers[t].state == State::Runnable) {
                            current = t;
                            threadIdx = dim3{t, 0, 0};
                            emu_switch(&scheduler_sp, fibers[t].sp);
                        }
                    }
                    if (!all_exited(threads) && !release_barriers(threads)) {
                        std::fprintf(stderr, "emulator: %s deadlocked in block (%u,%u,%u)\n",
                                     kernel->name, x, y, z);
                        std::abort();
                    }
                }
            }
        }
    }
}

// ---- the driver API subset ----------------------------------------------------------

API CUresult cuInit(unsigned) { return OK; }
API CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return OK;
}
API CUresult cuDeviceGetCount(int* n) {
    *n = 1;
    return OK;
}
API CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal != 0) return INVALID_VALUE;
    *d = 0;
    return OK;
}
API CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    std::snprintf(name, len, "sparkrt CPU emulator");
    return OK;
}
API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    *bytes = size_t(8) << 30;
    return OK;
}
API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice) {
    int sm = env_int("EMU_SM", 121);
    switch (attribute) {
    case 75: *value = sm / 10; break;                              // compute capability major
    case 76: *value = sm % 10; break;                              // minor
    case 18: *value = env_int("EMU_INTEGRATED", 0); break;         // integrated
    case 88: *value = env_int("EMU_PAGEABLE", 0); break;           // pageable memory access
    case 16: *value = 4; break;                                    // multiprocessors
    case 97: *value = 101376; break;                               // shared memory opt-in
    case 113: *value = 1; break;                                   // read-only host register
    default: *value = 0; break;
    }
    return OK;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice) {
    static int context;
    *ctx = &context;
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return OK; }
API CUresult cuCtxSetCurrent(CUcontext) { return OK; }
API CUresult cuStreamCreate(CUstream* stream, unsigned) {
    static int s;
    *stream = &s;
    return OK;
}
API CUresult cuStreamSynchronize(CUstream) { return sticky.load(); }
API CUresult cuStreamDestroy_v2(CUstream) { return OK; }
API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    // The CUBIN (real, from NVRTC) must at least be an ELF file.
    if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return INVALID_VALUE;
    static int m;
    *module = &m;
    return OK;
}
API CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
    for (EmuKernel* k = table; k; k = k->next) {
        if (std::strcmp(k->name, name) == 0) {
            *f = k;
            return OK;
        }
    }
    return NOT_FOUND;
}
API CUresult cuModuleUnload(CUmodule) { return OK; }
API CUresult cuFuncSetAttribute(CUfunction, int, int) { return OK; }
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, CUstream, void** params,
                            void**) {
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by != 1 || bz != 1 || bx > 1024 ||
        gy > 65535 || gz > 65535 || shared > 101376) {
        return INVALID_VALUE;
    }
    if (sticky.load() != OK) return sticky.load();
    const char* fault = std::getenv("EMU_FAULT_KERNEL");
    if (fault && std::strcmp(fault, static_cast<EmuKernel*>(f)->name) == 0) {
        // Reported later, as a GPU reports a fault: at the next call that waits.
        sticky.store(ILLEGAL_ADDRESS);
        return OK;
    }
    // One launch at a time: the launch state above is process-wide (tests
    // run backends on several threads).
    static std::mutex one_at_a_time;
    std::lock_guard<std::mutex> lock(one_at_a_time);
    run_launch(static_cast<EmuKernel*>(f), dim3{gx, gy, gz}, bx, shared, params[0]);
    return OK;
}
API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    void* m = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!m) return OUT_OF_MEMORY;
    // Fresh device memory is not zero: make forgetting to clear it show.
    std::memset(m, 0x7f, bytes);
    *p = reinterpret_cast<CUdeviceptr>(m);
    return OK;
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
    std::free(reinterpret_cast<void*>(p));
    return OK;
}
API CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream) {
    if (sticky.load() != OK) return sticky.load();
    std::memset(reinterpret_cast<void*>(p), v, n);
    return OK;
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream) {
    if (sticky.load() != OK) return sticky.load();
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return OK;
}
API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream) {
    if (sticky.load() != OK) return sticky.load();
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return OK;
}
API CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
    *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return *p ? OK : OUT_OF_MEMORY;
}
API CUresult cuMemFreeHost(void* p) {
    std::free(p);
    return OK;
}
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned) {
    *d = reinterpret_cast<CUdeviceptr>(p);
    return OK;
}
API CUresult cuMemHostRegister_v2(void*, size_t, unsigned) {
    return env_int("EMU_NO_REGISTER", 0) ? NOT_SUPPORTED : OK;
}
API CUresult cuMemHostUnregister(void*) { return OK; }
API CUresult cuGetErrorName(CUresult e, const char** s) {
    *s = e == OK ? "CUDA_SUCCESS" : e == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
         : e == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : e == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
         : e == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS"
         : "CUDA_ERROR_INVALID_VALUE";
    return OK;
}
API CUresult cuGetErrorString(CUresult e, const char** s) { return cuGetErrorName(e, s); }
