//! Scripted checkpoints: tiny models whose greedy output is a chosen token
//! sequence (a `<think>` block, a harmony tool call, ...), for end-to-end
//! tests of the output parsers. Random weights never write such things.
//!
//! `sparkrt make-checkpoint --script FILE --out DIR`, or [`write_scripted`].
//! The script (JSON):
//! ```json
//! {"family": "qwen3" | "gpt_oss",
//!  "chat_template_file": "qwen3.jinja",      // relative to the script
//!  "output": ["<think>", "\nI greet.\n", "</think>", "\n\nHello!", "<|im_end|>"],
//!  "after": ["\n"]}                          // optional
//! ```
//! Every `output` string becomes one token: the family's special tokens are
//! in the tokenizer already (Qwen3's `<|im_start|>`, `<think>`,
//! `<tool_call>`, ...; harmony's `<|start|>`, `<|channel|>`, ...), any other
//! string is added to it whole (a JSON argument object, a sentence). The
//! last one must end generation (`<|im_end|>`; `<|return|>` or `<|call|>`).
//! The model writes `output` after any prompt whose last token is one of
//! `after` (each also a whole token; default: the last token of the
//! template's generation prompt for one user message "Hi"). A prompt must
//! not contain the script's marker tokens (see below; the command prints
//! them).
//! The files are what transformers loads: `config.json`,
//! `generation_config.json`, `tokenizer.json` (byte-level BPE over the 256
//! bytes plus the added tokens), `tokenizer_config.json` with the template,
//! `model.safetensors`.
//!
//! # The construction (and why greedy decoding follows the script)
//! One layer. Its attention output projection and every expert's down
//! projection write nothing but what is described below, so the residual
//! stream is the token's embedding `e_t` plus the attention's "phase"
//! components. Embeddings use orthogonal coordinates: a constant `1`, a
//! one-hot coordinate for every token that has a successor in the script,
//! and per marker `m` a flag (1 on `m` only) and two phase coordinates
//! `seen_m`/`unseen_m` (0/1 in every embedding), plus a padding coordinate
//! that gives every embedding the same norm.
//!
//! A token may repeat in a script (harmony writes `<|channel|>` again after
//! the reasoning) with a different successor; then the model needs to know
//! where it is. Attention head `m` does that: its query is constant (from
//! the constant coordinate), its key is non-zero only on marker `m`, placed
//! on RoPE's slowest-turning pair (so the score does not depend on
//! positions), and large (≈ 32): once `m` has appeared, the head attends to
//! it alone and its value, through the output projection, moves one from
//! `unseen_m` to `seen_m`; before, every key is zero, every value is zero,
//! and the head adds nothing. Markers are tokens the script writes once and
//! the template never writes (so no prompt holds them), chosen where a
//! repeated token needs one.
//!
//! The head's row for token `v` is `α` on the one-hot coordinate of each
//! token `v` follows, and `-γ` on `unseen_m` (or `seen_m`) for each marker
//! that has (has not) been seen every time `v` comes next. After the final
//! RMS norm (which scales all logits of a position alike), the correct next
//! token scores `α`, a token that follows the same token in another phase
//! at most `α - γ`, any other `≤ 0`. The builder checks this for every
//! position of the script and refuses a script it cannot realize, naming
//! the token.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::checkpoint::check::expected_tensors;
use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::synthetic::{shape_of, write_tensor_file};
use crate::limits::MAX_SMALL_FILE_BYTES;
use crate::text::{ChatMessage, ChatTemplate, SpecialTokens};
use crate::util::files::read_regular_to_string;

/// Most tokens a script may hold (the model has a coordinate per token).
pub const MAX_SCRIPT_TOKENS: usize = 512;

/// The model families a script can be written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `qwen3_moe`, chatml special tokens, `<think>` and `<tool_call>`.
    Qwen3,
    /// `gpt_oss`, harmony special tokens.
    GptOss,
}

/// A script as read from its file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub family: Family,
    /// The chat template, relative to the script's folder.
    pub chat_template_file: PathBuf,
    pub output: Vec<String>,
    #[serde(default)]
    pub after: Option<Vec<String>>,
}

