//! The plan split over several nodes (`plan --tensor-parallel-size N`):
//! each rank's share by hand, the shares summing back to the model, every
//! rank checked against its own node, and the splits that cannot be made
//! refused by name.

use sparkrt::geometry::WeightGroup;
use sparkrt::plan::PlanDevice;
use sparkrt::plan::memory::HostFigures;
use sparkrt::plan::parallel::{NodeHost, ParallelError, plan_ranks, shares};
use sparkrt::plan::profile::Profile;

use crate::common::{self, fixture, sparkrt, stdout};

/// A node with `gib` GiB, nearly all of it available, no kubelet.
fn node(name: &str, gib: u64) -> NodeHost {
    NodeHost {
        name: name.to_string(),
        figures: HostFigures {
            mem_total: gib << 30,
            mem_available: (gib - 3) << 30,
            ..HostFigures::default()
        },
    }
}

fn sparks(n: usize) -> Vec<NodeHost> {
    (0..n).map(|i| node(&format!("spark-{i}"), 121)).collect()
}

fn load(name: &str) -> Profile {
    Profile::load(&common::profile(name)).unwrap()
}

fn group(plan: &sparkrt::plan::Plan, g: WeightGroup) -> u64 {
    plan.weights.groups.get(&g).copied().unwrap_or(0)
}

#[test]
fn qwen3_235b_nvfp4_rank_share_by_hand() {
    let profile = load("qwen3-235b-a22b-nvfp4");
    let plan = plan_ranks(&profile, &sparks(2), PlanDevice::Cpu).unwrap();
    assert!(plan.fits);
    let rank = &plan.ranks[0];
    let (s, p) = (&rank.share, &rank.plan);
    // 64 query heads and 4 KV heads over 2 ranks; 128 experts by id.
    assert_eq!(
        (s.attention_heads, s.kv_heads, s.kv_head_copies),
        (32, 2, 1)
    );
    assert_eq!((s.first_expert, s.experts), (0, 64));
    assert_eq!(plan.ranks[1].share.first_expert, 64);
    // 151,936 vocabulary rows: 75,968 each.
    assert_eq!((s.first_vocab_row, s.vocab_rows), (0, 75_968));
    // No dense layer: intermediate_size is not split (nor planned).
    assert_eq!(s.intermediate_size, 0);

    // Attention (bf16) per layer: q 4096 × 4096, k and v 256 × 4096,
    // o 4096 × 4096, 2 B each: 71,303,168 B; × 94 layers.
    assert_eq!(group(p, WeightGroup::Attention), 94 * 71_303_168);
    // An NVFP4 [1536, 4096] or [4096, 1536] weight: 3,145,728 B of codes,
    // 393,216 E4M3 scales, two f32 scalars = 3,538,952 B; an expert is three,
    // and a rank holds 64 of each layer's 128.
    assert_eq!(group(p, WeightGroup::Experts), 94 * 64 * 3 * 3_538_952);
    // The router scores all 128 experts on every rank: 128 × 4096 × 2 B.
    assert_eq!(group(p, WeightGroup::Router), 94 * 1_048_576);
    // Embedding and lm_head: 75,968 rows of 4096 bf16 each.
    assert_eq!(group(p, WeightGroup::Embeddings), 75_968 * 4096 * 2);
    assert_eq!(group(p, WeightGroup::LmHead), 75_968 * 4096 * 2);
    // Norms whole: 2 × 4096 + 2 × 128 a layer, and the final 4096, bf16.
    assert_eq!(
        group(p, WeightGroup::Norms),
        94 * (2 * 4096 + 2 * 128) * 2 + 4096 * 2
    );
    // KV: 94 layers × 2 KV heads × 128 × (K, V) × 2 B = 96,256 B a token.
    assert_eq!(p.kv_cache.bytes_per_token, 96_256);
    // One shared workspace for 8192 tokens of top-8 rows (a rank may get
    // all of a token's experts).
    assert_eq!(p.moe_workspace.routed_rows, 8192 * 8);
    // The logits stay whole: max_num_seqs 8 rows of 151,936 f32.
    let logits = p.activations.buffers.iter().find(|b| b.name == "logits");
    assert_eq!(logits.map(|b| b.bytes), Some(8 * 151_936 * 4));
    // Collectives per decoded token: an all-reduce of 4096 f32 after the
    // embedding and 2 per layer, each ring sending 2·(N−1)/N = 1 buffer in
    // 2 steps, and half the logits gathered in 1.
    let c = &plan.collectives;
    assert_eq!(c.all_reduces_per_token, 189);
    assert_eq!(c.sent_bytes_per_token, 189 * 16_384 + 151_936 * 4 / 2);
    assert_eq!(c.steps_per_token, 189 * 2 + 1);
}

