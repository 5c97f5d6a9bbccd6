//! Sampling: validation, greedy ties, the cuts, frequencies on hand-made
//! distributions, and reproducibility.

use sparkrt::engine::sampling::{Sampler, SamplingError, SamplingParams, SamplingWorkspace};
use sparkrt::util::rng::SplitMix64;

fn params(temperature: f32, top_k: Option<usize>, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// Lowest index among the largest logits, written independently of the crate.
fn reference_argmax(logits: &[f32]) -> u32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&l| l == max).unwrap() as u32
}

fn random_logits(rng: &mut SplitMix64, vocab: usize, scale: f64) -> Vec<f32> {
    (0..vocab)
        .map(|_| (rng.next_f64() * scale) as f32)
        .collect()
}

/// Draws `n` tokens from the same row; returns each token's frequency.
fn frequencies(p: &SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
    let mut sampler = Sampler::new(p).unwrap();
    let mut workspace = SamplingWorkspace::new(logits.len());
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[sampler.sample(logits, &mut workspace).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

fn assert_close(got: &[f64], want: &[f64], tolerance: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "token {i}: frequency {g}, expected {w} (all: {got:?})"
        );
    }
}

#[test]
fn invalid_params_are_typed_errors() {
    let base = SamplingParams::default();
    assert_eq!(base.validate(), Ok(()));
    assert_eq!(SamplingParams::greedy(5).validate(), Ok(()));
    let cases = [
        (
            SamplingParams {
                temperature: -0.1,
                ..base.clone()
            },
            SamplingError::NegativeTemperature(-0.1),
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..base.clone()
            },
            SamplingError::NonFiniteTemperature(f32::INFINITY),
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..base.clone()
            },
            SamplingError::TopPOutOfRange(0.0),
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..base.clone()
            },
            SamplingError::TopPOutOfRange(1.5),
        ),
        (
            SamplingParams {
                top_p: -1.0,
                ..base.clone()
            },
            SamplingError::TopPOutOfRange(-1.0),
        ),
        (
            SamplingParams {
                top_k: Some(0),
                ..base.clone()
            },
            SamplingError::ZeroTopK,
        ),
        (
            SamplingParams {
                max_tokens: 0,
                ..base.clone()
            },
            SamplingError::ZeroMaxTokens,
        ),
        (
            SamplingParams {
                stop: vec!["ok".into(), String::new()],
                ..base.clone()
            },
            SamplingError::EmptyStopString { index: 1 },
        ),
    ];
    for (p, want) in cases {
        assert_eq!(p.validate(), Err(want.clone()));
        assert_eq!(Sampler::new(&p).err(), Some(want));
    }
    let nan_temperature = SamplingParams {
        temperature: f32::NAN,
        ..base.clone()
    };
    assert!(matches!(
        nan_temperature.validate(),
        Err(SamplingError::NonFiniteTemperature(_))
    ));
    let nan_top_p = SamplingParams {
        top_p: f32::NAN,
        ..base
    };
    assert!(matches!(
        nan_top_p.validate(),
        Err(SamplingError::TopPOutOfRange(_))
    ));
}

#[test]
fn bad_logits_are_typed_errors() {
    let mut sampler = Sampler::new(&params(1.0, None, 1.0, 1)).unwrap();
    let mut workspace = SamplingWorkspace::new(4);
    assert_eq!(
        sampler.sample(&[], &mut workspace),
        Err(SamplingError::EmptyLogits)
    );
    assert!(matches!(
        sampler.sample(&[0.0, f32::NAN, 1.0], &mut workspace),
        Err(SamplingError::NonFiniteLogit { index: 1, .. })
    ));
    assert!(matches!(
        sampler.sample(&[0.0, 1.0, f32::INFINITY], &mut workspace),
        Err(SamplingError::NonFiniteLogit { index: 2, .. })
    ));
    assert_eq!(
        sampler.sample(&[f32::NEG_INFINITY; 3], &mut workspace),
        Err(SamplingError::AllTokensMasked)
    );
    assert_eq!(
        sampler.sample(&[0.0; 5], &mut workspace),
        Err(SamplingError::WorkspaceTooSmall {
            vocab: 5,
            capacity: 4
        })
    );
}

