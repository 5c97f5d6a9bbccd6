// Dense linear layers: `out[r] = x[r] · Wᵀ (+ bias)` for up to MAX_JOBS
// weights in one launch (q, k and v together), any weight format. One warp
// per output feature; the weight row streams once per TOKEN_TILE rows.
#include "linear.cuh"

#define MATMUL_WARPS 4
#define MAX_JOBS 4

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