#[test]
fn rank_shares_add_up_to_the_model() {
    for (name, world) in [
        ("qwen3-30b-a3b-bf16", 2),
        ("qwen3-30b-a3b-bf16", 4),
        ("qwen3.6-35b-a3b-bf16", 2),
        ("gpt-oss-120b", 4),
    ] {
        let profile = load(name);
        let whole = plan_ranks(&profile, &sparks(1), PlanDevice::Cpu).unwrap();
        let whole = &whole.ranks[0].plan;
        let split = plan_ranks(&profile, &sparks(world), PlanDevice::Cpu).unwrap();
        let sum = |g| split.ranks.iter().map(|r| group(&r.plan, g)).sum::<u64>();
        let what = format!("{name} over {world}");
        // Split without remainder: experts by id, rows of the vocabulary,
        // and (bf16, so no per-tensor scalars; no KV head held twice) the
        // attention. Gated DeltaNet's and the shared expert's norms and
        // gates are whole on every rank, so those groups are not.
        for g in [
            WeightGroup::Experts,
            WeightGroup::Embeddings,
            WeightGroup::LmHead,
            WeightGroup::Attention,
        ] {
            // gpt-oss's o_proj bias ([H] a layer, bf16) is whole on every rank.
            let geometry = profile.served_geometry();
            let whole_bias = if g == WeightGroup::Attention && geometry.attention_bias {
                (world as u64 - 1) * geometry.num_layers as u64 * geometry.hidden_size as u64 * 2
            } else {
                0
            };
            assert_eq!(sum(g), group(whole, g) + whole_bias, "{what}: {g:?}");
        }
        // Held whole by every rank.
        for r in &split.ranks {
            assert_eq!(
                group(&r.plan, WeightGroup::Router),
                group(whole, WeightGroup::Router),
                "{what}"
            );
        }
        // The KV cache per token and the recurrent state per sequence split
        // evenly (no KV head is held twice at these sizes).
        let r0 = &split.ranks[0].plan;
        assert_eq!(
            r0.kv_cache.bytes_per_token * world as u64,
            whole.kv_cache.bytes_per_token,
            "{what}"
        );
        assert_eq!(
            r0.recurrent_state.bytes_per_seq * world as u64,
            whole.recurrent_state.bytes_per_seq,
            "{what}"
        );
    }
}

#[test]
fn qwen36_state_halves_per_rank_by_hand() {
    let profile = load("qwen3.6-35b-a3b-bf16");
    let plan = plan_ranks(&profile, &sparks(2), PlanDevice::Cpu).unwrap();
    let s = &plan.ranks[1].share;
    assert_eq!((s.linear_key_heads, s.linear_value_heads), (8, 16));
    // 2 KV heads over 2 ranks, 16 query heads: 8 and 1.
    assert_eq!((s.attention_heads, s.kv_heads), (8, 1));
    // Per GDN layer and sequence: 3 conv inputs of 2·8·128 + 16·128 = 4096
    // channels, 16 heads of 128 × 128, f32, over 30 layers.
    let st = &plan.ranks[1].plan.recurrent_state;
    assert_eq!(st.bytes_per_seq, 30 * (3 * 4096 + 16 * 128 * 128) * 4);
    assert_eq!(st.bytes_per_seq, 65_863_680 / 2);
    // 256 experts: 128 a rank; the shared expert's 512 columns: 256.
    assert_eq!((s.first_expert, s.experts), (128, 128));
    assert_eq!(s.shared_expert_intermediate_size, 256);
}

