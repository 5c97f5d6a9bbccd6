//! The scheduler's step plans for hand-made request mixes, without a model:
//! a scripted executor records every plan it is given and answers each
//! logits row with a one-hot row whose hot id is a fixed function of the
//! row's token and position, so greedy outputs are known in advance and a
//! preempted, cached or forked run can be checked against a plain one.
//!
//! Every expected figure below is worked out by hand from the policy in
//! `engine::scheduler`'s module doc (block size 4 unless said otherwise).

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use sparkrt::engine::sampling::SamplingParams;
use sparkrt::engine::step_plan::{ChunkKind, Fork, RowRole};
use sparkrt::engine::{Engine, EngineLimits, Event, Executor, FinishReason, Request, StepPlan};
use sparkrt::model::ModelError;

pub const VOCAB: usize = 64;

/// The id greedy sampling picks after `token` at `position`.
pub fn next_token(token: u32, position: usize) -> u32 {
    ((token as usize * 7 + position * 3 + 1) % VOCAB) as u32
}

/// Answers every logits row from `row(plan, logit_row)` and keeps the plans.
pub struct Scripted<F> {
    pub vocab: usize,
    pub row: F,
    pub plans: Arc<Mutex<Vec<StepPlan>>>,
}

impl<F: FnMut(&StepPlan, usize) -> Vec<f32> + Send> Executor for Scripted<F> {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn execute(
        &mut self,
        plan: &StepPlan,
        logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.plans.lock().unwrap().push(plan.clone());
        for r in 0..plan.batch.logit_rows.len() {
            let values = (self.row)(plan, r);
            assert_eq!(values.len(), self.vocab);
            logits(r, &values);
        }
        Ok(())
    }

    fn copy_states(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        // A scripted model has no recurrent state to copy.
        assert!(pairs.is_empty(), "state copies asked of a scripted model");
        Ok(())
    }
}

/// A one-hot row for `next_token` of logits row `r`'s token and position.
pub fn one_hot(plan: &StepPlan, r: usize) -> Vec<f32> {
    let row = plan.batch.logit_rows[r] as usize;
    let hot = next_token(plan.batch.tokens[row], plan.batch.positions[row] as usize);
    let mut values = vec![0.0; VOCAB];
    values[hot as usize] = 10.0;
    values
}

pub fn limits(max_num_seqs: usize, batched: usize, kv_blocks: usize) -> EngineLimits {
    EngineLimits {
        max_num_seqs,
        max_num_batched_tokens: batched,
        max_model_len: 64,
        kv_blocks,
        kv_block_size: 4,
        sliding_window: 0,
        prefix_caching: false,
        state_slots: 0,
        snapshot_slots: 0,
        snapshot_interval: 0,
        speculative: None,
    }
}

pub type Plans = Arc<Mutex<Vec<StepPlan>>>;

fn engine(limits: EngineLimits) -> (Engine<'static>, Plans) {
    let plans = Plans::default();
    let executor = Scripted {
        vocab: VOCAB,
        row: one_hot,
        plans: Arc::clone(&plans),
    };
    (Engine::new(executor, limits, None, vec![]).unwrap(), plans)
}

pub fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 5 + seed * 11) % VOCAB as u32)
        .collect()
}

pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(prompt, SamplingParams::greedy(max_tokens)).with_ignore_eos(true)
}

/// What greedy decoding under `next_token` gives after `prompt`.
pub fn expected(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    for _ in 0..max_tokens {
        let last = tokens.len() - 1;
        tokens.push(next_token(tokens[last], last));
    }
    tokens[prompt.len()..].to_vec()
}

/// Runs every request to its end; returns each one's tokens and cached
/// prompt tokens, checking the block books after each step.
fn run(engine: &mut Engine<'_>, requests: Vec<Request>) -> Vec<(Vec<u32>, usize)> {
    let receivers: Vec<_> = requests
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            engine.add_request(r, Box::new(tx)).unwrap();
            rx
        })
        .collect();
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    assert_eq!(engine.kv_blocks_used(), 0, "every block is back");
    receivers.into_iter().map(collect).collect()
}

fn collect(rx: mpsc::Receiver<Event>) -> (Vec<u32>, usize) {
    let mut tokens = Vec::new();
    let mut cached = None;
    for event in rx.try_iter() {
        match event {
            Event::Token { id, .. } => tokens.push(id),
            Event::Finished {
                reason,
                cached_tokens,
                ..
            } => {
                assert_eq!(reason, FinishReason::Length);
                cached = Some(cached_tokens);
            }
            Event::Failed { message } => panic!("failed: {message}"),
            Event::PromptLogits { .. } | Event::PromptLogprob { .. } => {}
        }
    }
    (tokens, cached.expect("finished"))
}

/// (id, computed, len, kind) of each chunk of a plan.
fn chunks(plan: &StepPlan) -> Vec<(u64, usize, usize, ChunkKind)> {
    plan.chunks
        .iter()
        .map(|c| (c.id, c.computed, c.len, c.kind))
        .collect()
}

