//! `sparkrt bench --temperature`: seeded sampling, so a speculative bench
//! can measure drafts that fail (rejection sampling keeps few of them),
//! reproducibly; out-of-range temperatures refused by name.

use crate::common;

const FIXTURE: &str = "tests/fixtures/qwen3-moe-tiny";

/// `sparkrt bench` on the fixture's CPU backend at `temperature`, with
/// `more` flags.
fn bench_at(temperature: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec![
        "bench",
        "--model",
        FIXTURE,
        "--backend",
        "cpu",
        "--temperature",
        temperature,
    ];
    args.extend_from_slice(more);
    common::sparkrt(&args)
}

/// The bench's speculative counts at `temperature` (ngram, k = 3, prompts
/// repeating a phrase).
fn drafts_at(temperature: &str) -> (u64, u64) {
    let out = bench_at(
        temperature,
        &[
            "--prompt",
            "repeat",
            "--prompt-len",
            "64",
            "--gen",
            "64",
            "--repeats",
            "1",
            "--speculative-config",
            r#"{"method": "ngram", "num_speculative_tokens": 3}"#,
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = common::json(&out);
    assert_eq!(
        report["temperature"].as_f64(),
        Some(temperature.parse::<f64>().unwrap())
    );
    let spec = &report["speculative"];
    (
        spec["draft_tokens"].as_u64().unwrap(),
        spec["accepted_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn sampled_benches_reject_drafts_and_repeat_exactly() {
    let (greedy_drafted, greedy_kept) = drafts_at("0");
    let (drafted, kept) = drafts_at("0.3");
    assert!(drafted > 0, "prompt lookup proposed nothing at 0.3");
    assert!(
        kept < drafted,
        "every draft kept at 0.3: {kept} of {drafted}"
    );
    // Sampling keeps a smaller share of the drafts than greedy decoding,
    // whose loop the drafts follow.
    assert!(
        (kept as f64 / drafted as f64) < (greedy_kept as f64 / greedy_drafted as f64),
        "sampled {kept}/{drafted}, greedy {greedy_kept}/{greedy_drafted}"
    );
    // Seeded per request: the same draws, so the same drafts, every run.
    assert_eq!(drafts_at("0.3"), (drafted, kept));
}

#[test]
fn temperatures_outside_0_to_2_are_refused_by_name() {
    for bad in ["-0.1", "2.5", "NaN", "inf"] {
        let out = bench_at(bad, &[]);
        assert!(!out.status.success(), "--temperature {bad} was accepted");
        assert!(
            common::stderr(&out).contains("--temperature"),
            "{bad}: {}",
            common::stderr(&out)
        );
    }
}
