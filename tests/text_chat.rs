//! Chat templates: the fixtures' ChatML template, and crafted templates whose
//! expected output was produced by Jinja2 3.1 configured as transformers
//! configures it (trim_blocks, lstrip_blocks, loop controls, `tojson` =
//! `json.dumps(ensure_ascii=False)`, `raise_exception`).

use std::path::{Path, PathBuf};

use serde_json::json;
use sparkrt::text::{ChatMessage, ChatTemplate, SpecialTokens, TextError};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn render(
    source: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, TextError> {
    ChatTemplate::from_source(source.to_owned(), SpecialTokens::default())?
        .render(messages, add_generation_prompt)
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "  Be brief.  "),
        ChatMessage::new("user", "hi"),
        ChatMessage::new("assistant", "<think>\nhmm\n</think>\n\nHello!"),
        ChatMessage::new("user", "2+2?"),
    ]
}

#[test]
fn fixtures_render_chatml() {
    for name in ["qwen3-moe-tiny", "qwen3-moe-tiny-nvfp4", "gpt-oss-tiny"] {
        let template = ChatTemplate::from_dir(&fixture_dir(name)).unwrap();
        let hi = [ChatMessage::new("user", "hi")];
        assert_eq!(
            template.render(&hi, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "{name}"
        );
        assert_eq!(
            template.render(&hi, false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n",
            "{name}"
        );
        let two = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", "U"),
        ];
        assert_eq!(
            template.render(&two, true).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
            "{name}"
        );
    }
}

/// What `serve` loads: no template at all is `None` (chat routes then
/// answer 400); a broken one is an error naming the file it came from.
#[test]
fn a_broken_template_is_an_error_naming_its_file_and_none_is_none() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_dir_if_any(dir.path()).unwrap().is_none());

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"chat_template": "{% for m in messages %}{{ m.content }"}).to_string(),
    )
    .unwrap();
    let err = ChatTemplate::from_dir_if_any(dir.path()).err().unwrap();
    assert!(matches!(err, TextError::TemplateSyntaxIn { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");

    // chat_template.jinja wins over the config's, and is the file named.
    std::fs::write(dir.path().join("chat_template.jinja"), "{% if %}").unwrap();
    let err = ChatTemplate::from_dir_if_any(dir.path()).err().unwrap();
    assert!(err.to_string().contains("chat_template.jinja"), "{err}");
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let template = ChatTemplate::from_dir_if_any(dir.path()).unwrap().unwrap();
    assert_eq!(
        template
            .render(&[ChatMessage::new("user", "hi")], false)
            .unwrap(),
        "hi"
    );
}

#[test]
fn missing_template_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = ChatTemplate::from_dir(dir.path()).err().unwrap();
    assert!(matches!(err, TextError::NoChatTemplate { .. }));
    assert!(err.to_string().contains("no chat template"), "{err}");

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"eos_token": "</s>", "chat_template": null}).to_string(),
    )
    .unwrap();
    assert!(matches!(
        ChatTemplate::from_dir(dir.path()),
        Err(TextError::NoChatTemplate { .. })
    ));
}

#[test]
fn template_sources_other_than_a_plain_string() {
    // A list of named templates: transformers uses "default".
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &config,
        json!({"bos_token": {"content": "<s>"}, "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}
        ]})
        .to_string(),
    )
    .unwrap();
    let hi = [ChatMessage::new("user", "hi")];
    let template = ChatTemplate::from_dir(dir.path()).unwrap();
    assert_eq!(template.render(&hi, false).unwrap(), "<s>hi");

    // chat_template.jinja takes precedence over tokenizer_config.json.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "[{{ messages[0].role }}]",
    )
    .unwrap();
    let template = ChatTemplate::from_dir(dir.path()).unwrap();
    assert_eq!(template.render(&hi, false).unwrap(), "[user]");

    // A list without "default" says which names it has.
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    std::fs::write(
        &config,
        json!({"chat_template": [{"name": "tool_use", "template": "x"}]}).to_string(),
    )
    .unwrap();
    match ChatTemplate::from_dir(dir.path()) {
        Err(TextError::NoDefaultChatTemplate { names, .. }) => assert_eq!(names, ["tool_use"]),
        other => panic!("unexpected {:?}", other.err()),
    }
}

#[test]
fn syntax_errors_are_reported_at_load() {
    let err = ChatTemplate::from_source(
        "{% for m in messages %}".to_owned(),
        SpecialTokens::default(),
    )
    .err()
    .unwrap();
    assert!(matches!(err, TextError::TemplateSyntax { .. }), "{err}");
}