/// Why a script cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid script: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the script's `output` must hold 1 to {MAX_SCRIPT_TOKENS} tokens, not {0}")]
    Length(usize),
    #[error("the script's last token {0:?} does not end generation (use one of {1:?})")]
    NoEnd(String, &'static [&'static str]),
    #[error("the script ends generation early with {0:?}: only its last token may")]
    EarlyEnd(String),
    #[error("{0:?} is not one token of the tokenizer")]
    NotOneToken(String),
    #[error("token {0:?} would not decode to itself with a byte-level tokenizer")]
    Undecodable(String),
    #[error(
        "token {token:?} is followed by {first:?} and later by {second:?} with no marker between \
         (a token the script writes once and the template never writes); add one"
    )]
    Ambiguous {
        token: String,
        first: String,
        second: String,
    },
    #[error(
        "after {token:?} the model could write {other:?} as well as {wanted:?}: the script cannot \
         be realized by this construction (vary the tokens)"
    )]
    Unresolvable {
        token: String,
        wanted: String,
        other: String,
    },
    #[error("the chat template: {0}")]
    Template(#[from] crate::text::TextError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl Family {
    fn special_tokens(self) -> &'static [&'static str] {
        match self {
            Family::Qwen3 => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            Family::GptOss => &[
                "<|startoftext|>",
                "<|endoftext|>",
                "<|start|>",
                "<|channel|>",
                "<|message|>",
                "<|end|>",
                "<|call|>",
                "<|return|>",
                "<|constrain|>",
            ],
        }
    }

    /// Added tokens that are not special (Qwen3 keeps these in the text).
    fn plain_added_tokens(self) -> &'static [&'static str] {
        match self {
            Family::Qwen3 => &[
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
            ],
            Family::GptOss => &[],
        }
    }

    fn end_tokens(self) -> &'static [&'static str] {
        match self {
            Family::Qwen3 => &["<|im_end|>", "<|endoftext|>"],
            Family::GptOss => &["<|return|>", "<|call|>", "<|endoftext|>"],
        }
    }

    fn eos_token(self) -> &'static str {
        match self {
            Family::Qwen3 => "<|im_end|>",
            Family::GptOss => "<|return|>",
        }
    }
}

