//! The memory plan of the hybrid models, figures by hand: Qwen3.6-35B-A3B
//! and Qwen3.5-122B-A10B (profiles/), and the tiny fixture whose buffers
//! the CPU backend allocates.

use sparkrt::plan::memory::{self, HostFigures};
use sparkrt::plan::profile::{Profile, StateDtype};
use sparkrt::plan::{self, PlanDevice};

use crate::common;

/// The bytes of the activation buffer `name` in `plan`, if it has one.
fn buffer(plan: &sparkrt::plan::Plan, name: &str) -> Option<u64> {
    plan.activations
        .buffers
        .iter()
        .find(|b| b.name == name)
        .map(|b| b.bytes)
}

fn host() -> HostFigures {
    // A DGX Spark's ~121.7 GiB, nearly all available.
    HostFigures {
        mem_total: 121 << 30,
        mem_available: 118 << 30,
        ..HostFigures::default()
    }
}

#[test]
fn qwen36_35b_state_pool_and_kv_cache_by_hand() {
    let profile = Profile::load(&common::profile("qwen3.6-35b-a3b-bf16")).unwrap();
    let g = &profile.model.geometry;
    assert_eq!((g.num_kv_layers(), g.num_linear_layers()), (10, 30));
    let plan = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    // Per GDN layer and sequence: the convolution keeps 3 inputs of
    // 2·16·128 + 32·128 = 8192 channels, the delta rule 32 heads of
    // 128 × 128, all f32: (24,576 + 524,288) × 4 B; over 30 layers
    // 65,863,680 B (62.8 MiB) a slot, × (16 live + 32 snapshot) slots.
    let s = &plan.recurrent_state;
    assert_eq!(
        (s.conv_elements, s.ssm_elements),
        (8192 * 3, 32 * 128 * 128)
    );
    assert_eq!(s.bytes_per_seq, 30 * (24_576 + 524_288) * 4);
    assert_eq!(s.bytes_per_seq, 65_863_680);
    assert_eq!((s.live_slots, s.snapshot_slots, s.slots), (16, 32, 48));
    assert_eq!(s.bytes, 48 * 65_863_680);
    // A decode step reads and writes each sequence's slot once (bench's
    // performance model): 2 × 65,863,680 B a sequence.
    assert_eq!(memory::decode_state_bytes_per_step(s, 1), 131_727_360);
    assert_eq!(memory::decode_state_bytes_per_step(s, 3), 3 * 131_727_360);
    // KV only for the 10 attention layers: 10 × 2 KV heads × 256 × (K, V)
    // × 2 B (bf16) = 20,480 B a token.
    assert_eq!(plan.kv_cache.bytes_per_token, 10 * 2 * 256 * 2 * 2);
    assert_eq!(plan.kv_cache.layout.sliding_layers.len(), 10);
    // The state is charged with the KV cache and counted in the total.
    assert_eq!(
        plan.total,
        plan.weights.total
            + plan.moe_workspace.bytes
            + plan.activations.bytes
            + plan.runtime_overhead.bytes
            + s.bytes
            + plan.kv_cache.bytes
    );
    // The shared expert is in the one MoE workspace: its gate and up
    // projections (8192 tokens × 512), output (× 2048) and gate logit.
    let ws = |name: &str| {
        plan.moe_workspace
            .buffers
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.bytes)
    };
    assert_eq!(ws(memory::SHARED_GATE), Some(8192 * 512 * 4));
    assert_eq!(ws(memory::SHARED_UP), Some(8192 * 512 * 4));
    assert_eq!(ws(memory::SHARED_OUTPUT), Some(8192 * 2048 * 4));
    assert_eq!(ws(memory::SHARED_GATE_LOGIT), Some(8192 * 4));
    // Activations: the GDN projections' outputs for 8192 tokens.
    let act = |name: &str| {
        plan.activations
            .buffers
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.bytes)
    };
    assert_eq!(act(memory::GDN_QKV), Some(8192 * 8192 * 4));
    assert_eq!(act(memory::GDN_Z), Some(8192 * 4096 * 4));
    assert_eq!(act(memory::GDN_B), Some(8192 * 32 * 4));
    assert_eq!(act(memory::QUERY_GATE), Some(8192 * 2 * 16 * 256 * 4));
    // Weights by hand (bf16): 30 GDN layers of in_proj_qkv 8192 × 2048,
    // z 4096 × 2048, b and a 32 × 2048, out_proj 2048 × 4096, the
    // convolution 8192 × 4, A_log, dt_bias (32 each) and the norm (128).
    let gdn = (8192 * 2048 + 4096 * 2048 + 2 * 32 * 2048 + 2048 * 4096 + 8192 * 4 + 64 + 128) * 2;
    let groups = &plan.weights.groups;
    let group = |g| groups.get(&g).copied().unwrap_or(0);
    use sparkrt::geometry::WeightGroup;
    assert_eq!(group(WeightGroup::LinearAttention), 30 * gdn);
    // 10 attention layers: q_proj 2 × 4096 × 2048, k and v 512 × 2048,
    // o_proj 2048 × 4096.
    let attention = (2 * 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096) * 2;
    assert_eq!(group(WeightGroup::Attention), 10 * attention);
    // The shared expert and its [1, 2048] gate in all 40 layers.
    assert_eq!(
        group(WeightGroup::SharedExpert),
        40 * (3 * 512 * 2048 + 2048) * 2
    );
    assert_eq!(group(WeightGroup::Experts), 40 * 256 * 3 * 512 * 2048 * 2);
}

