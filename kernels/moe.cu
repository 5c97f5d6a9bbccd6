// Routed experts through the one MoE workspace, with no copy to the host:
//   route_group   router softmax + top-k per token, then (last block) a
//                 stable counting sort of the routed rows by expert
//   expert_gate_up gate/up projections of every routed row + the activation
//   expert_down   down projections (+ bias) of every routed row
//   moe_combine   per token, the routing-weighted sum of its k rows, in rank
//                 order (deterministic: no atomics)
// expert_gate_up_mma and expert_down_mma are the tensor-core forms of the
// two projections (mma.cuh: each expert's rows as tiles of 8, 16 features
// per warp); the host picks one form per step, one launch either way
// (src/backend/cuda/moe.rs).
// The semantics are those of src/backend/cpu/moe.rs.
#include "linear.cuh"
#include "mma.cuh"

// ROUTE_WARPS, MAX_EXPERTS, MAX_TOP_K, EXPERT_WARPS, EXPERT_MMA_WARPS and the
// ROUTER_* kinds: constants.cuh.
// Routed rows per pass: fewer than the dense matmul's, as gate/up keeps two
// accumulators per row (register pressure).
#define EXPERT_TILE 4
#define NONE 0xffffffffu
// Tensor-core forms: EXPERT_MMA_WARPS warps per block (MMA_M features each),
// and tiles of MMA_N routed rows per pass (gate/up keeps two sets of
// accumulators).
#define GATE_UP_MMA_TILES 4
#define DOWN_MMA_TILES 8

struct RouteParams {
    u64 logits;        // [rows, experts]
    u64 topk_ids;      // [rows·k]: expert of each routed slot; after grouping, its position
    u64 topk_weights;  // [rows·k]
    u64 offsets;       // [experts + 1]
    u64 sorted_rows;   // [rows·k]: slot at each position, in expert order
    u64 counter;       // one u32, zero between launches
    u32 rows;
    u32 num_experts;
    u32 top_k;
    u32 kind;  // ROUTER_*
};
static_assert(sizeof(RouteParams) == 64, "RouteParams layout");

__device__ __forceinline__ bool better(float v, u32 i, float best_v, u32 best_i) {
    if (i == NONE) {
        return false;
    }
    return best_i == NONE || v > best_v || (v == best_v && i < best_i);
}

