//! The wire shapes of vLLM's `POST /tokenize` and `POST /detokenize`.
//! Re-exported by [`super::types`].

use serde::{Deserialize, Serialize};

use super::chat_types::ChatInput;
use super::unsupported::{RequestBody, Unsupported};

/// The body of `POST /tokenize`: a `prompt`, or chat `messages` rendered by
/// the model's template first.
#[derive(Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatInput>>,
    /// Default: true for a prompt, false for messages (the template writes
    /// its own), as in vLLM.
    pub add_special_tokens: Option<bool>,
    /// Messages only; default true.
    pub add_generation_prompt: Option<bool>,
    /// Also answer each token's string.
    pub return_token_strs: Option<bool>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// The body of `POST /detokenize`.
#[derive(Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

#[derive(Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

impl RequestBody for TokenizeRequest {
    fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }
}

impl RequestBody for DetokenizeRequest {
    fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }
}
