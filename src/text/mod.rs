//! Text in and out: the tokenizer, the chat template, streaming detokenization
//! and stop strings.
//!
//! Everything here reads the files a Hugging Face checkpoint ships
//! (`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`,
//! `config.json`) and nothing else.
//!
//! How the pieces fit in a generation loop:
//! 1. [`ChatTemplate::render`] turns chat messages into a prompt string;
//! 2. [`Tokenizer::encode`] turns it into ids (with `add_special_tokens =
//!    false` for a rendered chat prompt: the template already wrote them);
//! 3. each sampled id goes through a [`StreamDecoder`], which yields only text
//!    that no later token can change;
//! 4. that text goes through a [`StopMatcher`], which holds back what could
//!    still become a stop string and says when one completed.
mod chat;
mod config_files;
mod error;
pub mod generation_config;
pub mod parsers;
mod python_json;
pub mod render_limits;
pub mod render_worker;
pub mod render_worker_main;
mod stop;
mod stream;
pub mod tokenizer;

pub use chat::{ChatMessage, ChatPrompt, ChatTemplate, ToolCall};
pub use config_files::SpecialTokens;
pub use error::TextError;
pub use generation_config::GenerationDefaults;
pub use render_limits::{RenderLimits, TemplateLimit};
pub use stop::{StopMatcher, StopStep};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