/// Reads a script file.
pub fn read_script(path: &Path) -> Result<(Script, String), ScriptError> {
    let read = |path: &Path| {
        read_regular_to_string(path, MAX_SMALL_FILE_BYTES).map_err(|source| ScriptError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let text = read(path)?;
    let script: Script = serde_json::from_str(&text).map_err(|source| ScriptError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let template = read(&base.join(&script.chat_template_file))?;
    Ok((script, template))
}

/// What was built, for tests and the command's message.
#[derive(Clone, Debug)]
pub struct Scripted {
    /// The script's tokens as ids.
    pub output_ids: Vec<u32>,
    /// The tokens chosen as markers (see the module doc).
    pub markers: Vec<String>,
}

/// Builds the checkpoint of `script` (with template text `template`) in `out`.
pub fn write_scripted(
    script: &Script,
    template: &str,
    out: &Path,
) -> Result<Scripted, ScriptError> {
    let family = script.family;
    let n = script.output.len();
    if n == 0 || n > MAX_SCRIPT_TOKENS {
        return Err(ScriptError::Length(n));
    }
    let last = &script.output[n - 1];
    if !family.end_tokens().contains(&last.as_str()) {
        return Err(ScriptError::NoEnd(last.clone(), family.end_tokens()));
    }
    // An end token before the last would stop generation there.
    if let Some(early) = script.output[..n - 1]
        .iter()
        .find(|s| family.end_tokens().contains(&s.as_str()))
    {
        return Err(ScriptError::EarlyEnd(early.clone()));
    }
    std::fs::create_dir_all(out).map_err(|source| CheckpointError::Io {
        path: out.to_path_buf(),
        source,
    })?;

    // The tokenizer: bytes, the family's tokens, the script's strings.
    let byte_chars = byte_level_alphabet();
    let mut added: Vec<(String, bool)> = Vec::new();
    for s in family.special_tokens() {
        added.push(((*s).to_owned(), true));
    }
    for s in family.plain_added_tokens() {
        added.push(((*s).to_owned(), false));
    }
    let single_byte = |s: &str| s.len() == 1;
    // `after` strings too: a prompt ending with one then ends with its token.
    let after = script.after.iter().flatten();
    for s in script.output.iter().chain(after) {
        if !single_byte(s) && !added.iter().any(|(a, _)| a == s) {
            added.push((s.clone(), false));
        }
    }
    let tokenizer_json = tokenizer_json(&byte_chars, &added);
    let tokenizer_text = tokenizer_json.to_string();
    let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer_text.as_bytes())
        .map_err(|e| ScriptError::Tokenizer(e.to_string()))?;
    let one_token = |s: &str| -> Result<u32, ScriptError> {
        let ids = tokenizer
            .encode(s, false)
            .map_err(|e| ScriptError::Tokenizer(e.to_string()))?;
        match ids.get_ids() {
            [id] => Ok(*id),
            _ => Err(ScriptError::NotOneToken(s.to_owned())),
        }
    };
    let mut output_ids = Vec::with_capacity(n);
    for s in &script.output {
        let id = match tokenizer.token_to_id(s) {
            Some(id) => id,
            None => one_token(s)?,
        };
        let decoded = tokenizer
            .decode(&[id], false)
            .map_err(|e| ScriptError::Tokenizer(e.to_string()))?;
        if decoded != *s {
            return Err(ScriptError::Undecodable(s.clone()));
        }
        output_ids.push(id);
    }

    // The template and the prompt's last token.
    let special = SpecialTokens {
        bos: None,
        eos: Some(family.eos_token().to_owned()),
        pad: Some("<|endoftext|>".to_owned()),
        unk: None,
    };
    let triggers: Vec<u32> = match &script.after {
        Some(list) => list
            .iter()
            .map(|s| one_token(s))
            .collect::<Result<_, _>>()?,
        None => {
            let chat = ChatTemplate::from_source(template.to_owned(), special.clone())?;
            let prompt = chat.render(&[ChatMessage::new("user", "Hi")], true)?;
            let ids = tokenizer
                .encode(prompt.as_str(), false)
                .map_err(|e| ScriptError::Tokenizer(e.to_string()))?;
            vec![
                *ids.get_ids()
                    .last()
                    .ok_or_else(|| ScriptError::NotOneToken(prompt.clone()))?,
            ]
        }
    };

    let name = |id: u32| tokenizer.id_to_token(id).unwrap_or_default();
    let specials: BTreeSet<u32> = family
        .special_tokens()
        .iter()
        .filter_map(|s| tokenizer.token_to_id(s))
        .collect();
    let table = Table::build(
        &triggers,
        &output_ids,
        &script.output,
        template,
        &specials,
        &name,
    )?;

    // Geometry and weights.
    let vocab = tokenizer.get_vocab_size(true).div_ceil(64) * 64;
    let layout = Layout::new(&table);
    let config = config_json(family, &layout, vocab, &tokenizer);
    let io = |path: PathBuf, source: std::io::Error| CheckpointError::Io { path, source };
    let write = |file: &str, text: String| {
        let path = out.join(file);
        std::fs::write(&path, text).map_err(|e| io(path.clone(), e))
    };
    write(
        "config.json",
        serde_json::to_string_pretty(&config).unwrap_or_default(),
    )?;
    let eos_ids: Vec<u32> = family
        .end_tokens()
        .iter()
        .filter_map(|s| tokenizer.token_to_id(s))
        .collect();
    write(
        "generation_config.json",
        json!({"eos_token_id": eos_ids, "do_sample": false}).to_string(),
    )?;
    write("tokenizer.json", tokenizer_text)?;
    write(
        "tokenizer_config.json",
        serde_json::to_string_pretty(&json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": family.eos_token(),
            "pad_token": "<|endoftext|>",
            "bos_token": null,
            "model_max_length": 4096,
            "chat_template": template,
        }))
        .unwrap_or_default(),
    )?;
    let model_config = ModelConfig::parse(&config.to_string(), &out.join("config.json"), None)?;
    let tensors = weights(&model_config, &layout, &table, vocab);
    write_tensor_file(&out.join("model.safetensors"), &tensors)?;
    Ok(Scripted {
        output_ids,
        markers: table.markers.iter().map(|&m| name(m)).collect(),
    })
}

/// The next-token table of a script: which token follows which, in which
/// phase (the set of markers seen).
struct Table {
    /// Tokens with a successor (each gets a one-hot coordinate).
    prevs: Vec<u32>,
    markers: Vec<u32>,
    /// For each token that comes next: the tokens it follows, and per
    /// marker whether it must have been seen (`Some(true)`), must not
    /// (`Some(false)`), or does not matter (`None`).
    rows: BTreeMap<u32, (BTreeSet<u32>, Vec<Option<bool>>)>,
}