// Top-k of one token's logits by repeated maximum (ties to the lower expert,
// as on the CPU), then its weights.
__device__ void route_row(const RouteParams& p, u32 row, u32 lane, float* chosen) {
    const float* logits = (const float*)p.logits + (u64)row * p.num_experts;
    u32* ids = (u32*)p.topk_ids + (u64)row * p.top_k;
    float* weights = (float*)p.topk_weights + (u64)row * p.top_k;
    u32 taken = 0u;  // bit i: expert lane + 32·i is chosen
    for (u32 r = 0; r < p.top_k; ++r) {
        float best_v = f32_neg_inf();
        u32 best_i = NONE;
        for (u32 i = 0, j = lane; j < p.num_experts; ++i, j += WARP) {
            if (!((taken >> i) & 1u)) {
                float v = logits[j];
                if (best_i == NONE || v > best_v) {
                    best_v = v;
                    best_i = j;
                }
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            float v = __shfl_xor_sync(FULL_MASK, best_v, offset);
            u32 i = __shfl_xor_sync(FULL_MASK, best_i, offset);
            if (better(v, i, best_v, best_i)) {
                best_v = v;
                best_i = i;
            }
        }
        if (best_i % WARP == lane) {
            taken |= 1u << (best_i / WARP);
        }
        if (lane == 0u) {
            ids[r] = best_i;
            chosen[r] = best_v;
        }
    }
    __syncwarp();
    float max = chosen[0];
    float total = 0.0f;
    if (p.kind != ROUTER_TOPK_SOFTMAX) {
        float partial = 0.0f;
        for (u32 j = lane; j < p.num_experts; j += WARP) {
            partial += expf(logits[j] - max);
        }
        total = warp_sum(partial);
    }
    if (lane == 0u) {
        if (p.kind == ROUTER_TOPK_SOFTMAX) {
            float sum = 0.0f;
            for (u32 r = 0; r < p.top_k; ++r) {
                weights[r] = expf(chosen[r] - max);
                sum += weights[r];
            }
            for (u32 r = 0; r < p.top_k; ++r) {
                weights[r] = weights[r] / sum;
            }
        } else {
            for (u32 r = 0; r < p.top_k; ++r) {
                weights[r] = expf(chosen[r] - max) / total;
            }
            if (p.kind == ROUTER_SOFTMAX_TOPK_RENORM) {
                float sum = 0.0f;
                for (u32 r = 0; r < p.top_k; ++r) {
                    sum += weights[r];
                }
                for (u32 r = 0; r < p.top_k; ++r) {
                    weights[r] = weights[r] / sum;
                }
            }
        }
    }
}

// Counting sort of the routed slots by expert, stable (slots keep token
// order within an expert): offsets, sorted_rows, and each slot's position
// written over its expert id. Run by one block once every row is routed.
__device__ void group_by_expert(const RouteParams& p) {
    __shared__ u32 running[MAX_EXPERTS];
    const u32 n = p.rows * p.top_k;
    const u32 E = p.num_experts;
    // Written by other blocks: read past the (incoherent) L1.
    volatile u32* ids = (volatile u32*)p.topk_ids;
    u32* offsets = (u32*)p.offsets;
    u32* sorted = (u32*)p.sorted_rows;
    for (u32 e = threadIdx.x; e < E; e += blockDim.x) {
        running[e] = 0u;
    }
    __syncthreads();
    for (u32 s = threadIdx.x; s < n; s += blockDim.x) {
        atomicAdd(&running[ids[s]], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0u) {
        u32 start = 0u;
        for (u32 e = 0; e < E; ++e) {
            u32 count = running[e];
            offsets[e] = start;
            running[e] = start;
            start += count;
        }
        offsets[E] = start;
    }
    __syncthreads();
    if (threadIdx.x < WARP) {
        // One warp walks the slots in order, 32 at a time; lanes routed to
        // the same expert take consecutive positions in lane order.
        u32 lane = threadIdx.x;
        for (u32 base = 0; base < n; base += WARP) {
            u32 s = base + lane;
            u32 e = s < n ? ids[s] : NONE;
            u32 same = __match_any_sync(FULL_MASK, e);
            u32 rank = __popc(same & ((1u << lane) - 1u));
            u32 first = s < n ? running[e] : 0u;
            __syncwarp();
            if (s < n) {
                u32 position = first + rank;
                sorted[position] = s;
                ids[s] = position;
                if (rank == 0u) {
                    running[e] = first + __popc(same);
                }
            }
            __syncwarp();
        }
    }
}

// Grid: ceil(rows / ROUTE_WARPS) blocks, one warp per token.
extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * WARP) route_group(RouteParams p) {
    __shared__ float chosen[ROUTE_WARPS][MAX_TOP_K];
    __shared__ bool last;
    u32 warp = threadIdx.x / WARP;
    u32 lane = threadIdx.x % WARP;
    u32 row = blockIdx.x * ROUTE_WARPS + warp;
    if (row < p.rows) {
        route_row(p, row, lane, chosen[warp]);
    }
    // The last block to finish groups every row (threadFenceReduction).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0u) {
        u32 done = atomicAdd((u32*)p.counter, 1u);
        last = done == gridDim.x - 1u;
    }
    __syncthreads();
    if (!last) {
        return;
    }
    __threadfence();
    group_by_expert(p);
    if (threadIdx.x == 0u) {
        *(u32*)p.counter = 0u;
    }
}

// One MoE layer's experts, one entry per expert, in device memory.
struct ExpertWeights {
    Weight gate;  // split: gate [I, H]; interleaved: gate_up [2I, H]
    Weight up;    // split: up [I, H]; interleaved: unused
    Weight down;  // [H, I]
    u64 gate_up_bias;  // interleaved: [2I] or 0
    u64 down_bias;     // [H] or 0
};
static_assert(sizeof(ExpertWeights) == 112, "ExpertWeights layout");

