// Tensor-core tiles for the linear layers and the experts: one warp-wide
// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (sm_80 and newer, so
// the same code serves sm_90 and sm_121), and the loaders that build its
// fragments in registers straight from the weights (any of BF16, NVFP4,
// MXFP4) and the f32 activations.
//
// Orientation: A (16 × 16) is 16 weight rows = 16 output features, B (16 × 8)
// is 8 activation rows = 8 tokens, D (16 × 8) features × tokens. Putting the
// weights in A lets a batch of 8 tokens fill whole tiles (batched decode).
//
// Exactness (why the results match the CPU backend up to summation order):
// - Weights become BF16 without rounding. BF16 is as stored; an E2M1 value
//   (2 significant bits) times an E4M3 scale (4 bits, subnormals 3) has at
//   most 6 significant bits, and times an E8M0 power of two stays 2 bits:
//   both fit BF16's 8 (its exponent range is f32's). NVFP4's per-tensor
//   global scale (an arbitrary f32) would not fit, so it multiplies the f32
//   accumulator instead: (Σ e2m1·e4m3·x)·global.
// - Activations are split exactly into ACTIVATION_TERMS = 3 BF16 terms,
//   x = t0 + t1 + t2 (split_bf16: 3 × 8 significant bits hold f32's 24),
//   each multiplied by the same weight fragment. So no activation is
//   rounded and the kernels agree with the GEMV and the CPU backend up to
//   summation order. Fewer terms were measured on the fixtures: two terms
//   (x to within 2⁻¹⁸) moved gpt-oss-tiny's prompt logits by 1.4e-4 between
//   the tensor cores and the GEMV (the backends are held to 1e-4 there,
//   tests/cuda_fixtures.rs) and qwen3-moe-tiny's with a BF16 KV cache by
//   2.3e-3 from the CPU (held to 1e-3); one term (2⁻⁹) is worse still. The
//   terms triple the tensor-core work, which decode (bound by weight
//   bandwidth) does not feel and prefill pays for; a tolerance that allowed
//   BF16 activations would make it ACTIVATION_TERMS = 1.
// - Products of BF16 values are exact in f32; the accumulation is f32.
#pragma once
#include "common.cuh"

// The tile is MMA_M weight rows (output features) × MMA_N activation rows
// (tokens) × MMA_K reduction depth (constants.cuh).
#define ACTIVATION_TERMS 3  // BF16 terms per activation (see above)

// d += A·B over one 16×8×16 tile; every lane of the warp calls it at once.
// With g = lane / 4 and t = lane % 4 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), the low half of each 32-bit
// register holding the lower column (A) or row (B):
//   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// The CPU emulator (kernels/emu/mma.h, a test tool) implements the same
// contract as a warp-collective.
__device__ __forceinline__ void mma_bf16_16x8x16(float* d, const u32* a, const u32* b) {
#if defined(SPARKRT_EMULATOR)
    sparkrt_emu_mma_bf16_16x8x16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // The host selects the tensor-core kernels on sm_80 and newer only.
    __trap();
#endif
}

__device__ __forceinline__ u32 pack_bf16x2(u32 low, u32 high) { return (low & 0xffffu) | (high << 16); }

// An f32 already representable in BF16 (see above): its top 16 bits.
__device__ __forceinline__ u32 exact_bf16_bits(float v) { return __float_as_uint(v) >> 16; }

// Elements (row, k) and (row, k + 1) of `w` as packed BF16, k even and
// relative to a tile start k0 (multiple of MMA_K); zero past the last column.
__device__ __forceinline__ u32 weight_pair(const Weight& w, u32 row, u32 k0, u32 k) {
    const u32 K = w.cols;
    const u8* data = (const u8*)w.data;
    u64 index = (u64)row * K + k;
    switch (w.format) {
    case FMT_BF16: {
        if (k + 1u < K) {
            return load_u32_any(data + 2ull * index);
        }
        return k < K ? load_u16_any(data + 2ull * index) : 0u;
    }
    case FMT_NVFP4: {
        // K is a multiple of NVFP4_GROUP: no partial tiles, one scale per tile.
        u32 byte = data[index >> 1];
        float scale = e4m3_to_f32(((const u8*)w.scales)[(u64)row * (K / NVFP4_GROUP) + k0 / NVFP4_GROUP]);
        return pack_bf16x2(exact_bf16_bits(e2m1_to_f32(byte & 15u) * scale),
                           exact_bf16_bits(e2m1_to_f32(byte >> 4) * scale));
    }
    default: {
        // FMT_MXFP4 (F32 weights never take the tensor-core path).
        u32 byte = data[index >> 1];
        float scale = e8m0_to_f32(((const u8*)w.scales)[(u64)row * (K / MXFP4_GROUP) + k0 / MXFP4_GROUP]);
        return pack_bf16x2(exact_bf16_bits(e2m1_to_f32(byte & 15u) * scale),
                           exact_bf16_bits(e2m1_to_f32(byte >> 4) * scale));
    }
    }
}

