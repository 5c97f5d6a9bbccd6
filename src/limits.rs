//! Every upper bound sparkrt puts on a size that a file or a flag controls,
//! in one table. The values are checked before any list or buffer is built
//! from them, so a tiny hostile `config.json` or profile is an error rather
//! than gigabytes of allocation or a loop of 10¹² turns.
//!
//! Geometry limits are about 10× the largest published MoE models
//! (DeepSeek-V3 / Kimi-K2: 61 layers, 256–384 experts, top-8, hidden 7168,
//! 128 heads, vocab 129k–164k; Llama-4: vocab 202k, 10M positions;
//! Mixtral-8x22B: expert intermediate 16384), rounded up to a power of two:
//! generous for anything real, small enough that every formula over them
//! stays far from `u64` overflow and every per-layer list stays small.

use std::fmt;

/// Decoder layers (`num_hidden_layers`, a profile's `num_layers`).
pub const MAX_LAYERS: usize = 1024;
/// Experts per MoE layer.
pub const MAX_EXPERTS: usize = 4096;
/// Experts each token is routed to.
pub const MAX_EXPERTS_PER_TOKEN: usize = 256;
/// Experts over all layers (`layers × experts`): what the expected-tensor
/// list and the expert tables grow with (Kimi-K2: 61 × 384 ≈ 23k).
pub const MAX_TOTAL_EXPERTS: usize = 262_144;
/// Width of the residual stream.
pub const MAX_HIDDEN_SIZE: usize = 65_536;
/// Query heads.
pub const MAX_ATTENTION_HEADS: usize = 2048;
/// Key/value heads.
pub const MAX_KV_HEADS: usize = 2048;
/// Width of one head.
pub const MAX_HEAD_DIM: usize = 4096;
/// Tokens in the vocabulary.
pub const MAX_VOCAB_SIZE: usize = 4_194_304;
/// Intermediate size of a dense MLP.
pub const MAX_INTERMEDIATE_SIZE: usize = 262_144;
/// Intermediate size of one expert.
pub const MAX_MOE_INTERMEDIATE_SIZE: usize = 262_144;
/// `max_position_embeddings` (and YaRN's original one).
pub const MAX_POSITION_EMBEDDINGS: usize = 16_777_216;
/// Window of a sliding-attention layer, in tokens.
pub const MAX_SLIDING_WINDOW: usize = MAX_POSITION_EMBEDDINGS;
/// `decoder_sparse_step` (a step beyond the layer count means no MoE layer).
pub const MAX_DECODER_SPARSE_STEP: usize = MAX_LAYERS;
/// Entries of `mlp_only_layers` (each names a layer, so at most one per layer).
pub const MAX_MLP_ONLY_LAYERS: usize = MAX_LAYERS;

/// Key or value heads of a Gated DeltaNet layer.
pub const MAX_LINEAR_HEADS: usize = 2048;
/// Width of one Gated DeltaNet key or value head (the CPU keeps a row of
/// the state per key dimension on its stack).
pub const MAX_LINEAR_HEAD_DIM: usize = 1024;
/// Kernel of the Gated DeltaNet's causal convolution (published: 4).
pub const MAX_CONV_KERNEL: usize = 64;
/// Intermediate size of the shared expert.
pub const MAX_SHARED_EXPERT_INTERMEDIATE_SIZE: usize = MAX_INTERMEDIATE_SIZE;

/// `[serving] max_model_len`: tokens of one sequence.
pub const MAX_MODEL_LEN: usize = MAX_POSITION_EMBEDDINGS;
/// `[serving] max_num_seqs`: sequences running at once.
pub const MAX_NUM_SEQS: usize = 65_536;
/// `[serving] max_num_batched_tokens`: tokens of one step.
pub const MAX_NUM_BATCHED_TOKENS: usize = 1_048_576;
/// `[serving] kv_block_size`: tokens per KV block.
pub const MAX_KV_BLOCK_SIZE: usize = 65_536;
/// `[serving] state_snapshots`: recurrent-state snapshots kept.
pub const MAX_STATE_SNAPSHOTS: usize = MAX_NUM_SEQS;
/// `[serving] dp_size`: data-parallel ranks.
pub const MAX_DP_SIZE: usize = 1024;
/// Longest `cache_salt` a request may carry (bytes); it is hashed once per request.
pub const MAX_CACHE_SALT_BYTES: usize = 1024;
/// `[backend] threads` in a profile (the host's cores bound `--threads`,
/// see `cli::common::set_threads`).
pub const MAX_PROFILE_THREADS: usize = 4096;

