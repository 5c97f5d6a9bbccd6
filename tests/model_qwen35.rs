//! qwen3_5_moe, qwen3_5 and qwen3_next on the CPU backend against the
//! transformers references in tests/fixtures (scripts/make-qwen35-fixtures.py
//! for the two made here), driving `Transformer::forward` with hand-built
//! steps:
//!
//! - every prompt position's logits within 1e-3 of transformers' (f32 KV
//!   cache, f32 recurrent state) and the greedy continuation identical, for
//!   the short prompt and the 150-token one;
//! - the same prompt in one step, in chunks over several forward calls and
//!   token by token gives the same logits (within 2e-5 of the largest
//!   logit: attention over chunks cut at other places sums in different
//!   orders);
//! - two sequences in one step, in different state slots, give each one's
//!   solo logits.

use std::sync::Arc;

use sparkrt::backend::cpu::CpuBackend;
use sparkrt::checkpoint::kv_scales::KvScales;
use sparkrt::checkpoint::{self, Checkpoint, ModelConfig};
use sparkrt::model::source::CheckpointSource;
use sparkrt::model::{Buffers, Transformer};
use sparkrt::plan::ledger::Ledger;
use sparkrt::plan::memory::HostFigures;
use sparkrt::plan::profile::{CheckpointFacts, KvCacheDtype, Profile, StateDtype};
use sparkrt::plan::speculative::{DraftMethod, SpeculativeConfig};
use sparkrt::plan::{self, Plan, PlanDevice};
use sparkrt::step::{Logits, StepBatch};

use crate::common;
use crate::fixture_runs::{assert_greedy_matches, last_row, logits_tolerance};

/// Every Qwen3.5 / Qwen3-Next fixture (`qwen35-moe-tiny-ct-nvfp4`: the
/// compressed-tensors NVFP4 layout, scripts/make-ct-nvfp4-fixture.py).
pub(crate) const FIXTURES: [&str; 5] = [
    "qwen35-moe-tiny",
    "qwen35-tiny",
    "qwen3-next-tiny",
    "qwen35-moe-tiny-r4",
    "qwen35-moe-tiny-ct-nvfp4",
];
/// Sequences a test plan holds (state slots).
const SLOTS: usize = 3;
/// Tokens of a sequence's block table.
const MAX_LEN: usize = 256;
const BLOCK: usize = 16;

/// What transformers computed for one prompt of a fixture.
pub(crate) struct Reference {
    pub input_ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy_ids: Vec<u32>,
}

pub(crate) fn reference(name: &str, prefix: &str) -> Reference {
    let bytes = std::fs::read(common::fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ints = |key: &str| -> Vec<u32> {
        st.tensor(&format!("{prefix}{key}"))
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let logits = st.tensor(&format!("{prefix}logits")).unwrap();
    Reference {
        input_ids: ints("input_ids"),
        greedy_ids: ints("greedy_ids"),
        logits: logits
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
    }
}

/// A fixture's config, mapped checkpoint and a plan for `SLOTS` sequences
/// of `MAX_LEN` tokens with f32 keys and values.
struct Fixture {
    config: ModelConfig,
    checkpoint: Checkpoint,
    plan: Plan,
}

fn fixture(name: &str) -> Fixture {
    fixture_with(name, StateDtype::F32)
}

/// As `fixture`, the recurrent state stored in `state_dtype`.
fn fixture_with(name: &str, state_dtype: StateDtype) -> Fixture {
    fixture_serving(name, state_dtype, None)
}

/// As `fixture_with`, drafting with `speculative` (with "mtp": the
/// checkpoint's MTP head loaded and its buffers planned).
fn fixture_serving(
    name: &str,
    state_dtype: StateDtype,
    speculative: Option<SpeculativeConfig>,
) -> Fixture {
    let dir = common::fixture(name);
    let (mut config, checkpoint) = checkpoint::load(&dir).unwrap();
    let geometry = config.geometry.clone();
    let mut profile = Profile::for_checkpoint(
        CheckpointFacts {
            geometry: &geometry,
            max_position_embeddings: config.max_position_embeddings,
        },
        Some(dir),
    )
    .unwrap();
    let s = &mut profile.serving;
    s.max_model_len = MAX_LEN;
    s.max_num_seqs = SLOTS;
    s.max_num_batched_tokens = 256;
    s.kv_block_size = BLOCK;
    s.kv_cache_dtype = KvCacheDtype::F32;
    s.state_dtype = state_dtype;
    s.speculative = speculative;
    config.geometry.mtp_layers = s.mtp_layers();
    let host = HostFigures {
        mem_total: 64 << 30,
        mem_available: 60 << 30,
        ..HostFigures::default()
    };
    let weights = sparkrt::runtime::header_weight_bytes(&config, checkpoint.headers());
    let plan = plan::compute(&profile, &host, Some(weights), PlanDevice::Cpu);
    assert!(plan.fits, "{name}");
    Fixture {
        config,
        checkpoint,
        plan,
    }
}

/// The model a step runs through.
#[derive(Clone, Copy)]
enum Pass {
    /// The decoder.
    Target,
    /// The MTP head; `first`: over the rows of the decoder step before
    /// (else the head's own outputs of its pass before).
    Mtp { first: bool },
}

/// A model and its buffers on the CPU, and a way to run steps.
struct Runner<'f> {
    backend: &'f CpuBackend,
    model: Transformer<'f, CpuBackend>,
    buffers: Buffers<CpuBackend>,
    vocab: usize,
}

/// One sequence's part of a step: its tokens, how many it has before them,
/// its state slot, its block table's first block.
struct Part<'a> {
    tokens: &'a [u32],
    past: usize,
    slot: u32,
}