// What the accumulator is multiplied by: NVFP4's global scale, else 1.
__device__ __forceinline__ float weight_accumulator_scale(const Weight& w) {
    return w.format == FMT_NVFP4 ? w.global : 1.0f;
}

// This lane's A fragment: weight rows row0 (= tile row g) and row1 (g + 8),
// columns k0 + 2t (+1, +8, +9).
__device__ __forceinline__ void weight_fragment(const Weight& w, u32 row0, u32 row1, u32 k0, u32 t,
                                                u32* a) {
    u32 k = k0 + 2u * t;
    a[0] = weight_pair(w, row0, k0, k);
    a[1] = weight_pair(w, row1, k0, k);
    a[2] = weight_pair(w, row0, k0, k + 8u);
    a[3] = weight_pair(w, row1, k0, k + 8u);
}

// x = terms[0] + terms[1] + terms[2], each BF16: each term is the top 16
// bits of what is left (truncation: the remainder is exact in f32 and keeps
// the sign, and 3 × 8 significant bits hold f32's 24; exact for every
// finite |x| above 2⁻¹¹⁰, where the last remainder would be subnormal). A
// non-finite x is its first term (rounded as f32_to_bf16 does) alone.
__device__ __forceinline__ void split_bf16(float x, u32* terms) {
    const bool finite = x - x == 0.0f;
    float rest = x;
#pragma unroll
    for (int i = 0; i < ACTIVATION_TERMS; ++i) {
        u32 term = finite ? __float_as_uint(rest) >> 16 : (i == 0 ? (u32)f32_to_bf16(x) : 0u);
        terms[i] = term;
        rest = rest - bf16_to_f32(term);
    }
}

// This lane's B fragments, one per activation term, of one activation row
// `x` (nullptr: a row past the last, zeros), columns k0 + 2t (+1, +8, +9).
__device__ __forceinline__ void activation_fragments(const float* x, u32 K, u32 k0, u32 t,
                                                     u32 (*b)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        u32 k = k0 + 2u * t + 8u * (u32)half;
        float v0 = x && k < K ? x[k] : 0.0f;
        float v1 = x && k + 1u < K ? x[k + 1u] : 0.0f;
        u32 t0[ACTIVATION_TERMS], t1[ACTIVATION_TERMS];
        split_bf16(v0, t0);
        split_bf16(v1, t1);
#pragma unroll
        for (int i = 0; i < ACTIVATION_TERMS; ++i) {
            b[i][half] = pack_bf16x2(t0[i], t1[i]);
        }
    }
}

// acc[j] += W[n0 .. n0+16) · x_jᵀ for the first `tiles` of TILES tiles of 8
// activation rows; x[j] is this lane's row of tile j (row g of the tile), or
// nullptr. Feature n is weight row n·stride + offset (interleaved gate/up:
// stride 2); features past `features` read the last one (their outputs are
// not stored). Every lane of the warp calls it with the same n0 and tiles.
template <int TILES>
__device__ __forceinline__ void mma_rows(const Weight& w, u32 n0, u32 features, u32 stride,
                                         u32 offset, u32 lane, const float* const* x, u32 tiles,
                                         float (*acc)[4]) {
    const u32 g = lane >> 2;
    const u32 t = lane & 3u;
    const u32 last = features - 1u;
    const u32 row0 = min(n0 + g, last) * stride + offset;
    const u32 row1 = min(n0 + g + 8u, last) * stride + offset;
    for (u32 k0 = 0; k0 < w.cols; k0 += MMA_K) {
        u32 a[4];
        weight_fragment(w, row0, row1, k0, t, a);
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
            if ((u32)j < tiles) {
                u32 b[ACTIVATION_TERMS][2];
                activation_fragments(x[j], w.cols, k0, t, b);
#pragma unroll
                for (int i = 0; i < ACTIVATION_TERMS; ++i) {
                    mma_bf16_16x8x16(acc[j], a, b[i]);
                }
            }
        }
    }
}

// Where accumulator element i of this lane lands: feature n0 + mma_feature,
// activation row (within its tile) mma_token.
__device__ __forceinline__ u32 mma_feature(u32 lane, int i) { return (lane >> 2) + (i >= 2 ? 8u : 0u); }
__device__ __forceinline__ u32 mma_token(u32 lane, int i) { return 2u * (lane & 3u) + (u32)(i & 1); }
