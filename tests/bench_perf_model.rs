//! `sparkrt bench`'s performance model on the gpt-oss tiny fixture, against
//! figures worked by hand from its config (H = 64, 8 heads and 2 KV heads
//! of 16, 8 experts of I = 64, top-4, 4 layers alternating sliding (window
//! 8) and full attention, bf16 KV) and the group bytes `sparkrt inspect`
//! reads from its headers.

use crate::common;

const FIXTURE: &str = "tests/fixtures/gpt-oss-tiny";

#[test]
fn bench_prints_the_performance_model_worked_by_hand() {
    let inspect = common::sparkrt(&["inspect", FIXTURE, "--json"]);
    assert!(inspect.status.success(), "{}", common::stderr(&inspect));
    let groups = &common::json(&inspect)["groups"];
    let group = |name: &str| groups[name].as_u64().unwrap();
    let out = common::sparkrt(&[
        "bench",
        "--model",
        FIXTURE,
        "--backend",
        "cpu",
        "--prompt-len",
        "16",
        "--gen",
        "8",
        "--repeats",
        "1",
        "--batch",
        "4",
        "--json",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = common::json(&out);
    let model = &report["perf_model"];
    let u = |key: &str| {
        model[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {model}"))
    };
    let f = |key: &str| {
        model[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {model}"))
    };

    // Read once per step whatever the batch.
    let dense = group("attention") + group("router") + group("norms") + group("lm_head");
    let row = group("embeddings") / 512;
    // Batch 1: 4 of 8 experts; batch 4: 8 · (1 − (1 − 4/8)⁴) = 7.5 of them.
    assert_eq!(
        u("weight_bytes_per_step_batch_1"),
        dense + group("experts") * 4 / 8 + row
    );
    assert_eq!(
        report["bytes_per_token"].as_u64(),
        Some(u("weight_bytes_per_step_batch_1"))
    );
    assert_eq!(f("distinct_experts_per_moe_layer"), 7.5);
    let experts_b4 = (group("experts") as f64 * 7.5 / 8.0).round() as u64;
    assert_eq!(u("weight_bytes_per_step"), dense + experts_b4 + 4 * row);

    // KV at 16 + 8/2 = 20 tokens: a token's K and V of 2 × 16 bf16 values
    // is 128 B per layer; the 2 full layers read 20 tokens, the 2 sliding
    // ones their window of 8; 4 sequences.
    assert_eq!(u("kv_context_tokens"), 20);
    assert_eq!(u("kv_bytes_per_step"), 4 * (2 * 20 * 128 + 2 * 8 * 128));

    // Per layer: q, k, v, o 2·128·64 + 2·32·64 = 20480, router 8·64 = 512,
    // 4 experts × 3·64·64 = 49152; 4 layers.
    assert_eq!(u("activated_params"), 4 * (20480 + 512 + 49152));
    // 4·128 FLOPs per key; 16 prompt tokens attend 8.5 keys on average on
    // a full layer, (1 + … + 8 + 8·8) / 16 = 6.25 on a sliding one.
    assert_eq!(
        f("attention_flops_per_prefill_token"),
        512.0 * (2.0 * 8.5 + 2.0 * 6.25)
    );
    assert_eq!(
        f("flops_per_prefill_token"),
        2.0 * 280_576.0 + f("attention_flops_per_prefill_token")
    );

    // The rates are the measured ones times the model's work.
    let decode_tok_s = report["decode_tok_s"].as_f64().unwrap();
    let per_step = (u("weight_bytes_per_step") + u("kv_bytes_per_step")) as f64;
    assert!(
        (f("decode_bytes_s") - decode_tok_s / 4.0 * per_step).abs()
            <= 1e-6 * per_step * decode_tok_s
    );
    let prefill_tok_s = report["prefill_tok_s"].as_f64().unwrap();
    let flops = prefill_tok_s * f("flops_per_prefill_token");
    assert!((f("prefill_flops_s") - flops).abs() <= 1e-9 * flops);
    // No GPU, no tensor-core peak.
    assert!(model["tensor_core_peak_flops"].is_null());

    let text = common::stdout(&common::sparkrt(&[
        "bench",
        "--model",
        FIXTURE,
        "--backend",
        "cpu",
        "--prompt-len",
        "16",
        "--gen",
        "8",
        "--repeats",
        "1",
        "--batch",
        "4",
    ]));
    for line in [
        "performance model",
        "weights / decode step, batch 1",
        "weights / decode step, batch 4",
        "KV / decode step at 20 tokens",
        "FLOPs / prefill token at 16",
        "decode reads",
        "prefill compute",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}
