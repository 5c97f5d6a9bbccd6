// Test tool: one m16n8k16 through the emulator's mma (kernels/emu/mma.h),
// called the way the kernels call it (mma_bf16_16x8x16 in kernels/mma.cuh),
// against a scalar A·B + C. Every element of A, B and C is distinct, so any
// fragment placed in the wrong row, column or half changes D; the values
// are small multiples of powers of two, so every partial sum is exact in
// f32 and D must match to the bit whatever the summation order.
// Built with driver.cpp and run by tests/cuda_kernels.rs; prints "ok" or
// the first mismatch.
#include <cstdio>

#include "../shim.h"
#include "../../mma.cuh"

// Distinct in every element, exact in BF16 (at most 8 significant bits),
// signs mixed so that sums cancel.
static float a_value(unsigned m, unsigned k) {
    float v = (float)(m * 16 + k + 1);  // 1 .. 256
    return (m + k) % 3 == 0 ? -v : v;
}
static float b_value(unsigned k, unsigned n) {
    float v = (float)(k * 8 + n + 1) / 128.0f;  // 1/128 .. 1
    return (k * n) % 2 == 1 ? -v : v;
}
static float c_value(unsigned m, unsigned n) { return (float)(m * 8 + n) * 0.5f - 20.0f; }

static unsigned bf16_bits(float v) { return __float_as_uint(v) >> 16; }
static unsigned pair(float low, float high) { return bf16_bits(low) | (bf16_bits(high) << 16); }

struct ProbeParams {
    float* d;  // [32 lanes][4]
};

// Fragments written out element by element from the PTX ISA's formulas
// (row/col of a_i, b_i, c_i), independently of mma.h's unpacking loops.
static void mma_probe(ProbeParams p) {
    unsigned lane = threadIdx.x % 32;
    unsigned g = lane >> 2;
    unsigned t = lane % 4;
    unsigned a[4] = {
        pair(a_value(g, 2 * t), a_value(g, 2 * t + 1)),              // a0, a1
        pair(a_value(g + 8, 2 * t), a_value(g + 8, 2 * t + 1)),      // a2, a3
        pair(a_value(g, 2 * t + 8), a_value(g, 2 * t + 9)),          // a4, a5
        pair(a_value(g + 8, 2 * t + 8), a_value(g + 8, 2 * t + 9)),  // a6, a7
    };
    unsigned b[2] = {
        pair(b_value(2 * t, g), b_value(2 * t + 1, g)),      // b0, b1
        pair(b_value(2 * t + 8, g), b_value(2 * t + 9, g)),  // b2, b3
    };
    float d[4] = {c_value(g, 2 * t), c_value(g, 2 * t + 1), c_value(g + 8, 2 * t),
                  c_value(g + 8, 2 * t + 1)};
    mma_bf16_16x8x16(d, a, b);
    for (int i = 0; i < 4; ++i) {
        p.d[lane * 4 + i] = d[i];
    }
}
EMU_KERNEL(mma_probe, ProbeParams)

extern "C" int cuModuleGetFunction(void** f, void* module, const char* name);
extern "C" int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shared, void* stream,
                              void** params, void** extra);

int main() {
    float d[128];
    ProbeParams params = {d};
    void* args[] = {&params};
    void* f = nullptr;
    if (cuModuleGetFunction(&f, nullptr, "mma_probe") != 0 ||
        cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) != 0) {
        std::printf("launch failed\n");
        return 1;
    }
    for (unsigned lane = 0; lane < 32; ++lane) {
        for (unsigned i = 0; i < 4; ++i) {
            unsigned m = (lane >> 2) + (i >= 2 ? 8 : 0);
            unsigned n = 2 * (lane % 4) + (i & 1);
            double want = c_value(m, n);
            for (unsigned k = 0; k < 16; ++k) {
                want += (double)a_value(m, k) * (double)b_value(k, n);
            }
            if ((float)want != d[lane * 4 + i]) {
                std::printf("lane %u d[%u] = D[%u][%u]: %.9g, want %.9g\n", lane, i, m, n,
                            d[lane * 4 + i], want);
                return 1;
            }
        }
    }
    std::printf("ok\n");
    return 0;
}