struct GateUpParams {
    u64 experts;      // ExpertWeights[num_experts]
    u64 x;            // [rows, hidden]
    u64 sorted_rows;  // slot (token·k + rank) at each position
    u64 offsets;      // [num_experts + 1]
    u64 act;          // [routed, inter]
    u32 num_experts;
    u32 top_k;
    u32 hidden;
    u32 inter;
    u32 interleaved;  // gate row 2j, up row 2j+1, biases, clamped SwiGLU
    u32 bias_bf16;
    float limit;
    float alpha;
};
static_assert(sizeof(GateUpParams) == 72, "GateUpParams layout");

// The activation of one gate/up pair, biases included: clamped SwiGLU
// (interleaved experts) or silu(gate) · up.
__device__ __forceinline__ float expert_activation(const GateUpParams& p, float g, float u) {
    if (p.interleaved) {
        float gc = fminf(g, p.limit);
        float uc = fminf(fmaxf(u, -p.limit), p.limit);
        return (uc + 1.0f) * gc * (1.0f / (1.0f + expf(-(p.alpha * gc))));
    }
    return g / (1.0f + expf(-g)) * u;
}

// Grid: ceil(inter / EXPERT_WARPS); warp = output feature j of every expert
// in turn (empty experts are skipped by reading their offsets).
extern "C" __global__ void __launch_bounds__(EXPERT_WARPS * WARP, 4) expert_gate_up(GateUpParams p) {
    u32 warp = threadIdx.x / WARP;
    u32 lane = threadIdx.x % WARP;
    u32 j = blockIdx.x * EXPERT_WARPS + warp;
    if (j >= p.inter) {
        return;
    }
    const u32* offsets = (const u32*)p.offsets;
    const u32* sorted = (const u32*)p.sorted_rows;
    const ExpertWeights* experts = (const ExpertWeights*)p.experts;
    for (u32 e = 0; e < p.num_experts; ++e) {
        u32 begin = offsets[e];
        u32 end = offsets[e + 1u];
        if (begin >= end) {
            continue;
        }
        const Weight gate = experts[e].gate;
        const Weight up = p.interleaved ? gate : experts[e].up;
        u32 gate_row = p.interleaved ? 2u * j : j;
        u32 up_row = p.interleaved ? 2u * j + 1u : j;
        float gate_bias = 0.0f;
        float up_bias = 0.0f;
        u64 bias = experts[e].gate_up_bias;
        if (p.interleaved && bias) {
            gate_bias = vector_get(bias, p.bias_bf16, gate_row);
            up_bias = vector_get(bias, p.bias_bf16, up_row);
        }
        for (u32 p0 = begin; p0 < end; p0 += EXPERT_TILE) {
            u32 ntok = min(EXPERT_TILE, end - p0);
            const float* x[EXPERT_TILE];
            float acc_gate[EXPERT_TILE];
            float acc_up[EXPERT_TILE];
#pragma unroll
            for (int t = 0; t < EXPERT_TILE; ++t) {
                u32 token = (u32)t < ntok ? sorted[p0 + t] / p.top_k : 0u;
                x[t] = (const float*)p.x + (u64)token * p.hidden;
                acc_gate[t] = 0.0f;
                acc_up[t] = 0.0f;
            }
            dot_row_partial<EXPERT_TILE>(gate, gate_row, x, ntok, lane, acc_gate);
            dot_row_partial<EXPERT_TILE>(up, up_row, x, ntok, lane, acc_up);
#pragma unroll
            for (int t = 0; t < EXPERT_TILE; ++t) {
                if ((u32)t < ntok) {
                    float g = warp_sum(acc_gate[t]);
                    float u = warp_sum(acc_up[t]);
                    if (lane == 0u) {
                        ((float*)p.act)[(u64)(p0 + t) * p.inter + j] =
                            expert_activation(p, g + gate_bias, u + up_bias);
                    }
                }
            }
        }
    }
}

