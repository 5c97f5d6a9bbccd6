// Test tool, not product code: lets the kernel sources compile as C++ for
// the CPU emulator (libcuda.so built from emu/driver.cpp). One block runs at
// a time, its threads as OS threads: a function-static variable is then the
// block's shared memory, and barriers stand in for __syncthreads and the
// warp-synchronous intrinsics (which every lane of a warp must reach, as
// the kernels are written to do).
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define SPARKRT_EMULATOR 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
};
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    using T = typename std::common_type<A, B>::type;
    return (T)a < (T)b ? (T)a : (T)b;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

// Provided by driver.cpp.
void sparkrt_emu_syncthreads();
void sparkrt_emu_syncwarp();
unsigned sparkrt_emu_exchange(unsigned value, int source_lane);
unsigned sparkrt_emu_match_any(unsigned value);
float* sparkrt_emu_dynamic_shared();

inline void __syncthreads() { sparkrt_emu_syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { sparkrt_emu_syncwarp(); }

template <class T>
inline T sparkrt_emu_shfl(T v, int source_lane) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    bits = sparkrt_emu_exchange(bits, source_lane);
    T out;
    std::memcpy(&out, &bits, 4);
    return out;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int offset) {
    return sparkrt_emu_shfl(v, (int)(threadIdx.x % 32) ^ offset);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int lane) {
    return sparkrt_emu_shfl(v, lane);
}
inline unsigned __match_any_sync(unsigned, unsigned v) { return sparkrt_emu_match_any(v); }

// mma.sync as a warp-collective.
#include "mma.h"

// One kernel's entry for the driver's table.
struct EmuKernel {
    const char* name;
    void (*run)(const void* params);
    EmuKernel* next;
};
void sparkrt_emu_register(EmuKernel* kernel);

#define EMU_KERNEL(name, Params)                                                   \
    static EmuKernel emu_entry_##name = {#name,                                    \
                                         [](const void* p) { name(*(const Params*)p); }, \
                                         nullptr};                                 \
    static int emu_registered_##name = (sparkrt_emu_register(&emu_entry_##name), 0);