#[test]
fn qwen35_122b_state_pool_by_hand() {
    let profile = Profile::load(&common::profile("qwen3.5-122b-a10b-nvfp4")).unwrap();
    let plan = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    // 36 GDN layers of 2·16·128 + 64·128 = 12,288 channels × 3 and
    // 64 × 128 × 128, f32; 8 live slots and the profile's 16 snapshots.
    let s = &plan.recurrent_state;
    assert_eq!(s.layers, 36);
    assert_eq!(s.bytes_per_seq, 36 * (12_288 * 3 + 64 * 128 * 128) * 4);
    assert_eq!(s.bytes_per_seq, 156_303_360);
    assert_eq!(s.bytes, (8 + 16) * s.bytes_per_seq);
    // 12 attention layers × 2 KV heads × 256 × (K, V) × 2 B.
    assert_eq!(plan.kv_cache.bytes_per_token, 12 * 2 * 256 * 2 * 2);
}

#[test]
fn the_bench_configs_have_the_profiles_layer_shapes() {
    use sparkrt::checkpoint::ModelConfig;
    let bench = |name: &str| {
        ModelConfig::load(&common::repo().join("benches/models").join(name))
            .unwrap()
            .geometry
    };
    let profile = |name: &str| {
        Profile::load(&common::profile(name))
            .unwrap()
            .model
            .geometry
    };
    for (config, full) in [
        ("qwen3.6-35b-a3b-8l", "qwen3.6-35b-a3b-bf16"),
        ("qwen3.6-35b-a3b-8l-mtp", "qwen3.6-35b-a3b-bf16"),
        ("qwen3.5-122b-a10b-4l", "qwen3.5-122b-a10b-nvfp4"),
    ] {
        let (b, p) = (bench(config), profile(full));
        assert_eq!(b.delta_net(), p.delta_net(), "{config}");
        assert_eq!(
            (
                b.hidden_size,
                b.num_attention_heads,
                b.num_kv_heads,
                b.head_dim
            ),
            (
                p.hidden_size,
                p.num_attention_heads,
                p.num_kv_heads,
                p.head_dim
            ),
            "{config}"
        );
        assert_eq!(
            (
                b.num_experts,
                b.top_k,
                b.moe_intermediate_size,
                b.shared_expert_intermediate_size
            ),
            (
                p.num_experts,
                p.top_k,
                p.moe_intermediate_size,
                p.shared_expert_intermediate_size
            ),
            "{config}"
        );
    }
}

