// One warp's share of `out[t][n] = x[t] · W[n]` for up to TT input rows at
// once (TT is a compile-time tile: the accumulators live in registers): the lanes split the weight row into 16-byte chunks, decode
// them in registers (BF16, F32, NVFP4 with its E4M3 group scales and global
// scale, MXFP4 with its E8M0 block scales) and multiply-add into one partial
// sum per row; the caller adds the lanes' sums with warp_sum. Each weight
// element is decoded exactly as src/checkpoint/quant.rs does.
#pragma once
#include "common.cuh"

// Rows per pass of the dense matmul: TOKEN_TILE (constants.cuh).

// acc[t] += Σ_i w[i] · x[t][offset + i] over LEN consecutive elements.
template <int TT, int LEN>
__device__ __forceinline__ void fma_run(const float* w, const float* const* x, u32 offset,
                                        u32 ntok, float* acc) {
#pragma unroll
    for (int t = 0; t < TT; ++t) {
        if ((u32)t < ntok) {
            const float* xp = x[t] + offset;
            float a = acc[t];
#pragma unroll
            for (int i = 0; i < LEN; ++i) {
                a = fmaf(w[i], xp[i], a);
            }
            acc[t] = a;
        }
    }
}

__device__ __forceinline__ void unpack_bf16x8(uint4 q, float* w) {
    u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = __uint_as_float(words[i] << 16);
        w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ void unpack_fp4x8(u32 word, float scale, float* w) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        w[i] = e2m1_to_f32((word >> (4 * i)) & 15u) * scale;
    }
}

// This lane's partial dot products of weight row `n` with x[0..ntok).
template <int TT>
__device__ __forceinline__ void dot_row_partial(const Weight& w, u32 n, const float* const* x,
                                                u32 ntok, u32 lane, float* acc) {
    const u32 K = w.cols;
    const u8* data = (const u8*)w.data;
    switch (w.format) {
    case FMT_BF16: {
        const u8* row = data + (u64)n * K * 2u;
        u32 chunks = K / 8u;
        for (u32 c = lane; c < chunks; c += WARP) {
            float v[8];
            unpack_bf16x8(load16_any(row + 16u * c), v);
            fma_run<TT, 8>(v, x, 8u * c, ntok, acc);
        }
        for (u32 k = chunks * 8u + lane; k < K; k += WARP) {
            float v = bf16_to_f32(load_u16_any(row + 2u * k));
            fma_run<TT, 1>(&v, x, k, ntok, acc);
        }
        break;
    }
    case FMT_F32: {
        const u8* row = data + (u64)n * K * 4u;
        u32 chunks = K / 4u;
        for (u32 c = lane; c < chunks; c += WARP) {
            uint4 q = load16_any(row + 16u * c);
            float v[4] = {__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z),
                          __uint_as_float(q.w)};
            fma_run<TT, 4>(v, x, 4u * c, ntok, acc);
        }
        for (u32 k = chunks * 4u + lane; k < K; k += WARP) {
            float v = load_f32_any(row + 4u * k);
            fma_run<TT, 1>(&v, x, k, ntok, acc);
        }
        break;
    }
    case FMT_NVFP4: {
        // NVFP4_GROUP (16) elements per group: 8 bytes of codes and one E4M3 scale.
        const u8* row = data + (u64)n * (K / 2u);
        const u8* scales = (const u8*)w.scales + (u64)n * (K / NVFP4_GROUP);
        for (u32 c = lane; c < K / NVFP4_GROUP; c += WARP) {
            uint2 codes = load8_any(row + 8u * c);
            float scale = e4m3_to_f32(scales[c]) * w.global;
            float v[8];
            unpack_fp4x8(codes.x, scale, v);
            fma_run<TT, 8>(v, x, NVFP4_GROUP * c, ntok, acc);
            unpack_fp4x8(codes.y, scale, v);
            fma_run<TT, 8>(v, x, NVFP4_GROUP * c + 8u, ntok, acc);
        }
        break;
    }
    default: {
        // MXFP4: MXFP4_GROUP (32) elements per block: 16 bytes of codes and
        // one E8M0 scale.
        const u8* row = data + (u64)n * (K / 2u);
        const u8* scales = (const u8*)w.scales + (u64)n * (K / MXFP4_GROUP);
        for (u32 c = lane; c < K / MXFP4_GROUP; c += WARP) {
            uint4 codes = load16_any(row + MXFP4_BLOCK_BYTES * c);
            float scale = e8m0_to_f32(scales[c]);
            u32 words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float v[8];
                unpack_fp4x8(words[i], scale, v);
                fma_run<TT, 8>(v, x, MXFP4_GROUP * c + 8u * i, ntok, acc);
            }
        }
        break;
    }
    }
}