// Grid: (ceil(inter / (EXPERT_MMA_WARPS · MMA_M)), num_experts); block
// EXPERT_MMA_WARPS warps, warp = features j0 .. j0+16 of expert blockIdx.y
// over its routed rows, GATE_UP_MMA_TILES tiles per pass.
extern "C" __global__ void __launch_bounds__(EXPERT_MMA_WARPS * WARP)
    expert_gate_up_mma(GateUpParams p) {
    const u32 lane = threadIdx.x % WARP;
    const u32 j0 = (blockIdx.x * EXPERT_MMA_WARPS + threadIdx.x / WARP) * MMA_M;
    const u32 e = blockIdx.y;
    const u32 begin = ((const u32*)p.offsets)[e];
    const u32 end = ((const u32*)p.offsets)[e + 1u];
    if (j0 >= p.inter || begin >= end) {
        return;
    }
    const u32* sorted = (const u32*)p.sorted_rows;
    const ExpertWeights* experts = (const ExpertWeights*)p.experts;
    // Interleaved: feature j is gate row 2j and up row 2j + 1 of one weight.
    const Weight gate = experts[e].gate;
    const Weight up = p.interleaved ? gate : experts[e].up;
    const u32 stride = p.interleaved ? 2u : 1u;
    const u64 bias = experts[e].gate_up_bias;
    const float gate_scale = weight_accumulator_scale(gate);
    const float up_scale = weight_accumulator_scale(up);
    for (u32 p0 = begin; p0 < end; p0 += GATE_UP_MMA_TILES * MMA_N) {
        const u32 count = min(GATE_UP_MMA_TILES * MMA_N, end - p0);
        const u32 tiles = (count + MMA_N - 1u) / MMA_N;
        const float* x[GATE_UP_MMA_TILES];
        float acc_gate[GATE_UP_MMA_TILES][4];
        float acc_up[GATE_UP_MMA_TILES][4];
#pragma unroll
        for (int t = 0; t < GATE_UP_MMA_TILES; ++t) {
            u32 r = (u32)t * MMA_N + (lane >> 2);
            x[t] = r < count ? (const float*)p.x + (u64)(sorted[p0 + r] / p.top_k) * p.hidden
                             : nullptr;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                acc_gate[t][i] = 0.0f;
                acc_up[t][i] = 0.0f;
            }
        }
        mma_rows<GATE_UP_MMA_TILES>(gate, j0, p.inter, stride, 0u, lane, x, tiles, acc_gate);
        mma_rows<GATE_UP_MMA_TILES>(up, j0, p.inter, stride, stride - 1u, lane, x, tiles, acc_up);
#pragma unroll
        for (int t = 0; t < GATE_UP_MMA_TILES; ++t) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                u32 j = j0 + mma_feature(lane, i);
                u32 r = (u32)t * MMA_N + mma_token(lane, i);
                if ((u32)t < tiles && j < p.inter && r < count) {
                    float g = acc_gate[t][i] * gate_scale;
                    float u = acc_up[t][i] * up_scale;
                    if (p.interleaved && bias) {
                        g = g + vector_get(bias, p.bias_bf16, 2u * j);
                        u = u + vector_get(bias, p.bias_bf16, 2u * j + 1u);
                    }
                    ((float*)p.act)[(u64)(p0 + r) * p.inter + j] = expert_activation(p, g, u);
                }
            }
        }
    }
}

struct DownParams {
    u64 experts;
    u64 act;       // [routed, inter]
    u64 offsets;
    u64 down_out;  // [routed, hidden]
    u32 num_experts;
    u32 hidden;
    u32 inter;
    u32 bias_bf16;
};
static_assert(sizeof(DownParams) == 48, "DownParams layout");

// Grid: ceil(hidden / EXPERT_WARPS); warp = output feature n.
extern "C" __global__ void __launch_bounds__(EXPERT_WARPS * WARP, 4) expert_down(DownParams p) {
    u32 warp = threadIdx.x / WARP;
    u32 lane = threadIdx.x % WARP;
    u32 n = blockIdx.x * EXPERT_WARPS + warp;
    if (n >= p.hidden) {
        return;
    }
    const u32* offsets = (const u32*)p.offsets;
    const ExpertWeights* experts = (const ExpertWeights*)p.experts;
    for (u32 e = 0; e < p.num_experts; ++e) {
        u32 begin = offsets[e];
        u32 end = offsets[e + 1u];
        if (begin >= end) {
            continue;
        }
        const Weight down = experts[e].down;
        u64 bias_ptr = experts[e].down_bias;
        float bias = bias_ptr ? vector_get(bias_ptr, p.bias_bf16, n) : 0.0f;
        for (u32 p0 = begin; p0 < end; p0 += EXPERT_TILE) {
            u32 ntok = min(EXPERT_TILE, end - p0);
            const float* x[EXPERT_TILE];
            float acc[EXPERT_TILE];
#pragma unroll
            for (int t = 0; t < EXPERT_TILE; ++t) {
                x[t] = (const float*)p.act + (u64)(p0 + t) * p.inter;
                acc[t] = 0.0f;
            }
            dot_row_partial<EXPERT_TILE>(down, n, x, ntok, lane, acc);
#pragma unroll
            for (int t = 0; t < EXPERT_TILE; ++t) {
                if ((u32)t < ntok) {
                    float sum = warp_sum(acc[t]);
                    if (lane == 0u) {
                        ((float*)p.down_out)[(u64)(p0 + t) * p.hidden + n] =
                            bias_ptr ? sum + bias : sum;
                    }
                }
            }
        }
    }
}

