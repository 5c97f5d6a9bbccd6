// Test tool, not product code: the emulator's
// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, a warp-collective
// with the fragment layouts the PTX ISA defines ("Matrix Fragments for
// mma.m16n8k16 with floating point type"; the contract is spelled out in
// kernels/mma.cuh). Every lane hands its fragments to the warp, rebuilds the
// whole A (16×16), B (16×8) and C (16×8), and computes its own four
// elements of D = A·B + C: each product of two BF16 values is exact in f32,
// the sum is f32 in k order starting from C (the hardware's order is not
// specified; the kernels' tests allow for summation order).
#pragma once

// Each lane's `words` values, gathered from the whole warp into
// all[lane · words + i] (driver.cpp; a warp barrier like the shuffles').
void sparkrt_emu_warp_gather(const unsigned* mine, unsigned words, unsigned* all);

inline float sparkrt_emu_bf16(unsigned bits) { return __uint_as_float((bits & 0xffffu) << 16); }

inline void sparkrt_emu_mma_bf16_16x8x16(float* d, const unsigned* a, const unsigned* b) {
    const unsigned WORDS = 10;  // a[4], b[2], c[4]
    unsigned mine[WORDS] = {a[0], a[1], a[2], a[3], b[0], b[1],
                            __float_as_uint(d[0]), __float_as_uint(d[1]),
                            __float_as_uint(d[2]), __float_as_uint(d[3])};
    unsigned all[32 * WORDS];
    sparkrt_emu_warp_gather(mine, WORDS, all);
    float A[16][16], B[16][8], C[16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
        const unsigned* w = all + lane * WORDS;
        unsigned g = lane >> 2, t = lane & 3;
        // a[r]: rows g (r even) or g + 8 (r odd), columns 2t, 2t+1 (+8 for r ≥ 2).
        for (unsigned r = 0; r < 4; ++r) {
            unsigned row = g + ((r & 1) ? 8 : 0);
            unsigned col = 2 * t + ((r & 2) ? 8 : 0);
            A[row][col] = sparkrt_emu_bf16(w[r]);
            A[row][col + 1] = sparkrt_emu_bf16(w[r] >> 16);
        }
        // b[r]: rows (k) 2t, 2t+1 (+8 for r = 1), column g.
        for (unsigned r = 0; r < 2; ++r) {
            unsigned k = 2 * t + (r ? 8 : 0);
            B[k][g] = sparkrt_emu_bf16(w[4 + r]);
            B[k + 1][g] = sparkrt_emu_bf16(w[4 + r] >> 16);
        }
        // c[i]: row g (i < 2) or g + 8, column 2t + (i & 1).
        for (unsigned i = 0; i < 4; ++i) {
            C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)] = __uint_as_float(w[6 + i]);
        }
    }
    unsigned lane = threadIdx.x % 32;
    unsigned g = lane >> 2, t = lane & 3;
    for (unsigned i = 0; i < 4; ++i) {
        unsigned row = g + (i >= 2 ? 8 : 0);
        unsigned col = 2 * t + (i & 1);
        float sum = C[row][col];
        for (unsigned k = 0; k < 16; ++k) {
            sum += A[row][k] * B[k][col];
        }
        d[i] = sum;
    }
}
