// Dense linear layers: `out[r] = x[r] · Wᵀ (+ bias)` for up to MAX_JOBS
// weights in one launch (q, k and v together), any weight format. Two
// kernels over the same parameters, one launch either way (the host picks,
// src/backend/cuda/mod.rs `matmul`):
//   matmul      one warp per output feature of FP32 FMAs; the weight row
//               streams once per TOKEN_TILE rows (batch-1..8 decode)
//   matmul_mma  tensor cores (mma.cuh): one warp per 16 features, one block
//               per MMA_TOKENS rows (prefill, batched decode)
#include "linear.cuh"
#include "mma.cuh"

// MATMUL_WARPS, MAX_JOBS, and for matmul_mma MMA_WARPS (a warp per MMA_M
// features), MMA_TILES and MMA_TOKENS (rows per block): constants.cuh.

struct MatmulJob {
    Weight w;
    u64 x;       // rows of w.cols, from the job's first row
    u64 out;     // rows of w.rows
    u64 bias;    // 0 or [w.rows]
    u32 bias_bf16;
    u32 rows;
    u32 first_block;  // blocks of the jobs before this one
    u32 pad;
};
static_assert(sizeof(MatmulJob) == 72, "MatmulJob layout");

struct MatmulParams {
    MatmulJob jobs[MAX_JOBS];
    u32 count;
    u32 pad;
};
static_assert(sizeof(MatmulParams) == 72 * MAX_JOBS + 8, "MatmulParams layout");

extern "C" __global__ void __launch_bounds__(MATMUL_WARPS * WARP, 4) matmul(MatmulParams p) {
    // Constant indices keep the job table in parameter space.
    MatmulJob job = p.jobs[0];
#pragma unroll
    for (u32 j = 1; j < MAX_JOBS; ++j) {
        if (j < p.count && blockIdx.x >= p.jobs[j].first_block) {
            job = p.jobs[j];
        }
    }
    u32 warp = threadIdx.x / WARP;
    u32 lane = threadIdx.x % WARP;
    u32 n = (blockIdx.x - job.first_block) * MATMUL_WARPS + warp;
    if (n >= job.w.rows) {
        return;
    }
    const u32 K = job.w.cols;
    const u32 N = job.w.rows;
    float bias = job.bias ? vector_get(job.bias, job.bias_bf16, n) : 0.0f;
    for (u32 t0 = 0; t0 < job.rows; t0 += TOKEN_TILE) {
        u32 ntok = min(TOKEN_TILE, job.rows - t0);
        const float* x[TOKEN_TILE];
        float acc[TOKEN_TILE];
#pragma unroll
        for (int t = 0; t < TOKEN_TILE; ++t) {
            x[t] = (const float*)job.x + (u64)(t0 + t) * K;
            acc[t] = 0.0f;
        }
        dot_row_partial<TOKEN_TILE>(job.w, n, x, ntok, lane, acc);
#pragma unroll
        for (int t = 0; t < TOKEN_TILE; ++t) {
            if ((u32)t < ntok) {
                float sum = warp_sum(acc[t]);
                if (lane == 0u) {
                    float* out = (float*)job.out + (u64)(t0 + t) * N + n;
                    *out = job.bias ? sum + bias : sum;
                }
            }
        }
    }
}

// Grid: (Σ ceil(w.rows / (MMA_WARPS · MMA_M)) over the jobs, ceil(max rows /
// MMA_TOKENS)); block MMA_WARPS warps. BF16, NVFP4 and MXFP4 weights.
extern "C" __global__ void __launch_bounds__(MMA_WARPS * WARP) matmul_mma(MatmulParams p) {
    MatmulJob job = p.jobs[0];
#pragma unroll
    for (u32 j = 1; j < MAX_JOBS; ++j) {
        if (j < p.count && blockIdx.x >= p.jobs[j].first_block) {
            job = p.jobs[j];
        }
    }
    const u32 lane = threadIdx.x % WARP;
    const u32 n0 = ((blockIdx.x - job.first_block) * MMA_WARPS + threadIdx.x / WARP) * MMA_M;
    const u32 t0 = blockIdx.y * MMA_TOKENS;
    // Whole warps leave together: the mma below needs every lane.
    if (n0 >= job.w.rows || t0 >= job.rows) {
        return;
    }
    const u32 K = job.w.cols;
    const u32 N = job.w.rows;
    const u32 ntok = min(MMA_TOKENS, job.rows - t0);
    const u32 tiles = (ntok + MMA_N - 1u) / MMA_N;
    const float* x[MMA_TILES];
    float acc[MMA_TILES][4];
#pragma unroll
    for (int j = 0; j < MMA_TILES; ++j) {
        u32 row = (u32)j * MMA_N + (lane >> 2);
        x[j] = row < ntok ? (const float*)job.x + (u64)(t0 + row) * K : nullptr;
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    }
    mma_rows<MMA_TILES>(job.w, n0, N, 1u, 0u, lane, x, tiles, acc);
    const float scale = weight_accumulator_scale(job.w);
#pragma unroll
    for (int j = 0; j < MMA_TILES; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 n = n0 + mma_feature(lane, i);
            u32 row = (u32)j * MMA_N + mma_token(lane, i);
            if ((u32)j < tiles && n < N && row < ntok) {
                float v = acc[j][i] * scale;
                if (job.bias) {
                    v = v + vector_get(job.bias, job.bias_bf16, n);
                }
                ((float*)job.out)[(u64)(t0 + row) * N + n] = v;
            }
        }
    }
}