#[test]
fn prompts_are_chunked_to_the_token_budget_oldest_first() {
    // Budget 16: A (20 tokens) takes all of step 1; step 2 has A's last 4
    // (its sampling row) and all of B (5); then one decode row each.
    let (mut engine, plans) = engine(limits(4, 16, 64));
    let a = prompt(20, 1);
    let b = prompt(5, 2);
    let out = run(
        &mut engine,
        vec![greedy(a.clone(), 3), greedy(b.clone(), 3)],
    );
    assert_eq!(out[0].0, expected(&a, 3));
    assert_eq!(out[1].0, expected(&b, 3));
    let plans = plans.lock().unwrap();
    use ChunkKind::{Decode, Prefill};
    assert_eq!(chunks(&plans[0]), vec![(0, 0, 16, Prefill)]);
    assert!(
        plans[0].logit_rows.is_empty(),
        "a chunk short of the end samples nothing"
    );
    assert_eq!(
        chunks(&plans[1]),
        vec![(0, 16, 4, Prefill), (1, 0, 5, Prefill)]
    );
    assert_eq!(
        chunks(&plans[2]),
        vec![(0, 20, 1, Decode), (1, 5, 1, Decode)]
    );
    assert_eq!(
        chunks(&plans[3]),
        vec![(0, 21, 1, Decode), (1, 6, 1, Decode)]
    );
    assert_eq!(plans.len(), 4);
    // Step 2's rows: A's 4 at positions 16..20, B's 5 at 0..5; the last row
    // of each samples.
    assert_eq!(plans[1].batch.positions, [16, 17, 18, 19, 0, 1, 2, 3, 4]);
    assert_eq!(plans[1].batch.logit_rows, [3, 8]);
    let roles: Vec<_> = plans[1]
        .logit_rows
        .iter()
        .map(|r| (r.seq, r.position, r.role))
        .collect();
    assert_eq!(roles, [(0, 19, RowRole::Sample), (1, 4, RowRole::Sample)]);
    // Tables cover what each sequence computes by the step's end, disjoint.
    let step2 = &plans[1].batch;
    assert_eq!(step2.table(0).len(), 5, "20 tokens in blocks of 4");
    assert_eq!(step2.table(1).len(), 2, "5 tokens");
    assert!(step2.table(0).iter().all(|b| !step2.table(1).contains(b)));
    assert_eq!(
        plans[2].batch.table(1).len(),
        2,
        "6 tokens still fit 2 blocks"
    );
    assert_eq!(plans[3].batch.table(1).len(), 2, "7 tokens too");
}

#[test]
fn a_prefix_hit_starts_after_the_cached_full_blocks_of_the_same_chain() {
    let mut l = limits(4, 64, 64);
    l.prefix_caching = true;
    let (mut engine, plans) = engine(l);
    let first = prompt(12, 3);
    let mut second = first[..9].to_vec();
    second.extend([60, 61, 62, 63]);
    let out = run(&mut engine, vec![greedy(first.clone(), 2)]);
    assert_eq!(out[0], (expected(&first, 2), 0));
    let out = run(&mut engine, vec![greedy(second.clone(), 2)]);
    // 9 shared tokens: two full blocks (8 tokens) hit, the 9th is recomputed.
    assert_eq!(out[0], (expected(&second, 2), 8));
    let plans = plans.lock().unwrap();
    let first_table = plans[0].batch.table(0).to_vec();
    let hit = plans
        .iter()
        .find(|p| p.chunks.first().is_some_and(|c| c.id == 1))
        .unwrap();
    assert_eq!(chunks(hit), vec![(1, 8, 5, ChunkKind::Prefill)]);
    assert_eq!(hit.batch.positions, [8, 9, 10, 11, 12]);
    assert_eq!(
        hit.batch.table(0)[..2],
        first_table[..2],
        "the cached blocks themselves"
    );
    assert!(
        !first_table[2..].contains(&hit.batch.table(0)[2]),
        "the rest is private"
    );
    // Looked up: the second prompt's tokens but its last (12); served: 8.
    let c = &engine.counters;
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(c.prefix_cache_queries.load(Relaxed), 11 + 12);
    assert_eq!(c.prefix_cache_hits.load(Relaxed), 8);
}

