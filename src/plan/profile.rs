//! Profiles: the memory budget of one model on one kind of box
//! (`profiles/*.toml`). Unknown keys are errors and every error names the
//! file, line and column.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::geometry::{Architecture, LayerAttention, ModelGeometry, Quantization};
use crate::limits::{self, GeometryFields, LimitExceeded};
use crate::units::{GIB, MIB, parse_bytes};
use crate::util::files::read_regular_to_string;

#[derive(Debug, Error)]
pub enum ProfileError {
    #[error("cannot read profile {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Invalid {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A size above its limit in `crate::limits`.
    #[error("{file}:{line}:{column}: [{section}] {limit}")]
    Limit {
        file: String,
        line: usize,
        column: usize,
        section: &'static str,
        limit: LimitExceeded,
    },
}

/// A parsed, validated profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    /// Where it was read from (`<built-in>` for profiles made in code).
    pub source: String,
    pub model: ModelSection,
    pub serving: ServingSection,
    pub host: HostSection,
    pub backend: BackendSection,
}

/// `[model]`: the architecture and the geometry the plan needs, so a plan
/// works before the checkpoint is downloaded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Display name, e.g. the hub id.
    #[serde(default)]
    pub name: Option<String>,
    /// Checkpoint folder; `--model` overrides it.
    #[serde(default)]
    pub path: Option<PathBuf>,
    pub architecture: Architecture,
    pub quantization: Quantization,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    #[serde(default)]
    pub intermediate_size: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub layer_types: Vec<LayerAttention>,
    #[serde(default)]
    pub sliding_window: Option<usize>,
}

fn one() -> usize {
    1
}

impl ModelSection {
    pub fn geometry(&self) -> ModelGeometry {
        ModelGeometry {
            architecture: self.architecture,
            quantization: self.quantization,
            num_layers: self.num_layers,
            hidden_size: self.hidden_size,
            num_attention_heads: self.num_attention_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            num_experts: self.num_experts,
            top_k: self.top_k,
            moe_intermediate_size: self.moe_intermediate_size,
            intermediate_size: self.intermediate_size,
            mlp_only_layers: self.mlp_only_layers.clone(),
            decoder_sparse_step: self.decoder_sparse_step,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: self.attention_bias,
            layer_types: self.layer_types.clone(),
            sliding_window: self.sliding_window,
        }
    }

    /// A `[model]` section describing `geometry` (for runs without a profile file).
    pub fn from_geometry(geometry: &ModelGeometry, path: Option<PathBuf>) -> ModelSection {
        ModelSection {
            name: None,
            path,
            architecture: geometry.architecture,
            quantization: geometry.quantization,
            num_layers: geometry.num_layers,
            hidden_size: geometry.hidden_size,
            num_attention_heads: geometry.num_attention_heads,
            num_kv_heads: geometry.num_kv_heads,
            head_dim: geometry.head_dim,
            vocab_size: geometry.vocab_size,
            num_experts: geometry.num_experts,
            top_k: geometry.top_k,
            moe_intermediate_size: geometry.moe_intermediate_size,
            intermediate_size: geometry.intermediate_size,
            mlp_only_layers: geometry.mlp_only_layers.clone(),
            decoder_sparse_step: geometry.decoder_sparse_step,
            tie_word_embeddings: geometry.tie_word_embeddings,
            attention_bias: geometry.attention_bias,
            layer_types: geometry.layer_types.clone(),
            sliding_window: geometry.sliding_window,
        }
    }
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    Bf16,
    F32,
}

impl KvCacheDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::F32 => "f32",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            KvCacheDtype::Bf16 => 2,
            KvCacheDtype::F32 => 4,
        }
    }
}

/// `kv_cache = "auto"` (what remains, capped) or a fixed size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheSize {
    Auto,
    Bytes(u64),
}

/// `[serving]`: the limits every byte of the plan scales with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingSection {
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    #[serde(default = "one")]
    pub dp_size: usize,
    #[serde(default = "default_kv_dtype")]
    pub kv_cache_dtype: KvCacheDtype,
    #[serde(default = "default_kv_cache")]
    pub kv_cache: KvCacheSize,
    /// Tokens per KV block.
    #[serde(default = "default_block_size")]
    pub kv_block_size: usize,
}

fn default_kv_dtype() -> KvCacheDtype {
    KvCacheDtype::Bf16
}
fn default_kv_cache() -> KvCacheSize {
    KvCacheSize::Auto
}
fn default_block_size() -> usize {
    16
}

