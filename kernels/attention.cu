// Causal GQA attention over the paged KV cache, with optional per-head sink
// logits (gpt_oss), the append of a step's keys and values to the cache, and
// the copy of whole blocks. A full-attention layer reads its sequences' full
// tables, a sliding-window layer their sliding tables (common.cuh); both
// kinds share the pool, one array per layer index of its kind.
//
// `attention`: grid (query tiles, heads, splits). A tile is up to Q_TILE
// consecutive rows of one sequence; a split is a span of split_len keys
// (decode splits long contexts so that enough blocks run). The block loads
// KEY_TILE keys and values at a time into shared memory (from the cache for
// positions before the step, from the step's k/v rows, rounded to the cache
// dtype, for the step's own) and each warp runs an online softmax for its
// rows. With one split it writes the normalized output; with several, a
// partial (max, sum, weighted values) that `attention_combine` merges in
// split order. Semantics: src/backend/cpu/attention.rs.
//
// A sliding table's blocks before the window are NO_BLOCK: the keys there are
// masked for every row, and are read as zeros, never from memory.
#include "common.cuh"

// Q_TILE, KEY_TILE, ATTN_WARPS, MAX_HEAD_DIM, MAX_COPY_PAIRS: constants.cuh.
#define ROWS_PER_WARP (Q_TILE / ATTN_WARPS)
#define DIMS_PER_LANE (MAX_HEAD_DIM / WARP)
#define NO_SEQ 0xffffffffu

struct AttnParams {
    u64 q;        // [rows, heads·head_dim]
    u64 k;        // [rows, kv_heads·head_dim]
    u64 v;
    u64 k_cache;  // this layer's [slots, kv_heads·head_dim], in the cache dtype
    u64 v_cache;
    u64 meta;
    u64 sinks;    // 0 or [heads]
    u64 out;      // [rows, heads·head_dim]
    u64 partial;  // splits > 1: [rows, heads, splits, head_dim + 2]
    u32 max_tokens;
    u32 max_seqs;
    u32 num_seqs;
    u32 rows;
    u32 heads;
    u32 kv_heads;
    u32 head_dim;
    u32 kv_bf16;
    u32 sinks_bf16;
    u32 block_size;
    u32 table;        // the sequence field of the layer's table: SEQ_TABLE or SEQ_SLIDING
    u32 window;       // sliding window of the mask, 0 = full attention
    u32 splits;
    u32 split_len;    // keys per split (a multiple of KEY_TILE)
    float scale;
    u32 pad;
};
static_assert(sizeof(AttnParams) == 136, "AttnParams layout");

// Cache slot of a position in block `block` (not NO_BLOCK).
__device__ __forceinline__ u64 block_slot(u32 block, u32 position, u32 block_size) {
    return (u64)block * block_size + position % block_size;
}

__device__ __forceinline__ float round_kv(float x, u32 kv_bf16) {
    return kv_bf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
}

__device__ __forceinline__ float load_kv(u64 cache, u32 kv_bf16, u64 index) {
    return kv_bf16 ? bf16_to_f32(((const u16*)cache)[index]) : ((const float*)cache)[index];
}

__device__ __forceinline__ void store_kv(u64 cache, u32 kv_bf16, u64 index, float x) {
    if (kv_bf16) {
        ((u16*)cache)[index] = f32_to_bf16(x);
    } else {
        ((float*)cache)[index] = x;
    }
}

// The first key a query at `position` sees: i − W < j ≤ i.
__device__ __forceinline__ u32 first_key(u32 position, u32 window) {
    return (window != 0u && position + 1u > window) ? position + 1u - window : 0u;
}