/// Bytes of a small JSON/TOML/Jinja side file: `config.json`,
/// `hf_quant_config.json`, `tokenizer_config.json`, `generation_config.json`,
/// `chat_template.jinja`, a profile, an API key file (real ones are KiBs).
pub const MAX_SMALL_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Bytes of a file read about the host: the kubelet configuration and
/// everything below `--host-root` (`proc/meminfo`, `proc/self/cgroup`,
/// `proc/self/status`, cgroup `memory.*` files). Real ones are a few KiB; a
/// kubelet configuration with every field set is under 10 KiB.
pub const MAX_HOST_FILE_BYTES: u64 = 1024 * 1024;
/// Bytes of `model.safetensors.index.json` (DeepSeek-V3's is ~9 MiB).
pub const MAX_INDEX_FILE_BYTES: u64 = 128 * 1024 * 1024;
/// Bytes of `tokenizer.json` (a 200k-token vocabulary is ~30 MiB).
pub const MAX_TOKENIZER_FILE_BYTES: u64 = 512 * 1024 * 1024;
/// Safetensors files of one checkpoint (DeepSeek-V3 ships 163).
pub const MAX_SHARDS: usize = 4096;
/// Tensors of one checkpoint, over all files (an NVFP4 Kimi-K2 has ~300k).
/// The JSON header of one file is bounded in bytes too
/// (`checkpoint::header::MAX_HEADER_BYTES`).
pub const MAX_TENSORS: usize = 4_194_304;

/// Bytes any one category of a plan may come to (1 EiB: no host is near).
/// A profile whose limits multiply past it is refused before planning, so
/// the plan's `u64` / `i64` sums of a few categories cannot overflow.
pub const MAX_PLAN_BYTES: u128 = 1 << 60;

/// A value above its limit: the field as the file spells it, the value and
/// the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` is {value}, above the limit of {limit}")]
pub struct LimitExceeded {
    pub field: String,
    pub value: u128,
    pub limit: u128,
}

/// `Err` when `value > limit`.
pub fn check(field: impl fmt::Display, value: usize, limit: usize) -> Result<(), LimitExceeded> {
    check_wide(field, value as u128, limit as u128)
}

/// [`check`] for products computed in `u128`.
pub fn check_wide(field: impl fmt::Display, value: u128, limit: u128) -> Result<(), LimitExceeded> {
    if value > limit {
        Err(LimitExceeded {
            field: field.to_string(),
            value,
            limit,
        })
    } else {
        Ok(())
    }
}

