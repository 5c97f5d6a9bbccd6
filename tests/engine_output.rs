//! The output stage on hand-made logits (no model): a scripted executor
//! hands the engine chosen rows, and the events must be what those rows
//! mean — log-probabilities worked out by hand, prompt rows reported once
//! in order, stop tokens and end-of-sequence ids ending the text, a grammar
//! mask overriding the row's favourite, a NaN row failing the step.

use std::sync::Arc;
use std::sync::mpsc;

use sparkrt::engine::grammar::{GrammarCompiler, GrammarSpec};
use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::{Engine, Event, FinishReason, LogprobRequest, Request, StepPlan};
use sparkrt::text::Tokenizer;

use crate::common;
use crate::engine_plans::{Plans, Scripted, VOCAB, limits, prompt};

/// An engine whose every logits row is `row(plan, logit_row)`; end of
/// sequence is `eos`.
fn engine_with(
    vocab: usize,
    eos: Vec<u32>,
    tokenizer: Option<Arc<Tokenizer>>,
    row: impl FnMut(&StepPlan, usize) -> Vec<f32> + Send + 'static,
) -> Engine<'static> {
    let executor = Scripted {
        vocab,
        row,
        plans: Plans::default(),
    };
    let mut l = limits(4, 64, 64);
    l.max_model_len = 256;
    Engine::new(executor, l, tokenizer, eos).unwrap()
}

fn events(engine: &mut Engine<'_>, request: Request) -> Vec<Event> {
    let (tx, rx) = mpsc::channel();
    engine.add_request(request, Box::new(tx)).unwrap();
    while engine.has_work() {
        engine.step().unwrap();
    }
    rx.try_iter().collect()
}

fn tokens(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn finish(events: &[Event]) -> FinishReason {
    match events.last() {
        Some(Event::Finished { reason, .. }) => *reason,
        other => panic!("no Finished event last: {other:?}"),
    }
}

/// A row of zeros with `hot` set: (id, logit) pairs.
fn row_with(hot: &[(u32, f32)]) -> Vec<f32> {
    let mut values = vec![0.0; VOCAB];
    for &(id, logit) in hot {
        values[id as usize] = logit;
    }
    values
}

#[test]
fn sampled_log_probabilities_are_the_log_softmax_of_the_raw_row() {
    // Every row: logit 2 at id 3, 1 at id 5, 0 elsewhere (62 ids).
    let mut engine = engine_with(VOCAB, vec![], None, |_, _| row_with(&[(3, 2.0), (5, 1.0)]));
    let request = Request::new(prompt(6, 1), SamplingParams::greedy(2))
        .with_ignore_eos(true)
        .with_logprobs(LogprobRequest {
            sampled: Some(2),
            prompt: None,
        });
    let events = events(&mut engine, request);
    let z = 2f64.exp() + 1f64.exp() + 62.0;
    let (lp3, lp5) = ((2.0 - z.ln()) as f32, (1.0 - z.ln()) as f32);
    let mut seen = 0;
    for e in &events {
        if let Event::Token { id, logprob, .. } = e {
            let l = logprob.as_ref().unwrap();
            assert_eq!((*id, l.id, l.rank), (3, 3, 1));
            assert!((l.logprob - lp3).abs() < 1e-6, "{} vs {lp3}", l.logprob);
            assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), [3, 5]);
            assert!((l.top[1].1 - lp5).abs() < 1e-6);
            seen += 1;
        }
    }
    assert_eq!(seen, 2);
    assert_eq!(finish(&events), FinishReason::Length);
}

#[test]
fn prompt_rows_are_reported_once_in_order_before_any_token() {
    // Row at position p favours the prompt's token p + 1 with logit 3, so
    // its log-probability is 3 − ln(e³ + 63).
    let p = prompt(7, 2);
    let next = p.clone();
    let mut engine = engine_with(VOCAB, vec![], None, move |plan, r| {
        let position = plan.logit_rows[r].position;
        match next.get(position + 1) {
            Some(&t) => row_with(&[(t, 3.0)]),
            None => row_with(&[(9, 3.0)]),
        }
    });
    let request = Request::new(p.clone(), SamplingParams::greedy(2))
        .with_ignore_eos(true)
        .with_prompt_logits(true)
        .with_logprobs(LogprobRequest {
            sampled: None,
            prompt: Some(0),
        });
    let events = events(&mut engine, request);
    let expected = (3.0 - (3f64.exp() + 63.0).ln()) as f32;
    let positions: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::PromptLogprob { position, logprob } => {
                assert_eq!(logprob.id, p[*position]);
                assert!((logprob.logprob - expected).abs() < 1e-6);
                Some(*position)
            }
            _ => None,
        })
        .collect();
    assert_eq!(positions, [1, 2, 3, 4, 5, 6]);
    let logits: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            Event::PromptLogits { first, values } => {
                assert_eq!(values.len(), VOCAB);
                let hot = p.get(first + 1).copied().unwrap_or(9);
                assert_eq!(values[hot as usize], 3.0);
                Some(*first)
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        logits,
        [0, 1, 2, 3, 4, 5, 6],
        "every prompt position's row, once"
    );
    let first_token = events.iter().position(|e| matches!(e, Event::Token { .. }));
    let last_prompt = events
        .iter()
        .rposition(|e| matches!(e, Event::PromptLogprob { .. }));
    assert!(last_prompt < first_token);
    assert_eq!(tokens(&events), [9, 9]);
}

