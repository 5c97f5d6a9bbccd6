//! Multi-turn prefix reuse (issue 17): when a client sends the second turn
//! of a chat (the history, the model's first answer, a new user message), how
//! much of it is a token prefix of what the engine already computed for the
//! first turn — the first turn's prompt followed by the tokens the model
//! generated? Only that shared prefix can come from the prefix cache.
//!
//! The official templates render earlier turns differently from how the model
//! produced them: Qwen3 (thinking) and gpt-oss drop the reasoning of
//! assistant turns before the last user message, so for them the reuse ends
//! where the first answer began; Qwen3-Instruct-2507 has no reasoning and the
//! whole first answer is reused. These tests pin that down with the
//! fixtures' tokenizers, so a template or renderer change that breaks reuse
//! (or a claim in the README about it) fails here.

use std::path::{Path, PathBuf};

use sparkrt::server::openai::chat_prompt;
use sparkrt::server::openai::types::ChatRequest;
use sparkrt::text::{ChatTemplate, SpecialTokens, Tokenizer};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The official template `reference` (a file of tests/chat_templates) names,
/// with its special tokens and fixed date, as text_chat_reference renders it.
fn template(reference: &str) -> ChatTemplate {
    let text =
        std::fs::read_to_string(root().join("tests/chat_templates").join(reference)).unwrap();
    let data: serde_json::Value = serde_json::from_str(&text).unwrap();
    let name = data["template"].as_str().unwrap();
    let source =
        std::fs::read_to_string(root().join("tests/fixtures/templates").join(name)).unwrap();
    let token = |key: &str| data["special_tokens"][key].as_str().map(str::to_string);
    let tokens = SpecialTokens {
        bos: token("bos_token"),
        eos: token("eos_token"),
        pad: token("pad_token"),
        unk: token("unk_token"),
    };
    ChatTemplate::from_source(source, tokens)
        .unwrap()
        .with_fixed_time(data["fixed_unix_seconds"].as_i64().unwrap())
}

fn render(template: &ChatTemplate, request: serde_json::Value) -> String {
    let body: ChatRequest = serde_json::from_value(request).unwrap();
    let prepared = chat_prompt::prepare(body.messages, body.template).unwrap();
    template.render_prompt(&prepared.prompt).unwrap()
}

fn tokenizer(fixture: &str) -> Tokenizer {
    Tokenizer::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(fixture),
    )
    .unwrap()
}

/// Token counts of one two-turn conversation: the first turn's prompt, what
/// the engine holds after answering it (prompt + generated tokens), and the
/// longest token prefix the second turn's prompt shares with that.
struct Reuse {
    first_prompt: usize,
    first_transcript: usize,
    shared: usize,
    second_prompt: usize,
}

/// `generated` is the model's raw output for the first turn, special tokens
/// included, as the engine holds it; `answer` is the assistant message the
/// client sends back (content and reasoning as the parsers returned them).
fn two_turns(reference: &str, fixture: &str, generated: &str, answer: serde_json::Value) -> Reuse {
    let template = template(reference);
    let tokenizer = tokenizer(fixture);
    let system = serde_json::json!({"role": "system", "content": "You are a careful assistant."});
    let first = serde_json::json!({"role": "user", "content": "Say hello."});
    let second = serde_json::json!({"role": "user", "content": "Now say goodbye."});
    let first_prompt = render(&template, serde_json::json!({"messages": [system, first]}));
    let second_prompt = render(
        &template,
        serde_json::json!({"messages": [system, first, answer, second]}),
    );
    let first_ids = tokenizer.encode(&first_prompt, false).unwrap();
    // The engine appends generated ids to the prompt's ids, never re-encodes.
    let mut transcript = first_ids.clone();
    transcript.extend(tokenizer.encode(generated, false).unwrap());
    let second_ids = tokenizer.encode(&second_prompt, false).unwrap();
    let shared = transcript
        .iter()
        .zip(&second_ids)
        .take_while(|(a, b)| a == b)
        .count();
    eprintln!(
        "{reference}: first prompt {} tokens, first transcript {}, shared with the second turn {}, second prompt {}",
        first_ids.len(),
        transcript.len(),
        shared,
        second_ids.len()
    );
    Reuse {
        first_prompt: first_ids.len(),
        first_transcript: transcript.len(),
        shared,
        second_prompt: second_ids.len(),
    }
}

impl Reuse {
    /// The whole first prompt is shared, but not all the engine computed:
    /// the template re-renders the first answer without its reasoning.
    fn ends_within_the_first_answer(&self) {
        assert!(
            self.shared >= self.first_prompt,
            "shared {} < {}",
            self.shared,
            self.first_prompt
        );
        assert!(self.shared < self.first_transcript);
    }
}

#[test]
fn qwen3_instruct_2507_reuses_the_whole_first_answer() {
    let reuse = two_turns(
        "qwen3_instruct_2507.json",
        "qwen3-moe-tiny",
        "Hello there!<|im_end|>",
        serde_json::json!({"role": "assistant", "content": "Hello there!"}),
    );
    // Everything the engine computed is a prefix of the second turn.
    assert_eq!(reuse.shared, reuse.first_transcript);
    assert!(reuse.second_prompt > reuse.first_transcript);
}

#[test]
fn qwen3_thinking_drops_earlier_reasoning_so_reuse_ends_at_the_first_answer() {
    let reuse = two_turns(
        "qwen3.json",
        "qwen3-moe-tiny",
        "<think>\nThe user wants a greeting.\n</think>\n\nHello there!<|im_end|>",
        serde_json::json!({
            "role": "assistant",
            "content": "Hello there!",
            "reasoning_content": "The user wants a greeting."
        }),
    );
    // The whole first prompt (system prompt and first question) is reused;
    // the answer is not, because the template re-renders it without its
    // `<think>` block.
    reuse.ends_within_the_first_answer();
}

#[test]
fn gptoss_drops_earlier_analysis_so_reuse_ends_at_the_first_answer() {
    let reuse = two_turns(
        "gptoss.json",
        "gpt-oss-tiny",
        "<|channel|>analysis<|message|>The user wants a greeting.<|end|>\
         <|start|>assistant<|channel|>final<|message|>Hello there!<|return|>",
        serde_json::json!({
            "role": "assistant",
            "content": "Hello there!",
            "reasoning_content": "The user wants a greeting."
        }),
    );
    reuse.ends_within_the_first_answer();
}