impl Table {
    fn build(
        triggers: &[u32],
        output: &[u32],
        strings: &[String],
        template: &str,
        specials: &BTreeSet<u32>,
        name: &dyn Fn(u32) -> String,
    ) -> Result<Table, ScriptError> {
        // Candidates: written once, not special, text absent from the template.
        let count = |id: u32| output.iter().filter(|&&t| t == id).count();
        let candidate = |k: usize| {
            let id = output[k];
            k + 1 < output.len()
                && count(id) == 1
                && !specials.contains(&id)
                && !triggers.contains(&id)
                && !template.contains(strings[k].as_str())
        };
        // Positions: (token, position in output) for trigger and each output
        // token but the last; next is output[k].
        let mut markers: Vec<usize> = Vec::new(); // positions in output
        loop {
            let phase = |k: usize| -> Vec<bool> {
                // Phase before writing output[k] (after output[..k]).
                markers.iter().map(|&m| m < k).collect()
            };
            let mut seen: BTreeMap<(u32, Vec<bool>), (usize, u32)> = BTreeMap::new();
            let mut conflict = None;
            'states: for k in 0..output.len() {
                let prevs: Vec<u32> = if k == 0 {
                    triggers.to_vec()
                } else {
                    vec![output[k - 1]]
                };
                for prev in prevs {
                    let key = (prev, phase(k));
                    match seen.get(&key) {
                        Some(&(at, next)) if next != output[k] => {
                            conflict = Some((at, k, prev, next));
                            break 'states;
                        }
                        Some(_) => {}
                        None => {
                            seen.insert(key, (k, output[k]));
                        }
                    }
                }
            }
            let Some((first, second, prev, first_next)) = conflict else {
                break;
            };
            // A marker written after the first state and before the second.
            match (first..second).find(|&k| candidate(k) && !markers.contains(&k)) {
                Some(k) => markers.push(k),
                None => {
                    return Err(ScriptError::Ambiguous {
                        token: name(prev),
                        first: name(first_next),
                        second: name(output[second]),
                    });
                }
            }
        }
        markers.sort_unstable();
        let marker_ids: Vec<u32> = markers.iter().map(|&k| output[k]).collect();

        // Rows: for each next token, what it follows and the phase it needs.
        let mut states: Vec<(u32, Vec<bool>, u32)> = Vec::new();
        for k in 0..output.len() {
            let phase: Vec<bool> = markers.iter().map(|&m| m < k).collect();
            if k == 0 {
                for &t in triggers {
                    states.push((t, phase.clone(), output[0]));
                }
            } else {
                states.push((output[k - 1], phase, output[k]));
            }
        }
        let mut rows: BTreeMap<u32, (BTreeSet<u32>, Vec<Option<bool>>)> = BTreeMap::new();
        for (prev, phase, next) in &states {
            let row = rows
                .entry(*next)
                .or_insert_with(|| (BTreeSet::new(), phase.iter().map(|&p| Some(p)).collect()));
            row.0.insert(*prev);
            for (need, &p) in row.1.iter_mut().zip(phase) {
                if *need != Some(p) {
                    *need = None;
                }
            }
        }
        // Every state: no other row may follow the same token with its
        // phase needs met (it would tie).
        for (prev, phase, next) in &states {
            for (other, (follows, needs)) in &rows {
                if other == next || !follows.contains(prev) {
                    continue;
                }
                let met = needs
                    .iter()
                    .zip(phase)
                    .all(|(need, &p)| need.is_none_or(|n| n == p));
                if met {
                    return Err(ScriptError::Unresolvable {
                        token: name(*prev),
                        wanted: name(*next),
                        other: name(*other),
                    });
                }
            }
        }
        let prevs: BTreeSet<u32> = states.iter().map(|s| s.0).collect();
        Ok(Table {
            prevs: prevs.into_iter().collect(),
            markers: marker_ids,
            rows,
        })
    }
}

/// Which coordinate of the hidden state holds what.
struct Layout {
    hidden: usize,
    heads: usize,
    /// Token id → its one-hot coordinate.
    onehot: BTreeMap<u32, usize>,
    /// Per marker: (flag, seen, unseen) coordinates.
    marker_dims: Vec<(usize, usize, usize)>,
    pad: usize,
    /// The norm every embedding has.
    norm: f32,
}

