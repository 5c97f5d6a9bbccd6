//! The wire shapes of log-probabilities: the request fields that ask for
//! them and the answers, for `/v1/completions` (OpenAI's legacy shape and
//! vLLM's `prompt_logprobs`) and `/v1/chat/completions`. Re-exported by
//! [`super::types`]; filled in by [`super::logprobs`].

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

// ---------------------------------------------------------------- requests

/// The log-probability fields of a completions request.
#[derive(Deserialize, Default)]
pub struct CompletionLogprobParams {
    /// Report each generated token's log-probability with this many
    /// alternatives (0 to 20).
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the text (and, with `logprobs`, its tokens'
    /// log-probabilities, the first one `null`).
    pub echo: Option<bool>,
    /// vLLM's extension: each prompt token's log-probability and rank with
    /// this many alternatives (0 to 20), in `choices[i].prompt_logprobs`.
    pub prompt_logprobs: Option<i64>,
}

/// The log-probability fields of a chat request.
#[derive(Deserialize, Default)]
pub struct ChatLogprobParams {
    /// Report each generated token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`, this many alternatives per token (0 to 20).
    pub top_logprobs: Option<i64>,
}

// ----------------------------------------------------------------- answers

/// A choice's `logprobs`, in its route's shape.
#[derive(Serialize, Debug, PartialEq)]
#[serde(untagged)]
pub enum Logprobs {
    Completion(CompletionLogprobs),
    Chat(ChatLogprobs),
}

/// `/v1/completions`: one entry per token of the choice's text, in four
/// parallel lists. With `echo`, the prompt's tokens come first, the first
/// of them with `null` (it has no context).
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely tokens at each position, most likely first.
    pub top_logprobs: Vec<Option<OrderedMap<f32>>>,
    /// Where each token's text starts in the choice's text, in characters.
    pub text_offset: Vec<usize>,
}

/// `/v1/chat/completions`: one entry per generated token.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The UTF-8 bytes of `token`.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, most likely first.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// vLLM's `prompt_logprobs`: per prompt position (the first `null`), the
/// prompt's token and the most likely alternatives, keyed by token id.
pub type PromptLogprobs = Vec<Option<OrderedMap<PromptLogprob>>>;

#[derive(Serialize, Debug, PartialEq)]
pub struct PromptLogprob {
    pub logprob: f32,
    /// 1 for the most likely token of the position.
    pub rank: usize,
    pub decoded_token: String,
}

/// A JSON object whose keys keep the order they were pushed in (most likely
/// first), which a `BTreeMap` would lose.
#[derive(Debug, Default, PartialEq)]
pub struct OrderedMap<V>(pub Vec<(String, V)>);

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn shapes_are_openais() {
        let completion = Logprobs::Completion(CompletionLogprobs {
            tokens: vec!["a".into(), "b".into()],
            token_logprobs: vec![None, Some(-0.5)],
            top_logprobs: vec![
                None,
                Some(OrderedMap(vec![("z".into(), -0.25), ("b".into(), -0.5)])),
            ],
            text_offset: vec![0, 1],
        });
        let text = serde_json::to_string(&completion).unwrap();
        // Most likely first, as pushed.
        assert!(text.contains(r#"{"z":-0.25,"b":-0.5}"#), "{text}");
        assert_eq!(
            serde_json::to_value(&completion).unwrap(),
            json!({"tokens": ["a", "b"], "token_logprobs": [null, -0.5],
                   "top_logprobs": [null, {"z": -0.25, "b": -0.5}], "text_offset": [0, 1]})
        );
        let chat = Logprobs::Chat(ChatLogprobs {
            content: vec![ChatTokenLogprob {
                token: "é".into(),
                logprob: -1.0,
                bytes: "é".as_bytes().to_vec(),
                top_logprobs: vec![ChatTopLogprob {
                    token: "x".into(),
                    logprob: -0.5,
                    bytes: vec![120],
                }],
            }],
        });
        assert_eq!(
            serde_json::to_value(&chat).unwrap(),
            json!({"content": [{"token": "é", "logprob": -1.0, "bytes": [195, 169],
                   "top_logprobs": [{"token": "x", "logprob": -0.5, "bytes": [120]}]}]})
        );
    }
}