impl Default for ServingSection {
    /// Modest limits for a run without a profile (`sparkrt generate --model DIR`).
    fn default() -> Self {
        ServingSection {
            max_model_len: 4096,
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            dp_size: 1,
            kv_cache_dtype: default_kv_dtype(),
            kv_cache: default_kv_cache(),
            kv_block_size: default_block_size(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeletMode {
    /// Use the kubelet's configuration if the host has one.
    Auto,
    /// Plan as if there were no kubelet.
    None,
}

/// `[host]`: what the plan keeps back for the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// Kept free for the OS, sshd, page-cache churn.
    #[serde(default = "default_os_reserve")]
    pub os_reserve: ByteSize,
    /// Kept free on top of every other reserve.
    #[serde(default = "default_safety_margin")]
    pub safety_margin: ByteSize,
    #[serde(default = "default_kubelet")]
    pub kubelet: KubeletMode,
}

fn default_os_reserve() -> ByteSize {
    ByteSize(2 * GIB)
}
fn default_safety_margin() -> ByteSize {
    ByteSize(GIB)
}
fn default_kubelet() -> KubeletMode {
    KubeletMode::Auto
}

impl Default for HostSection {
    fn default() -> Self {
        HostSection {
            os_reserve: default_os_reserve(),
            safety_margin: default_safety_margin(),
            kubelet: default_kubelet(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// CUDA when a usable GPU is present, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

/// `[backend]`: where the model runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    #[serde(default = "default_device")]
    pub device: DeviceKind,
    /// Overrides the backend's default runtime overhead (CUDA context, NVRTC
    /// modules, allocator slack; the process's code and tokenizer on the CPU).
    #[serde(default)]
    pub runtime_overhead: Option<ByteSize>,
    /// CPU worker threads; default: all cores.
    #[serde(default)]
    pub threads: Option<usize>,
}

fn default_device() -> DeviceKind {
    DeviceKind::Auto
}

impl Default for BackendSection {
    fn default() -> Self {
        BackendSection {
            device: default_device(),
            runtime_overhead: None,
            threads: None,
        }
    }
}

/// Runtime overhead when the profile does not say: the CPU backend's process
/// (code, tokenizer, allocator slack) and, on CUDA, the context and modules.
pub const DEFAULT_CPU_OVERHEAD: u64 = 256 * MIB;
pub const DEFAULT_CUDA_OVERHEAD: u64 = GIB;

/// A byte count written as `"24GiB"`, `"512Mi"` or a plain integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for KvCacheSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KvVisitor;
        impl<'de> Visitor<'de> for KvVisitor {
            type Value = KvCacheSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"auto\" or a size such as \"24GiB\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KvCacheSize, E> {
                if v == "auto" {
                    Ok(KvCacheSize::Auto)
                } else {
                    SizeVisitor.visit_str(v).map(KvCacheSize::Bytes)
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KvCacheSize, E> {
                SizeVisitor.visit_i64(v).map(KvCacheSize::Bytes)
            }
        }
        d.deserialize_any(KvVisitor)
    }
}

struct SizeVisitor;

impl<'de> Visitor<'de> for SizeVisitor {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a size such as \"24GiB\", \"512MiB\" or a number of bytes")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_bytes(v).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom("a size cannot be negative"))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    model: ModelSection,
    serving: ServingSection,
    #[serde(default)]
    host: HostSection,
    #[serde(default)]
    backend: BackendSection,
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let text =
            read_regular_to_string(path, limits::MAX_SMALL_FILE_BYTES).map_err(|source| {
                ProfileError::Read {
                    file: path.display().to_string(),
                    source,
                }
            })?;
        Profile::parse(&text, &path.display().to_string())
    }

    /// Parses and validates profile text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Profile, ProfileError> {
        let file: ProfileFile = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|span| line_column(text, span.start))
                .unwrap_or((1, 1));
            // Name the key the error points at: toml's message alone often does not.
            let key = text
                .lines()
                .nth(line - 1)
                .and_then(|l| l.split_once('='))
                .map(|(k, _)| k.trim())
                .filter(|k| !k.is_empty() && !k.starts_with('['));
            ProfileError::Invalid {
                file: source.to_string(),
                line,
                column,
                message: match key {
                    Some(key) => format!("{key}: {}", e.message()),
                    None => e.message().to_string(),
                },
            }
        })?;
        let profile = Profile {
            source: source.to_string(),
            model: file.model,
            serving: file.serving,
            host: file.host,
            backend: file.backend,
        };
        // Before any check that walks the layers or sizes a list.
        if let Err((section, limit)) = profile.check_limits() {
            // A product (`num_layers × num_experts`) points at its first factor.
            let key = limit.field.split(' ').next().unwrap_or_default();
            let (line, column) = locate_key(text, section, key).unwrap_or((1, 1));
            return Err(ProfileError::Limit {
                file: source.to_string(),
                line,
                column,
                section,
                limit,
            });
        }
        if let Some((section, key, message)) = profile.first_problem() {
            let (line, column) = locate_key(text, section, key).unwrap_or((1, 1));
            return Err(ProfileError::Invalid {
                file: source.to_string(),
                line,
                column,
                message: format!("[{section}] {key}: {message}"),
            });
        }
        Ok(profile)
    }

    /// A profile for a checkpoint run without a profile file: the checkpoint's
    /// geometry and modest serving limits.
    pub fn for_geometry(geometry: &ModelGeometry, path: Option<PathBuf>) -> Profile {
        Profile {
            source: "<built-in defaults>".to_string(),
            model: ModelSection::from_geometry(geometry, path),
            serving: ServingSection::default(),
            host: HostSection::default(),
            backend: BackendSection::default(),
        }
    }

    /// Every size of `[model]`, `[serving]` and `[backend]` against
    /// `crate::limits`, as (section, the first one above its limit).
    fn check_limits(&self) -> Result<(), (&'static str, LimitExceeded)> {
        let m = &self.model;
        GeometryFields {
            layers: ("num_layers", m.num_layers),
            experts: ("num_experts", m.num_experts),
            experts_per_token: ("top_k", m.top_k),
            hidden: ("hidden_size", m.hidden_size),
            heads: ("num_attention_heads", m.num_attention_heads),
            kv_heads: ("num_kv_heads", m.num_kv_heads),
            head_dim: ("head_dim", m.head_dim),
            vocab: ("vocab_size", m.vocab_size),
            intermediate: ("intermediate_size", m.intermediate_size),
            moe_intermediate: ("moe_intermediate_size", m.moe_intermediate_size),
            decoder_sparse_step: ("decoder_sparse_step", m.decoder_sparse_step),
            mlp_only_layers: ("mlp_only_layers", m.mlp_only_layers.len()),
            layer_types: ("layer_types", m.layer_types.len()),
            sliding_window: ("sliding_window", m.sliding_window.unwrap_or(0)),
        }
        .check()
        .map_err(|limit| ("model", limit))?;
        let s = &self.serving;
        let serving = [
            ("max_model_len", s.max_model_len, limits::MAX_MODEL_LEN),
            ("max_num_seqs", s.max_num_seqs, limits::MAX_NUM_SEQS),
            (
                "max_num_batched_tokens",
                s.max_num_batched_tokens,
                limits::MAX_NUM_BATCHED_TOKENS,
            ),
            ("kv_block_size", s.kv_block_size, limits::MAX_KV_BLOCK_SIZE),
            ("dp_size", s.dp_size, limits::MAX_DP_SIZE),
        ];
        for (key, value, limit) in serving {
            limits::check(key, value, limit).map_err(|limit| ("serving", limit))?;
        }
        let threads = self.backend.threads.unwrap_or(0);
        limits::check("threads", threads, limits::MAX_PROFILE_THREADS)
            .map_err(|limit| ("backend", limit))?;
        self.check_plan_magnitude()
    }

    /// Coarse upper bounds, in `u128`, of what each plan category can come
    /// to with these limits (`plan::memory` has the exact formulas): each
    /// must stay below [`limits::MAX_PLAN_BYTES`].
    fn check_plan_magnitude(&self) -> Result<(), (&'static str, LimitExceeded)> {
        let (m, s) = (&self.model, &self.serving);
        let w = |v: usize| v as u128;
        let (layers, h, e) = (w(m.num_layers), w(m.hidden_size), w(m.num_experts));
        let (q, kv) = (
            w(m.num_attention_heads) * w(m.head_dim),
            w(m.num_kv_heads) * w(m.head_dim),
        );
        let (moe_i, dense_i) = (w(m.moe_intermediate_size), w(m.intermediate_size));
        let (tokens, seqs, len) = (
            w(s.max_num_batched_tokens),
            w(s.max_num_seqs),
            w(s.max_model_len),
        );
        // Every stored element at most 2 bytes (bf16; FP4 formats are less),
        // plus 16 bytes of scalars per expert.
        let weight_elements = 2 * w(m.vocab_size) * h
            + layers
                * (2 * (q + kv) * h
                    + 2 * (q + kv)
                    + 4 * h
                    + w(m.num_attention_heads)
                    + 2 * w(m.head_dim)
                    + 2 * e * h
                    + e * (3 * moe_i * h + 3 * moe_i + 16)
                    + 3 * dense_i * h
                    + 3 * dense_i);
        // Routed rows × (ids, weights, rows, inputs, outputs) in f32, one per
        // layer in the plan's "one per layer would be" figure.
        let routed_rows = tokens * w(s.dp_size) * w(m.top_k);
        let workspace = (routed_rows * 16 * (1 + h + moe_i) + 4 * (e + 1)) * layers.max(1);
        let activations = tokens * (3 * h + 2 * q + 2 * kv + e + w(m.head_dim) + 2 * dense_i) * 4
            + seqs * w(m.vocab_size) * 4
            + (2 * tokens + seqs * (len + 5)) * 4;
        // Full and sliding layers alike keep at most every token of every
        // sequence (rounded up to a block).
        let kv_cache = 2 * layers * kv * 4 * seqs * (len + w(s.kv_block_size));
        let categories = [
            (
                "model",
                "weights of the geometry (bytes)",
                2 * weight_elements,
            ),
            (
                "serving",
                "MoE workspace of max_num_batched_tokens × dp_size × top_k (bytes)",
                workspace,
            ),
            (
                "serving",
                "activations of max_num_batched_tokens and max_num_seqs (bytes)",
                activations,
            ),
            (
                "serving",
                "KV cache of max_num_seqs × max_model_len (bytes)",
                kv_cache,
            ),
        ];
        for (section, what, bytes) in categories {
            limits::check_wide(what, bytes, limits::MAX_PLAN_BYTES)
                .map_err(|limit| (section, limit))?;
        }
        Ok(())
    }

    /// The first value that parses but makes no sense, as (section, key, why).
    fn first_problem(&self) -> Option<(&'static str, &'static str, String)> {
        let m = &self.model;
        let s = &self.serving;
        let positive: [(&'static str, &'static str, usize); 13] = [
            ("model", "num_layers", m.num_layers),
            ("model", "hidden_size", m.hidden_size),
            ("model", "num_attention_heads", m.num_attention_heads),
            ("model", "num_kv_heads", m.num_kv_heads),
            ("model", "head_dim", m.head_dim),
            ("model", "vocab_size", m.vocab_size),
            ("model", "num_experts", m.num_experts),
            ("model", "top_k", m.top_k),
            ("model", "moe_intermediate_size", m.moe_intermediate_size),
            ("serving", "max_model_len", s.max_model_len),
            ("serving", "max_num_seqs", s.max_num_seqs),
            (
                "serving",
                "max_num_batched_tokens",
                s.max_num_batched_tokens,
            ),
            ("serving", "kv_block_size", s.kv_block_size),
        ];
        for (section, key, value) in positive {
            if value == 0 {
                return Some((section, key, "must be at least 1".to_string()));
            }
        }
        if s.dp_size == 0 {
            return Some(("serving", "dp_size", "must be at least 1".to_string()));
        }
        if m.decoder_sparse_step == 0 {
            return Some((
                "model",
                "decoder_sparse_step",
                "must be at least 1".to_string(),
            ));
        }
        if m.top_k > m.num_experts {
            return Some((
                "model",
                "top_k",
                format!("{} exceeds num_experts = {}", m.top_k, m.num_experts),
            ));
        }
        if !m.num_attention_heads.is_multiple_of(m.num_kv_heads) {
            return Some((
                "model",
                "num_kv_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    m.num_kv_heads, m.num_attention_heads
                ),
            ));
        }
        let block = m.quantization.group_size();
        for (key, value) in [
            ("hidden_size", m.hidden_size),
            ("moe_intermediate_size", m.moe_intermediate_size),
        ] {
            if !value.is_multiple_of(block) {
                return Some((
                    "model",
                    key,
                    format!(
                        "{value} is not a multiple of the {} block size {block}",
                        m.quantization.name()
                    ),
                ));
            }
        }
        if let Some(&layer) = m.mlp_only_layers.iter().find(|&&l| l >= m.num_layers) {
            return Some((
                "model",
                "mlp_only_layers",
                format!(
                    "layer {layer} does not exist (num_layers = {})",
                    m.num_layers
                ),
            ));
        }
        let geometry = m.geometry();
        if geometry.num_moe_layers() < m.num_layers && m.intermediate_size == 0 {
            return Some((
                "model",
                "intermediate_size",
                "dense MLP layers need intermediate_size > 0".to_string(),
            ));
        }
        if !m.layer_types.is_empty() && m.layer_types.len() != m.num_layers {
            return Some((
                "model",
                "layer_types",
                format!(
                    "has {} entries for {} layers",
                    m.layer_types.len(),
                    m.num_layers
                ),
            ));
        }
        let has_sliding = m.layer_types.contains(&LayerAttention::SlidingAttention);
        if has_sliding && !matches!(m.sliding_window, Some(w) if w > 0) {
            return Some((
                "model",
                "sliding_window",
                "sliding_attention layers need sliding_window >= 1".to_string(),
            ));
        }
        if s.max_num_batched_tokens < s.max_num_seqs {
            return Some((
                "serving",
                "max_num_batched_tokens",
                format!(
                    "{} is below max_num_seqs = {}: every running sequence needs a token per step",
                    s.max_num_batched_tokens, s.max_num_seqs
                ),
            ));
        }
        if let Some(0) = self.backend.threads {
            return Some(("backend", "threads", "must be at least 1".to_string()));
        }
        None
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Finds `key = ...` inside `[section]`, for errors found after parsing.
fn locate_key(text: &str, section: &str, key: &str) -> Option<(usize, usize)> {
    let mut in_section = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(header) = trimmed.strip_prefix('[') {
            in_section = header.trim_end().trim_end_matches(']').trim() == section;
            continue;
        }
        let Some(rest) = trimmed.strip_prefix(key) else {
            continue;
        };
        if in_section && rest.trim_start().starts_with('=') {
            return Some((index + 1, line.len() - trimmed.len() + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
[model]
architecture = "qwen3_moe"
quantization = "bf16"
num_layers = 4
hidden_size = 128
num_attention_heads = 8
num_kv_heads = 2
head_dim = 32
vocab_size = 512
num_experts = 16
top_k = 4
moe_intermediate_size = 64
intermediate_size = 256

[serving]
max_model_len = 256
max_num_seqs = 4
max_num_batched_tokens = 64
kv_cache = "1MiB"
"#;

    #[test]
    fn parses_with_defaults() {
        let p = Profile::parse(TINY, "tiny.toml").unwrap();
        assert_eq!(p.model.num_layers, 4);
        assert_eq!(p.serving.dp_size, 1);
        assert_eq!(p.serving.kv_cache, KvCacheSize::Bytes(1 << 20));
        assert_eq!(p.serving.kv_cache_dtype, KvCacheDtype::Bf16);
        assert_eq!(p.host.os_reserve, ByteSize(2 << 30));
        assert_eq!(p.backend.device, DeviceKind::Auto);
    }

    #[test]
    fn unknown_key_names_file_line_and_column() {
        let text = TINY.replace("top_k = 4", "top_k = 4\nnum_expertz = 3");
        let err = Profile::parse(&text, "tiny.toml").unwrap_err().to_string();
        // line 13 of the edited text, column 1
        assert!(err.starts_with("tiny.toml:13:1:"), "{err}");
        assert!(err.contains("num_expertz"), "{err}");
    }

    #[test]
    fn wrong_type_and_missing_field() {
        let text = TINY.replace("hidden_size = 128", "hidden_size = \"wide\"");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.starts_with("t.toml:6:"), "{err}");
        let text = TINY.replace("head_dim = 32\n", "");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.contains("head_dim"), "{err}");
    }

    #[test]
    fn sizes_above_the_limits_are_refused_with_field_value_and_limit() {
        let text = TINY.replace("num_layers = 4", "num_layers = 1000000000000");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert_eq!(
            err,
            "t.toml:5:1: [model] `num_layers` is 1000000000000, above the limit of 1024"
        );
        // Each within its limit, together past what any plan may come to.
        let text = TINY
            .replace("num_layers = 4", "num_layers = 1024")
            .replace("num_kv_heads = 2", "num_kv_heads = 8")
            .replace("head_dim = 32", "head_dim = 4096")
            .replace("max_model_len = 256", "max_model_len = 16777216")
            .replace("max_num_seqs = 4", "max_num_seqs = 65536")
            .replace(
                "max_num_batched_tokens = 64",
                "max_num_batched_tokens = 65536",
            );
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(
            err.contains("[serving] `KV cache of max_num_seqs × max_model_len (bytes)`"),
            "{err}"
        );
        assert!(
            err.ends_with("above the limit of 1152921504606846976"),
            "{err}"
        );
        // The shipped profiles are well inside every limit.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            Profile::load(&path).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn semantic_errors_point_at_the_key() {
        let text = TINY.replace("top_k = 4", "top_k = 40");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.starts_with("t.toml:12:1: [model] top_k"), "{err}");
        let text = TINY.replace("kv_cache = \"1MiB\"", "kv_cache = \"lots\"");
        let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.starts_with("t.toml:20:"), "{err}");
    }
}
