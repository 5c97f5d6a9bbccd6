//! The per-token cost of a structured-output mask, on the tiny fixture's
//! vocabulary (512) and on one of Qwen3's size (151,936 tokens: the
//! fixture's byte-level tokenizer grown with made-up BPE pieces), and that
//! a walk that only takes allowed tokens ends in JSON valid for the schema.
//! Prints the figures (`-- --nocapture`); the bound asserted is loose (a
//! slow debug machine), the figures quoted in docs/ARCHITECTURE.md come
//! from this test.

use std::time::Instant;

use serde_json::{Value, json};
use sparkrt::engine::grammar::{GrammarCompiler, GrammarSpec};
use sparkrt::text::Tokenizer;
use sparkrt::util::rng::SplitMix64;

use crate::common;

/// Qwen3's vocabulary size.
const QWEN3_VOCAB: usize = 151_936;

/// The fixture's tokenizer folder, or one like it whose vocabulary has
/// `vocab` ids: made-up pieces (a byte-level space `Ġ` or not, then 1 to 9
/// letters, digits or punctuation) fill the ids between the fixture's
/// pieces and its three special tokens, which move to the end.
fn tokenizer_with_vocab(vocab: usize, dir: &std::path::Path) -> Tokenizer {
    let fixture = common::fixture("qwen3-moe-tiny");
    if vocab == 512 {
        return Tokenizer::from_dir(&fixture).unwrap();
    }
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap())
            .unwrap();
    let pieces = json["model"]["vocab"].as_object_mut().unwrap();
    let first_new = pieces.len();
    let specials = 3;
    let alphabet: Vec<char> = ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='9')
        .chain("{}[]\":,._-".chars())
        .collect();
    let mut rng = SplitMix64::new(3);
    let mut id = first_new;
    while id < vocab - specials {
        let mut piece = String::new();
        if rng.next_f64() < 0.5 {
            piece.push('Ġ');
        }
        for _ in 0..1 + (rng.next_f64() * 9.0) as usize {
            piece.push(alphabet[(rng.next_f64() * alphabet.len() as f64) as usize]);
        }
        if !pieces.contains_key(&piece) {
            pieces.insert(piece, json!(id));
            id += 1;
        }
    }
    for (i, added) in json["added_tokens"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        added["id"] = json!(vocab - specials + i);
    }
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::copy(
        fixture.join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let tokenizer = Tokenizer::from_dir(dir).unwrap();
    assert_eq!(tokenizer.vocab_size(), vocab);
    tokenizer
}

/// The process's resident set (a rough figure: other tests' threads share it).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn allowed(mask: &[u32], id: usize) -> bool {
    mask.get(id / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}

#[test]
fn mask_cost_per_token_on_small_and_qwen3_sized_vocabularies() {
    let schema = json!({"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]},
                                "maxItems": 3},
                       "n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["name", "tags", "n"], "additionalProperties": false});
    for vocab in [512, QWEN3_VOCAB] {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer_with_vocab(vocab, dir.path());
        let eos = tokenizer.eos_token_ids().to_vec();
        // SAFETY: as below.
        unsafe { libc::malloc_trim(0) };
        let rss_before = rss_kib();
        let started = Instant::now();
        let compiler = GrammarCompiler::new(&tokenizer, &eos).unwrap();
        let trie_time = started.elapsed();
        // What stays: freed transient memory goes back to the system first.
        // SAFETY: malloc_trim only releases free heap pages.
        unsafe { libc::malloc_trim(0) };
        let trie_kib = rss_kib().saturating_sub(rss_before);
        let started = Instant::now();
        let mut constraint = compiler
            .compile(&GrammarSpec::JsonSchema(schema.clone()))
            .unwrap();
        let compile_time = started.elapsed();

        // A walk that takes a random allowed token each step (EOS last).
        let mut rng = SplitMix64::new(9);
        let mut ids = Vec::new();
        let mut mask_time = std::time::Duration::ZERO;
        let mut steps = 0;
        while !constraint.is_finished() && steps < 400 {
            let started = Instant::now();
            let mask = constraint.mask().unwrap();
            mask_time += started.elapsed();
            steps += 1;
            let choices: Vec<usize> = (0..vocab)
                .filter(|&id| allowed(&mask, id) && !eos.contains(&(id as u32)))
                .collect();
            if choices.is_empty() {
                break; // only end-of-sequence is left: the JSON is complete
            }
            let token = choices[(rng.next_f64() * choices.len() as f64) as usize] as u32;
            constraint.consume(token).unwrap();
            ids.push(token);
        }
        let text = tokenizer.decode(&ids, false).unwrap();
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("vocab {vocab}: {text:?} is not JSON: {e}"));
        assert!(value["n"].as_u64().unwrap() <= 999, "{text}");
        let per_token = mask_time / steps;
        eprintln!(
            "vocab {vocab}: trie {trie_time:.2?} (RSS +{trie_kib} KiB), compile {compile_time:.2?}, \
             mask {per_token:.2?} per token over {steps} tokens: {text}"
        );
        assert!(
            per_token.as_millis() < 50,
            "vocab {vocab}: {per_token:?} per mask"
        );
    }
}
