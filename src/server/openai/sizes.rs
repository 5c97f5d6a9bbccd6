//! A request's client-sized fields counted into the plain sizes
//! [`crate::server::limits`] checks: where an OpenAI request meets the
//! limits, before anything is rendered or tokenized for it.

use super::chat_types::{ChatContent, ChatInput, TemplateParams};
use super::types::{CommonParams, OneOrMany};
use crate::server::limits::{CommonSizes, InputSizes, MessageSizes, TemplateSizes};
use crate::text::ChatMessage;

/// The fields every generation route shares (its sampling fields moved in).
pub fn common(common: &CommonParams) -> CommonSizes<'_> {
    let stop: &[String] = match &common.stop {
        None => &[],
        Some(OneOrMany::One(s)) => std::slice::from_ref(s),
        Some(OneOrMany::Many(v)) => v,
    };
    let sampling = &common.sampling;
    CommonSizes {
        model_bytes: common.model.as_ref().map(String::len),
        n: common.n,
        max_tokens: common.max_tokens,
        max_completion_tokens: common.max_completion_tokens,
        stop,
        best_of: sampling.best_of,
        logit_bias: sampling.logit_bias.as_ref().map_or(0, |m| m.len()),
        stop_token_ids: sampling.stop_token_ids.as_ref().map_or(0, Vec::len),
        grammar_bytes: sampling.grammar_bytes(),
    }
}

/// A chat's messages: their count, roles, content parts and tool calls,
/// and the bytes of all their text (contents, reasoning, names, tool-call
/// arguments) together.
pub fn messages(messages: &[ChatInput]) -> MessageSizes {
    let mut sizes = MessageSizes {
        messages: messages.len(),
        role_bytes: Vec::with_capacity(messages.len()),
        ..MessageSizes::default()
    };
    let mut bytes = 0usize;
    let mut add = |n: usize| bytes = bytes.saturating_add(n);
    for m in messages {
        sizes.role_bytes.push(m.role.len());
        add(m.role.len());
        match &m.content {
            None => {}
            Some(ChatContent::Text(t)) => add(t.len()),
            Some(ChatContent::Parts(p)) => {
                sizes.content_parts = sizes.content_parts.saturating_add(p.len());
                for part in p {
                    add(part.kind.len());
                    add(part.text.as_ref().map_or(0, String::len));
                }
            }
        }
        for text in [&m.name, &m.tool_call_id, &m.reasoning_content, &m.reasoning]
            .into_iter()
            .flatten()
        {
            add(text.len());
        }
        for call in m.tool_calls.iter().flatten() {
            sizes.tool_calls += 1;
            add(call.id.as_ref().map_or(0, String::len));
            add(call.function.name.len());
            add(json_bytes(&call.function.arguments));
        }
    }
    sizes.text_bytes = bytes;
    sizes
}

/// Messages built from `/v1/responses` input items.
pub fn input_items(messages: &[ChatMessage]) -> InputSizes {
    let mut sizes = InputSizes {
        items: messages.len(),
        ..InputSizes::default()
    };
    for m in messages {
        sizes.text_bytes = sizes
            .text_bytes
            .saturating_add(m.role.len())
            .saturating_add(m.content.len())
            .saturating_add(m.reasoning.as_ref().map_or(0, String::len));
        for call in m.tool_calls.iter().flatten() {
            sizes.function_calls += 1;
            sizes.text_bytes = sizes
                .text_bytes
                .saturating_add(call.name.len())
                .saturating_add(json_bytes(&call.arguments));
        }
    }
    sizes
}

/// The template's further inputs: the number of tools, and the JSON bytes
/// of tools, documents and template arguments together.
pub fn template(params: &TemplateParams) -> TemplateSizes {
    let tools = params.tools.as_deref().unwrap_or_default();
    let documents = params.documents.as_deref().unwrap_or_default();
    let kwargs = params.chat_template_kwargs.iter().flatten();
    let argument_bytes = tools
        .iter()
        .chain(documents)
        .map(json_bytes)
        .chain(kwargs.map(|(name, value)| name.len() + json_bytes(value)))
        .fold(0usize, usize::saturating_add);
    TemplateSizes {
        tools: tools.len(),
        argument_bytes,
    }
}