impl<'f> Runner<'f> {
    fn new(
        fixture: &'f Fixture,
        backend: &'f CpuBackend,
        source: &'f CheckpointSource<'f>,
    ) -> Self {
        let model = Transformer::load(backend, &fixture.config, source).unwrap();
        let layout = &fixture.plan.kv_cache.layout;
        let scales = KvScales::unit(layout.sliding_layers.len());
        let buffers = Buffers::allocate(backend, &fixture.plan, layout, &scales).unwrap();
        Runner {
            backend,
            model,
            buffers,
            vocab: fixture.config.geometry.vocab_size,
        }
    }

    /// Runs one step of `parts`, every row's logits wanted; returns them
    /// per part (`[rows, vocab]` each).
    fn step(&mut self, parts: &[Part]) -> Vec<Vec<f32>> {
        self.run(parts, Logits::All, Pass::Target)
    }

    /// Runs `pass` over one step of `parts`, the logits of `wanted` rows of
    /// each; returns them per part (`[rows, vocab]` each).
    fn run(&mut self, parts: &[Part], wanted: Logits, pass: Pass) -> Vec<Vec<f32>> {
        let blocks_per_seq = MAX_LEN / BLOCK;
        let mut batch = StepBatch::with_capacity(256, SLOTS, blocks_per_seq);
        for (i, part) in parts.iter().enumerate() {
            // Slot s owns blocks s·16 … s·16 + 15 (a sequence's table).
            let first = part.slot as usize * blocks_per_seq;
            let needed = (part.past + part.tokens.len()).div_ceil(BLOCK);
            let table: Vec<u32> = (first..first + needed).map(|b| b as u32).collect();
            batch.push_seq(part.tokens, part.past, &table, &[], wanted);
            batch.set_state_slot(i, part.slot);
        }
        let mut all = Vec::new();
        let vocab = self.vocab;
        let mut on_logits = |_, count, values: &[f32]| {
            all.extend_from_slice(&values[..count * vocab]);
        };
        match pass {
            Pass::Target => {
                self.model
                    .forward(self.backend, &batch, &mut self.buffers, &mut on_logits)
            }
            Pass::Mtp { first } => self.model.mtp_forward(
                self.backend,
                &batch,
                first,
                &mut self.buffers,
                &mut on_logits,
            ),
        }
        .unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        for part in parts {
            let rows = match wanted {
                Logits::All => part.tokens.len(),
                Logits::Last => 1,
                Logits::None => 0,
            };
            out.push(all[at..at + rows * vocab].to_vec());
            at += rows * vocab;
        }
        out
    }

