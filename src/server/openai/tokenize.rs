//! vLLM's `POST /tokenize` (a prompt, or chat messages through the model's
//! template) and `POST /detokenize`, bounded like the generation routes: the
//! body limit, the prompt and message limits, and the preparation pool.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;

use super::handlers::{check_model, encode, parse_body, render_messages};
use super::logprobs::token_name;
use super::types::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use crate::server::body;
use crate::server::errors::ApiError;
use crate::server::state::ServerState;

pub async fn tokenize(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let bytes = body::read(&headers, body, state.request_limits.max_body_bytes).await?;
    let job_state = Arc::clone(&state);
    let answer = state
        .prep
        .run(bytes.len(), move || tokenize_body(&job_state, &bytes))
        .await??;
    Ok(Json(answer))
}

fn tokenize_body(state: &ServerState, bytes: &[u8]) -> Result<TokenizeResponse, ApiError> {
    let body: TokenizeRequest = parse_body(bytes)?;
    check_model(state, body.model.as_deref())?;
    let tokenizer = state
        .config
        .tokenizer
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no tokenizer", None))?;
    let (text, add_special_tokens) = match (body.prompt, body.messages) {
        (Some(prompt), None) => (prompt, body.add_special_tokens.unwrap_or(true)),
        (None, Some(messages)) => {
            let add_generation_prompt = body.add_generation_prompt.unwrap_or(true);
            let rendered = render_messages(state, messages, add_generation_prompt)?;
            (rendered, body.add_special_tokens.unwrap_or(false))
        }
        _ => {
            return Err(ApiError::invalid(
                "send exactly one of `prompt` and `messages`",
                Some("prompt"),
            ));
        }
    };
    let tokens = if add_special_tokens {
        state.request_limits.check_prompt_bytes(text.len())?;
        tokenizer.encode(&text, true).map_err(|e| {
            ApiError::invalid(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
        })?
    } else {
        encode(state, &text)?
    };
    let token_strs = body.return_token_strs.unwrap_or(false).then(|| {
        tokens
            .iter()
            .map(|&id| token_name(Some(tokenizer), id))
            .collect()
    });
    Ok(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.config.limits.max_model_len,
        tokens,
        token_strs,
    })
}

pub async fn detokenize(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let bytes = body::read(&headers, body, state.request_limits.max_body_bytes).await?;
    let job_state = Arc::clone(&state);
    let answer = state
        .prep
        .run(bytes.len(), move || detokenize_body(&job_state, &bytes))
        .await??;
    Ok(Json(answer))
}

fn detokenize_body(state: &ServerState, bytes: &[u8]) -> Result<DetokenizeResponse, ApiError> {
    let body: DetokenizeRequest = parse_body(bytes)?;
    check_model(state, body.model.as_deref())?;
    state.request_limits.check_prompt_ids(body.tokens.len())?;
    let tokenizer = state
        .config
        .tokenizer
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no tokenizer", None))?;
    // The tokenizer would skip an id it does not know and answer the rest:
    // refused as completions refuse it, naming the id.
    let vocab = tokenizer.vocab_size();
    if let Some(&id) = body.tokens.iter().find(|&&id| id as usize >= vocab) {
        let refused = crate::engine::AdmissionError::TokenOutOfRange { id, vocab };
        return Err(ApiError::invalid(refused.to_string(), Some("tokens")));
    }
    let prompt = tokenizer
        .decode(&body.tokens, false)
        .map_err(|e| ApiError::invalid(format!("cannot decode the tokens: {e}"), Some("tokens")))?;
    Ok(DetokenizeResponse { prompt })
}