/// The geometry fields both a `config.json` and a profile's `[model]` give,
/// each with the name its file spells it with, checked against the table.
pub struct GeometryFields<'a> {
    pub layers: (&'a str, usize),
    pub experts: (&'a str, usize),
    pub experts_per_token: (&'a str, usize),
    pub hidden: (&'a str, usize),
    pub heads: (&'a str, usize),
    pub kv_heads: (&'a str, usize),
    pub head_dim: (&'a str, usize),
    pub vocab: (&'a str, usize),
    pub intermediate: (&'a str, usize),
    pub moe_intermediate: (&'a str, usize),
    pub decoder_sparse_step: (&'a str, usize),
    /// Entries of `mlp_only_layers`.
    pub mlp_only_layers: (&'a str, usize),
    /// Entries of `layer_types`.
    pub layer_types: (&'a str, usize),
    pub sliding_window: (&'a str, usize),
}

impl GeometryFields<'_> {
    /// The first field above its limit, in the order listed, then the
    /// product `layers × experts`.
    pub fn check(&self) -> Result<(), LimitExceeded> {
        let table = [
            (self.layers, MAX_LAYERS),
            (self.experts, MAX_EXPERTS),
            (self.experts_per_token, MAX_EXPERTS_PER_TOKEN),
            (self.hidden, MAX_HIDDEN_SIZE),
            (self.heads, MAX_ATTENTION_HEADS),
            (self.kv_heads, MAX_KV_HEADS),
            (self.head_dim, MAX_HEAD_DIM),
            (self.vocab, MAX_VOCAB_SIZE),
            (self.intermediate, MAX_INTERMEDIATE_SIZE),
            (self.moe_intermediate, MAX_MOE_INTERMEDIATE_SIZE),
            (self.decoder_sparse_step, MAX_DECODER_SPARSE_STEP),
            (self.mlp_only_layers, MAX_MLP_ONLY_LAYERS),
            (self.layer_types, MAX_LAYERS),
            (self.sliding_window, MAX_SLIDING_WINDOW),
        ];
        for ((field, value), limit) in table {
            check(field, value, limit)?;
        }
        // Both factors are bounded above, so the product cannot overflow.
        check(
            format_args!("{} × {}", self.layers.0, self.experts.0),
            self.layers.1 * self.experts.1,
            MAX_TOTAL_EXPERTS,
        )
    }
}

/// The Gated DeltaNet and shared-expert fields of a `config.json` or a
/// profile's `[model]`, each with the name its file spells it with.
pub struct HybridFields<'a> {
    pub key_heads: (&'a str, usize),
    pub value_heads: (&'a str, usize),
    pub key_head_dim: (&'a str, usize),
    pub value_head_dim: (&'a str, usize),
    pub conv_kernel: (&'a str, usize),
    pub shared_expert_intermediate: (&'a str, usize),
}

impl HybridFields<'_> {
    /// The first field above its limit, in the order listed.
    pub fn check(&self) -> Result<(), LimitExceeded> {
        let table = [
            (self.key_heads, MAX_LINEAR_HEADS),
            (self.value_heads, MAX_LINEAR_HEADS),
            (self.key_head_dim, MAX_LINEAR_HEAD_DIM),
            (self.value_head_dim, MAX_LINEAR_HEAD_DIM),
            (self.conv_kernel, MAX_CONV_KERNEL),
            (
                self.shared_expert_intermediate,
                MAX_SHARED_EXPERT_INTERMEDIATE_SIZE,
            ),
        ];
        for ((field, value), limit) in table {
            check(field, value, limit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(layers: usize, experts: usize) -> GeometryFields<'static> {
        GeometryFields {
            layers: ("num_layers", layers),
            experts: ("num_experts", experts),
            experts_per_token: ("top_k", 8),
            hidden: ("hidden_size", 7168),
            heads: ("heads", 128),
            kv_heads: ("kv_heads", 128),
            head_dim: ("head_dim", 128),
            vocab: ("vocab_size", 163_840),
            intermediate: ("intermediate_size", 18432),
            moe_intermediate: ("moe_intermediate_size", 2048),
            decoder_sparse_step: ("decoder_sparse_step", 1),
            mlp_only_layers: ("mlp_only_layers", 3),
            layer_types: ("layer_types", 0),
            sliding_window: ("sliding_window", 0),
        }
    }

    #[test]
    fn largest_published_moe_is_within_limits() {
        assert_eq!(fields(61, 384).check(), Ok(()));
    }

    #[test]
    fn each_violation_names_field_value_and_limit() {
        let err = fields(1_000_000, 8).check().unwrap_err();
        assert_eq!(err.field, "num_layers");
        assert_eq!((err.value, err.limit), (1_000_000, MAX_LAYERS as u128));
        assert_eq!(
            err.to_string(),
            "`num_layers` is 1000000, above the limit of 1024"
        );
        let err = fields(1024, 4096).check().unwrap_err();
        assert_eq!(err.field, "num_layers × num_experts");
        assert_eq!(err.limit, MAX_TOTAL_EXPERTS as u128);
    }
}