    /// `prompt` in steps of `cuts` tokens (the last takes the rest), slot
    /// `slot`; every position's logits.
    fn prompt(&mut self, prompt: &[u32], cuts: &[usize], slot: u32) -> Vec<f32> {
        let mut logits = Vec::new();
        let mut past = 0;
        let mut cuts = cuts.iter().copied();
        while past < prompt.len() {
            let len = cuts.next().unwrap_or(prompt.len()).min(prompt.len() - past);
            let tokens = &prompt[past..past + len];
            logits.extend(self.step(&[Part { tokens, past, slot }]).remove(0));
            past += len;
        }
        logits
    }

    /// The greedy continuation of `prompt` (prefilled in one step), `n` tokens.
    fn greedy(&mut self, prompt: &[u32], n: usize) -> Vec<u32> {
        let logits = self.prompt(prompt, &[prompt.len()], 0);
        let mut next = argmax(&logits[logits.len() - self.vocab..]);
        let mut out = vec![next];
        let mut past = prompt.len();
        while out.len() < n {
            let logits = self.step(&[Part {
                tokens: &[next],
                past,
                slot: 0,
            }]);
            next = argmax(&logits[0]);
            out.push(next);
            past += 1;
        }
        out
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best as u32
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `f` with a runner on fixture `name`.
fn with_runner(name: &str, f: impl FnOnce(&mut Runner)) {
    with_runner_state(name, StateDtype::F32, f)
}

/// As `with_runner`, the recurrent state stored in `state_dtype`.
fn with_runner_state(name: &str, state_dtype: StateDtype, f: impl FnOnce(&mut Runner)) {
    with_runner_on(fixture_with(name, state_dtype), f)
}

/// Runs `f` with a runner on `fixture`.
fn with_runner_on(fixture: Fixture, f: impl FnOnce(&mut Runner)) {
    let ledger = Ledger::from_plan(&fixture.plan);
    let backend = CpuBackend::new(Arc::clone(&ledger));
    let source = CheckpointSource {
        checkpoint: &fixture.checkpoint,
        config: &fixture.config,
    };
    let mut runner = Runner::new(&fixture, &backend, &source);
    f(&mut runner);
}

#[test]
fn prompt_logits_and_greedy_match_transformers() {
    for name in FIXTURES {
        for prefix in ["", "long_"] {
            let r = reference(name, prefix);
            let tolerance = logits_tolerance(&fixture(name).plan, 1e-3);
            with_runner(name, |runner| {
                let logits = runner.prompt(&r.input_ids, &[r.input_ids.len()], 0);
                let diff = max_abs_diff(&logits, &r.logits);
                assert!(diff < tolerance, "{name} {prefix}logits differ by {diff}");
                let greedy = runner.greedy(&r.input_ids, r.greedy_ids.len());
                let what = format!("{name} {prefix}");
                assert_greedy_matches(
                    &what,
                    &r.input_ids,
                    &greedy,
                    &r.greedy_ids,
                    tolerance,
                    1e-3,
                    |ids| last_row(runner.prompt(ids, &[ids.len()], 0), ids.len()),
                );
            });
        }
    }
}

#[test]
fn one_step_chunks_and_token_by_token_agree() {
    for name in FIXTURES {
        let r = reference(name, "long_");
        let prompt = &r.input_ids;
        with_runner(name, |runner| {
            let whole = runner.prompt(prompt, &[prompt.len()], 0);
            // Chunks across forward calls (37 + 64 + the rest), in another
            // slot; one token a step in a third.
            let chunked = runner.prompt(prompt, &[37, 64], 1);
            let tokens = runner.prompt(prompt, &vec![1; prompt.len()], 2);
            let (a, b) = (
                max_abs_diff(&whole, &chunked),
                max_abs_diff(&whole, &tokens),
            );
            // Relative to the largest logit (4.3 to 9.1 here): measured
            // 0.2e-5 to 1.1e-5 of it, f32 sums in other orders over 150
            // tokens and 4 layers.
            let tolerance = 2e-5 * whole.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(a < tolerance, "{name}: chunked prefill differs by {a}");
            assert!(b < tolerance, "{name}: token by token differs by {b}");
            // Slot 0 again, from position 0: its state starts from zeros.
            let again = runner.prompt(prompt, &[prompt.len()], 0);
            assert_eq!(again, whole, "{name}: a restarted slot");
        });
    }
}

#[test]
fn two_sequences_in_one_step_equal_each_alone() {
    for name in FIXTURES {
        let (short, long) = (reference(name, ""), reference(name, "long_"));
        let long_prompt = &long.input_ids[..100];
        with_runner(name, |runner| {
            let solo_short = runner.prompt(&short.input_ids, &[short.input_ids.len()], 0);
            let solo_long = runner.prompt(long_prompt, &[long_prompt.len()], 1);
            // Both at once, in swapped slots: slot 1 short, slot 2 long.
            let both = runner.step(&[
                Part {
                    tokens: &short.input_ids,
                    past: 0,
                    slot: 1,
                },
                Part {
                    tokens: long_prompt,
                    past: 0,
                    slot: 2,
                },
            ]);
            let (a, b) = (
                max_abs_diff(&both[0], &solo_short),
                max_abs_diff(&both[1], &solo_long),
            );
            assert!(a < 1e-5, "{name}: batched short prompt differs by {a}");
            assert!(b < 1e-5, "{name}: batched long prompt differs by {b}");
        });
    }
}

#[test]
fn a_step_with_two_sequences_in_one_slot_is_refused() {
    let r = reference("qwen35-moe-tiny", "");
    with_runner("qwen35-moe-tiny", |runner| {
        let fixture_blocks = MAX_LEN / BLOCK;
        let mut batch = StepBatch::with_capacity(256, SLOTS, fixture_blocks);
        let table: Vec<u32> = (0..2).collect();
        batch.push_seq(&r.input_ids, 0, &table, &[], Logits::Last);
        let other: Vec<u32> = (16..18).collect();
        batch.push_seq(&r.input_ids, 0, &other, &[], Logits::Last);
        batch.set_state_slot(1, 0);
        let err = runner
            .model
            .forward(
                runner.backend,
                &batch,
                &mut runner.buffers,
                &mut |_, _, _| {},
            )
            .unwrap_err();
        assert!(err.to_string().contains("share state slot 0"), "{err}");
    });
}

/// Through the runtime and the engine: every planned buffer allocated
/// exactly (the recurrent-state pool's bytes by hand), and the greedy
/// continuation transformers' for each prompt with both prompts served
/// together, in chunks of 32 tokens (each sequence in a state slot of its
/// own, kept across steps while the other prefills or decodes).
#[test]
fn the_engine_batches_them_each_in_its_state_slot() {
    for name in FIXTURES {
        let f = fixture(name);
        let loaded = engine_loaded(name, &f, 32);
        // 3 GDN layers × (8 live + 2 × 8 snapshot) slots × (conv
        // (2·Hk·dk + Hv·dv) × 3 + Hv × dk × dv) × 4 B.
        let (channels, ssm) = match name {
            "qwen35-moe-tiny-r4" => (2 * 32 + 4 * 16, 4 * 32 * 16),
            _ => (2 * 2 * 32 + 4 * 32, 4 * 32 * 32),
        };
        let state = &loaded.plan.recurrent_state;
        assert_eq!(state.bytes, 3 * 24 * (channels * 3 + ssm) * 4, "{name}");
        let source = loaded.source();
        let mut engine = loaded.engine(&source).unwrap();
        assert_eq!(loaded.ledger.verify_complete(), Ok(()), "{name}");
        let (short, long) = (reference(name, ""), reference(name, "long_"));
        let out = crate::fixture_runs::serve_greedy(
            &mut engine,
            &[short.input_ids.clone(), long.input_ids.clone()],
            short.greedy_ids.len(),
        );
        let tolerance = logits_tolerance(&loaded.plan, 1e-3);
        for (outcome, r) in out.iter().zip([&short, &long]) {
            assert_greedy_matches(
                name,
                &r.input_ids,
                &outcome.tokens,
                &r.greedy_ids,
                tolerance,
                1e-3,
                |ids| {
                    let mut logits = Vec::new();
                    with_runner(name, |runner| {
                        logits = last_row(runner.prompt(ids, &[ids.len()], 0), ids.len())
                    });
                    logits
                },
            );
        }
        let diff = max_abs_diff(&out[1].prompt_logits, &long.logits);
        assert!(
            diff < tolerance,
            "{name}: engine prompt logits differ by {diff}"
        );
    }
}

/// `n = 3` sampled choices: the prompt computed once, each later choice
/// forked with a copy of the leader's recurrent state, equal token for
/// token to three requests seeded s, s+1, s+2 served one after another.
#[test]
fn forked_choices_carry_their_leaders_state() {
    use sparkrt::engine::sampling::SamplingParams;
    use sparkrt::engine::{Event, EventSink, Request};
    use std::sync::mpsc;

    let name = "qwen35-moe-tiny";
    let f = fixture(name);
    let loaded = engine_loaded(name, &f, 64);
    let source = loaded.source();
    let mut engine = loaded.engine(&source).unwrap();
    let prompt = reference(name, "").input_ids;
    let request = |seed| {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            max_tokens: 12,
            ..SamplingParams::default()
        };
        Request::new(prompt.clone(), params).with_ignore_eos(true)
    };
    let tokens = |rx: mpsc::Receiver<Event>| -> Vec<u32> {
        rx.try_iter()
            .filter_map(|e| match e {
                Event::Token { id, .. } => Some(id),
                Event::Failed { message } => panic!("{message}"),
                _ => None,
            })
            .collect()
    };
    let (sinks, receivers): (Vec<Box<dyn EventSink>>, Vec<_>) = (0..3)
        .map(|_| {
            let (tx, rx) = mpsc::channel();
            (Box::new(tx) as Box<dyn EventSink>, rx)
        })
        .unzip();
    engine.add_request_group(request(7), sinks).unwrap();
    let mut steps = 0;
    while engine.has_work() {
        engine.step().unwrap();
        steps += 1;
    }
    let forked: Vec<Vec<u32>> = receivers.into_iter().map(tokens).collect();
    assert_eq!(
        steps, 13,
        "one prompt step, 11 decode steps of all three, a last retire"
    );
    for (j, choice) in forked.iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        engine
            .add_request(request(7 + j as u64), Box::new(tx))
            .unwrap();
        while engine.has_work() {
            engine.step().unwrap();
        }
        assert_eq!(choice, &tokens(rx), "choice {j}");
    }
    assert_ne!(forked[0], forked[1], "different seeds sample differently");
}