#[test]
fn greedy_takes_the_lowest_index_among_ties() {
    let mut sampler = Sampler::new(&SamplingParams::greedy(1)).unwrap();
    let mut workspace = SamplingWorkspace::new(8);
    assert_eq!(sampler.sample(&[1.0, 3.0, 3.0, 2.0], &mut workspace), Ok(1));
    assert_eq!(
        sampler.sample(&[f32::NEG_INFINITY, -5.0, -5.0], &mut workspace),
        Ok(1)
    );
    assert_eq!(sampler.sample(&[7.0], &mut workspace), Ok(0));
    assert_eq!(sampler.sample(&[0.5; 8], &mut workspace), Ok(0));
}

#[test]
fn top_k_one_and_tiny_top_p_equal_greedy() {
    let mut rng = SplitMix64::new(42);
    let vocab = 1000;
    let mut workspace = SamplingWorkspace::new(vocab);
    let mut top_k_one = Sampler::new(&params(1.5, Some(1), 1.0, 3)).unwrap();
    let mut tiny_top_p = Sampler::new(&params(1.5, None, 1e-7, 4)).unwrap();
    for row in 0..200 {
        // Coarse values give many ties for the maximum.
        let logits: Vec<f32> = random_logits(&mut rng, vocab, 8.0)
            .iter()
            .map(|l| l.floor())
            .collect();
        let want = reference_argmax(&logits);
        assert_eq!(
            top_k_one.sample(&logits, &mut workspace),
            Ok(want),
            "row {row}"
        );
        assert_eq!(
            tiny_top_p.sample(&logits, &mut workspace),
            Ok(want),
            "row {row}"
        );
    }
}

/// The hand-made distribution p = [1/2, 1/4, 1/8, 1/8] as logits (shifted by
/// a constant, which softmax ignores). Expected frequencies are worked out by
/// hand in each case; 40,000 draws put one standard error near 0.0025, so a
/// tolerance of 0.015 is generous.
#[test]
fn frequencies_follow_temperature_top_k_and_top_p() {
    let logits: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125]
        .iter()
        .map(|p| p.ln() + 3.0)
        .collect();
    let n = 40_000;
    let tol = 0.015;

    // Temperature 1: the distribution itself.
    assert_close(
        &frequencies(&params(1.0, None, 1.0, 11), &logits, n),
        &[0.5, 0.25, 0.125, 0.125],
        tol,
    );

    // Temperature 2: p^(1/2) renormalised, about [0.369, 0.261, 0.185, 0.185].
    let roots = [0.5f64.sqrt(), 0.5, 0.125f64.sqrt(), 0.125f64.sqrt()];
    let sum: f64 = roots.iter().sum();
    let t2 = roots.map(|r| r / sum);
    assert_close(
        &frequencies(&params(2.0, None, 1.0, 12), &logits, n),
        &t2,
        tol,
    );

    // top_k 2: [1/2, 1/4] renormalised.
    let two = [2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0];
    let got = frequencies(&params(1.0, Some(2), 1.0, 13), &logits, n);
    assert_close(&got, &two, tol);
    assert_eq!((got[2], got[3]), (0.0, 0.0));

    // top_p 0.7: 1/2 < 0.7 <= 3/4, so the first two tokens.
    let got = frequencies(&params(1.0, None, 0.7, 14), &logits, n);
    assert_close(&got, &two, tol);
    assert_eq!((got[2], got[3]), (0.0, 0.0));

    // top_p 0.8 needs a third token; tokens 2 and 3 tie, the lower id is kept.
    let got = frequencies(&params(1.0, None, 0.8, 15), &logits, n);
    assert_close(&got, &[4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0, 0.0], tol);
    assert_eq!(got[3], 0.0);

    // top_k 3 then top_p 0.85: after top-k the probabilities are
    // [4/7, 2/7, 1/7] and 4/7 + 2/7 = 0.857 >= 0.85, so two tokens remain.
    // (Applied to the original distribution, 0.85 would need three.)
    let got = frequencies(&params(1.0, Some(3), 0.85, 16), &logits, n);
    assert_close(&got, &two, tol);
}

#[test]
fn masked_tokens_are_never_sampled() {
    let mut logits = vec![0.0f32; 64];
    for (i, l) in logits.iter_mut().enumerate() {
        if i % 3 != 0 {
            *l = f32::NEG_INFINITY;
        }
    }
    for p in [
        params(5.0, None, 1.0, 1),
        params(5.0, Some(40), 1.0, 2),
        params(5.0, None, 0.99, 3),
    ] {
        let got = frequencies(&p, &logits, 5000);
        for (i, f) in got.iter().enumerate() {
            if i % 3 != 0 {
                assert_eq!(*f, 0.0, "token {i} with {p:?}");
            }
        }
    }
}