#[test]
fn the_newest_sequence_is_preempted_and_recomputed_when_blocks_run_out() {
    // Six blocks of 4. A and B (8-token prompts) start together: B's start
    // leaves one block for A's next token (can_start). Each grows a third
    // block at token 9; at token 13 A needs a fourth and none is free, so
    // B (the newest) is preempted: 3 blocks back, B waits until A ends.
    let (mut engine, plans) = engine(limits(2, 64, 6));
    let a = prompt(8, 4);
    let b = prompt(8, 5);
    let out = run(
        &mut engine,
        vec![greedy(a.clone(), 12), greedy(b.clone(), 12)],
    );
    assert_eq!(out[0].0, expected(&a, 12));
    assert_eq!(out[1].0, expected(&b, 12), "recomputing changes nothing");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(engine.counters.preemptions.load(Relaxed), 1);
    let plans = plans.lock().unwrap();
    use ChunkKind::{Decode, Prefill};
    assert_eq!(
        chunks(&plans[0]),
        vec![(0, 0, 8, Prefill), (1, 0, 8, Prefill)]
    );
    for (step, plan) in plans.iter().enumerate().take(5).skip(1) {
        let at = 8 + step - 1;
        assert_eq!(
            chunks(plan),
            vec![(0, at, 1, Decode), (1, at, 1, Decode)],
            "step {step}"
        );
    }
    // Step 6: A computes its 13th token alone.
    assert_eq!(chunks(&plans[5]), vec![(0, 12, 1, Decode)]);
    assert_eq!(plans[5].batch.table(0).len(), 4);
    // A decodes to 20 tokens alone (steps 6..=12); B then recomputes its
    // 13 known tokens (8 prompt + 5 sampled) from position 0.
    let restart = plans
        .iter()
        .position(|p| {
            p.chunks
                .iter()
                .any(|c| c.id == 1 && c.computed == 0 && c.len > 8)
        })
        .unwrap();
    assert_eq!(restart, 12, "once A is done");
    assert_eq!(chunks(&plans[restart]), vec![(1, 0, 13, Prefill)]);
    let roles: Vec<_> = plans[restart]
        .logit_rows
        .iter()
        .map(|r| (r.position, r.role))
        .collect();
    assert_eq!(roles, [(12, RowRole::Sample)]);
}

#[test]
fn later_choices_fork_from_the_leader_when_its_prompt_ends() {
    // n = 3 on a 10-token prompt: step 1 computes the prompt once; both
    // later choices fork there (3 blocks: 2 full shared, the partial third
    // copied to a block of each choice after the forward pass) and sample
    // their first token from the leader's row.
    let (mut engine, plans) = engine(limits(4, 64, 64));
    let p = prompt(10, 6);
    let receivers: Vec<_> = (0..3).map(|_| mpsc::channel()).collect();
    let (sinks, receivers): (Vec<_>, Vec<_>) = receivers
        .into_iter()
        .map(|(tx, rx)| (Box::new(tx) as Box<dyn sparkrt::engine::EventSink>, rx))
        .unzip();
    let ids = engine
        .add_request_group(greedy(p.clone(), 4), sinks)
        .unwrap();
    assert_eq!(ids, [0, 1, 2]);
    while engine.has_work() {
        engine.step().unwrap();
        engine.audit_blocks().unwrap();
    }
    for (j, rx) in receivers.into_iter().enumerate() {
        // A forked choice reports its whole prompt as cached.
        let cached = if j == 0 { 0 } else { 10 };
        assert_eq!(
            collect(rx),
            (expected(&p, 4), cached),
            "greedy choices agree"
        );
    }
    let plans = plans.lock().unwrap();
    assert_eq!(chunks(&plans[0]), vec![(0, 0, 10, ChunkKind::Prefill)]);
    assert_eq!(
        plans[0].forks,
        [
            Fork {
                leader: 0,
                choice: 1
            },
            Fork {
                leader: 0,
                choice: 2
            }
        ]
    );
    let leader = plans[0].batch.table(0).to_vec();
    assert_eq!(plans[0].kv_copies.len(), 2);
    assert!(
        plans[0]
            .kv_copies
            .iter()
            .all(|&(from, _)| from == leader[2])
    );
    // Step 2: three decode rows; the choices share the leader's full blocks.
    let step2 = &plans[1];
    assert_eq!(
        chunks(step2),
        vec![
            (0, 10, 1, ChunkKind::Decode),
            (1, 10, 1, ChunkKind::Decode),
            (2, 10, 1, ChunkKind::Decode)
        ]
    );
    for choice in 1..3 {
        let table = step2.batch.table(choice);
        assert_eq!(table[..2], leader[..2]);
        assert_eq!(table[2], plans[0].kv_copies[choice - 1].1, "its own copy");
    }
}

#[test]
fn a_sequence_the_whole_pool_cannot_hold_fails_naming_the_figures() {
    // 40 tokens need 10 blocks; the pool has 8.
    let (mut engine, _) = engine(limits(2, 64, 8));
    let (tx, rx) = mpsc::channel();
    engine
        .add_request(greedy(prompt(40, 7), 2), Box::new(tx))
        .unwrap();
    while engine.has_work() {
        engine.step().unwrap();
    }
    let events: Vec<_> = rx.try_iter().collect();
    assert_eq!(
        events[0],
        Event::Failed {
            message: "the sequence needs 10 KV blocks; the pool has 8".to_string()
        }
    );
}