#[test]
fn speculative_decoding_is_planned_by_hand() {
    use sparkrt::plan::speculative::SpeculativeConfig;
    let mut profile = Profile::load(&common::profile("qwen3.6-35b-a3b-bf16")).unwrap();
    let off = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    profile.serving.speculative = Some(
        SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 3}"#)
            .unwrap(),
    );
    let on = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    // k = 3 drafts per sequence: 16 live slots × 3 verify slots of
    // 65,863,680 B each, after the 16 live and 32 snapshot slots.
    let s = &on.recurrent_state;
    assert_eq!(
        (s.live_slots, s.snapshot_slots, s.verify_slots),
        (16, 32, 48)
    );
    assert_eq!(s.bytes, (16 + 32 + 48) * 65_863_680);
    assert_eq!(on.speculative.verify_state_bytes, 48 * 65_863_680);
    assert_eq!(off.recurrent_state.verify_slots, 0);
    // The logits buffer: 16 × (1 + 3) rows of the 248,320-token vocabulary,
    // f32; the drafts' 48 rows are what it grows by.
    assert_eq!(on.speculative.logit_rows, 64);
    let vocab = on.model.vocab_size as u64;
    assert_eq!(vocab, 248_320);
    assert_eq!(on.speculative.logits_bytes, 48 * vocab * 4);
    assert_eq!(buffer(&on, memory::LOGITS), Some(64 * vocab * 4));
    assert_eq!(buffer(&off, memory::LOGITS), Some(16 * vocab * 4));
    // The 64-row buffer also holds a chunk of 64 prompt rows (prompt
    // log-probabilities), which without drafts has a buffer of its own.
    assert_eq!(buffer(&off, memory::PROMPT_LOGITS), Some(64 * vocab * 4));
    assert_eq!(buffer(&on, memory::PROMPT_LOGITS), None);
    assert_eq!(
        on.activations.bytes + 16 * vocab * 4,
        off.activations.bytes,
        "every other buffer is the same"
    );
    assert_eq!(
        on.fixed_bytes() + 16 * vocab * 4,
        off.fixed_bytes() + on.speculative.verify_state_bytes
    );
}

