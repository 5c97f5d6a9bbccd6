//! Shared by the engine tests on each backend: the transformers references
//! in tests/fixtures and a greedy run of several prompts through an engine.
#![allow(dead_code)]

use std::sync::mpsc;

use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, FinishReason, Request};
use sparkrt::plan::profile::Profile;

use crate::common;

pub const FIXTURES: [&str; 3] = ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"];

/// What transformers computed for a fixture's prompt.
pub struct Reference {
    pub input_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    /// `[input_ids.len(), vocab]`.
    pub logits: Vec<f32>,
    pub vocab: usize,
}

pub fn reference(name: &str) -> Reference {
    let bytes = std::fs::read(common::fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ints = |key: &str| -> Vec<u32> {
        st.tensor(key)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let logits = st.tensor("logits").unwrap();
    let vocab = logits.shape()[1];
    Reference {
        input_ids: ints("input_ids"),
        greedy_ids: ints("greedy_ids"),
        logits: logits
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        vocab,
    }
}

pub fn profile(name: &str) -> Profile {
    Profile::load(&common::profile(name)).unwrap()
}

/// What one request produced.
#[derive(Debug, Default)]
pub struct Outcome {
    pub prompt_logits: Vec<f32>,
    pub tokens: Vec<u32>,
    pub finish: Option<FinishReason>,
}

/// Queues `requests` on `engine`, each with a channel of its own; returns
/// the receiving ends, in order.
pub fn submit(engine: &mut Engine<'_>, requests: &[Request]) -> Vec<mpsc::Receiver<Event>> {
    requests
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            engine.add_request(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect()
}

/// Serves `prompts` together on `engine`, greedy, `max_tokens` each, with
/// prompt logits; returns each request's outcome.
pub fn serve_greedy(
    engine: &mut Engine<'_>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Vec<Outcome> {
    let vocab = engine.vocab_size();
    let mut receivers = Vec::new();
    for prompt in prompts {
        let (tx, rx) = mpsc::channel();
        engine
            .add_request(
                Request::new(prompt.clone(), SamplingParams::greedy(max_tokens))
                    .with_prompt_logits(true)
                    .with_ignore_eos(true),
                Box::new(tx),
            )
            .unwrap();
        receivers.push(rx);
    }
    while engine.has_work() {
        engine.step().unwrap();
    }
    receivers
        .into_iter()
        .zip(prompts)
        .map(|(rx, prompt)| {
            let mut out = Outcome {
                prompt_logits: vec![f32::NAN; prompt.len() * vocab],
                ..Outcome::default()
            };
            for event in rx.try_iter() {
                match event {
                    Event::PromptLogits { first, values } => {
                        out.prompt_logits[first * vocab..first * vocab + values.len()]
                            .copy_from_slice(&values);
                    }
                    Event::Token { id, .. } => out.tokens.push(id),
                    Event::Finished { reason, .. } => out.finish = Some(reason),
                    Event::PromptLogprob { .. } => {}
                    Event::Failed { message } => panic!("request failed: {message}"),
                }
            }
            out
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest |Δlogit| against transformers' f32 reference where the CPU
/// multiplies FP4 weights with int16 activations (`kernels::quantize`: 15
/// significant bits of each 32-value block's largest value, where a bf16
/// keeps 8). Measured on the NVFP4 fixtures on x86: 5.7e-3 to 8.4e-3
/// (2026-12-07); the avx512bf16 tier's bf16 activations move these logits by
/// up to 0.65. The f32 paths stay within the tests' own 1e-3 / 2e-3.
pub const QUANTIZED_INPUTS_TOLERANCE: f32 = 2e-2;

/// Whether a model planned as `plan` multiplies some weights with quantized
/// activations on this CPU: the plan holds the buffers they go to (MXFP4 or
/// NVFP4 linears), and the default tier quantizes them (the x86 ones for
/// both formats; NEON for MXFP4 only, counted alike: a looser bound).
pub fn quantizes_inputs(plan: &sparkrt::plan::Plan) -> bool {
    let planned = plan
        .moe_workspace
        .buffers
        .iter()
        .any(|b| b.name == "quantized_input");
    planned
        && sparkrt::backend::cpu::kernels::Isa::best()
            != sparkrt::backend::cpu::kernels::Isa::Scalar
}

/// The logits tolerance for a model planned as `plan`: `exact` on f32
/// paths, [`QUANTIZED_INPUTS_TOLERANCE`] where it quantizes activations.
pub fn logits_tolerance(plan: &sparkrt::plan::Plan, exact: f32) -> f32 {
    if quantizes_inputs(plan) {
        QUANTIZED_INPUTS_TOLERANCE.max(exact)
    } else {
        exact
    }
}

/// The last of `rows` rows of `logits` (a prompt's: the logits for the
/// token after it).
pub fn last_row(logits: Vec<f32>, rows: usize) -> Vec<f32> {
    let vocab = logits.len() / rows;
    logits[(rows - 1) * vocab..].to_vec()
}

/// `got`, a greedy continuation of `prompt`, is transformers' `want`; or,
/// where activations are quantized (`tolerance` above `exact`), it parts
/// from `want` only at a near-tie: at the first token that differs, this
/// engine's logit for `want`'s token is within `2 · tolerance` of its top
/// logit (`logits_after(ids)`: the engine's logits for the token after
/// `ids`). After that the two continue from different text, so nothing
/// more is compared.
pub fn assert_greedy_matches(
    what: &str,
    prompt: &[u32],
    got: &[u32],
    want: &[u32],
    tolerance: f32,
    exact: f32,
    logits_after: impl FnOnce(&[u32]) -> Vec<f32>,
) {
    if tolerance <= exact || got == want {
        assert_eq!(got, want, "{what}: greedy continuation");
        return;
    }
    assert_eq!(got.len(), want.len(), "{what}: greedy length");
    let k = (0..want.len()).find(|&i| got[i] != want[i]).unwrap();
    let ids: Vec<u32> = prompt.iter().chain(&want[..k]).copied().collect();
    let logits = logits_after(&ids);
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let theirs = logits[want[k] as usize];
    assert!(
        theirs >= top - 2.0 * tolerance,
        "{what}: greedy token {k} is {} here, transformers' {} is {} below the top logit (more than 2 × {tolerance})",
        got[k],
        want[k],
        top - theirs
    );
}
