// Shared by every kernel file: fixed-width types, bf16 / FP4 / FP8 / E8M0
// decoding by bit operations (NVRTC has no CUDA headers), loads that accept
// any alignment (weights are read in place from safetensors files, where a
// tensor may start at any byte), warp reductions, and the step metadata
// layout. Every struct passed to a kernel is mirrored field by field in
// src/backend/cuda/params.rs; its size is checked on both sides. The
// numbers shared with the host (block sizes, limits, format codes, the
// metadata layout) come from constants.cuh, which the host writes from
// src/backend/cuda/constants.rs.
#pragma once
#include "constants.cuh"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu

// Dynamic shared memory as floats. The CPU emulator (kernels/emu, a test
// tool) gives each block its own buffer instead.
#ifdef SPARKRT_EMULATOR
#define DYNAMIC_SHARED_FLOATS(name) float* name = sparkrt_emu_dynamic_shared()
#else
#define DYNAMIC_SHARED_FLOATS(name) extern __shared__ float name[]
#endif

__device__ __forceinline__ float f32_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float f32_neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float f32_nan() { return __int_as_float(0x7fc00000); }

// ---- bf16 -----------------------------------------------------------------

__device__ __forceinline__ float bf16_to_f32(u32 bits) {
    return __uint_as_float((bits & 0xffffu) << 16);
}

// Round to nearest even, NaN kept quiet: what half::bf16::from_f32 does.
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// ---- FP4 E2M1, FP8 E4M3, E8M0 ------------------------------------------------
// Mirrors src/formats.rs (the crate's one definition of these formats, see
// docs/FORMATS.md) constant for constant and rule for rule; the case table of
// tests/format_cases is checked against both (tests/formats.rs, and on the
// GPU or its emulator tests/cuda_kernels.rs). Its constants (NVFP4_GROUP,
// MXFP4_GROUP, MXFP4_BLOCK_BYTES, E8M0_NAN) are in constants.cuh.

// Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
__device__ __forceinline__ float e2m1_to_f32(u32 code) {
    u32 e = (code >> 1) & 3u;
    u32 m = code & 1u;
    u32 bits = e ? (((e + 126u) << 23) | (m << 22)) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((code & 8u) << 28));
}

// float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
__device__ __forceinline__ float e4m3_to_f32(u32 byte) {
    u32 e = (byte >> 3) & 0xfu;
    u32 m = byte & 7u;
    if (e == 0xfu && m == 7u) {
        return f32_nan();
    }
    float magnitude = e == 0u ? (float)m * (1.0f / 512.0f)
                              : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (byte & 0x80u) ? -magnitude : magnitude;
}

// 2^(s - 127); 0xff is NaN (OCP MX v1.0); s = 0 is the subnormal 2^-127.
__device__ __forceinline__ float e8m0_to_f32(u32 byte) {
    if (byte == E8M0_NAN) {
        return f32_nan();
    }
    return __uint_as_float(byte == 0u ? 0x00400000u : (byte << 23));
}

// ---- loads at any alignment ---------------------------------------------------
// The alignment test is uniform across a warp whenever the lanes' addresses
// differ by multiples of the load width, which is how the kernels use them.

