//! Tokenizer, streaming detokenizer and stop strings, against the
//! transformers fixtures and crafted tokenizers.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sparkrt::text::{StopMatcher, StopStep, StreamDecoder, TextError, Tokenizer};

const FIXTURES: [&str; 3] = ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn qwen_tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture_dir("qwen3-moe-tiny")).unwrap()
}

/// Streams `ids` through a fresh decoder; returns the chunks (the last one
/// from `finish`) and checks after every step that what was emitted is a
/// prefix of the full decode, i.e. nothing emitted is ever taken back.
fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let full = tokenizer.decode(ids, skip_special_tokens).unwrap();
    let mut decoder = StreamDecoder::new(skip_special_tokens);
    let mut emitted = String::new();
    let mut chunks = Vec::new();
    for &id in ids {
        let chunk = decoder.push(tokenizer, id).unwrap().text;
        emitted.push_str(&chunk);
        assert!(
            full.starts_with(&emitted),
            "emitted {emitted:?} is not a prefix of {full:?}"
        );
        chunks.push(chunk);
    }
    chunks.push(decoder.finish(tokenizer).unwrap());
    chunks
}

#[test]
fn fixture_prompts_encode_to_the_reference_ids() {
    for name in FIXTURES {
        let tokenizer = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        let reference = reference(name);
        let prompt = reference["prompt"].as_str().unwrap();
        let want = ids(&reference["input_ids"]);
        assert_eq!(tokenizer.encode(prompt, false).unwrap(), want, "{name}");
        // These tokenizers have no post-processor: special tokens add nothing.
        assert_eq!(tokenizer.encode(prompt, true).unwrap(), want, "{name}");
        assert_eq!(tokenizer.decode(&want, false).unwrap(), prompt, "{name}");
    }
}

#[test]
fn greedy_ids_decode_to_the_transformers_text() {
    // The references' `greedy_text` is transformers' decode of `greedy_ids`
    // with special tokens skipped (the NVFP4 one contains <|im_start|>),
    // invalid UTF-8 included as U+FFFD.
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4"] {
        let tokenizer = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        let reference = reference(name);
        let greedy = ids(&reference["greedy_ids"]);
        let want = reference["greedy_text"].as_str().unwrap();
        assert_eq!(tokenizer.decode(&greedy, true).unwrap(), want, "{name}");
        assert_eq!(stream(&tokenizer, &greedy, true).concat(), want, "{name}");
        // Streaming without skipping equals the full decode without skipping.
        let full = tokenizer.decode(&greedy, false).unwrap();
        assert_eq!(stream(&tokenizer, &greedy, false).concat(), full, "{name}");
    }
}

#[test]
fn text_round_trips_through_encode_and_decode() {
    let tokenizer = qwen_tokenizer();
    for text in [
        "",
        "plain ascii, with punctuation; and   runs of spaces\n\n\ttabs",
        "naïve café — 日本語のテキスト, 中文, 한국어",
        "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷",
        "<|im_start|>user\nhi<|im_end|>\n",
    ] {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
}

/// Whitespace, contractions, digits and non-Latin scripts exercise every
/// branch of the pre-tokenizer regex (its `\s+(?!\S)` look-ahead included).
/// Expected ids from the Python `tokenizers` 0.23.3 package, whose regex
/// engine is Oniguruma; sparkrt builds the Rust crate with fancy-regex.
#[test]
fn pre_tokenizer_regex_matches_the_python_tokenizers_package() {
    let tokenizer = qwen_tokenizer();
    let cases: [(&str, &[u32]); 10] = [
        (
            "  leading and trailing   ",
            &[220, 316, 68, 64, 391, 315, 257, 81, 64, 357, 285, 331],
        ),
        ("a\n\n\nb", &[64, 300, 198, 65]),
        ("\t \n x", &[197, 220, 198, 220, 87]),
        (
            "it's I'M we'LL they'Re",
            &[
                275, 6, 82, 375, 6, 44, 273, 68, 6, 43, 43, 265, 88, 6, 49, 68,
            ],
        ),
        (
            "123456 7.5e10",
            &[16, 17, 18, 19, 20, 21, 220, 22, 13, 20, 68, 16, 15],
        ),
        ("x   \n  y", &[87, 331, 198, 220, 220, 88]),
        (
            "don't!!!\r\n\r\nok",
            &[67, 261, 6, 83, 0, 0, 0, 201, 198, 201, 198, 78, 74],
        ),
        (
            "nbsp\u{a0}and\u{2003}em space",
            &[
                77, 65, 82, 79, 126, 254, 291, 67, 158, 222, 225, 68, 76, 282, 79, 64, 312,
            ],
        ),
        (
            "🙂🙂  🙂",
            &[
                172, 253, 247, 224, 172, 253, 247, 224, 220, 220, 172, 253, 247, 224,
            ],
        ),
        (
            "ÀÉÎõü ΑΒΓ абв",
            &[
                127, 222, 127, 231, 127, 236, 127, 113, 127, 120, 220, 138, 239, 138, 240, 138,
                241, 220, 140, 108, 140, 109, 140, 110,
            ],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tokenizer.encode(text, false).unwrap(), want, "{text:?}");
    }
}

#[test]
fn special_tokens_are_single_ids_and_can_be_skipped() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode("<|im_start|>hi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&510));
    assert_eq!(ids.last(), Some(&511));
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "hi");
    assert_eq!(tokenizer.vocab_size(), 512);
    assert_eq!(tokenizer.token_to_id("<|im_end|>"), Some(511));
}

