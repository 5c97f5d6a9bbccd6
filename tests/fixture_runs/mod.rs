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