#[test]
fn fewer_kv_heads_than_ranks_are_held_by_several() {
    // Qwen3.6: 2 KV heads over 8 ranks, each held by 4; each rank's KV per
    // token is one head's: 10 layers × 256 × (K, V) × 2 B.
    let profile = load("qwen3.6-35b-a3b-bf16");
    let plan = plan_ranks(&profile, &sparks(8), PlanDevice::Cpu).unwrap();
    let r = &plan.ranks[7];
    assert_eq!((r.share.kv_heads, r.share.kv_head_copies), (1, 4));
    assert_eq!(r.plan.kv_cache.bytes_per_token, 10 * 256 * 2 * 2);
}

#[test]
fn every_rank_holds_the_fewest_kv_tokens_any_rank_has_room_for() {
    let profile = load("qwen3-30b-a3b-bf16");
    let alone = |n: NodeHost| {
        plan_ranks(&profile, &[n.clone(), n], PlanDevice::Cpu)
            .unwrap()
            .kv_tokens
    };
    let small = alone(node("small", 48));
    let big = alone(node("big", 121));
    assert!(small < big, "{small} vs {big}");
    let mixed = plan_ranks(
        &profile,
        &[node("big", 121), node("small", 48)],
        PlanDevice::Cpu,
    )
    .unwrap();
    assert!(mixed.fits);
    assert_eq!(mixed.kv_tokens, small);
    for r in &mixed.ranks {
        assert_eq!(r.plan.kv_cache.tokens, small, "rank {}", r.share.rank);
    }
}

#[test]
fn splits_that_cannot_be_made_are_refused_by_name() {
    let g = load("qwen3.6-35b-a3b-bf16").served_geometry();
    assert_eq!(
        shares(&g, 3).unwrap_err(),
        ParallelError::NotDivisible {
            what: "num_attention_heads",
            size: 16,
            world: 3
        }
    );
    assert_eq!(
        shares(&g, 0).unwrap_err(),
        ParallelError::WorldSize { world: 0 }
    );
    assert_eq!(
        shares(&g, 65).unwrap_err(),
        ParallelError::WorldSize { world: 65 }
    );
    // Qwen's FP8 block-128 over 8: the shared expert's down_proj gets 64
    // input columns a rank, half a scale block.
    let fp8 = load("qwen3.6-35b-a3b-fp8").served_geometry();
    let err = shares(&fp8, 8).unwrap_err();
    assert!(
        matches!(
            err,
            ParallelError::QuantizationGroup {
                width: 64,
                group: 128,
                ..
            }
        ),
        "{err}"
    );
    // 3 KV heads cannot be split over 2 ranks nor shared evenly by them.
    let mut odd = load("qwen3-30b-a3b-bf16").served_geometry();
    odd.num_kv_heads = 3;
    assert_eq!(
        shares(&odd, 2).unwrap_err(),
        ParallelError::KvHeads {
            kv_heads: 3,
            world: 2
        }
    );
}

#[test]
fn qwen3_235b_nvfp4_fits_two_sparks_and_not_one() {
    let spark = fixture("hosts/spark").display().to_string();
    let box24 = fixture("hosts/box24").display().to_string();
    let profile = common::profile("qwen3-235b-a22b-nvfp4")
        .display()
        .to_string();
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", "--profile", &profile];
        args.extend_from_slice(extra);
        sparkrt(&args)
    };
    // One Spark: the weights alone do not fit (exit 3).
    let one = plan(&["--host-root", &spark]);
    assert_eq!(one.status.code(), Some(3), "{}", stdout(&one));
    // Two: each rank holds half the experts and fits its node.
    let two = plan(&[
        "--tensor-parallel-size",
        "2",
        "--node-host-root",
        &spark,
        "--node-host-root",
        &spark,
        "--json",
    ]);
    assert_eq!(two.status.code(), Some(0), "{}", stdout(&two));
    let v: serde_json::Value = serde_json::from_slice(&two.stdout).unwrap();
    assert_eq!(v["fits"], true);
    assert_eq!(v["ranks"].as_array().map(Vec::len), Some(2));
    let usable = v["ranks"][1]["plan"]["host"]["usable"].as_i64().unwrap();
    let total = v["ranks"][1]["plan"]["total"].as_i64().unwrap();
    assert!(total <= usable, "{total} > {usable}");
    // The second node too small: the plan stops, naming that rank's node.
    let short = plan(&[
        "--tensor-parallel-size",
        "2",
        "--node-host-root",
        &spark,
        "--node-host-root",
        &box24,
    ]);
    assert_eq!(short.status.code(), Some(3), "{}", stdout(&short));
    let text = stdout(&short);
    assert!(
        text.contains(&format!("DOES NOT FIT: rank 1 on {box24}")),
        "{text}"
    );
    assert!(text.contains("No rank allocates"), "{text}");
}