fn draw_sequence(p: &SamplingParams, rows: &[Vec<f32>]) -> Vec<u32> {
    let mut sampler = Sampler::new(p).unwrap();
    let mut workspace = SamplingWorkspace::new(rows[0].len());
    rows.iter()
        .map(|row| sampler.sample(row, &mut workspace).unwrap())
        .collect()
}

#[test]
fn same_seed_gives_the_same_tokens() {
    let mut rng = SplitMix64::new(5);
    let rows: Vec<Vec<f32>> = (0..300).map(|_| random_logits(&mut rng, 50, 3.0)).collect();
    for p in [params(0.8, None, 1.0, 77), params(0.8, Some(10), 0.9, 77)] {
        let first = draw_sequence(&p, &rows);
        assert_eq!(draw_sequence(&p, &rows), first);
        let other_seed = SamplingParams {
            seed: Some(78),
            ..p.clone()
        };
        assert_ne!(draw_sequence(&other_seed, &rows), first);
    }
    // Without a seed each request gets a fresh one, and reports it.
    let unseeded = SamplingParams {
        seed: None,
        ..SamplingParams::default()
    };
    let a = Sampler::new(&unseeded).unwrap();
    let b = Sampler::new(&unseeded).unwrap();
    assert_ne!(a.seed(), b.seed());
    let replay = SamplingParams {
        seed: Some(a.seed()),
        ..unseeded
    };
    assert_eq!(Sampler::new(&replay).unwrap().seed(), a.seed());
}

#[test]
fn batching_does_not_change_a_requests_tokens() {
    let mut rng = SplitMix64::new(9);
    let rows_a: Vec<Vec<f32>> = (0..100)
        .map(|_| random_logits(&mut rng, 300, 4.0))
        .collect();
    let rows_b: Vec<Vec<f32>> = (0..100)
        .map(|_| random_logits(&mut rng, 300, 4.0))
        .collect();
    let pa = params(1.0, Some(50), 0.95, 1);
    let pb = params(0.7, None, 1.0, 2);
    let alone_a = draw_sequence(&pa, &rows_a);
    let alone_b = draw_sequence(&pb, &rows_b);

    // Interleaved as an engine step would sample a batch, sharing the workspace.
    let mut a = Sampler::new(&pa).unwrap();
    let mut b = Sampler::new(&pb).unwrap();
    let mut workspace = SamplingWorkspace::new(300);
    let mut batched_a = Vec::new();
    let mut batched_b = Vec::new();
    for (row_a, row_b) in rows_a.iter().zip(&rows_b) {
        batched_b.push(b.sample(row_b, &mut workspace).unwrap());
        batched_a.push(a.sample(row_a, &mut workspace).unwrap());
    }
    assert_eq!(batched_a, alone_a);
    assert_eq!(batched_b, alone_b);
}

/// On a row the size of Qwen3's vocabulary, every sampled token lies in the
/// set a plain full sort says the cuts keep.
#[test]
fn full_vocabulary_cuts_keep_the_right_tokens() {
    let vocab = 151_936;
    let mut rng = SplitMix64::new(3);
    let logits = random_logits(&mut rng, vocab, 12.0);
    let mut order: Vec<u32> = (0..vocab as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });

    let weights: Vec<f64> = order
        .iter()
        .map(|&i| f64::from(logits[i as usize] - 12.0).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = 0.0;
    let nucleus = weights
        .iter()
        .position(|w| {
            cumulative += w;
            cumulative >= 0.9 * total
        })
        .unwrap()
        + 1;
    assert!(
        nucleus > 1000,
        "the test wants a wide nucleus, got {nucleus}"
    );
    let mut in_nucleus = vec![false; vocab];
    for &id in &order[..nucleus] {
        in_nucleus[id as usize] = true;
    }
    let mut in_top_50 = vec![false; vocab];
    for &id in &order[..50] {
        in_top_50[id as usize] = true;
    }

    let mut workspace = SamplingWorkspace::new(vocab);
    // A weight (f32), a processed logit (f32) and a rank key (u64) per token.
    assert_eq!(workspace.bytes(), vocab * 16);
    let mut top_p = Sampler::new(&params(1.0, None, 0.9, 21)).unwrap();
    let mut top_k = Sampler::new(&params(1.0, Some(50), 1.0, 22)).unwrap();
    for _ in 0..50 {
        let id = top_p.sample(&logits, &mut workspace).unwrap() as usize;
        assert!(in_nucleus[id], "token {id} is outside the nucleus");
        let id = top_k.sample(&logits, &mut workspace).unwrap() as usize;
        assert!(in_top_50[id], "token {id} is outside the top 50");
    }
}
