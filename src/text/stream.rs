//! Incremental detokenization: one id in, the newly completed text out.
//!
//! Decoding token by token and concatenating is wrong in two ways: a UTF-8
//! character split over several tokens (byte-level BPE, byte-fallback
//! `<0xE2>` tokens) decodes to U+FFFD until its last byte arrives, and some
//! decoders treat the first token of a sequence specially (SentencePiece
//! strips its leading space). So each step decodes a short *window*: a few
//! tokens already emitted (the context, decoded again only so that the next
//! tokens decode as they would in the full sequence) followed by the pending
//! tokens, and emits what the window's text adds beyond the context's text,
//! but only once the text does not end in U+FFFD, i.e. no character is still
//! incomplete. The emitted chunks then concatenate to the full decode.
//!
//! Special tokens: with `skip_special_tokens` a special token never enters
//! the window (as `tokenizers`' own decode filters it out before its
//! decoder runs), and [`StreamDecoder::push`] hands its text back apart, as
//! [`Decoded::hidden`], so output parsers can still act on it (gpt-oss's
//! harmony tokens are special) while the client does not see it. Without
//! it, special tokens are decoded in place, verbatim.
//!
//! `spaces_between_special_tokens` (vLLM's field): a `tokenizer.json`
//! tokenizer writes added tokens verbatim, with no space around them, which
//! is what transformers' fast tokenizers and vLLM's fast detokenizer give
//! for either value (only transformers' slow, Python tokenizers put spaces
//! there). The value is accepted and changes nothing here.

use super::error::TextError;
use super::tokenizer::Tokenizer;

/// After this many pending tokens the window is emitted even if its text
/// still ends in U+FFFD. A real character needs at most 4 byte tokens, so
/// only a model producing invalid bytes gets here; the cap keeps each step's
/// decode short instead of growing with the sequence.
const MAX_PENDING_TOKENS: usize = 16;

const REPLACEMENT_CHAR: char = '\u{FFFD}';

/// What one id adds to the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Text the id completes, as the client sees it.
    pub text: String,
    /// The id's own text when it is a special token left out of `text`.
    pub hidden: Option<String>,
}

/// Turns a stream of token ids into text chunks that never change afterwards.
///
/// Feed every generated id to [`push`](Self::push), then call
/// [`finish`](Self::finish) once to get what was still held back.
#[derive(Clone, Debug)]
pub struct StreamDecoder {
    skip_special_tokens: bool,
    /// Context tokens (`..emitted`) followed by pending tokens.
    window: Vec<u32>,
    /// How many tokens at the start of `window` were already emitted.
    emitted: usize,
}

impl StreamDecoder {
    pub fn new(skip_special_tokens: bool) -> StreamDecoder {
        StreamDecoder {
            skip_special_tokens,
            window: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds one id; returns the text it completes (often empty: a partial
    /// character, or a special token that is skipped, whose text is then in
    /// [`Decoded::hidden`]).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Decoded, TextError> {
        if self.skip_special_tokens
            && let Some(special) = tokenizer.special_token_text(id)
        {
            return Ok(Decoded {
                text: String::new(),
                hidden: Some(special.to_owned()),
            });
        }
        let text = self.push_text_token(tokenizer, id)?;
        Ok(Decoded { text, hidden: None })
    }

    /// `push` for an id that enters the window.
    fn push_text_token(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TextError> {
        self.window.push(id);
        let (context_text, text) = self.decode_window(tokenizer)?;
        let pending = self.window.len() - self.emitted;
        if text.ends_with(REPLACEMENT_CHAR) && pending < MAX_PENDING_TOKENS {
            return Ok(String::new());
        }
        let new_text = &text[common_prefix_len(&context_text, &text)..];
        if new_text.is_empty() {
            return Ok(String::new());
        }
        let new_text = new_text.to_owned();
        // The tokens just emitted become the context of the next window.
        self.window.drain(..self.emitted);
        self.emitted = self.window.len();
        Ok(new_text)
    }

    /// Ends the stream: returns the text still held back (an incomplete
    /// character becomes U+FFFD, as in a full decode) and resets the decoder.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TextError> {
        let (context_text, text) = self.decode_window(tokenizer)?;
        let rest = text[common_prefix_len(&context_text, &text)..].to_owned();
        self.window.clear();
        self.emitted = 0;
        Ok(rest)
    }

    /// Decodes the context alone and the whole window (skipped special
    /// tokens never enter it: the rest is decoded as it is).
    fn decode_window(&self, tokenizer: &Tokenizer) -> Result<(String, String), TextError> {
        let context = tokenizer.decode(&self.window[..self.emitted], false)?;
        let text = tokenizer.decode(&self.window, false)?;
        Ok((context, text))
    }
}

/// Length in bytes of the longest common prefix of `a` and `b`, on a
/// character boundary of both.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::common_prefix_len;

    #[test]
    fn common_prefix_stops_at_first_differing_character() {
        assert_eq!(common_prefix_len("abc", "abd"), 2);
        assert_eq!(common_prefix_len("ab", "abc"), 2);
        assert_eq!(common_prefix_len("abc", "ab"), 2);
        assert_eq!(common_prefix_len("", "x"), 0);
        // 'é' and 'ê' share their first UTF-8 byte: the prefix must not split it.
        assert_eq!(common_prefix_len("aé", "aê"), 1);
        assert_eq!(common_prefix_len("€x", "€y"), 3);
    }
}