// Grid: (ceil(hidden / (EXPERT_MMA_WARPS · MMA_M)), num_experts); warp =
// features n0 .. n0+16 of expert blockIdx.y over its rows, DOWN_MMA_TILES
// tiles per pass.
extern "C" __global__ void __launch_bounds__(EXPERT_MMA_WARPS * WARP)
    expert_down_mma(DownParams p) {
    const u32 lane = threadIdx.x % WARP;
    const u32 n0 = (blockIdx.x * EXPERT_MMA_WARPS + threadIdx.x / WARP) * MMA_M;
    const u32 e = blockIdx.y;
    const u32 begin = ((const u32*)p.offsets)[e];
    const u32 end = ((const u32*)p.offsets)[e + 1u];
    if (n0 >= p.hidden || begin >= end) {
        return;
    }
    const ExpertWeights* experts = (const ExpertWeights*)p.experts;
    const Weight down = experts[e].down;
    const u64 bias = experts[e].down_bias;
    const float scale = weight_accumulator_scale(down);
    for (u32 p0 = begin; p0 < end; p0 += DOWN_MMA_TILES * MMA_N) {
        const u32 count = min(DOWN_MMA_TILES * MMA_N, end - p0);
        const u32 tiles = (count + MMA_N - 1u) / MMA_N;
        const float* x[DOWN_MMA_TILES];
        float acc[DOWN_MMA_TILES][4];
#pragma unroll
        for (int t = 0; t < DOWN_MMA_TILES; ++t) {
            u32 r = (u32)t * MMA_N + (lane >> 2);
            x[t] = r < count ? (const float*)p.act + (u64)(p0 + r) * p.inter : nullptr;
            acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        }
        mma_rows<DOWN_MMA_TILES>(down, n0, p.hidden, 1u, 0u, lane, x, tiles, acc);
#pragma unroll
        for (int t = 0; t < DOWN_MMA_TILES; ++t) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                u32 n = n0 + mma_feature(lane, i);
                u32 r = (u32)t * MMA_N + mma_token(lane, i);
                if ((u32)t < tiles && n < p.hidden && r < count) {
                    float v = acc[t][i] * scale;
                    if (bias) {
                        v = v + vector_get(bias, p.bias_bf16, n);
                    }
                    ((float*)p.down_out)[(u64)(p0 + r) * p.hidden + n] = v;
                }
            }
        }
    }
}

struct CombineParams {
    u64 down_out;   // [routed, hidden]
    u64 positions;  // topk_ids after grouping: slot -> position
    u64 weights;    // [rows·k]
    u64 out;        // [rows, hidden]
    u32 rows;
    u32 top_k;
    u32 hidden;
    u32 pad;
};
static_assert(sizeof(CombineParams) == 48, "CombineParams layout");

// One block per token: out = Σ_rank w · down[position], ranks in order.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) moe_combine(CombineParams p) {
    u32 token = blockIdx.x;
    const u32* positions = (const u32*)p.positions + (u64)token * p.top_k;
    const float* weights = (const float*)p.weights + (u64)token * p.top_k;
    const float* down = (const float*)p.down_out;
    float* out = (float*)p.out + (u64)token * p.hidden;
    for (u32 n = threadIdx.x; n < p.hidden; n += blockDim.x) {
        float o = 0.0f;
        for (u32 r = 0; r < p.top_k; ++r) {
            o = o + weights[r] * down[(u64)positions[r] * p.hidden + n];
        }
        out[n] = o;
    }
}
