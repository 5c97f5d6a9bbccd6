//! `sparkrt generate`: one prompt through the engine, text streamed to stdout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::EXIT_DOES_NOT_FIT;
use super::common::{
    ChatTemplateArgs, ModelArgs, ServingArgs, dummy_if_asked, resolve, set_threads,
};
use crate::backend::Backend;
use crate::checkpoint::PageCachePolicy;
use crate::engine::sampling::SamplingParams;
use crate::engine::{Event, FinishReason, Request};
use crate::plan::memory;
use crate::plan::profile::{KvCacheSize, Profile, ValueSource};
use crate::runtime::{Loaded, LoadedModel, RuntimeError};
use crate::text::{ChatMessage, Tokenizer};

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub template: ChatTemplateArgs,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Raw prompt text.
    #[arg(long, group = "input")]
    pub prompt: Option<String>,
    /// A user message, wrapped in the checkpoint's chat template.
    #[arg(long, group = "input")]
    pub chat: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, group = "input", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write the logits of every prompt position (f32 [T, V], key `logits`)
    /// to this safetensors file.
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct GenerateReport {
    prompt_ids: Vec<u32>,
    token_ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// Tokens the KV cache holds, and why that many (`request`: sized to
    /// prompt + max_tokens, rounded up to whole blocks).
    kv_cache_tokens: u64,
    kv_cache_source: &'static str,
    /// Speculative decoding's drafts and how many were kept (absent when
    /// it is off); `target_passes` is the engine's steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<SpeculativeReport>,
}

#[derive(Serialize)]
struct SpeculativeReport {
    method: &'static str,
    num_speculative_tokens: usize,
    #[serde(flatten)]
    drafts: crate::engine::DraftStats,
    target_passes: u64,
}

pub fn run(args: &GenerateArgs) -> Result<ExitCode> {
    set_threads(args.model.threads)?;
    let (dir, mut profile) = resolve(&args.model, &args.serving)?;
    let prompt = prompt_ids(args, &dir)?;
    size_kv_to_request(&mut profile, prompt.len() + args.max_tokens);
    let (dir, _dummy) = dummy_if_asked(&args.model, &dir)?;
    let host = args.model.host();
    let loaded = match LoadedModel::open_with(
        &dir,
        Some(&profile),
        &host,
        PageCachePolicy::Keep,
        &args.model.device_options(),
    ) {
        Err(RuntimeError::DoesNotFit(why)) => {
            eprintln!("error: the plan does not fit this host: {why}");
            return Ok(ExitCode::from(EXIT_DOES_NOT_FIT));
        }
        other => other?,
    };
    match &loaded {
        LoadedModel::Cpu(loaded) => generate(args, prompt, loaded.as_ref()),
        LoadedModel::Cuda(loaded) => generate(args, prompt, loaded.as_ref()),
    }
}

/// Sizes the KV cache to the one request of `tokens` (prompt + max
/// tokens, rounded up to whole blocks) unless the profile or a flag set
/// `kv_cache`: the plan's `max_model_len` becomes that length too, since
/// the plan holds at least one full-length sequence. `kv_cache` buys
/// full-attention tokens; the sliding-window layers' blocks come on top
/// (`plan::memory::sliding_kv`). A request longer than `max_model_len` is
/// left for the engine to refuse, naming it.
fn size_kv_to_request(profile: &mut Profile, tokens: usize) {
    if profile.sources.get("kv_cache") != Some(&ValueSource::Default) {
        return;
    }
    // An MTP head that drafts has a KV layer too.
    let served = profile.served_geometry();
    let s = &mut profile.serving;
    let block = s.kv_block_size.max(1);
    let length = tokens.max(1).div_ceil(block) * block;
    if length > s.max_model_len {
        return;
    }
    let per_token = memory::kv_bytes_per_token(&served, s.kv_cache_dtype.bytes());
    s.max_model_len = length;
    s.kv_cache = KvCacheSize::Bytes(length as u64 * per_token);
    for key in ["kv_cache", "max_model_len"] {
        profile.sources.insert(key, ValueSource::Request);
    }
    tracing::info!(
        "KV cache sized to the request: {length} tokens ({} blocks)",
        length / block
    );
}