/// A fixture loaded through the runtime with f32 KV, `max_model_len`
/// 256 and steps of at most `batched` tokens.
fn engine_loaded(name: &str, f: &Fixture, batched: usize) -> sparkrt::runtime::Loaded<CpuBackend> {
    use sparkrt::checkpoint::PageCachePolicy;
    use sparkrt::runtime::{HostSource, Loaded};
    let host_root = common::fixture("hosts/box24");
    let host = HostSource {
        root: &host_root,
        kubelet_config: None,
    };
    let mut profile = Profile::for_checkpoint(
        CheckpointFacts {
            geometry: &f.config.geometry,
            max_position_embeddings: f.config.max_position_embeddings,
        },
        Some(common::fixture(name)),
    )
    .unwrap();
    profile.serving.max_model_len = MAX_LEN;
    profile.serving.max_num_batched_tokens = batched;
    profile.serving.kv_cache_dtype = KvCacheDtype::F32;
    Loaded::open_cpu(
        &common::fixture(name),
        Some(&profile),
        &host,
        PageCachePolicy::Keep,
    )
    .unwrap()
}

/// Max |Δlogit| a bf16 recurrent state may add over the prompt, fed token by
/// token (every step stores the state rounded), against transformers'
/// f32-state logits, on the Qwen3.5 fixtures. Measured (README,
/// state-pool paragraph): at most 0.49 there, logits reaching ±9; the
/// random weights of qwen3-next-tiny and qwen35-moe-tiny-r4 have near ties
/// and larger moves (0.48, 0.86), so they are not held to it.
const BF16_STATE_TOLERANCE: f32 = 0.6;

