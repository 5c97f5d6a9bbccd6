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