/// One prompt through an engine on the loaded model.
fn generate<B: Backend>(
    args: &GenerateArgs,
    prompt: Vec<u32>,
    loaded: &Loaded<B>,
) -> Result<ExitCode> {
    let source = loaded.source();
    let mut engine = loaded.engine(&source)?;

    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        ..SamplingParams::default()
    };
    let (tx, rx) = mpsc::channel();
    engine.add_request(
        Request::new(prompt.clone(), params)
            .with_prompt_logits(args.logits_out.is_some())
            .with_ignore_eos(args.ignore_eos),
        Box::new(tx),
    )?;

    let vocab = engine.vocab_size();
    let mut prompt_logits = vec![
        0f32;
        if args.logits_out.is_some() {
            prompt.len() * vocab
        } else {
            0
        }
    ];
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut finish = FinishReason::Aborted;
    let started = Instant::now();
    let mut first_token_at = None;
    let mut stdout = std::io::stdout();
    'steps: while engine.has_work() {
        engine.step()?;
        while let Ok(event) = rx.try_recv() {
            match event {
                Event::Token {
                    id, text: piece, ..
                } => {
                    first_token_at.get_or_insert_with(Instant::now);
                    tokens.push(id);
                    if !args.json {
                        let _ = stdout.write_all(piece.as_bytes());
                        let _ = stdout.flush();
                    }
                    text.push_str(&piece);
                }
                Event::PromptLogits { first, values } => {
                    let at = first * vocab;
                    if let Some(dst) = prompt_logits.get_mut(at..at + values.len()) {
                        dst.copy_from_slice(&values);
                    }
                }
                Event::Finished {
                    reason, text: rest, ..
                } => {
                    if !args.json {
                        let _ = writeln!(stdout, "{rest}");
                    }
                    text.push_str(&rest);
                    finish = reason;
                    break 'steps;
                }
                Event::PromptLogprob { .. } => {}
                Event::Failed { message } => bail!("generation failed: {message}"),
            }
        }
    }
    let ended = Instant::now();
    let first = first_token_at.unwrap_or(ended);
    let prefill_s = first.duration_since(started).as_secs_f64();
    let decode_s = ended.duration_since(first).as_secs_f64();
    if let Some(path) = &args.logits_out {
        write_logits(path, &prompt_logits, prompt.len(), vocab)?;
    }
    if args.json {
        let report = GenerateReport {
            prompt_ids: prompt.clone(),
            token_ids: tokens.clone(),
            text,
            finish_reason: finish.as_str(),
            prefill_tok_s: rate(prompt.len(), prefill_s),
            decode_tok_s: rate(tokens.len().saturating_sub(1), decode_s),
            kv_cache_tokens: loaded.plan.kv_cache.tokens,
            kv_cache_source: loaded
                .plan
                .sources
                .get("kv_cache")
                .map_or("default", |s| s.name()),
            speculative: engine.limits().speculative.map(|c| SpeculativeReport {
                method: c.method.name(),
                num_speculative_tokens: c.num_speculative_tokens,
                drafts: engine.counters.draft_stats(),
                target_passes: engine.counters.steps.load(Ordering::Relaxed),
            }),
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        eprintln!(
            "[{} prompt tokens, {} generated, {}; prefill {:.1} tok/s, decode {:.1} tok/s]",
            prompt.len(),
            tokens.len(),
            finish.as_str(),
            rate(prompt.len(), prefill_s),
            rate(tokens.len().saturating_sub(1), decode_s)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// The prompt's token ids, read before the model loads so the KV cache
/// can be sized to it.
fn prompt_ids(args: &GenerateArgs, dir: &Path) -> Result<Vec<u32>> {
    if let Some(ids) = &args.prompt_ids {
        return Ok(ids.clone());
    }
    if args.prompt.is_none() && args.chat.is_none() {
        bail!("give a prompt: --prompt TEXT, --chat TEXT or --prompt-ids 1,2,3");
    }
    // `exists`, not `is_file`: a tokenizer.json that is not a file is refused.
    if !dir.join("tokenizer.json").exists() {
        bail!("{} has no tokenizer.json: pass --prompt-ids", dir.display());
    }
    let tokenizer = Tokenizer::from_dir(dir)?;
    if let Some(text) = &args.prompt {
        return Ok(tokenizer.encode(text, false)?);
    }
    let message = args.chat.as_deref().unwrap_or_default();
    let template = match args.template.load(dir)? {
        Some(template) => template,
        None => crate::text::ChatTemplate::from_dir(dir)?,
    };
    let rendered = template.render(&[ChatMessage::new("user", message)], true)?;
    Ok(tokenizer.encode(&rendered, false)?)
}

fn write_logits(path: &Path, logits: &[f32], rows: usize, vocab: usize) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, vocab], &bytes)
            .map_err(|e| anyhow::anyhow!("logits tensor: {e}"))?;
    safetensors::tensor::serialize_to_file([("logits", view)], None, path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
