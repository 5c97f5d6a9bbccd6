// Small per-element and per-row kernels: the embedding gather, silu·mul,
// the residual add, moving the sampled rows together, and greedy sampling.
#include "common.cuh"

struct EmbedParams {
    Weight table;  // [vocab, hidden]
    u64 meta;      // the step's token ids come first
    u64 out;       // [rows, hidden]
    u32 rows;
    u32 pad;
};
static_assert(sizeof(EmbedParams) == 56, "EmbedParams layout");

// One block per row: out[t] = table[token[t]] (token ids checked on the host).
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) embed(EmbedParams p) {
    u32 row = blockIdx.x;
    u32 token = ((const u32*)p.meta)[row];
    float* out = (float*)p.out + (u64)row * p.table.cols;
    for (u32 c = threadIdx.x; c < p.table.cols; c += blockDim.x) {
        out[c] = weight_element(p.table, token, c);
    }
}

struct PairParams {
    u64 a;  // updated in place
    u64 b;
    u64 n;
};
static_assert(sizeof(PairParams) == 24, "PairParams layout");

// a[i] = silu(a[i]) · b[i], silu(x) = x / (1 + e^-x).
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) silu_mul(PairParams p) {
    float* a = (float*)p.a;
    const float* b = (const float*)p.b;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n;
         i += (u64)gridDim.x * blockDim.x) {
        float g = a[i];
        a[i] = g / (1.0f + expf(-g)) * b[i];
    }
}

// a[i] += b[i].
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) add(PairParams p) {
    float* a = (float*)p.a;
    const float* b = (const float*)p.b;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n;
         i += (u64)gridDim.x * blockDim.x) {
        a[i] = a[i] + b[i];
    }
}

struct CompactParams {
    u64 buf;   // rows of `width`
    u64 meta;  // logit rows at [max_tokens, 2·max_tokens)
    u32 max_tokens;
    u32 count;
    u32 width;
    u32 pad;
};
static_assert(sizeof(CompactParams) == 32, "CompactParams layout");

// One block, rows in order: row logit_rows[i] moves to row i. Ascending rows
// make the in-order copy safe; a parallel one could overwrite a row that a
// later copy still reads.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) compact_rows(CompactParams p) {
    float* buf = (float*)p.buf;
    const u32* rows = (const u32*)p.meta + p.max_tokens;
    for (u32 i = 0; i < p.count; ++i) {
        u32 from = rows[i];
        if (from != i) {
            for (u32 c = threadIdx.x; c < p.width; c += blockDim.x) {
                buf[(u64)i * p.width + c] = buf[(u64)from * p.width + c];
            }
        }
        __syncthreads();
    }
}

struct ArgmaxParams {
    u64 logits;  // [rows, vocab]
    u64 ids;     // [rows] u32
    u32 rows;
    u32 vocab;
};
static_assert(sizeof(ArgmaxParams) == 24, "ArgmaxParams layout");

__device__ __forceinline__ bool beats(float v, u32 i, float best_v, u32 best_i) {
    return v > best_v || (v == best_v && i < best_i);
}

// One block per row: the index of the largest logit, ties to the lowest.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) argmax(ArgmaxParams p) {
    __shared__ float warp_v[BLOCK_THREADS / WARP];
    __shared__ u32 warp_i[BLOCK_THREADS / WARP];
    const float* row = (const float*)p.logits + (u64)blockIdx.x * p.vocab;
    float best_v = f32_neg_inf();
    u32 best_i = 0xffffffffu;
    for (u32 i = threadIdx.x; i < p.vocab; i += blockDim.x) {
        float v = row[i];
        if (best_i == 0xffffffffu || v > best_v) {
            best_v = v;
            best_i = i;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float v = __shfl_xor_sync(FULL_MASK, best_v, offset);
        u32 i = __shfl_xor_sync(FULL_MASK, best_i, offset);
        if (i != 0xffffffffu && (best_i == 0xffffffffu || beats(v, i, best_v, best_i))) {
            best_v = v;
            best_i = i;
        }
    }
    u32 warp = threadIdx.x / WARP;
    if (threadIdx.x % WARP == 0u) {
        warp_v[warp] = best_v;
        warp_i[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0u) {
        for (u32 w = 1; w < blockDim.x / WARP; ++w) {
            if (warp_i[w] != 0xffffffffu &&
                (best_i == 0xffffffffu || beats(warp_v[w], warp_i[w], best_v, best_i))) {
                best_v = warp_v[w];
                best_i = warp_i[w];
            }
        }
        ((u32*)p.ids)[blockIdx.x] = best_i;
    }
}