#[test]
fn stop_tokens_and_end_of_sequence_end_the_text() {
    // The rows favour 20, then 21, then 22, ... by position.
    let by_position = |plan: &StepPlan, r: usize| {
        let position = plan.logit_rows[r].position as u32;
        row_with(&[(20 + position % 30, 5.0)])
    };
    let p = prompt(4, 3);
    // Positions 3, 4, 5 give 23, 24, 25.
    let stop_at = |include: bool| {
        let mut params = SamplingParams::greedy(10);
        params.stop_token_ids = vec![25];
        params.include_stop_str_in_output = include;
        Request::new(p.clone(), params).with_ignore_eos(true)
    };
    let mut engine = engine_with(VOCAB, vec![24], None, by_position);
    let stopped = events(&mut engine, stop_at(false));
    assert_eq!(
        tokens(&stopped),
        [23, 24],
        "ignore_eos passes 24; 25 stops, unsent"
    );
    assert_eq!(finish(&stopped), FinishReason::Stop);
    let kept = events(&mut engine, stop_at(true));
    assert_eq!(tokens(&kept), [23, 24, 25]);
    assert_eq!(finish(&kept), FinishReason::Stop);
    let eos = events(
        &mut engine,
        Request::new(p.clone(), SamplingParams::greedy(10)),
    );
    assert_eq!(tokens(&eos), [23], "24 ends the sequence and is not sent");
    assert_eq!(finish(&eos), FinishReason::Stop);
    match &eos[eos.len() - 1] {
        Event::Finished {
            prompt_tokens,
            completion_tokens,
            ..
        } => assert_eq!((*prompt_tokens, *completion_tokens), (4, 2)),
        _ => unreachable!(),
    }
}

#[test]
fn a_grammar_mask_overrides_the_rows_favourite() {
    let tokenizer = Arc::new(Tokenizer::from_dir(&common::fixture("qwen3-moe-tiny")).unwrap());
    let vocab = tokenizer.vocab_size();
    let digits: Vec<u32> = (0..10)
        .map(|d| tokenizer.encode(&d.to_string(), false).unwrap()[0])
        .collect();
    let letter = tokenizer.encode("x", false).unwrap()[0];
    // Every row favours "x" by far, then "7".
    let (x, seven) = (letter, digits[7]);
    let eos = tokenizer.eos_token_ids().to_vec();
    let mut engine = engine_with(
        vocab,
        eos.clone(),
        Some(Arc::clone(&tokenizer)),
        move |_, _| {
            let mut values = vec![0.0; vocab];
            values[x as usize] = 9.0;
            values[seven as usize] = 4.0;
            values
        },
    );
    let compiler = GrammarCompiler::new(&tokenizer, &eos).unwrap();
    let mut params = SamplingParams::greedy(3);
    params.constraint = Some(
        compiler
            .compile(&GrammarSpec::Regex("[0-9]{3}".into()))
            .unwrap(),
    );
    let events = events(&mut engine, Request::new(prompt(5, 4), params));
    assert_eq!(tokens(&events), [seven; 3], "only digits are allowed");
    assert_eq!(finish(&events), FinishReason::Stop, "the grammar's end");
}

#[test]
fn a_nan_row_fails_every_running_sequence_of_the_step() {
    let mut engine = engine_with(VOCAB, vec![], None, |plan, r| {
        let mut values = row_with(&[(1, 1.0)]);
        if plan.logit_rows[r].seq == 1 {
            values[2] = f32::NAN;
        }
        values
    });
    let receivers: Vec<_> = (0..2)
        .map(|i| {
            let (tx, rx) = mpsc::channel();
            let r = Request::new(prompt(5, 5 + i), SamplingParams::greedy(3)).with_ignore_eos(true);
            engine.add_request(r, Box::new(tx)).unwrap();
            rx
        })
        .collect();
    while engine.has_work() {
        engine.step().unwrap();
    }
    for rx in receivers {
        let events: Vec<_> = rx.try_iter().collect();
        let failed = events.iter().find_map(|e| match e {
            Event::Failed { message } => Some(message.clone()),
            _ => None,
        });
        assert_eq!(
            failed.as_deref(),
            Some("sampling failed: logit 2 is NaN: the model produced NaN or +infinity")
        );
        assert_eq!(finish(&events), FinishReason::Aborted);
    }
    assert_eq!(engine.kv_blocks_used(), 0);
}