#[test]
fn fixture_eos_ids_come_from_the_config_files() {
    for name in FIXTURES {
        let tokenizer = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        assert_eq!(tokenizer.eos_token_ids(), &[511], "{name}");
        assert!(tokenizer.is_eos(511));
        assert!(!tokenizer.is_eos(509));
    }
}

/// A checkpoint directory with the fixture's tokenizer.json and the given
/// side files.
fn crafted_dir(files: &[(&str, Value)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir("qwen3-moe-tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    for (name, value) in files {
        std::fs::write(dir.path().join(name), value.to_string()).unwrap();
    }
    dir
}

#[test]
fn eos_ids_are_the_union_of_all_three_files() {
    let dir = crafted_dir(&[
        ("generation_config.json", json!({"eos_token_id": [509, 7]})),
        ("config.json", json!({"eos_token_id": 509})),
        (
            "tokenizer_config.json",
            json!({"eos_token": {"content": "<|im_end|>", "special": true}}),
        ),
    ]);
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token_ids(), &[7, 509, 511]);
    assert_eq!(
        tokenizer.special_tokens().eos.as_deref(),
        Some("<|im_end|>")
    );
}

#[test]
fn missing_side_files_give_no_eos_ids() {
    let dir = crafted_dir(&[("config.json", json!({"eos_token_id": null}))]);
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(tokenizer.eos_token_ids().is_empty());
}

#[test]
fn malformed_side_files_are_typed_errors() {
    let dir = crafted_dir(&[("generation_config.json", json!({"eos_token_id": "511"}))]);
    let err = Tokenizer::from_dir(dir.path()).err().unwrap();
    assert!(
        matches!(
            err,
            TextError::BadField {
                field: "eos_token_id",
                ..
            }
        ),
        "{err}"
    );

    let dir = crafted_dir(&[("config.json", json!({"eos_token_id": [1, -2]}))]);
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TextError::BadField { .. })
    ));

    let dir = crafted_dir(&[("tokenizer_config.json", json!({"eos_token": "<nope>"}))]);
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TextError::UnknownEosToken { .. })
    ));

    let dir = crafted_dir(&[]);
    std::fs::write(dir.path().join("config.json"), "{not json").unwrap();
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TextError::Json { .. })
    ));

    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        Tokenizer::from_dir(empty.path()),
        Err(TextError::TokenizerLoad { .. })
    ));
}

#[test]
fn multibyte_text_streams_exactly_and_never_emits_half_a_character() {
    let tokenizer = qwen_tokenizer();
    let text = "Hello 世界! 😀🎉 naïve café — 日本語 👩‍👩‍👧 done";
    let ids = tokenizer.encode(text, false).unwrap();
    let chunks = stream(&tokenizer, &ids, false);
    assert_eq!(chunks.concat(), text);
    assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
    // The tiny vocabulary splits these characters into byte tokens, so some
    // steps must have held text back: the test exercises the hard case.
    let held_steps = chunks[..ids.len()].iter().filter(|c| c.is_empty()).count();
    assert!(held_steps >= 10, "only {held_steps} steps held text back");
}