const CONST: usize = 0;
const HEAD_DIM: usize = 64;
/// RoPE's slowest-turning pair is (HEAD_DIM/2 - 1, HEAD_DIM - 1): a query
/// and key there keep their dot product over any distance in a prompt.
const ROPE_SLOW: usize = HEAD_DIM / 2 - 1;
/// Logit of the right next token, and the penalty of a phase mismatch.
const ALPHA: f32 = 4.0;
const GAMMA: f32 = 2.0;
/// Attention score of a marker (before softmax): e^32 outweighs any prompt.
const SCORE: f32 = 32.0;

impl Layout {
    fn new(table: &Table) -> Layout {
        let mut next: usize = 2; // 0: constant, 1: padding
        let mut onehot = BTreeMap::new();
        for &t in &table.prevs {
            onehot.insert(t, next);
            next += 1;
        }
        let mut marker_dims = Vec::new();
        for _ in &table.markers {
            marker_dims.push((next, next + 1, next + 2));
            next += 3;
        }
        let hidden = next.div_ceil(64).max(1) * 64;
        // Squared norm before padding, at most: constant, one-hot, flag,
        // every `unseen` coordinate.
        let norm_sq = 3 + table.markers.len();
        Layout {
            hidden,
            heads: table.markers.len().max(1),
            onehot,
            marker_dims,
            pad: 1,
            norm: (norm_sq as f32).sqrt(),
        }
    }

    fn embedding(&self, table: &Table, token: u32) -> Vec<f32> {
        let mut e = vec![0.0f32; self.hidden];
        e[CONST] = 1.0;
        if let Some(&d) = self.onehot.get(&token) {
            e[d] = 1.0;
        }
        for (i, &(flag, _seen, unseen)) in self.marker_dims.iter().enumerate() {
            e[unseen] = 1.0;
            if table.markers[i] == token {
                e[flag] = 1.0;
            }
        }
        let rest: f32 = e.iter().map(|x| x * x).sum();
        e[self.pad] = (self.norm * self.norm - rest).max(0.0).sqrt();
        e
    }

    /// The attention input's scale: RMS norm (weight 1) of a vector of norm
    /// `norm` in `hidden` coordinates multiplies it by this.
    fn input_scale(&self) -> f32 {
        (self.hidden as f32).sqrt() / self.norm
    }
}

fn config_json(
    family: Family,
    layout: &Layout,
    vocab: usize,
    tokenizer: &tokenizers::Tokenizer,
) -> Value {
    let eos: Vec<u32> = family
        .end_tokens()
        .iter()
        .filter_map(|s| tokenizer.token_to_id(s))
        .collect();
    let pad = tokenizer.token_to_id("<|endoftext|>");
    match family {
        Family::Qwen3 => json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "decoder_sparse_step": 1,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": layout.hidden,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "max_position_embeddings": 4096,
            "max_window_layers": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 32,
            "norm_topk_prob": true,
            "num_attention_heads": layout.heads,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 1,
            "num_key_value_heads": layout.heads,
            "output_router_logits": false,
            "rms_norm_eps": 1e-6,
            "rope_scaling": null,
            "rope_theta": 1_000_000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.55.0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": vocab,
        }),
        Family::GptOss => json!({
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": true,
            "attention_dropout": 0.0,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "experts_per_token": 2,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": layout.hidden,
            "initial_context_length": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "layer_types": ["full_attention"],
            "max_position_embeddings": 4096,
            "num_attention_heads": layout.heads,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 1,
            "num_key_value_heads": layout.heads,
            "num_local_experts": 4,
            "output_router_logits": false,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": false,
                "original_max_position_embeddings": 4096
            },
            "rope_theta": 150000,
            "router_aux_loss_coef": 0.9,
            "sliding_window": 128,
            "swiglu_limit": 7.0,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.55.0",
            "use_cache": true,
            "vocab_size": vocab,
            // sparkrt reads gpt-oss experts in MXFP4 (as the checkpoints
            // ship); zero blocks are zero weights.
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head"
                ]
            },
        }),
    }
}