#[test]
fn a_bf16_state_stays_near_the_transformers_reference() {
    for name in ["qwen35-moe-tiny", "qwen35-tiny"] {
        for prefix in ["", "long_"] {
            let r = reference(name, prefix);
            let cuts = vec![1; r.input_ids.len()];
            let (mut f32_logits, mut f32_greedy) = (Vec::new(), Vec::new());
            with_runner_state(name, StateDtype::F32, |runner| {
                f32_logits = runner.prompt(&r.input_ids, &cuts, 0);
                f32_greedy = runner.greedy(&r.input_ids, 100);
            });
            with_runner_state(name, StateDtype::Bf16, |runner| {
                let logits = runner.prompt(&r.input_ids, &cuts, 0);
                let diff = max_abs_diff(&logits, &r.logits);
                let vs_f32 = max_abs_diff(&logits, &f32_logits);
                let greedy = runner.greedy(&r.input_ids, 100);
                let agree = greedy
                    .iter()
                    .zip(&f32_greedy)
                    .take_while(|(a, b)| a == b)
                    .count();
                let reference_agree = greedy
                    .iter()
                    .zip(&r.greedy_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                let scale = r.logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                eprintln!(
                    "{name} {prefix}: logits up to {scale:.2}; bf16 state max |Δlogit| {diff:.5} vs transformers, {vs_f32:.5} vs f32 state; greedy agrees with transformers for {reference_agree}/{} tokens, with the f32 state for {agree}/100",
                    r.greedy_ids.len()
                );
                assert!(
                    diff < BF16_STATE_TOLERANCE,
                    "{name} {prefix}: a bf16 state moves the logits by {diff}"
                );
                assert_eq!(
                    &greedy[..r.greedy_ids.len()],
                    &r.greedy_ids[..],
                    "{name} {prefix}greedy with a bf16 state"
                );
            });
        }
    }
}

/// A prompt's part in slot 0, from position 0.
fn slot0(tokens: &[u32]) -> Part<'_> {
    Part {
        tokens,
        past: 0,
        slot: 0,
    }
}