// Folds the sink logit into (max, sum, values) and writes values / sum.
__device__ __forceinline__ void finish_row(const AttnParams& p, u32 head, float m, float l,
                                           float* acc, u32 lane, float* out) {
    if (p.sinks) {
        float sink = vector_get(p.sinks, p.sinks_bf16, head);
        if (sink > m) {
            float correction = expf(m - sink);
            l *= correction;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; ++i) {
                acc[i] *= correction;
            }
            m = sink;
        }
        l += expf(sink - m);
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) {
        u32 d = lane + WARP * i;
        if (d < p.head_dim) {
            out[d] = acc[i] * inv;
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * WARP) attention(AttnParams p) {
    DYNAMIC_SHARED_FLOATS(smem);
    const u32 hd = p.head_dim;
    float* q_s = smem;                       // [Q_TILE][hd]
    float* k_s = q_s + Q_TILE * hd;          // [KEY_TILE][hd + 1] (padded: no bank conflicts)
    float* v_s = k_s + KEY_TILE * (hd + 1);  // [KEY_TILE][hd]

    StepView step = step_view(p.meta, p.max_tokens, p.max_seqs, p.num_seqs);
    // Which sequence and rows this tile is.
    u32 tile = blockIdx.x;
    u32 seq = NO_SEQ;
    u32 nrows = 0u;
    for (u32 s = 0; s < p.num_seqs; ++s) {
        u32 len = seq_field(step, s, SEQ_LEN);
        u32 tiles = (len + Q_TILE - 1u) / Q_TILE;
        if (tile < tiles) {
            seq = s;
            nrows = min(Q_TILE, len - tile * Q_TILE);
            break;
        }
        tile -= tiles;
    }
    if (seq == NO_SEQ) {
        return;
    }
    const u32 head = blockIdx.y;
    const u32 split = blockIdx.z;
    const u32 group = p.heads / p.kv_heads;
    const u32 kv_head = head / group;
    const u32 q_width = p.heads * hd;
    const u32 kv_width = p.kv_heads * hd;
    const u32 start = seq_field(step, seq, SEQ_START);
    const u32 past = seq_field(step, seq, SEQ_PAST);
    const u32 first_row = start + tile * Q_TILE;
    const u32 position0 = past + tile * Q_TILE;
    const u32 warp = threadIdx.x / WARP;
    const u32 lane = threadIdx.x % WARP;

    // The step's keys and values join the cache (kv_append then skips the
    // layer): the slots written are at positions >= past, which no block of
    // this launch reads from the cache, in blocks a sequence holds alone (a
    // block shared by several, a cached prefix, is full: all before past).
    // The host checked that every such position has a block.
    if (head % group == 0u && split == 0u) {
        for (u32 i = threadIdx.x; i < nrows * hd; i += blockDim.x) {
            u32 r = i / hd;
            u32 d = i % hd;
            u32 block = table_block(step, seq, p.table, position0 + r, p.block_size);
            if (block == NO_BLOCK) {
                continue;
            }
            u64 src = (u64)(first_row + r) * kv_width + kv_head * hd + d;
            u64 dst = block_slot(block, position0 + r, p.block_size) * kv_width + kv_head * hd + d;
            store_kv(p.k_cache, p.kv_bf16, dst, ((const float*)p.k)[src]);
            store_kv(p.v_cache, p.kv_bf16, dst, ((const float*)p.v)[src]);
        }
    }

    for (u32 i = threadIdx.x; i < Q_TILE * hd; i += blockDim.x) {
        u32 r = i / hd;
        u32 d = i % hd;
        q_s[i] = r < nrows ? ((const float*)p.q)[(u64)(first_row + r) * q_width + head * hd + d]
                           : 0.0f;
    }

    // Keys of this split: [begin, end), within what the tile's rows see.
    const u32 lowest = first_key(position0, p.window);
    const u32 highest = position0 + nrows;  // exclusive
    const u32 begin = lowest + split * p.split_len;
    const u32 end = begin >= highest ? begin
                    : (highest - begin <= p.split_len ? highest : begin + p.split_len);

    float m[ROWS_PER_WARP];
    float l[ROWS_PER_WARP];
    float acc[ROWS_PER_WARP][DIMS_PER_LANE];
    u32 row_position[ROWS_PER_WARP];
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) {
        m[i] = f32_neg_inf();
        l[i] = 0.0f;
        row_position[i] = position0 + warp * ROWS_PER_WARP + i;
#pragma unroll
        for (int d = 0; d < DIMS_PER_LANE; ++d) {
            acc[i][d] = 0.0f;
        }
    }

    for (u32 j0 = begin; j0 < end; j0 += KEY_TILE) {
        __syncthreads();
        for (u32 i = threadIdx.x; i < KEY_TILE * hd; i += blockDim.x) {
            u32 jj = i / hd;
            u32 d = i % hd;
            u32 j = j0 + jj;
            float key = 0.0f;
            float value = 0.0f;
            if (j < end) {
                if (j < past) {
                    // NO_BLOCK: out of the window, masked below; zeros.
                    u32 block = table_block(step, seq, p.table, j, p.block_size);
                    if (block != NO_BLOCK) {
                        u64 at = block_slot(block, j, p.block_size) * kv_width + kv_head * hd + d;
                        key = load_kv(p.k_cache, p.kv_bf16, at);
                        value = load_kv(p.v_cache, p.kv_bf16, at);
                    }
                } else {
                    u64 at = (u64)(start + (j - past)) * kv_width + kv_head * hd + d;
                    key = round_kv(((const float*)p.k)[at], p.kv_bf16);
                    value = round_kv(((const float*)p.v)[at], p.kv_bf16);
                }
            }
            k_s[jj * (hd + 1u) + d] = key;
            v_s[jj * hd + d] = value;
        }
        __syncthreads();

        // Lane = key j0 + lane: its score against each of the warp's rows.
        float score[ROWS_PER_WARP];
#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; ++i) {
            score[i] = 0.0f;
        }
        const float* key_row = k_s + lane * (hd + 1u);
        const float* q_rows = q_s + warp * ROWS_PER_WARP * hd;
        for (u32 d = 0; d < hd; ++d) {
            float kd = key_row[d];
#pragma unroll
            for (int i = 0; i < ROWS_PER_WARP; ++i) {
                score[i] = fmaf(q_rows[i * hd + d], kd, score[i]);
            }
        }
        const u32 j = j0 + lane;
#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; ++i) {
            if (warp * ROWS_PER_WARP + i >= nrows) {
                continue;
            }
            bool valid = j < end && j >= first_key(row_position[i], p.window) &&
                         j <= row_position[i];
            float s = valid ? p.scale * score[i] : f32_neg_inf();
            float m_new = fmaxf(m[i], warp_max(s));
            if (m_new == f32_neg_inf()) {
                continue;  // no key of this tile is visible to the row
            }
            float correction = expf(m[i] - m_new);
            float weight = valid ? expf(s - m_new) : 0.0f;
            l[i] = l[i] * correction + warp_sum(weight);
#pragma unroll
            for (int d = 0; d < DIMS_PER_LANE; ++d) {
                acc[i][d] *= correction;
            }
            for (u32 jj = 0; jj < KEY_TILE; ++jj) {
                float w = __shfl_sync(FULL_MASK, weight, jj);
                const float* value_row = v_s + jj * hd;
#pragma unroll
                for (int d = 0; d < DIMS_PER_LANE; ++d) {
                    u32 dim = lane + WARP * d;
                    if (dim < hd) {
                        acc[i][d] = fmaf(w, value_row[dim], acc[i][d]);
                    }
                }
            }
            m[i] = m_new;
        }
    }

