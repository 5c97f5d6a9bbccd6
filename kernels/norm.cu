// RMSNorm (plain and fused with the residual add), the RoPE cos/sin table of
// a step's positions, and the per-head q/k RMSNorm + rotate-half RoPE.
// All f32; the formulas are those of src/backend/cpu/ops.rs.
#include "common.cuh"

// NORM_THREADS, ROPE_THREADS, MAX_ROPE_HALF, MAX_HEAD_DIM: constants.cuh.

struct NormParams {
    u64 x;       // rmsnorm: the input; add_rmsnorm: the residual, updated in place
    u64 delta;   // 0 for a plain rmsnorm
    u64 weight;  // [width] bf16 or f32
    u64 out;
    u32 weight_bf16;
    u32 width;
    float eps;
    u32 rows;
};
static_assert(sizeof(NormParams) == 48, "NormParams layout");

__device__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    u32 warp = threadIdx.x / WARP;
    u32 lane = threadIdx.x % WARP;
    if (lane == 0u) {
        scratch[warp] = v;
    }
    __syncthreads();
    float total = 0.0f;
    // Every thread adds the warps' sums in the same order.
    for (u32 w = 0; w < blockDim.x / WARP; ++w) {
        total += scratch[w];
    }
    __syncthreads();
    return total;
}

// One block per row: [residual += delta;] out = x · rsqrt(mean(x²) + eps) · w.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) rmsnorm(NormParams p) {
    __shared__ float scratch[NORM_THREADS / WARP];
    u32 row = blockIdx.x;
    float* x = (float*)p.x + (u64)row * p.width;
    const float* delta = p.delta ? (const float*)p.delta + (u64)row * p.width : 0;
    float* out = (float*)p.out + (u64)row * p.width;
    float sum_sq = 0.0f;
    for (u32 i = threadIdx.x; i < p.width; i += blockDim.x) {
        float v = x[i];
        if (delta) {
            v = v + delta[i];
            x[i] = v;
        }
        sum_sq = fmaf(v, v, sum_sq);
    }
    float total = block_sum(sum_sq, scratch);
    float scale = 1.0f / sqrtf(total / (float)p.width + p.eps);
    for (u32 i = threadIdx.x; i < p.width; i += blockDim.x) {
        out[i] = x[i] * scale * vector_get(p.weight, p.weight_bf16, i);
    }
}

struct RopeTableParams {
    u64 meta;
    u64 out;  // [rows, 2·half]: cos then sin
    u32 max_tokens;
    u32 max_seqs;
    u32 num_seqs;
    u32 rows;
    u32 half;
    float attention_factor;
    float inv_freq[MAX_ROPE_HALF];
};
static_assert(sizeof(RopeTableParams) == 40 + 4 * MAX_ROPE_HALF, "RopeTableParams layout");

// One block per row. The angle is an f32 product, as transformers computes
// it; cos and sin are taken in double and rounded, like the CPU backend.
extern "C" __global__ void __launch_bounds__(ROPE_THREADS) rope_table(RopeTableParams p) {
    u32 row = blockIdx.x;
    StepView step = step_view(p.meta, p.max_tokens, p.max_seqs, p.num_seqs);
    float position = (float)position_of_row(step, row);
    float* out = (float*)p.out + (u64)row * 2u * p.half;
    for (u32 j = threadIdx.x; j < p.half; j += blockDim.x) {
        double angle = (double)(position * p.inv_freq[j]);
        out[j] = (float)cos(angle) * p.attention_factor;
        out[p.half + j] = (float)sin(angle) * p.attention_factor;
    }
}

struct QkRopeParams {
    u64 q;
    u64 k;
    u64 q_norm;  // 0: no q/k norm
    u64 k_norm;
    u64 rope;    // [rows, head_dim] from rope_table
    u32 q_norm_bf16;
    u32 k_norm_bf16;
    u32 rows;
    u32 heads;
    u32 kv_heads;
    u32 head_dim;
    float eps;
    u32 pad;
};
static_assert(sizeof(QkRopeParams) == 72, "QkRopeParams layout");

// Grid (rows, heads + kv_heads), one warp per head: q heads first, then k.
extern "C" __global__ void __launch_bounds__(WARP) qk_norm_rope(QkRopeParams p) {
    __shared__ float head[MAX_HEAD_DIM];
    u32 row = blockIdx.x;
    u32 h = blockIdx.y;
    u32 lane = threadIdx.x;
    u32 hd = p.head_dim;
    bool is_q = h < p.heads;
    u32 width = (is_q ? p.heads : p.kv_heads) * hd;
    float* x = (float*)(is_q ? p.q : p.k) + (u64)row * width + (u64)(is_q ? h : h - p.heads) * hd;
    u64 norm = is_q ? p.q_norm : p.k_norm;
    u32 norm_bf16 = is_q ? p.q_norm_bf16 : p.k_norm_bf16;

    float scale = 1.0f;
    if (norm) {
        float sum_sq = 0.0f;
        for (u32 i = lane; i < hd; i += WARP) {
            sum_sq += x[i] * x[i];
        }
        scale = 1.0f / sqrtf(warp_sum(sum_sq) / (float)hd + p.eps);
    }
    for (u32 i = lane; i < hd; i += WARP) {
        float v = x[i];
        head[i] = norm ? v * scale * vector_get(norm, norm_bf16, i) : v;
    }
    __syncwarp();
    u32 half = hd / 2u;
    const float* cos_row = (const float*)p.rope + (u64)row * hd;
    const float* sin_row = cos_row + half;
    for (u32 j = lane; j < half; j += WARP) {
        float a = head[j];
        float b = head[j + half];
        float c = cos_row[j];
        float s = sin_row[j];
        x[j] = a * c - b * s;
        x[j + half] = b * c + a * s;
    }
}
