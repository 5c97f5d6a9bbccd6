//! The official chat templates (tests/fixtures/templates/*.jinja,
//! byte-identical copies of the Hub's `Qwen/Qwen3-*`, `Qwen/Qwen3-*-Instruct-2507` and
//! `openai/gpt-oss-*` templates) render every reference conversation
//! exactly as transformers does.
//!
//! The expected strings were generated once with
//! `scripts/render-chat-reference.py` (transformers' `apply_chat_template(...,
//! tokenize=False)`, Jinja2 3.1, the date fixed); each case holds the OpenAI
//! chat request and transformers' output (or the error it raised). Here the
//! same request goes through the server's own path: parsed as a
//! `ChatRequest`, turned into the template's input by `chat_prompt::prepare`,
//! rendered by `ChatTemplate` with the same fixed date, and compared byte for
//! byte. A difference is fixed in the renderer, never in the data.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;
use sparkrt::server::openai::chat_prompt;
use sparkrt::server::openai::types::ChatRequest;
use sparkrt::text::{ChatTemplate, SpecialTokens};

#[derive(Deserialize)]
struct Reference {
    template: String,
    special_tokens: Tokens,
    fixed_unix_seconds: i64,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Tokens {
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    /// Kept as text: the key order of tools and arguments is part of the input.
    request: Box<RawValue>,
    expected: Option<String>,
    error: Option<String>,
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_templates")
}

/// Renders one case as the server would; `Err` is the error's text.
fn render(template: &ChatTemplate, request: &str) -> Result<String, String> {
    let body: ChatRequest = serde_json::from_str(request).map_err(|e| e.to_string())?;
    let prepared =
        chat_prompt::prepare(body.messages, body.template).map_err(|e| e.message.clone())?;
    template
        .render_prompt(&prepared.prompt)
        .map_err(|e| e.to_string())
}

fn check_reference(file: &str) {
    let text = std::fs::read_to_string(data_dir().join(file)).unwrap();
    let reference: Reference = serde_json::from_str(&text).unwrap();
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/templates")
            .join(&reference.template),
    )
    .unwrap();
    let tokens = SpecialTokens {
        bos: reference.special_tokens.bos_token,
        eos: reference.special_tokens.eos_token,
        pad: reference.special_tokens.pad_token,
        unk: reference.special_tokens.unk_token,
    };
    let template = ChatTemplate::from_source(source, tokens)
        .unwrap()
        .with_fixed_time(reference.fixed_unix_seconds);
    assert!(reference.cases.len() >= 20, "{file}: too few cases");
    let mut failures = Vec::new();
    for case in &reference.cases {
        let got = render(&template, case.request.get());
        match (&case.expected, &case.error, got) {
            (Some(want), None, Ok(got)) if *want == got => {}
            (None, Some(_), Err(_)) => {}
            (want, error, got) => failures.push(format!(
                "{}: transformers gave {:?}\n  sparkrt gave {:?}",
                case.name,
                want.as_deref().or(error.as_deref()),
                got
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{file} ({} of {} cases differ):\n{}",
        failures.len(),
        reference.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_renders_like_transformers() {
    check_reference("qwen3.json");
}

#[test]
fn qwen3_instruct_2507_renders_like_transformers() {
    check_reference("qwen3_instruct_2507.json");
}

#[test]
fn gptoss_renders_like_transformers() {
    check_reference("gptoss.json");
}