#[test]
fn the_mtp_head_is_planned_by_hand() {
    use sparkrt::geometry::WeightGroup;
    use sparkrt::plan::speculative::SpeculativeConfig;
    let mut profile = Profile::load(&common::profile("qwen3.6-35b-a3b-bf16")).unwrap();
    let off = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    profile.serving.speculative = Some(
        SpeculativeConfig::from_json(r#"{"method": "mtp", "num_speculative_tokens": 2}"#).unwrap(),
    );
    let on = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    // Its layer is one more full-attention KV layer: 11 × 2 KV heads × 256
    // × (K, V) × 2 B a token.
    assert_eq!(on.kv_cache.bytes_per_token, 11 * 2 * 256 * 2 * 2);
    assert_eq!(off.kv_cache.bytes_per_token, 10 * 2 * 256 * 2 * 2);
    // Its weights, bf16 (2 B), H = 2048: gated attention (q_proj 2·4096 ×
    // H, k and v 512 × H, o H × 4096) 54,525,952 B; the router 256 × H and
    // 256 experts of 3 × 512 × H, 1,611,661,312 B; the shared expert 3 ×
    // 512 × H and its gate H, 6,295,552 B; the layer's norms (2 H + 2 ·
    // 256) 9,216 B; fc H × 2H and three norms of H, 16,789,504 B.
    let group = |p: &sparkrt::plan::Plan| p.weights.groups.get(&WeightGroup::Mtp).copied();
    let mtp = group(&on).unwrap();
    assert_eq!(
        mtp,
        54_525_952 + 1_611_661_312 + 6_295_552 + 9_216 + 16_789_504
    );
    assert_eq!(mtp, 1_689_281_536);
    assert_eq!(
        group(&off),
        None,
        "plans without the head keep their groups"
    );
    assert_eq!(on.weights.total, off.weights.total + mtp);
    // Its buffers: every batched row's last hidden state, and the fc input
    // twice as wide, f32 (8192 rows × 2048).
    assert_eq!(buffer(&on, memory::MTP_HIDDEN), Some(8192 * 2048 * 4));
    assert_eq!(buffer(&on, memory::MTP_INPUT), Some(2 * 8192 * 2048 * 4));
    assert_eq!(buffer(&off, memory::MTP_HIDDEN), None);
}

#[test]
fn qwen36_35b_bf16_state_halves_the_pool() {
    let mut profile = Profile::load(&common::profile("qwen3.6-35b-a3b-bf16")).unwrap();
    let f32_plan = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    profile.serving.state_dtype = StateDtype::Bf16;
    let plan = plan::compute(&profile, &host(), None, PlanDevice::Cpu);
    // 30 layers × (24,576 conv + 524,288 delta-rule values) × 2 B =
    // 32,931,840 B (31.4 MiB) a slot, × 48 slots = 1,580,728,320 B.
    let s = &plan.recurrent_state;
    assert_eq!(s.dtype, StateDtype::Bf16);
    assert_eq!(s.bytes_per_seq, 32_931_840);
    assert_eq!(s.bytes, 1_580_728_320);
    assert_eq!(2 * s.bytes, f32_plan.recurrent_state.bytes);
    // The `plan` text names the dtype; the KV cache never shrinks for it.
    assert!(plan.kv_cache.bytes >= f32_plan.kv_cache.bytes);
    // Its own ledger category: 16 live slots and 32 snapshots.
    let rows = sparkrt::plan::ledger::Ledger::from_plan(&plan)
        .snapshot()
        .categories;
    let row = rows.iter().find(|r| r.name == "recurrent_state").unwrap();
    assert_eq!(row.planned, 16 * 32_931_840 + 32 * 32_931_840);
}

/// The quantized Qwen3.6-35B-A3B profiles' weights by hand: the bf16
/// profile's shapes (see above), each matrix in its format's bytes.
#[test]
fn quantized_qwen36_profiles_size_each_group_by_hand() {
    use sparkrt::geometry::WeightGroup;
    let weights = |name: &str| {
        let profile = Profile::load(&common::profile(name)).unwrap();
        plan::compute(&profile, &host(), None, PlanDevice::Cpu)
            .weights
            .groups
    };
    // (rows, cols) of each GDN layer's projections and each attention
    // layer's, and of one expert's (and the shared expert's) three.
    let gdn = [
        (8192, 2048),
        (4096, 2048),
        (32, 2048),
        (32, 2048),
        (2048, 4096),
    ];
    let attention = [(8192, 2048), (512, 2048), (512, 2048), (2048, 4096)];
    let mlp = [(512, 2048), (512, 2048), (2048, 512)];
    let gdn_rest = (8192 * 4 + 64 + 128) * 2; // convolution, A_log, dt_bias, norm
    let sum = |shapes: &[(u64, u64)], bytes: &dyn Fn(u64, u64) -> u64| {
        shapes.iter().map(|&(r, c)| bytes(r, c)).sum::<u64>()
    };

    // FP8 block: a byte per value and an f32 per 128 × 128 block (the
    // 32-row projections make one ragged block row).
    let fp8_block = |r: u64, c: u64| r * c + r.div_ceil(128) * c.div_ceil(128) * 4;
    let g = weights("qwen3.6-35b-a3b-fp8");
    assert_eq!(
        g[&WeightGroup::LinearAttention],
        30 * (sum(&gdn, &fp8_block) + gdn_rest)
    );
    assert_eq!(g[&WeightGroup::Attention], 10 * sum(&attention, &fp8_block));
    assert_eq!(g[&WeightGroup::Experts], 40 * 256 * sum(&mlp, &fp8_block));
    assert_eq!(
        g[&WeightGroup::SharedExpert],
        40 * (sum(&mlp, &fp8_block) + 2048 * 2)
    );

    // ModelOpt mixed: NVFP4 experts and shared expert (half a byte a value,
    // an E4M3 scale per 16, two f32 scalars), FP8 attention and GDN
    // projections (a byte a value, two f32 scalars).
    let nvfp4 = |r: u64, c: u64| r * c / 2 + r * c / 16 + 8;
    let fp8 = |r: u64, c: u64| r * c + 8;
    let g = weights("qwen3.6-35b-a3b-nvfp4");
    assert_eq!(
        g[&WeightGroup::LinearAttention],
        30 * (sum(&gdn, &fp8) + gdn_rest)
    );
    assert_eq!(g[&WeightGroup::Attention], 10 * sum(&attention, &fp8));
    assert_eq!(g[&WeightGroup::Experts], 40 * 256 * sum(&mlp, &nvfp4));
    assert_eq!(
        g[&WeightGroup::SharedExpert],
        40 * (sum(&mlp, &nvfp4) + 2048 * 2)
    );
    // NVIDIA's lm_head is NVFP4 too; the embeddings stay bf16.
    assert_eq!(g[&WeightGroup::LmHead], nvfp4(248_320, 2048));
    assert_eq!(g[&WeightGroup::Embeddings], 248_320 * 2048 * 2);
}