#[test]
fn streaming_skips_special_tokens_when_asked() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer
        .encode("<|im_start|>日本<|im_end|>", false)
        .unwrap();
    assert_eq!(stream(&tokenizer, &ids, true).concat(), "日本");
    assert_eq!(
        stream(&tokenizer, &ids, false).concat(),
        "<|im_start|>日本<|im_end|>"
    );
}

#[test]
fn an_unfinished_character_is_flushed_as_a_replacement_char() {
    let tokenizer = qwen_tokenizer();
    // The first two of the three bytes of '€' (E2 82 AC).
    let euro = tokenizer.encode("€", false).unwrap();
    let cut = tokenizer.encode("a", false).unwrap();
    let mut ids = cut.clone();
    ids.extend(&euro[..euro.len() - 1]);
    assert!(euro.len() >= 2);
    let mut decoder = StreamDecoder::new(false);
    let emitted: String = ids
        .iter()
        .map(|&id| decoder.push(&tokenizer, id).unwrap().text)
        .collect();
    assert_eq!(emitted, "a");
    let rest = decoder.finish(&tokenizer).unwrap();
    assert_eq!(rest, "\u{FFFD}");
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "a\u{FFFD}");
}

/// A Llama-2-style tokenizer: SentencePiece `▁` spaces, byte-fallback
/// `<0xNN>` tokens for characters outside the vocabulary, and a decoder that
/// strips the sequence's first space.
fn byte_fallback_dir() -> tempfile::TempDir {
    let mut vocab = serde_json::Map::new();
    for (id, token) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(token.to_string(), json!(id));
    }
    for byte in 0..=255u32 {
        vocab.insert(format!("<0x{byte:02X}>"), json!(3 + byte));
    }
    for (i, token) in ["▁", "a", "b", "▁a"].iter().enumerate() {
        vocab.insert(token.to_string(), json!(259 + i));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": ["▁ a"]}
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"eos_token": "</s>"}).to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn byte_fallback_tokens_stream_whole_characters() {
    let dir = byte_fallback_dir();
    let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tokenizer.eos_token_ids(), &[2]);

    let byte = |b: u32| 3 + b;
    let ids = tokenizer.encode("a €😀b", false).unwrap();
    // "▁a", "▁", the bytes of '€' and '😀' (not in the vocabulary), "b".
    let want_ids = [
        262,
        259,
        byte(0xE2),
        byte(0x82),
        byte(0xAC),
        byte(0xF0),
        byte(0x9F),
        byte(0x98),
        byte(0x80),
        261,
    ];
    assert_eq!(ids, want_ids);
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "a €😀b");

    let chunks = stream(&tokenizer, &ids, false);
    assert_eq!(chunks.concat(), "a €😀b");
    // Each character comes out whole, once its last byte arrived.
    let non_empty: Vec<&str> = chunks
        .iter()
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(non_empty, ["a", " ", "€", "😀", "b"]);

    // Invalid bytes: shown as U+FFFD once the next token proves them invalid.
    let invalid = [byte(0xE2), byte(0x82), 260];
    assert_eq!(
        tokenizer.decode(&invalid, false).unwrap(),
        "\u{FFFD}\u{FFFD}a"
    );
    assert_eq!(
        stream(&tokenizer, &invalid, false).concat(),
        "\u{FFFD}\u{FFFD}a"
    );
}

#[test]
fn stop_string_split_across_streamed_tokens_is_found() {
    let tokenizer = qwen_tokenizer();
    let text = "The answer is 42.\nUser: and then more text";
    let ids = tokenizer.encode(text, false).unwrap();
    let mut decoder = StreamDecoder::new(false);
    let mut stops = StopMatcher::new(["\nUser:"]);
    let mut emitted = String::new();
    let mut stopped_at = None;
    for (i, &id) in ids.iter().enumerate() {
        let chunk = decoder.push(&tokenizer, id).unwrap().text;
        match stops.push(&chunk) {
            StopStep::Continue { emit } => emitted.push_str(&emit),
            StopStep::Stopped { emit, stop_index } => {
                emitted.push_str(&emit);
                assert_eq!(stop_index, 0);
                stopped_at = Some(i);
                break;
            }
        }
    }
    assert_eq!(emitted, "The answer is 42.");
    // The stop string spans several tokens; it completes on the one with ':'.
    let stop_token = stopped_at.unwrap();
    let through_stop = tokenizer.decode(&ids[..=stop_token], false).unwrap();
    assert!(through_stop.ends_with("User:"), "{through_stop:?}");
}

