//! The logits processors (penalties, logit_bias, min_tokens, min_p) against
//! an independent reference of each formula written here, in f64 from the
//! definitions (OpenAI's for the presence and frequency penalties, vLLM's
//! and transformers' for the repetition penalty and min_p), not from the
//! crate's code; and batch invariance of a request with every parameter set.

use std::collections::{HashMap, HashSet};

use sparkrt::backend::cpu::CpuBackend;
use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::engine::sampling::{Sampler, SamplingParams, SamplingWorkspace};
use sparkrt::engine::{Engine, Event, Request};
use sparkrt::plan::profile::Profile;
use sparkrt::runtime::{HostSource, Loaded};
use sparkrt::util::rng::SplitMix64;

use crate::common;

/// The settings the reference reads.
#[derive(Clone, Copy, Debug)]
struct Settings {
    temperature: f64,
    presence: f64,
    frequency: f64,
    repetition: f64,
    min_p: f64,
    min_tokens: usize,
}

impl Settings {
    fn params(&self, bias: &[(u32, f32)], stop_ids: &[u32], seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature as f32,
            presence_penalty: self.presence as f32,
            frequency_penalty: self.frequency as f32,
            repetition_penalty: self.repetition as f32,
            min_p: self.min_p as f32,
            min_tokens: self.min_tokens,
            logit_bias: bias.to_vec(),
            stop_token_ids: stop_ids.to_vec(),
            seed: Some(seed),
            max_tokens: 64,
            ..SamplingParams::default()
        }
    }
}

/// The next token's probabilities by the definitions: bias added; end
/// tokens impossible before `min_tokens` outputs; every token of prompt or
/// output: `l > 0 ? l / r : l * r`; every output token: `l -= f × count +
/// p`; softmax of `l / T`; tokens with probability below `min_p × max`
/// dropped and the rest renormalised.
fn reference_probabilities(
    logits: &[f32],
    s: &Settings,
    bias: &[(u32, f32)],
    end_ids: &[u32],
    prompt: &[u32],
    output: &[u32],
) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    for &(id, b) in bias {
        l[id as usize] += f64::from(b);
    }
    if output.len() < s.min_tokens {
        for &id in end_ids {
            l[id as usize] = f64::NEG_INFINITY;
        }
    }
    let seen: HashSet<u32> = prompt.iter().chain(output).copied().collect();
    for &id in &seen {
        let x = &mut l[id as usize];
        *x = if *x > 0.0 {
            *x / s.repetition
        } else {
            *x * s.repetition
        };
    }
    let mut counts: HashMap<u32, f64> = HashMap::new();
    for &id in output {
        *counts.entry(id).or_default() += 1.0;
    }
    for (&id, &count) in &counts {
        l[id as usize] -= s.frequency * count + s.presence;
    }
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut p: Vec<f64> = l
        .iter()
        .map(|&x| ((x - max) / s.temperature).exp())
        .collect();
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    let top = p.iter().copied().fold(0.0, f64::max);
    p.iter_mut()
        .filter(|x| **x < s.min_p * top)
        .for_each(|x| *x = 0.0);
    let kept: f64 = p.iter().sum();
    p.iter().map(|x| x / kept).collect()
}

/// A row that makes `token` all but certain whatever the processors do
/// (biases are at most 100, penalties at most halve it).
fn forcing_row(vocab: usize, token: u32) -> Vec<f32> {
    let mut row = vec![0.0; vocab];
    row[token as usize] = 1000.0;
    row
}