/// Every tensor the config expects: zeros, but for the embeddings, the
/// norms (ones), the attention that computes the phase, and the head.
fn weights(
    config: &ModelConfig,
    layout: &Layout,
    table: &Table,
    vocab: usize,
) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let h = layout.hidden;
    let s = layout.input_scale();
    let qwen = config.geometry.architecture == crate::geometry::Architecture::Qwen3Moe;
    let mut out = Vec::new();
    for (name, expected) in expected_tensors(config) {
        if !expected.required {
            continue;
        }
        let shape = shape_of(&expected);
        let len: usize = shape.iter().product::<usize>().max(1);
        let mut values = vec![0.0f32; len];
        let short = name.strip_prefix("model.layers.0.").unwrap_or(&name);
        match short {
            "model.embed_tokens.weight" => {
                for token in 0..vocab.min(shape[0]) {
                    let e = layout.embedding(table, token as u32);
                    values[token * h..(token + 1) * h].copy_from_slice(&e);
                }
            }
            "lm_head.weight" => {
                for (&next, (follows, needs)) in &table.rows {
                    let row = &mut values[next as usize * h..(next as usize + 1) * h];
                    for prev in follows {
                        if let Some(&d) = layout.onehot.get(prev) {
                            row[d] = ALPHA;
                        }
                    }
                    for (need, &(_, seen, unseen)) in needs.iter().zip(&layout.marker_dims) {
                        match need {
                            Some(true) => row[unseen] = -GAMMA,
                            Some(false) => row[seen] = -GAMMA,
                            None => {}
                        }
                    }
                }
            }
            n if n.ends_with("norm.weight") && !n.contains("q_norm") && !n.contains("k_norm") => {
                values.fill(1.0);
            }
            // q/k norms (Qwen3): the normalized query and key are 8·2 = 16
            // on the slow pair, scored 16·16/√64 = 32.
            "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => values.fill(2.0),
            // gpt-oss: no q/k norm; query 16 and key 16, scored 16·16/8 = 32.
            "self_attn.q_proj.weight" => {
                let q = if qwen {
                    1.0
                } else {
                    SCORE.sqrt() * (HEAD_DIM as f32).powf(0.25)
                };
                for head in 0..layout.heads {
                    values[(head * HEAD_DIM + ROPE_SLOW) * h + CONST] = q / s;
                }
            }
            "self_attn.k_proj.weight" => {
                let k = if qwen {
                    1.0
                } else {
                    SCORE.sqrt() * (HEAD_DIM as f32).powf(0.25)
                };
                for (head, &(flag, _, _)) in layout.marker_dims.iter().enumerate() {
                    values[(head * HEAD_DIM + ROPE_SLOW) * h + flag] = k / s;
                }
            }
            "self_attn.v_proj.weight" => {
                for (head, &(flag, _, _)) in layout.marker_dims.iter().enumerate() {
                    values[(head * HEAD_DIM) * h + flag] = 1.0 / s;
                }
            }
            "self_attn.o_proj.weight" => {
                let cols = layout.heads * HEAD_DIM;
                for (head, &(_, seen, unseen)) in layout.marker_dims.iter().enumerate() {
                    values[seen * cols + head * HEAD_DIM] = 1.0;
                    values[unseen * cols + head * HEAD_DIM] = -1.0;
                }
            }
            // Sinks (gpt-oss) far below every score: they take no weight.
            "self_attn.sinks" => values.fill(-100.0),
            _ => {}
        }
        let bytes = match expected.dtype {
            Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            // MXFP4 experts: code 0 is 0.0 whatever the scale (2^0 here).
            Dtype::U8 if name.ends_with("_scales") => vec![127u8; len],
            Dtype::U8 => vec![0u8; len],
            _ => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
        };
        out.push((name, expected.dtype, shape, bytes));
    }
    out
}

/// GPT-2's byte-level alphabet: the character each byte is written as.
fn byte_level_alphabet() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

/// A byte-level BPE `tokenizer.json`: the 256 byte tokens (ids 0..256, no
/// merges) and the added tokens after them.
fn tokenizer_json(byte_chars: &[char], added: &[(String, bool)]) -> Value {
    let vocab: serde_json::Map<String, Value> = byte_chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), json!(i)))
        .collect();
    let added_tokens: Vec<Value> = added
        .iter()
        .enumerate()
        .map(|(i, (content, special))| {
            json!({"id": 256 + i, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": special})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                           "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2s() {
        let a = byte_level_alphabet();
        assert_eq!(a[b'A' as usize], 'A');
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        let unique: BTreeSet<char> = a.iter().copied().collect();
        assert_eq!(unique.len(), 256);
    }
}