const QWEN_LIKE: &str = r#"{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content.strip() }}
    {%- if tools %}
        {{- '\n\n# Tools\n' }}
        {%- for tool in tools %}
            {{- tool | tojson }}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages[::-1] %}
    {%- if ns.last_user == -1 and message.role == 'user' %}
        {%- set ns.last_user = messages|length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{ raise_exception('the system message must come first') }}{% endif %}
    {%- elif message.role == 'assistant' and message.content.startswith('<think>') %}
        {{- '<|im_start|>assistant\n' + message.content.split('</think>')[-1].lstrip('\n') + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
    {%- if loop.index0 == ns.last_user %}{{ '<!-- last user -->\n' }}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

#[test]
fn qwen_style_template_matches_jinja2() {
    let messages = conversation();
    assert_eq!(
        render(QWEN_LIKE, &messages, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<!-- last user -->\n<|im_start|>assistant\n"
    );
    assert_eq!(
        render(QWEN_LIKE, &messages[1..], false).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<!-- last user -->\n"
    );
    // raise_exception's message reaches the caller.
    let mut out_of_order = messages.clone();
    out_of_order.swap(0, 1);
    let err = render(QWEN_LIKE, &out_of_order, true).err().unwrap();
    assert!(matches!(err, TextError::TemplateRender { .. }));
    assert!(
        err.to_string()
            .contains("the system message must come first"),
        "{err}"
    );
}

#[test]
fn block_tags_are_trimmed_like_transformers() {
    let template = "{% for message in messages %}\n  {% if message.role == 'user' %}\nUser: {{ message.content }}\n  {% else %}\nBot: {{ message.content }}\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\nBot:\n{% endif %}\n";
    assert_eq!(
        render(template, &conversation()[1..], true).unwrap(),
        "User: hi\nBot: <think>\nhmm\n</think>\n\nHello!\nUser: 2+2?\nBot:\n"
    );
}

#[test]
fn tojson_writes_like_python_json_dumps() {
    let messages = [ChatMessage::new("user", "x\"<&>é😀\u{1}\n")];
    assert_eq!(
        render("{{ messages | tojson }}", &messages, false).unwrap(),
        r#"[{"role": "user", "content": "x\"<&>é😀\u0001\n"}]"#
    );
    assert_eq!(
        render("{{ messages[0] | tojson(indent=2) }}", &messages, false).unwrap(),
        "{\n  \"role\": \"user\",\n  \"content\": \"x\\\"<&>é😀\\u0001\\n\"\n}"
    );
    assert_eq!(
        render(
            "{{ messages | tojson(ensure_ascii=true, sort_keys=true) }}",
            &messages,
            false
        )
        .unwrap(),
        r#"[{"content": "x\"<&>\u00e9\ud83d\ude00\u0001\n", "role": "user"}]"#
    );
    assert_eq!(
        render(
            "{{ {'n': none, 't': true, 'f': 1.5, 'i': 3, 'big': 1e16, 'l': [1, [], {}]} | tojson(separators=(',', ':')) }}",
            &messages,
            false
        )
        .unwrap(),
        r#"{"n":null,"t":true,"f":1.5,"i":3,"big":1e+16,"l":[1,[],{}]}"#
    );
    assert!(render("{{ nothing | tojson }}", &messages, false).is_err());
}

#[test]
fn python_methods_loop_controls_and_special_tokens() {
    let messages = &conversation()[..2];
    assert_eq!(
        render(
            "{% for k, v in messages[0].items() %}{{ k.upper() }}={{ v.strip().replace('B', 'b') }};{% endfor %}{% if messages[1].content.startswith('h') %}starts{% endif %}|{{ '  x '.rstrip() }}|{{ 'a,b'.split(',') | length }}",
            messages,
            false
        )
        .unwrap(),
        "ROLE=system;CONTENT=be brief.;starts|  x|2"
    );
    assert_eq!(
        render(
            "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.content }}]{% endfor %}",
            &conversation(),
            false
        )
        .unwrap(),
        "[hi]"
    );
    let tokens = SpecialTokens {
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
        pad: Some("<pad>".into()),
        unk: None,
    };
    let template = ChatTemplate::from_source(
        "{{ bos_token }}|{{ eos_token }}|{% if pad_token is defined %}pad{% endif %}|{% if unk_token is defined %}unk{% endif %}".to_owned(),
        tokens,
    )
    .unwrap();
    assert_eq!(template.render(messages, false).unwrap(), "<s>|</s>|pad|");
}

#[test]
fn strftime_now_gives_todays_date() {
    let out = render("{{ strftime_now('%Y-%m-%d') }}", &[], false).unwrap();
    // Shape only: the date itself is checked against Python in unit tests.
    let parts: Vec<&str> = out.split('-').collect();
    assert_eq!(parts.len(), 3, "{out}");
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [4, 2, 2],
        "{out}"
    );
    assert!(out.chars().all(|c| c.is_ascii_digit() || c == '-'), "{out}");
    assert!(out.as_str() >= "2025-01-01", "{out}");
}

#[test]
fn templates_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<TextError>();
}

/// The three bounds of a rendering, each named in the error, each reached
/// in a bounded time (the nested loops would run 10¹⁰ turns unbounded).
#[test]
fn renderings_stop_at_their_fuel_output_and_time_bounds() {
    use sparkrt::text::{ChatPrompt, RenderLimits, TemplateLimit};
    use std::time::{Duration, Instant};

    let hi = [ChatMessage::new("user", "hi")];
    let loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let start = Instant::now();
    let err = render(loops, &hi, true).unwrap_err();
    let elapsed = start.elapsed();
    assert!(
        matches!(
            err,
            TextError::TemplateOverLimit {
                limit: TemplateLimit::Fuel(_)
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("max_template_fuel"), "{err}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    eprintln!("the default fuel spent in {elapsed:?}");

    // A string doubled and written each turn: stopped at the output cap,
    // long before the 2⁶⁰ bytes it asks for.
    let doubling = "{% set ns = namespace(s=messages[0].content) %}{% for i in range(60) %}{{ ns.s }}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
    let template = ChatTemplate::from_source(doubling.into(), SpecialTokens::default())
        .unwrap()
        .with_limits(RenderLimits {
            max_output_bytes: 1 << 20,
            ..RenderLimits::default()
        });
    let err = template.render(&hi, true).unwrap_err();
    assert!(
        err.to_string()
            .contains("max_template_output_bytes = 1048576"),
        "{err}"
    );

    // Request data driving a benign-looking loop: the same fuel bound.
    let by_kwargs = "{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}{{ messages[0].content }}";
    let template = ChatTemplate::from_source(by_kwargs.into(), SpecialTokens::default())
        .unwrap()
        .with_limits(RenderLimits {
            fuel: 100_000,
            ..RenderLimits::default()
        });
    let prompt = |n: u32| ChatPrompt {
        messages: hi.to_vec(),
        kwargs: vec![("n".into(), n.into())],
        ..ChatPrompt::default()
    };
    assert_eq!(template.render_prompt(&prompt(10)).unwrap(), "hi");
    let err = template.render_prompt(&prompt(1000)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the chat template ran more than max_template_fuel = 100000 instructions"
    );

    // Time: checked at each write.
    let slow = "{% for i in range(100000) %}{{ i }}{% endfor %}";
    let template = ChatTemplate::from_source(slow.into(), SpecialTokens::default())
        .unwrap()
        .with_limits(RenderLimits {
            max_time: Duration::ZERO,
            ..RenderLimits::default()
        });
    let err = template.render(&hi, true).unwrap_err();
    assert!(err.to_string().contains("max_template_seconds"), "{err}");
}

/// The default bounds leave room for the largest request the server takes
/// through an official template: 2048 messages and 128 tools (gpt-oss's
/// template writes each tool's schema with macros, the costliest case).
#[test]
fn a_maximal_request_renders_within_the_default_bounds() {
    use sparkrt::text::{ChatPrompt, RenderLimits};
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates/gptoss.jinja"),
    )
    .unwrap();
    // An eighth of the default fuel is enough: the default has room to spare.
    let defaults = RenderLimits::default();
    let template = ChatTemplate::from_source(source, SpecialTokens::default())
        .unwrap()
        .with_limits(RenderLimits {
            fuel: defaults.fuel / 8,
            ..defaults
        });
    let mut messages = Vec::new();
    for i in 0..1024 {
        messages.push(ChatMessage::new("user", format!("question {i}")));
        messages.push(ChatMessage::new("assistant", format!("answer {i}")));
    }
    messages.pop();
    let tool = |i: usize| {
        minijinja::Value::from_serialize(json!({
            "type": "function",
            "function": {
                "name": format!("tool_{i}"),
                "description": "does a thing",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "a": {"type": "string", "description": "first", "enum": ["x", "y"]},
                        "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "number"}}}},
                        "d": {"type": ["integer", "null"], "default": 3},
                    },
                    "required": ["a"],
                },
            },
        }))
    };
    let prompt = ChatPrompt {
        messages,
        tools: Some((0..128).map(tool).collect()),
        add_generation_prompt: true,
        ..ChatPrompt::default()
    };
    let start = std::time::Instant::now();
    let text = template.render_prompt(&prompt).unwrap();
    eprintln!("{} bytes in {:?}", text.len(), start.elapsed());
    assert!(text.contains("tool_127") && text.contains("question 1023"));
}