/// The fixtures with an MTP head (scripts/make-mtp-fixture.py), MoE and
/// dense: the head at every prompt position, fed the next token
/// (`mtp_logits`), and three drafts made one from the other after the prompt
/// (`mtp_chain`).
#[test]
fn the_mtp_head_matches_its_reference() {
    for name in ["qwen35-moe-tiny-mtp", "qwen35-tiny-mtp"] {
        mtp_head_matches(name);
    }
}

/// A synthetic checkpoint (`make-checkpoint --like`) of a config with
/// `mtp_num_hidden_layers` carries the head transformers' own model has:
/// the same `mtp.*` names, dtypes and shapes as the fixtures the reference
/// script wrote, so a bench model can draft with `mtp`.
#[test]
fn synthetic_checkpoints_carry_the_mtp_head_transformers_writes() {
    fn mtp_headers(file: &std::path::Path) -> Vec<(String, String, Vec<usize>)> {
        let bytes = std::fs::read(file).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let mut found: Vec<_> = meta
            .tensors()
            .into_iter()
            .filter(|(name, _)| name.starts_with("mtp."))
            .map(|(name, info)| (name, format!("{:?}", info.dtype), info.shape.clone()))
            .collect();
        found.sort();
        found
    }
    for name in ["qwen35-moe-tiny-mtp", "qwen35-tiny-mtp"] {
        let like = common::fixture(name);
        let config = ModelConfig::load(&like).unwrap();
        let out = tempfile::tempdir().unwrap();
        checkpoint::synthetic::write_checkpoint(&like, &config, out.path(), 1, 7, &mut |_, _| {})
            .unwrap();
        let made = mtp_headers(&out.path().join("model.safetensors"));
        let reference = mtp_headers(&like.join("model.safetensors"));
        assert!(reference.len() > 10, "{name}: the fixture has its head");
        assert_eq!(made, reference, "{name}");
    }
}