/// The length of a value written as compact JSON, without writing it out.
fn json_bytes(value: &minijinja::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A value parsed from JSON always serializes; an error counts as huge.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::errors::ApiError;
    use crate::server::limits::RequestLimits;

    /// Counted, then checked, as the chat route does.
    fn check_messages(l: &RequestLimits, m: &[ChatInput]) -> Result<(), ApiError> {
        l.check_messages(&messages(m))
    }

    /// Counted, then checked, as the chat route does.
    fn check_template_params(l: &RequestLimits, p: &TemplateParams) -> Result<(), ApiError> {
        l.check_template_arguments(&template(p))
    }

    #[test]
    fn messages_are_counted_with_their_parts_and_bytes() {
        let l = RequestLimits::new(1024, Some(16));
        let parse = |v: serde_json::Value| -> Vec<ChatInput> { serde_json::from_value(v).unwrap() };
        let one = serde_json::json!({"role": "user", "content": "hi"});
        let too_many = parse(serde_json::Value::Array(vec![one.clone(); 2049]));
        assert_eq!(
            check_messages(&l, &too_many).unwrap_err().code,
            Some("max_messages")
        );
        let part = serde_json::json!({"type": "text", "text": "a"});
        let parts = parse(serde_json::json!([{"role": "user", "content": vec![part; 2049]}]));
        assert_eq!(
            check_messages(&l, &parts).unwrap_err().code,
            Some("max_content_parts")
        );
        let big = parse(serde_json::json!([{"role": "user", "content": "z".repeat(16 * 1024)}]));
        assert_eq!(
            check_messages(&l, &big).unwrap_err().code,
            Some("max_prompt_bytes")
        );
        let role = parse(serde_json::json!([{"role": "r".repeat(65), "content": "hi"}]));
        assert_eq!(
            check_messages(&l, &role).unwrap_err().code,
            Some("max_role_bytes")
        );
        assert!(check_messages(&l, &parse(serde_json::json!([one]))).is_ok());
        // Tool-call arguments count as message bytes, and calls are counted.
        let call = serde_json::json!({"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "y".repeat(16 * 1024)}});
        let big_call = parse(serde_json::json!([{"role": "assistant", "tool_calls": [call]}]));
        assert_eq!(
            check_messages(&l, &big_call).unwrap_err().code,
            Some("max_prompt_bytes")
        );
        let small = serde_json::json!({"function": {"name": "f", "arguments": "{}"}});
        let calls =
            parse(serde_json::json!([{"role": "assistant", "tool_calls": vec![small; 2049]}]));
        assert_eq!(
            check_messages(&l, &calls).unwrap_err().code,
            Some("max_tool_calls")
        );
    }

    #[test]
    fn tools_and_template_arguments_are_bounded() {
        let l = RequestLimits::new(1024, Some(16));
        let params =
            |v: serde_json::Value| -> TemplateParams { serde_json::from_value(v).unwrap() };
        let tool = serde_json::json!({"type": "function", "function": {"name": "f"}});
        assert!(
            check_template_params(
                &l,
                &params(serde_json::json!({"tools": vec![tool.clone(); 128]}))
            )
            .is_ok()
        );
        assert_eq!(
            check_template_params(&l, &params(serde_json::json!({"tools": vec![tool; 129]})))
                .unwrap_err()
                .code,
            Some("max_tools")
        );
        // 16 KiB of JSON in any of tools, documents or kwargs, together.
        let half = "d".repeat(8 * 1024);
        let over = params(serde_json::json!({
            "documents": [{"text": half}], "chat_template_kwargs": {"k": half}
        }));
        let e = check_template_params(&l, &over).unwrap_err();
        assert_eq!(e.code, Some("max_template_arguments_bytes"));
        let under = params(serde_json::json!({"chat_template_kwargs": {"k": half}}));
        assert!(check_template_params(&l, &under).is_ok());
    }
}