#[test]
fn stop_matcher_holds_back_possible_prefixes() {
    let mut m = StopMatcher::new(["<|end|>"]);
    assert_eq!(
        m.push("Hello <|e"),
        StopStep::Continue {
            emit: "Hello ".into()
        }
    );
    assert_eq!(m.push("nd"), StopStep::Continue { emit: "".into() });
    assert_eq!(
        m.push("|> ignored"),
        StopStep::Stopped {
            emit: "".into(),
            stop_index: 0
        }
    );

    // A prefix that does not complete is released.
    let mut m = StopMatcher::new(["<|end|>"]);
    assert_eq!(m.push("ab<"), StopStep::Continue { emit: "ab".into() });
    assert_eq!(m.push("|x"), StopStep::Continue { emit: "<|x".into() });
    assert_eq!(m.finish(), "");

    // Held text comes out at the end of the stream.
    let mut m = StopMatcher::new(["STOP"]);
    assert_eq!(m.push("abcST"), StopStep::Continue { emit: "abc".into() });
    assert_eq!(m.finish(), "ST");
}

#[test]
fn stop_matcher_takes_the_earliest_stop_and_handles_multibyte_text() {
    let mut m = StopMatcher::new(["world", "lo w"]);
    assert_eq!(
        m.push("hello world"),
        StopStep::Stopped {
            emit: "hel".into(),
            stop_index: 1
        }
    );
    // "bc" completes before "abcd" does, though "abcd" starts first: the
    // answer must not depend on whether "d" arrived in the same chunk.
    for chunks in [vec!["abcd"], vec!["abc", "d"]] {
        let mut m = StopMatcher::new(["abcd", "bc"]);
        assert_eq!(
            m.push(chunks[0]),
            StopStep::Stopped {
                emit: "a".into(),
                stop_index: 1
            }
        );
    }

    // The empty stop string is ignored but still counts for the indices.
    let mut m = StopMatcher::new(["", "世界"]);
    assert_eq!(
        m.push("hello 世"),
        StopStep::Continue {
            emit: "hello ".into()
        }
    );
    assert_eq!(
        m.push("界!"),
        StopStep::Stopped {
            emit: "".into(),
            stop_index: 1
        }
    );

    // No stop strings: everything passes straight through.
    let mut m = StopMatcher::new(Vec::<String>::new());
    assert_eq!(m.push("abc"), StopStep::Continue { emit: "abc".into() });
}

/// Random texts over a small alphabet, cut into random chunks, against a
/// whole-text reference: the stop string whose first occurrence ends
/// earliest (the longest of those ending together) wins, and the output is
/// the text before it.
#[test]
fn stop_matcher_agrees_with_a_whole_text_search() {
    let stops = ["abc", "bc", "cab", "bb", "aaaa", "éa"];
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = move |n: u64| {
        // xorshift64: a different generator from the one under test elsewhere.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for _ in 0..2000 {
        let len = next(30) as usize;
        let text: String = (0..len)
            .map(|_| ['a', 'b', 'c', 'é'][next(4) as usize])
            .collect();
        let first_stop = stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| text.find(s).map(|at| (at + s.len(), at, i)))
            .min()
            .map(|(_end, at, i)| (at, i));

        let mut m = StopMatcher::new(stops);
        let mut emitted = String::new();
        let mut result = None;
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut cut = (next(5) as usize + 1).min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let (chunk, tail) = rest.split_at(cut);
            rest = tail;
            match m.push(chunk) {
                StopStep::Continue { emit } => emitted.push_str(&emit),
                StopStep::Stopped { emit, stop_index } => {
                    emitted.push_str(&emit);
                    result = Some(stop_index);
                    break;
                }
            }
        }
        match first_stop {
            Some((at, index)) => {
                assert_eq!(emitted, &text[..at], "{text:?}");
                assert_eq!(result, Some(index), "{text:?}");
            }
            None => {
                assert_eq!(result, None, "{text:?}");
                emitted.push_str(&m.finish());
                assert_eq!(emitted, text);
            }
        }
    }
}

#[test]
fn tokenizer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<StreamDecoder>();
    assert_send_sync::<StopMatcher>();
}