/// A head pass that wants no logits (every sequence backing off) computes
/// only the head's keys and values: a later pass, whose attention reads
/// them, gives bitwise the logits it gives after a whole pass (and other
/// logits if they were missing: the cache starts zeroed).
#[test]
fn a_head_pass_without_logits_keeps_the_same_keys_and_values() {
    for name in ["qwen35-moe-tiny-mtp", "qwen35-tiny-mtp"] {
        let r = reference(name, "");
        let mtp = SpeculativeConfig {
            method: DraftMethod::Mtp,
            num_speculative_tokens: 1,
            prompt_lookup_min: 0,
            prompt_lookup_max: 0,
        };
        let after_a_first_pass = |wanted: Logits| {
            let mut logits = Vec::new();
            with_runner_on(
                fixture_serving(name, StateDtype::F32, Some(mtp)),
                |runner| {
                    let (prompt, t) = (&r.input_ids, r.input_ids.len());
                    runner.prompt(prompt, &[t], 0);
                    let mut next = prompt[1..].to_vec();
                    next.push(r.greedy_ids[0]);
                    runner.run(&[slot0(&next)], wanted, Pass::Mtp { first: true });
                    // The target's next step, then the head on it.
                    let step = |token| Part {
                        tokens: std::slice::from_ref(token),
                        past: t,
                        slot: 0,
                    };
                    runner.step(&[step(&r.greedy_ids[0])]);
                    logits = runner
                        .run(
                            &[step(&r.greedy_ids[1])],
                            Logits::All,
                            Pass::Mtp { first: true },
                        )
                        .remove(0);
                },
            );
            logits
        };
        let whole = after_a_first_pass(Logits::All);
        let keys_only = after_a_first_pass(Logits::None);
        assert_eq!(whole.len(), keys_only.len(), "{name}");
        assert!(whole.iter().all(|v| v.is_finite()), "{name}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&whole), bits(&keys_only), "{name}");
    }
}

fn mtp_head_matches(name: &str) {
    let r = reference(name, "");
    let bytes = std::fs::read(common::fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mtp_logits: Vec<f32> = st
        .tensor("mtp_logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let chain: Vec<u32> = st
        .tensor("mtp_chain")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    assert_eq!(chain.len(), 3);
    let mtp = SpeculativeConfig {
        method: DraftMethod::Mtp,
        num_speculative_tokens: 3,
        prompt_lookup_min: 0,
        prompt_lookup_max: 0,
    };
    with_runner_on(
        fixture_serving(name, StateDtype::F32, Some(mtp)),
        |runner| {
            assert!(
                runner.model.mtp.is_some(),
                "{name}: the head is loaded when served"
            );

            let prompt = &r.input_ids;
            let t = prompt.len();
            let target = runner.prompt(prompt, &[t], 0);
            assert!(
                max_abs_diff(&target, &r.logits) < 1e-3,
                "{name}: the target itself"
            );
            // Each prompt row fed its next token, the last the greedy first token.
            let mut next: Vec<u32> = prompt[1..].to_vec();
            next.push(r.greedy_ids[0]);
            let head = runner.run(&[slot0(&next)], Logits::All, Pass::Mtp { first: true });
            let diff = max_abs_diff(&head[0], &mtp_logits);
            assert!(diff < 1e-3, "{name}: MTP logits differ by {diff}");
            for (row, (ours, theirs)) in head[0]
                .chunks_exact(runner.vocab)
                .zip(mtp_logits.chunks_exact(runner.vocab))
                .enumerate()
            {
                assert_eq!(
                    argmax(ours),
                    argmax(theirs),
                    "{name}: MTP top token at row {row}"
                );
            }

            // The chain: the same first pass keeping only the last row (the next
            // pass reads its output), then a row a position later per draft.
            let last = runner.run(&[slot0(&next)], Logits::Last, Pass::Mtp { first: true });
            let mut drafts = vec![argmax(&last[0])];
            for position in t..t + 2 {
                let token = [drafts[drafts.len() - 1]];
                let logits = runner.run(
                    &[Part {
                        tokens: &token,
                        past: position,
                        slot: 0,
                    }],
                    Logits::All,
                    Pass::Mtp { first: false },
                );
                drafts.push(argmax(&logits[0]));
            }
            assert_eq!(drafts, chain, "{name}");
        },
    );
}