__device__ __forceinline__ u32 load_u32_any(const u8* p) {
    u64 a = (u64)p;
    if ((a & 3u) == 0u) {
        return *(const u32*)p;
    }
    if ((a & 1u) == 0u) {
        const u16* h = (const u16*)p;
        return (u32)h[0] | ((u32)h[1] << 16);
    }
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ uint2 load8_any(const u8* p) {
    if (((u64)p & 7u) == 0u) {
        return *(const uint2*)p;
    }
    return make_uint2(load_u32_any(p), load_u32_any(p + 4));
}

__device__ __forceinline__ uint4 load16_any(const u8* p) {
    u64 a = (u64)p;
    if ((a & 15u) == 0u) {
        return *(const uint4*)p;
    }
    if ((a & 7u) == 0u) {
        uint2 lo = *(const uint2*)p;
        uint2 hi = *(const uint2*)(p + 8);
        return make_uint4(lo.x, lo.y, hi.x, hi.y);
    }
    return make_uint4(load_u32_any(p), load_u32_any(p + 4), load_u32_any(p + 8),
                      load_u32_any(p + 12));
}

__device__ __forceinline__ u32 load_u16_any(const u8* p) {
    if (((u64)p & 1u) == 0u) {
        return *(const u16*)p;
    }
    return (u32)p[0] | ((u32)p[1] << 8);
}

__device__ __forceinline__ float load_f32_any(const u8* p) {
    return __uint_as_float(load_u32_any(p));
}

// ---- warp reductions ------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

// ---- vectors (norm weights, biases, sinks): bf16 or f32 -----------------------

__device__ __forceinline__ float vector_get(u64 data, u32 is_bf16, u32 i) {
    const u8* p = (const u8*)data;
    return is_bf16 ? bf16_to_f32(load_u16_any(p + 2ull * i)) : load_f32_any(p + 4ull * i);
}

// ---- weights ------------------------------------------------------------------------
// Formats FMT_F32, FMT_BF16, FMT_NVFP4, FMT_MXFP4 (constants.cuh).

// A [rows, cols] weight in device-readable memory, in its checkpoint format.
struct Weight {
    u64 data;    // values (F32 / BF16) or packed E2M1 codes, low nibble first
    u64 scales;  // NVFP4: E4M3 [rows, cols/NVFP4_GROUP]; MXFP4: E8M0 [rows, cols/MXFP4_GROUP]
    u32 format;  // FMT_*
    float global;  // NVFP4 weight_scale_2
    u32 rows;
    u32 cols;
};
static_assert(sizeof(Weight) == 32, "Weight layout");

// Element (row, col) as f32: the embedding gather and the reference of the
// matmul's decoding.
__device__ __forceinline__ float weight_element(const Weight& w, u32 row, u32 col) {
    u64 index = (u64)row * w.cols + col;
    const u8* data = (const u8*)w.data;
    const u8* scales = (const u8*)w.scales;
    switch (w.format) {
    case FMT_F32:
        return load_f32_any(data + 4ull * index);
    case FMT_BF16:
        return bf16_to_f32(load_u16_any(data + 2ull * index));
    case FMT_NVFP4: {
        u32 byte = data[index >> 1];
        u32 code = (index & 1ull) ? (byte >> 4) : (byte & 15u);
        float scale = e4m3_to_f32(scales[(u64)row * (w.cols / NVFP4_GROUP) + col / NVFP4_GROUP]) * w.global;
        return e2m1_to_f32(code) * scale;
    }
    default: {
        u32 byte = data[index >> 1];
        u32 code = (index & 1ull) ? (byte >> 4) : (byte & 15u);
        return e2m1_to_f32(code) * e8m0_to_f32(scales[(u64)row * (w.cols / MXFP4_GROUP) + col / MXFP4_GROUP]);
    }
    }
}

// ---- step metadata ------------------------------------------------------------------
// One u32 buffer per step (src/backend/cuda/memory.rs, CudaStep; sized by
// plan::memory::StepMetadataPlan, T = max_tokens, S = max_seqs,
// B = max_blocks_per_seq):
//   [tokens: T][logit rows: T][seqs: 5 × S][tables: 2 × S × B]
// The tables region holds the full-attention tables (StepBatch::block_tables)
// in its first S × B words and the sliding-window tables
// (StepBatch::sliding_block_tables) in its last S × B. Each sequence: start
// row, length, cached tokens (past), and where its two tables start, both
// counted from the start of the tables region (so SEQ_SLIDING is S × B +
// SeqChunk::sliding_start): a kernel picks a layer's table by the field alone.
// A sliding table's entry is NO_BLOCK for a block that left the window.
// The fields' indices SEQ_START .. SEQ_TABLE, SEQ_FIELDS and NO_BLOCK are in
// constants.cuh.

struct StepView {
    const u32* tokens;
    const u32* logit_rows;
    const u32* seqs;
    const u32* tables;
    u32 num_seqs;
};

__device__ __forceinline__ StepView step_view(u64 meta, u32 max_tokens, u32 max_seqs,
                                              u32 num_seqs) {
    const u32* base = (const u32*)meta;
    StepView v;
    v.tokens = base;
    v.logit_rows = base + max_tokens;
    v.seqs = base + 2u * max_tokens;
    v.tables = base + 2u * max_tokens + SEQ_FIELDS * max_seqs;
    v.num_seqs = num_seqs;
    return v;
}

__device__ __forceinline__ u32 seq_field(const StepView& v, u32 seq, u32 field) {
    return v.seqs[seq * SEQ_FIELDS + field];
}

// The sequence holding step row `row`: the last whose start is <= row
// (sequences are packed in row order).
__device__ __forceinline__ u32 seq_of_row(const StepView& v, u32 row) {
    u32 lo = 0u;
    u32 hi = v.num_seqs;
    while (hi - lo > 1u) {
        u32 mid = (lo + hi) >> 1;
        if (seq_field(v, mid, SEQ_START) <= row) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Position of step row `row` in its sequence.
__device__ __forceinline__ u32 position_of_row(const StepView& v, u32 row) {
    u32 s = seq_of_row(v, row);
    return seq_field(v, s, SEQ_PAST) + (row - seq_field(v, s, SEQ_START));
}

// Block of `position` of sequence `seq` in the table its field `table`
// (SEQ_TABLE or SEQ_SLIDING) points at; NO_BLOCK where the table has none.
__device__ __forceinline__ u32 table_block(const StepView& v, u32 seq, u32 table, u32 position,
                                           u32 block_size) {
    return v.tables[seq_field(v, seq, table) + position / block_size];
}