#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) {
        u32 r = warp * ROWS_PER_WARP + i;
        if (r >= nrows) {
            continue;
        }
        u32 row = first_row + r;
        if (p.splits == 1u) {
            float* out = (float*)p.out + (u64)row * q_width + head * hd;
            finish_row(p, head, m[i], l[i], acc[i], lane, out);
        } else {
            float* part = (float*)p.partial +
                          ((u64)(row * p.heads + head) * p.splits + split) * (hd + 2u);
            if (lane == 0u) {
                part[0] = m[i];
                part[1] = l[i];
            }
#pragma unroll
            for (int d = 0; d < DIMS_PER_LANE; ++d) {
                u32 dim = lane + WARP * d;
                if (dim < hd) {
                    part[2u + dim] = acc[i][d];
                }
            }
        }
    }
}

// Grid (rows, heads), one warp: merges the splits' partials in split order.
extern "C" __global__ void __launch_bounds__(WARP) attention_combine(AttnParams p) {
    const u32 row = blockIdx.x;
    const u32 head = blockIdx.y;
    const u32 lane = threadIdx.x;
    const u32 hd = p.head_dim;
    const float* parts = (const float*)p.partial + (u64)(row * p.heads + head) * p.splits * (hd + 2u);
    float m = f32_neg_inf();
    float l = 0.0f;
    float acc[DIMS_PER_LANE];
#pragma unroll
    for (int d = 0; d < DIMS_PER_LANE; ++d) {
        acc[d] = 0.0f;
    }
    for (u32 z = 0; z < p.splits; ++z) {
        const float* part = parts + (u64)z * (hd + 2u);
        float mz = part[0];
        if (mz == f32_neg_inf()) {
            continue;  // the split held no key this row sees
        }
        float m_new = fmaxf(m, mz);
        float c_old = expf(m - m_new);
        float c_new = expf(mz - m_new);
        l = l * c_old + part[1] * c_new;
#pragma unroll
        for (int d = 0; d < DIMS_PER_LANE; ++d) {
            u32 dim = lane + WARP * d;
            float value = dim < hd ? part[2u + dim] : 0.0f;
            acc[d] = acc[d] * c_old + value * c_new;
        }
        m = m_new;
    }
    float* out = (float*)p.out + (u64)row * p.heads * hd + head * hd;
    finish_row(p, head, m, l, acc, lane, out);
}

