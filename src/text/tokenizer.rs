//! The checkpoint's tokenizer (`tokenizer.json`, run by HF `tokenizers`) and
//! the token ids that end a generation.

use std::collections::HashMap;
use std::path::Path;

use super::config_files::{
    GENERATION_CONFIG, MODEL_CONFIG, SpecialTokens, TOKENIZER_CONFIG, eos_token_ids_in,
    read_tokenizer_config,
};
use super::error::TextError;
use crate::limits::MAX_TOKENIZER_FILE_BYTES;
use crate::util::files::read_regular;

/// A loaded tokenizer plus the ids that end generation.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_token_ids: Vec<u32>,
    special_tokens: SpecialTokens,
    longest_token_bytes: usize,
    /// The text of every added token marked special, by id (what
    /// `skip_special_tokens` leaves out).
    special_token_texts: HashMap<u32, String>,
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a checkpoint directory, and collects the
    /// end-of-sequence ids from `generation_config.json` (`eos_token_id`, an
    /// integer or a list), `config.json` (the same field) and
    /// `tokenizer_config.json` (`eos_token`, a string). Generation stops on
    /// any of them; each file is optional.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TextError> {
        let path = dir.join("tokenizer.json");
        // Read here (a regular file, bounded) rather than by `from_file`,
        // which would block on a FIFO and read any size.
        let bytes = read_regular(&path, MAX_TOKENIZER_FILE_BYTES).map_err(|source| {
            TextError::TokenizerLoad {
                path: path.clone(),
                source: source.into(),
            }
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|source| TextError::TokenizerLoad { path, source })?;
        drop(bytes);
        let config = read_tokenizer_config(dir)?;

        let mut eos_token_ids = eos_token_ids_in(dir, GENERATION_CONFIG)?;
        eos_token_ids.extend(eos_token_ids_in(dir, MODEL_CONFIG)?);
        if let Some(eos) = &config.special_tokens.eos {
            let id = inner
                .token_to_id(eos)
                .ok_or_else(|| TextError::UnknownEosToken {
                    path: dir.join(TOKENIZER_CONFIG),
                    token: eos.clone(),
                })?;
            eos_token_ids.push(id);
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let longest_token_bytes = longest_token_bytes(&inner);
        let special_token_texts = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (id, token.content))
            .collect();

        Ok(Tokenizer {
            inner,
            eos_token_ids,
            special_tokens: config.special_tokens,
            longest_token_bytes,
            special_token_texts,
        })
    }

    /// Text to ids. `add_special_tokens` applies the tokenizer's post-processor
    /// (a BOS for Llama-style tokenizers, nothing for Qwen's); pass `false` for
    /// a prompt rendered by a chat template, which writes its own.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|source| TextError::Encode { source })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Ids to text, as transformers' `decode` does: bytes that do not form
    /// valid UTF-8 become U+FFFD. Ids the vocabulary does not know (a model's
    /// vocabulary is often padded past the tokenizer's) are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| TextError::Decode { source })
    }

    /// Ids that end generation, sorted, without duplicates (possibly empty).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.binary_search(&id).is_ok()
    }

    /// The special-token strings of `tokenizer_config.json`.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// The text of `id` when it is a special token (an added token marked
    /// `special`, which `skip_special_tokens` leaves out).
    pub fn special_token_text(&self, id: u32) -> Option<&str> {
        self.special_token_texts.get(&id).map(String::as_str)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The longest token of the vocabulary (added tokens included), in
    /// bytes as stored: no token stands for more bytes of text than this, so
    /// a text longer than `n ×` it cannot encode to `n` tokens or fewer.
    /// (The stored form is never shorter than the text a token decodes to:
    /// byte-level vocabularies store each byte as one or two UTF-8 bytes,
    /// SentencePiece's `▁` and `<0x41>` are longer than what they stand for.)
    pub fn longest_token_bytes(&self) -> usize {
        self.longest_token_bytes
    }

    /// The parts of `tokenizer.json` that say which bytes each token stands
    /// for: `decoder`, `added_tokens` and `model.vocab` (not the merges), for
    /// the structured-output grammars' vocabulary.
    pub fn vocabulary_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        let added: Vec<serde_json::Value> = self
            .inner
            .get_added_tokens_decoder()
            .iter()
            .map(|(id, token)| {
                serde_json::json!({"id": id, "content": token.content, "special": token.special})
            })
            .collect();
        Ok(serde_json::json!({
            "decoder": serde_json::to_value(self.inner.get_decoder())?,
            "added_tokens": added,
            "model": {"vocab": self.inner.get_vocab(false)},
        }))
    }

    /// Number of ids the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Computed once at load: the vocabulary is walked once (a copy of its
/// strings, dropped at once).
fn longest_token_bytes(inner: &tokenizers::Tokenizer) -> usize {
    inner
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(0)
}