/// Frequencies of the token drawn from `row` after `history` was sampled,
/// over `n` samplers with different seeds.
fn frequencies_after(
    params: &SamplingParams,
    prompt: &[u32],
    eos: &[u32],
    history: &[u32],
    row: &[f32],
    n: usize,
) -> Vec<f64> {
    let vocab = row.len();
    let mut workspace = SamplingWorkspace::new(vocab);
    let mut counts = vec![0usize; vocab];
    for seed in 0..n as u64 {
        let mut p = params.clone();
        p.seed = Some(seed);
        let mut sampler = Sampler::for_prompt(&p, prompt, eos).unwrap();
        for &t in history {
            let got = sampler.sample(&forcing_row(vocab, t), &mut workspace);
            assert_eq!(got, Ok(t), "the history is forced");
        }
        counts[sampler.sample(row, &mut workspace).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

fn assert_close(got: &[f64], want: &[f64], tolerance: f64, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "{what}: token {i}: frequency {g}, reference {w}\n got {got:?}\nwant {want:?}"
        );
        if *w == 0.0 {
            assert_eq!(*g, 0.0, "{what}: token {i} is impossible by the reference");
        }
    }
}

const BASE: Settings = Settings {
    temperature: 1.0,
    presence: 0.0,
    frequency: 0.0,
    repetition: 1.0,
    min_p: 0.0,
    min_tokens: 0,
};

/// Each parameter alone, then all together: the sampled distribution is
/// the reference's.
#[test]
fn each_parameter_shapes_the_distribution_as_defined() {
    let row: Vec<f32> = vec![1.5, -0.5, 0.8, 2.0, -1.2, 0.3, 1.1, 0.0];
    let prompt = [2, 6, 6];
    let history = [3, 3, 1, 5];
    let eos = [7];
    // (name, settings, logit_bias, stop_token_ids)
    type Case = (&'static str, Settings, Vec<(u32, f32)>, Vec<u32>);
    let cases: Vec<Case> = vec![
        ("plain", BASE, vec![], vec![]),
        (
            "presence",
            Settings {
                presence: 1.5,
                ..BASE
            },
            vec![],
            vec![],
        ),
        (
            "negative presence",
            Settings {
                presence: -1.0,
                ..BASE
            },
            vec![],
            vec![],
        ),
        (
            "frequency",
            Settings {
                frequency: 0.9,
                ..BASE
            },
            vec![],
            vec![],
        ),
        (
            "repetition",
            Settings {
                repetition: 1.8,
                ..BASE
            },
            vec![],
            vec![],
        ),
        (
            "repetition below 1",
            Settings {
                repetition: 0.6,
                ..BASE
            },
            vec![],
            vec![],
        ),
        (
            "min_p",
            Settings {
                min_p: 0.3,
                temperature: 0.7,
                ..BASE
            },
            vec![],
            vec![],
        ),
        ("logit_bias", BASE, vec![(4, 3.0), (3, -100.0)], vec![]),
        (
            "min_tokens",
            Settings {
                min_tokens: 6,
                ..BASE
            },
            vec![(7, 4.0), (0, 3.0)],
            vec![0],
        ),
        (
            "everything",
            Settings {
                temperature: 0.8,
                presence: 0.5,
                frequency: 0.4,
                repetition: 1.3,
                min_p: 0.05,
                min_tokens: 5,
            },
            vec![(7, 2.0), (1, 1.0)],
            vec![4],
        ),
    ];
    for (what, settings, bias, stop_ids) in cases {
        let params = settings.params(&bias, &stop_ids, 0);
        let end_ids: Vec<u32> = eos.iter().chain(&stop_ids).copied().collect();
        let want = reference_probabilities(&row, &settings, &bias, &end_ids, &prompt, &history);
        let got = frequencies_after(&params, &prompt, &eos, &history, &row, 20_000);
        assert_close(&got, &want, 0.015, what);
    }
}

/// Greedy decoding takes the argmax of the processed logits: on random rows
/// and histories, the sampler's choice is the reference's most likely token.
#[test]
fn greedy_takes_the_argmax_after_the_processors() {
    let mut rng = SplitMix64::new(5);
    let vocab = 40;
    let mut workspace = SamplingWorkspace::new(vocab);
    let mut flipped = 0;
    for case in 0..300 {
        let settings = Settings {
            temperature: 1.0,
            presence: rng.next_f64() * 4.0 - 2.0,
            frequency: rng.next_f64() * 4.0 - 2.0,
            repetition: 0.5 + rng.next_f64() * 1.5,
            min_p: 0.0,
            min_tokens: 0,
        };
        let bias: Vec<(u32, f32)> = (0..3)
            .map(|_| {
                (
                    (rng.next_f64() * vocab as f64) as u32,
                    (rng.next_f64() * 6.0 - 3.0) as f32,
                )
            })
            .collect();
        let prompt: Vec<u32> = (0..5)
            .map(|_| (rng.next_f64() * vocab as f64) as u32)
            .collect();
        let history: Vec<u32> = (0..6)
            .map(|_| (rng.next_f64() * vocab as f64) as u32)
            .collect();
        let row: Vec<f32> = (0..vocab)
            .map(|_| (rng.next_f64() * 4.0 - 2.0) as f32)
            .collect();
        let mut params = settings.params(&bias, &[], 1);
        params.temperature = 0.0;
        let mut sampler = Sampler::for_prompt(&params, &prompt, &[]).unwrap();
        for &t in &history {
            sampler
                .sample(&forcing_row(vocab, t), &mut workspace)
                .unwrap();
        }
        let want = reference_probabilities(&row, &settings, &bias, &[], &prompt, &history);
        let best = (0..vocab)
            .max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        let raw_best = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        flipped += usize::from(best != raw_best);
        assert_eq!(
            sampler.sample(&row, &mut workspace),
            Ok(best),
            "case {case}"
        );
    }
    assert!(
        flipped > 50,
        "the processors change the argmax often ({flipped})"
    );
}

/// The end tokens stay masked for exactly `min_tokens` tokens.
#[test]
fn min_tokens_masks_end_tokens_until_reached() {
    let vocab = 10;
    let params = SamplingParams {
        temperature: 0.0,
        min_tokens: 3,
        stop_token_ids: vec![4],
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::for_prompt(&params, &[1, 2], &[9]).unwrap();
    let mut workspace = SamplingWorkspace::new(vocab);
    let mut row = vec![0.0f32; vocab];
    row[9] = 5.0;
    row[4] = 4.0;
    row[2] = 1.0;
    let got: Vec<u32> = (0..4)
        .map(|_| sampler.sample(&row, &mut workspace).unwrap())
        .collect();
    assert_eq!(got, vec![2, 2, 2, 9]);
}

fn tiny_engine() -> Loaded<CpuBackend> {
    let mut profile = Profile::load(&common::profile("qwen3-moe-tiny")).unwrap();
    profile.serving.max_model_len = 256;
    let root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &root,
        kubelet_config: None,
    };
    Loaded::open_cpu(
        &common::fixture("qwen3-moe-tiny"),
        Some(&profile),
        &host,
        PageCachePolicy::Keep,
    )
    .unwrap()
}

fn serve(engine: &mut Engine<'_>, requests: &[Request]) -> Vec<Vec<u32>> {
    let receivers = crate::fixture_runs::submit(engine, requests);
    while engine.has_work() {
        engine.step().unwrap();
    }
    receivers
        .into_iter()
        .map(|rx| {
            rx.try_iter()
                .filter_map(|e| match e {
                    Event::Token { id, .. } => Some(id),
                    Event::Failed { message } => panic!("failed: {message}"),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// A seeded request with every parameter set yields the same tokens alone
/// and in a batch with other requests (each with its own settings).
#[test]
fn every_parameter_keeps_batch_invariance() {
    let loaded = tiny_engine();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let request = |seed: u64, shift: u32| {
        Request::new(
            (0..12).map(|i| (i * 41 + shift * 7) % 500).collect(),
            SamplingParams {
                temperature: 0.9,
                top_k: Some(100),
                top_p: 0.95,
                seed: Some(seed),
                max_tokens: 24,
                presence_penalty: 0.7,
                frequency_penalty: 0.4,
                repetition_penalty: 1.3,
                min_p: 0.02,
                logit_bias: vec![(17, 2.5), (300, -5.0)],
                stop_token_ids: vec![499],
                min_tokens: 4,
                ..SamplingParams::default()
            },
        )
    };
    let alone = serve(&mut engine, &[request(11, 0)]);
    let others: Vec<Request> = (1..5).map(|i| request(100 + i, i as u32)).collect();
    let mut batch = vec![others[0].clone(), request(11, 0)];
    batch.extend(others[1..].iter().cloned());
    let together = serve(&mut engine, &batch);
    assert!(!alone[0].is_empty());
    assert_eq!(alone[0], together[1], "alone vs in a batch of five");
    // The parameters are in effect: a plain seeded request differs.
    let mut plain = request(11, 0);
    plain.params = SamplingParams {
        seed: Some(11),
        temperature: 0.9,
        top_k: Some(100),
        top_p: 0.95,
        max_tokens: 24,
        ..SamplingParams::default()
    };
    assert_ne!(serve(&mut engine, &[plain])[0], alone[0]);
}

/// A constrained request's tokens are the same alone and in a batch with
/// constrained and unconstrained others (its mask is its own), and follow
/// the grammar.
#[test]
fn structured_outputs_keep_batch_invariance() {
    use sparkrt::engine::grammar::{GrammarCompiler, GrammarSpec};
    use sparkrt::text::Tokenizer;

    let tokenizer = Tokenizer::from_dir(&common::fixture("qwen3-moe-tiny")).unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.eos_token_ids()).unwrap();
    let loaded = tiny_engine();
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let request = |seed: u64, regex: Option<&str>| {
        Request::new(
            (0..10).map(|i| (i * 13 + seed as u32) % 500).collect(),
            SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                max_tokens: 40,
                constraint: regex.map(|r| compiler.compile(&GrammarSpec::Regex(r.into())).unwrap()),
                ..SamplingParams::default()
            },
        )
    };
    let regex = "[a-z]{3,8}( [a-z]{2,6}){1,3}";
    let alone = serve(&mut engine, &[request(5, Some(regex))]);
    let batch = [
        request(6, None),
        request(5, Some(regex)),
        request(7, Some("[0-9]{4,12}")),
        request(8, None),
    ];
    let together = serve(&mut engine, &batch);
    assert_eq!(alone[0], together[1]);
    let text = tokenizer.decode(&alone[0], true).unwrap();
    let words: Vec<&str> = text.split(' ').collect();
    assert!(
        (2..=4).contains(&words.len())
            && words
                .iter()
                .all(|w| w.len() >= 2 && w.len() <= 8 && w.bytes().all(|b| b.is_ascii_lowercase())),
        "{text:?}"
    );
    let digits = tokenizer.decode(&together[2], true).unwrap();
    assert!(
        (4..=12).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
        "{digits:?}"
    );
}

/// A grammar's mask: only ids with a set bit are drawn, and ids past the
/// mask's end (model rows beyond the tokenizer's vocabulary) never are.
#[test]
fn a_mask_allows_only_its_tokens_and_nothing_past_its_end() {
    let vocab = 64;
    // One word: ids 0..32 only; ids 1, 3 and 20 allowed.
    let mask = [(1u32 << 1) | (1 << 3) | (1 << 20)];
    let mut row: Vec<f32> = (0..vocab).map(|i| i as f32 / 8.0).collect();
    row[40] = 50.0; // the model's favourite, past the mask
    let mut counts = [0usize; 64];
    let mut workspace = SamplingWorkspace::new(vocab);
    for seed in 0..3000 {
        let params = SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(&params).unwrap();
        counts[sampler
            .sample_masked(&row, Some(&mask), &mut workspace)
            .unwrap() as usize] += 1;
    }
    // Reference: softmax over the allowed logits only.
    let allowed = [1usize, 3, 20];
    let total: f64 = allowed.iter().map(|&i| f64::from(row[i]).exp()).sum();
    for (id, &count) in counts.iter().enumerate() {
        let want = if allowed.contains(&id) {
            f64::from(row[id]).exp() / total
        } else {
            0.0
        };
        let got = count as f64 / 3000.0;
        assert!((got - want).abs() < 0.03, "token {id}: {got} vs {want}");
        if want == 0.0 {
            assert_eq!(count, 0, "token {id} is masked");
        }
    }
    // Greedy takes the best allowed token.
    let mut greedy = Sampler::new(&SamplingParams::greedy(1)).unwrap();
    assert_eq!(
        greedy.sample_masked(&row, Some(&mask), &mut workspace),
        Ok(20)
    );
}