struct AppendParams {
    u64 k;
    u64 v;
    u64 k_cache;
    u64 v_cache;
    u64 meta;
    u32 max_tokens;
    u32 max_seqs;
    u32 num_seqs;
    u32 rows;
    u32 kv_width;
    u32 kv_bf16;
    u32 block_size;
    u32 table;  // SEQ_TABLE or SEQ_SLIDING
};
static_assert(sizeof(AppendParams) == 72, "AppendParams layout");

// One block per row: its key and value into the layer's cache, through the
// layer's table (the engine gives every position of a step's chunk a block
// in both tables; the host checked it, a NO_BLOCK is skipped all the same).
extern "C" __global__ void __launch_bounds__(APPEND_THREADS) kv_append(AppendParams p) {
    const u32 row = blockIdx.x;
    StepView step = step_view(p.meta, p.max_tokens, p.max_seqs, p.num_seqs);
    const u32 seq = seq_of_row(step, row);
    const u32 position = seq_field(step, seq, SEQ_PAST) + (row - seq_field(step, seq, SEQ_START));
    const u32 block = table_block(step, seq, p.table, position, p.block_size);
    if (block == NO_BLOCK) {
        return;
    }
    const u64 slot = block_slot(block, position, p.block_size);
    for (u32 c = threadIdx.x; c < p.kv_width; c += blockDim.x) {
        u64 src = (u64)row * p.kv_width + c;
        store_kv(p.k_cache, p.kv_bf16, slot * p.kv_width + c, ((const float*)p.k)[src]);
        store_kv(p.v_cache, p.kv_bf16, slot * p.kv_width + c, ((const float*)p.v)[src]);
    }
}

struct CopyParams {
    u64 cache;        // the whole pool: each array's K, then its V
    u64 half_bytes;   // bytes of one array's K (its V as many)
    u32 block_units;  // u16 units of one block of K (or V): block_size × width × dtype / 2
    u32 pairs;
    u32 from[MAX_COPY_PAIRS];
    u32 to[MAX_COPY_PAIRS];
};
static_assert(sizeof(CopyParams) == 24 + 8 * MAX_COPY_PAIRS, "CopyParams layout");

// Grid (pairs, 2 × arrays): block `from` onto block `to` in one K or V of
// one array. The host checked the ids and that no `to` is another pair's
// `from` or `to`, so the blocks of a launch do not race. u16 units: the
// smallest KV element, so any block size and width copies exactly.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) kv_copy_blocks(CopyParams p) {
    const u32 pair = blockIdx.x;
    if (pair >= p.pairs) {
        return;
    }
    const u64 base = p.cache + (u64)blockIdx.y * p.half_bytes;
    const u16* src = (const u16*)base + (u64)p.from[pair] * p.block_units;
    u16* dst = (u16*)base + (u64)p.to[pair] * p.block_units;
    for (u32 i = threadIdx.x; i < p.block_units; i += blockDim.x) {
        dst[i] = src[i];
    }
}