#[test]
fn bad_parallel_flags_are_refused() {
    let spark = fixture("hosts/spark").display().to_string();
    let profile = common::profile("qwen3.6-35b-a3b-bf16")
        .display()
        .to_string();
    for (args, needle) in [
        (
            vec!["--host-root", &spark, "--tensor-parallel-size", "3"],
            "num_attention_heads = 16 does not split over 3 ranks",
        ),
        (
            vec!["--tensor-parallel-size", "2", "--node-host-root", &spark],
            "1 node host roots were given for --tensor-parallel-size 2",
        ),
        (
            vec![
                "--host-root",
                &spark,
                "--tensor-parallel-size",
                "1",
                "--node-host-root",
                &spark,
            ],
            "leave out --host-root and --kubelet-config",
        ),
        (
            vec!["--host-root", &spark, "--tensor-parallel-size", "0"],
            "--tensor-parallel-size 0 must be between 1 and 64",
        ),
        (
            vec![
                "--host-root",
                &spark,
                "--tensor-parallel-size",
                "18446744073709551615",
            ],
            "must be between 1 and 64",
        ),
    ] {
        let mut all = vec!["plan", "--profile", &profile];
        all.extend_from_slice(&args);
        let out = sparkrt(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn uneven_experts_and_vocabulary_by_hand() {
    // 10 experts and 10 vocabulary rows over 4 ranks: the first 10 mod 4
    // ranks hold an expert more; vocabulary rows ⌈10 / 4⌉ = 3 a rank, the
    // last the 1 left.
    let mut profile = load("qwen3-30b-a3b-bf16");
    let g = &mut profile.model.geometry;
    (g.num_experts, g.vocab_size) = (10, 10);
    let got = shares(&profile.served_geometry(), 4).unwrap();
    let experts: Vec<_> = got.iter().map(|s| (s.first_expert, s.experts)).collect();
    assert_eq!(experts, [(0, 3), (3, 3), (6, 2), (8, 2)]);
    let vocab: Vec<_> = got
        .iter()
        .map(|s| (s.first_vocab_row, s.vocab_rows))
        .collect();
    assert_eq!(vocab, [(0, 3), (3, 3), (6, 3), (9, 1)]);
    // Fewer experts than ranks.
    assert_eq!(
        shares(&profile.served_geometry(), 16).unwrap_err(),
        ParallelError::TooFewExperts {
            experts: 10,
            world: 16
        }
    );
    // A rank holding 2 experts of a top-8 model: the router still picks 8
    // per token (512 × 8 ids), at most 2 of them run here (512 × 2 rows).
    let plan = plan_ranks(&profile, &sparks(4), PlanDevice::Cpu).unwrap();
    let ws = &plan.ranks[3].plan.moe_workspace;
    let tokens = profile.serving.max_num_batched_tokens as u64;
    let bytes = |name: &str| ws.buffers.iter().find(|b| b.name == name).map(|b| b.bytes);
    assert_eq!(bytes("topk_ids"), Some(tokens * 8 * 4));
    assert_eq!(bytes("sorted_rows"), Some(tokens * 2 * 4));
    assert_eq!(ws.routed_rows, tokens * 2);
}

#[test]
fn one_rank_is_the_one_node_plan() {
    for name in [
        "qwen3-30b-a3b-bf16",
        "qwen3.6-35b-a3b-nvfp4",
        "gpt-oss-120b",
    ] {
        let profile = load(name);
        let nodes = sparks(1);
        let one = plan_ranks(&profile, &nodes, PlanDevice::Cpu).unwrap();
        let whole = sparkrt::plan::compute(&profile, &nodes[0].figures, None, PlanDevice::Cpu);
        assert_eq!(
            serde_json::to_value(&one.ranks[0].plan).unwrap(),
            serde_json::to_value(&whole).unwrap(),
            "{name}"
        );
        assert_eq!(one.collectives.sent_bytes_per_token, 0);
    }
}
