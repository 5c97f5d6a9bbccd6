//! Profiles: the memory budget of one model on one kind of box
//! (`profiles/*.toml`). Unknown keys are errors and every error names the
//! file, line and column.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::speculative::{SpeculativeConfig, SpeculativeDraft};
use crate::geometry::{
    Architecture, LayerAttention, ModelGeometry, Quantization, with_geometry_fields,
};
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
    /// A command-line flag's value the profile rules refuse.
    #[error("{flag}: {message}")]
    Flag { flag: String, message: String },
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
    /// Where each serving value (and the geometry, key `model`) came from.
    pub sources: BTreeMap<&'static str, ValueSource>,
}

/// Where a value of the profile came from, most specific first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueSource {
    /// A command-line flag (`--max-model-len`, ...).
    Flag,
    /// Sized to the one request of `sparkrt generate`.
    Request,
    /// The profile file.
    Profile,
    /// The checkpoint's config.json.
    Checkpoint,
    /// The documented default.
    Default,
}

impl ValueSource {
    pub fn name(self) -> &'static str {
        match self {
            ValueSource::Flag => "flag",
            ValueSource::Request => "request",
            ValueSource::Profile => "profile",
            ValueSource::Checkpoint => "checkpoint",
            ValueSource::Default => "default",
        }
    }
}

/// `[model]`: the architecture and the geometry the plan needs, so a plan
/// works before the checkpoint is downloaded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelSection {
    /// Display name, e.g. the hub id.
    pub name: Option<String>,
    /// Checkpoint folder; `--model` overrides it.
    pub path: Option<PathBuf>,
    #[serde(flatten)]
    pub geometry: ModelGeometry,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    Bf16,
    F32,
    /// FP8 E4M3 (`float8_e4m3fn`), one byte per value times a per-layer K
    /// or V scale (`formats::f32_to_e4m3`); vLLM's `fp8_e4m3` is the same.
    #[serde(alias = "fp8_e4m3")]
    Fp8,
}

impl KvCacheDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::F32 => "f32",
            KvCacheDtype::Fp8 => "fp8",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            KvCacheDtype::Bf16 => 2,
            KvCacheDtype::F32 => 4,
            KvCacheDtype::Fp8 => 1,
        }
    }
}

/// Element type the recurrent-state pool stores (the recurrence itself
/// computes in f32 either way; bf16 rounds the state when it is stored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
}

impl StateDtype {
    pub fn name(self) -> &'static str {
        match self {
            StateDtype::Bf16 => "bf16",
            StateDtype::F32 => "f32",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            StateDtype::Bf16 => 2,
            StateDtype::F32 => 4,
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
    /// Keep full KV blocks for reuse by later requests with the same
    /// prefix (inside the KV pool; changes no memory figure).
    #[serde(default = "default_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Recurrent-state snapshots the prefix cache keeps (models with Gated
    /// DeltaNet layers; each one sequence's state): `None` is
    /// `plan::memory::DEFAULT_SNAPSHOTS_PER_SEQ × max_num_seqs`, 0 turns
    /// prefix caching off for such models.
    #[serde(default)]
    pub state_snapshots: Option<usize>,
    /// Prompt positions between a prefill's snapshots (a multiple of
    /// `kv_block_size`; 0: only the one at the prompt's last full block).
    #[serde(default = "default_snapshot_interval")]
    pub state_snapshot_interval: usize,
    /// Speculative decoding (vLLM's `speculative_config`); `None`: off.
    #[serde(default)]
    pub speculative: Option<SpeculativeConfig>,
    /// Element type of the recurrent-state pool (f32, or bf16: half the
    /// bytes; its logit cost is measured in the README).
    #[serde(default)]
    pub state_dtype: StateDtype,
}

/// Prompt positions between a prefill's state snapshots: a request sharing
/// the first `p` tokens of an earlier prompt reuses at least
/// `p − 1024` of them.
pub const DEFAULT_SNAPSHOT_INTERVAL: usize = 1024;

fn default_snapshot_interval() -> usize {
    DEFAULT_SNAPSHOT_INTERVAL
}

fn one() -> usize {
    1
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
fn default_prefix_caching() -> bool {
    true
}

impl ServingSection {
    /// MTP layers served: the checkpoint's MTP head (one layer) when
    /// speculative decoding drafts with it, else none.
    pub fn mtp_layers(&self) -> usize {
        use super::speculative::DraftMethod;
        usize::from(
            self.speculative
                .is_some_and(|c| c.method == DraftMethod::Mtp),
        )
    }
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
            enable_prefix_caching: default_prefix_caching(),
            state_snapshots: None,
            state_snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
            speculative: None,
            state_dtype: StateDtype::F32,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
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

/// Defines `ModelDraft`, `[model]` as written, from the geometry's field
/// list (`geometry::with_geometry_fields`): `name`, `path` and every
/// geometry key, each optional. With a checkpoint at hand the geometry
/// comes from its config.json (a value given here must agree, see
/// `plan::check_geometry`); without one the `required` keys must be given.
///
/// A struct of its own rather than a `#[serde(flatten)]`ed geometry: serde
/// buffers a table for flatten before the geometry reads it, and toml then
/// reports an unknown or mistyped key at the `[model]` line, not the key's,
/// and an unknown key without the list of expected ones.
macro_rules! define_model_draft {
    (@default $field:ident required) => {
        return Err(stringify!($field))
    };
    (@default $field:ident ($value:expr)) => {
        $value
    };
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $default:tt,)*) => {
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct ModelDraft {
            name: Option<String>,
            path: Option<PathBuf>,
            $($field: Option<$ty>,)*
        }

        impl ModelDraft {
            /// Each geometry key as written, else the checkpoint's, else
            /// its default; `Err(key)` names the first required key that
            /// neither gives.
            fn geometry_over(
                &self,
                checkpoint: Option<&ModelGeometry>,
            ) -> Result<ModelGeometry, &'static str> {
                Ok(ModelGeometry {
                    $($field: match (&self.$field, checkpoint) {
                        (Some(value), _) => value.clone(),
                        (None, Some(g)) => g.$field.clone(),
                        (None, None) => define_model_draft!(@default $field $default),
                    },)*
                })
            }
        }
    };
}
with_geometry_fields!(define_model_draft);

/// `[serving]` as written: every key optional (defaults in
/// [`ServingSection::default`]).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServingDraft {
    max_model_len: Option<usize>,
    max_num_seqs: Option<usize>,
    max_num_batched_tokens: Option<usize>,
    dp_size: Option<usize>,
    kv_cache_dtype: Option<KvCacheDtype>,
    kv_cache: Option<KvCacheSize>,
    kv_block_size: Option<usize>,
    enable_prefix_caching: Option<bool>,
    state_snapshots: Option<usize>,
    state_snapshot_interval: Option<usize>,
    /// vLLM's keys, as an inline table.
    speculative_config: Option<SpeculativeDraft>,
    state_dtype: Option<StateDtype>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    #[serde(default)]
    model: ModelDraft,
    #[serde(default)]
    serving: ServingDraft,
    #[serde(default)]
    host: HostSection,
    #[serde(default)]
    backend: BackendSection,
}

/// Serving values given on the command line; each overrides its profile key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServingOverrides {
    pub max_model_len: Option<usize>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub dp_size: Option<usize>,
    pub kv_cache_dtype: Option<KvCacheDtype>,
    pub kv_cache: Option<KvCacheSize>,
    /// `--no-prefix-caching` gives `Some(false)`.
    pub enable_prefix_caching: Option<bool>,
    pub state_snapshots: Option<usize>,
    pub state_snapshot_interval: Option<usize>,
    /// `--speculative-config` (already validated).
    pub speculative: Option<SpeculativeConfig>,
    pub state_dtype: Option<StateDtype>,
    /// `--served-model-name`: overrides `[model] name`.
    pub name: Option<String>,
}

/// What a profile takes from the checkpoint it is laid over (config.json).
#[derive(Clone, Copy, Debug)]
pub struct CheckpointFacts<'a> {
    pub geometry: &'a ModelGeometry,
    /// The longest context the model was trained for: the default
    /// `max_model_len` is at most this.
    pub max_position_embeddings: usize,
}

/// A profile file parsed but not yet laid over its checkpoint: what is
/// known before config.json is read (e.g. `[model] path`, where it is).
#[derive(Clone, Debug)]
pub struct ProfileDraft {
    source: String,
    text: String,
    file: ProfileFile,
}

/// `flag`, else `profile`, else `default`, with where the value came from.
fn layer<T>(flag: Option<T>, profile: Option<T>, default: impl FnOnce() -> T) -> (T, ValueSource) {
    match (flag, profile) {
        (Some(v), _) => (v, ValueSource::Flag),
        (None, Some(v)) => (v, ValueSource::Profile),
        (None, None) => (default(), ValueSource::Default),
    }
}

impl ProfileDraft {
    /// Reads a profile file (syntax and unknown keys checked).
    pub fn load(path: &Path) -> Result<ProfileDraft, ProfileError> {
        let text =
            read_regular_to_string(path, limits::MAX_SMALL_FILE_BYTES).map_err(|source| {
                ProfileError::Read {
                    file: path.display().to_string(),
                    source,
                }
            })?;
        ProfileDraft::parse(&text, &path.display().to_string())
    }

    /// No profile file: every value from the checkpoint or the defaults.
    pub fn built_in() -> ProfileDraft {
        ProfileDraft {
            source: BUILT_IN.to_string(),
            text: String::new(),
            file: ProfileFile::default(),
        }
    }

    /// Parses profile text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<ProfileDraft, ProfileError> {
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
        Ok(ProfileDraft {
            source: source.to_string(),
            text: text.to_string(),
            file,
        })
    }

    /// `[host]`, as written (defaults for keys it leaves out).
    pub fn host(&self) -> &HostSection {
        &self.file.host
    }

    /// `[model] path`, as written (relative to the profile file).
    pub fn model_path(&self) -> Option<&Path> {
        self.file.model.path.as_deref()
    }

    /// The profile: `[model]` laid over `checkpoint` (config.json's
    /// geometry; without one every geometry key is required), `flags` over
    /// `[serving]`, defaults for the rest; then validated.
    pub fn resolve(
        self,
        checkpoint: Option<CheckpointFacts<'_>>,
        flags: &ServingOverrides,
    ) -> Result<Profile, ProfileError> {
        let mut sources = BTreeMap::new();
        let model = match self.resolve_model(checkpoint.map(|c| c.geometry)) {
            Ok(model) => model,
            Err(key) => {
                let (line, column) = locate_section(&self.text, "model").unwrap_or((1, 1));
                return Err(ProfileError::Invalid {
                    file: self.source.clone(),
                    line,
                    column,
                    message: format!(
                        "[model] {key}: missing: without a checkpoint (--model DIR or \
                         [model] path) the profile must give the model's geometry"
                    ),
                });
            }
        };
        let mut model = model;
        sources.insert(
            "model",
            if checkpoint.is_some() {
                ValueSource::Checkpoint
            } else {
                ValueSource::Profile
            },
        );
        let (name, name_source) = layer(
            flags.name.clone().map(Some),
            model.name.take().map(Some),
            || None,
        );
        model.name = name;
        sources.insert("name", name_source);
        let d = &self.file.serving;
        let defaults = ServingSection::default();
        let mut serving = defaults.clone();
        let mut take = |key: &'static str, source: ValueSource| {
            sources.insert(key, source);
        };
        let (mut v, mut src) = layer(flags.max_model_len, d.max_model_len, || {
            defaults.max_model_len
        });
        // The default is no longer than the model's trained context.
        if let Some(c) = checkpoint
            && src == ValueSource::Default
            && c.max_position_embeddings < v
        {
            (v, src) = (c.max_position_embeddings, ValueSource::Checkpoint);
        }
        serving.max_model_len = v;
        take("max_model_len", src);
        let (v, src) = layer(flags.max_num_seqs, d.max_num_seqs, || defaults.max_num_seqs);
        serving.max_num_seqs = v;
        take("max_num_seqs", src);
        // The default holds at least one token per running sequence.
        let seqs = serving.max_num_seqs;
        let (v, src) = layer(
            flags.max_num_batched_tokens,
            d.max_num_batched_tokens,
            || defaults.max_num_batched_tokens.max(seqs),
        );
        serving.max_num_batched_tokens = v;
        take("max_num_batched_tokens", src);
        let (v, src) = layer(flags.dp_size, d.dp_size, || defaults.dp_size);
        serving.dp_size = v;
        take("dp_size", src);
        let (v, src) = layer(flags.kv_cache_dtype, d.kv_cache_dtype, || {
            defaults.kv_cache_dtype
        });
        serving.kv_cache_dtype = v;
        take("kv_cache_dtype", src);
        let (v, src) = layer(flags.kv_cache, d.kv_cache, || defaults.kv_cache);
        serving.kv_cache = v;
        take("kv_cache", src);
        let (v, src) = layer(None, d.kv_block_size, || defaults.kv_block_size);
        serving.kv_block_size = v;
        take("kv_block_size", src);
        let (v, src) = layer(flags.enable_prefix_caching, d.enable_prefix_caching, || {
            defaults.enable_prefix_caching
        });
        serving.enable_prefix_caching = v;
        take("enable_prefix_caching", src);
        let (v, src) = layer(
            flags.state_snapshots.map(Some),
            d.state_snapshots.map(Some),
            || defaults.state_snapshots,
        );
        serving.state_snapshots = v;
        take("state_snapshots", src);
        let (v, src) = layer(
            flags.state_snapshot_interval,
            d.state_snapshot_interval,
            || defaults.state_snapshot_interval,
        );
        serving.state_snapshot_interval = v;
        take("state_snapshot_interval", src);
        let written = match &d.speculative_config {
            Some(draft) => Some(draft.validate().map_err(|e| {
                let (line, column) =
                    locate_key(&self.text, "serving", "speculative_config").unwrap_or((1, 1));
                ProfileError::Invalid {
                    file: self.source.clone(),
                    line,
                    column,
                    message: format!("[serving] speculative_config: {e}"),
                }
            })?),
            None => None,
        };
        let (v, src) = layer(flags.speculative.map(Some), written.map(Some), || None);
        serving.speculative = v;
        take("speculative_config", src);
        let (v, src) = layer(flags.state_dtype, d.state_dtype, || defaults.state_dtype);
        serving.state_dtype = v;
        take("state_dtype", src);
        let profile = Profile {
            source: self.source.clone(),
            model,
            serving,
            host: self.file.host.clone(),
            backend: self.file.backend.clone(),
            sources,
        };
        profile.validate(&self.text)?;
        Ok(profile)
    }

    /// `[model]` over the checkpoint's geometry; `Err(key)` names the first
    /// required key missing when there is no checkpoint.
    fn resolve_model(
        &self,
        checkpoint: Option<&ModelGeometry>,
    ) -> Result<ModelSection, &'static str> {
        let d = &self.file.model;
        Ok(ModelSection {
            name: d.name.clone(),
            path: d.path.clone(),
            geometry: d.geometry_over(checkpoint)?,
        })
    }
}

/// The `source` of a profile made without a file.
pub const BUILT_IN: &str = "<built-in defaults>";

impl Profile {
    /// The model's geometry as served: with the MTP head's layers when
    /// speculative decoding drafts with it (their KV layer, weights and
    /// buffers are planned).
    pub fn served_geometry(&self) -> crate::geometry::ModelGeometry {
        crate::geometry::ModelGeometry {
            mtp_layers: self.serving.mtp_layers(),
            ..self.model.geometry.clone()
        }
    }

    /// Reads and validates a profile file that gives its whole geometry.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        ProfileDraft::load(path)?.resolve(None, &ServingOverrides::default())
    }

    /// Parses and validates profile text that gives its whole geometry;
    /// `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Profile, ProfileError> {
        ProfileDraft::parse(text, source)?.resolve(None, &ServingOverrides::default())
    }

    /// Limits and sanity checks; errors point at the key in `text`, or
    /// name the flag that set the value.
    fn validate(&self, text: &str) -> Result<(), ProfileError> {
        let flag_error = |key: &str, message: String| {
            let key = key.split(' ').next().unwrap_or_default();
            (self.sources.get(key) == Some(&ValueSource::Flag)).then(|| ProfileError::Flag {
                flag: format!("--{}", key.replace('_', "-")),
                message,
            })
        };
        // Before any check that walks the layers or sizes a list.
        if let Err((section, limit)) = self.check_limits() {
            if let Some(e) = flag_error(&limit.field, limit.to_string()) {
                return Err(e);
            }
            // A product (`num_layers × num_experts`) points at its first factor.
            let key = limit.field.split(' ').next().unwrap_or_default();
            let (line, column) = locate_key(text, section, key).unwrap_or((1, 1));
            return Err(ProfileError::Limit {
                file: self.source.clone(),
                line,
                column,
                section,
                limit,
            });
        }
        if let Some((section, key, message)) = self.first_problem() {
            if let Some(e) = flag_error(key, message.clone()) {
                return Err(e);
            }
            let (line, column) = locate_key(text, section, key).unwrap_or((1, 1));
            return Err(ProfileError::Invalid {
                file: self.source.clone(),
                line,
                column,
                message: format!("[{section}] {key}: {message}"),
            });
        }
        Ok(())
    }

    /// A profile for a checkpoint run without a profile file: the checkpoint's
    /// geometry and the default serving limits.
    pub fn for_checkpoint(
        checkpoint: CheckpointFacts<'_>,
        path: Option<PathBuf>,
    ) -> Result<Profile, ProfileError> {
        let mut profile =
            ProfileDraft::built_in().resolve(Some(checkpoint), &ServingOverrides::default())?;
        profile.model.path = path;
        Ok(profile)
    }

    /// Every size of `[model]`, `[serving]` and `[backend]` against
    /// `crate::limits`, as (section, the first one above its limit).
    fn check_limits(&self) -> Result<(), (&'static str, LimitExceeded)> {
        let m = &self.model.geometry;
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
        limits::HybridFields {
            key_heads: ("linear_num_key_heads", m.linear_num_key_heads),
            value_heads: ("linear_num_value_heads", m.linear_num_value_heads),
            key_head_dim: ("linear_key_head_dim", m.linear_key_head_dim),
            value_head_dim: ("linear_value_head_dim", m.linear_value_head_dim),
            conv_kernel: ("linear_conv_kernel_dim", m.linear_conv_kernel_dim),
            shared_expert_intermediate: (
                "shared_expert_intermediate_size",
                m.shared_expert_intermediate_size,
            ),
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
            (
                "state_snapshots",
                s.state_snapshots.unwrap_or(0),
                limits::MAX_STATE_SNAPSHOTS,
            ),
            (
                "state_snapshot_interval",
                s.state_snapshot_interval,
                limits::MAX_MODEL_LEN,
            ),
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
        let (m, s) = (&self.model.geometry, &self.serving);
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
            + (2 * tokens + seqs * (2 * len + 5)) * 4; // step metadata: two tables a sequence
        // A pool slot holds K and V of at most `layers` arrays; the
        // full-attention tokens and the sliding-window blocks are each at
        // most every token of every sequence, rounded up to a block
        // (`memory::kv_tokens_for`, `memory::sliding_kv`).
        let kv_cache = 2 * (2 * layers * kv * 4) * seqs * (len + w(s.kv_block_size));
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
        let m = &self.model.geometry;
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
        // A dense model (qwen3_5) has no experts.
        let dense_model = m.architecture == Architecture::Qwen35;
        let expert_key =
            |key: &str| matches!(key, "num_experts" | "top_k" | "moe_intermediate_size");
        for (section, key, value) in positive {
            if value == 0 && !(dense_model && expert_key(key)) {
                return Some((section, key, "must be at least 1".to_string()));
            }
        }
        if s.dp_size == 0 {
            return Some(("serving", "dp_size", "must be at least 1".to_string()));
        }
        if !s.state_snapshot_interval.is_multiple_of(s.kv_block_size) {
            // A snapshot is found by the hash of the block it ends.
            return Some((
                "serving",
                "state_snapshot_interval",
                format!(
                    "{} is not a multiple of kv_block_size = {}",
                    s.state_snapshot_interval, s.kv_block_size
                ),
            ));
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
        let int4 = [
            m.quantization,
            m.attention_quantization,
            m.lm_head_quantization,
        ]
        .contains(&Quantization::Int4);
        if int4 && m.quant_group_size == 0 {
            return Some((
                "model",
                "quant_group_size",
                "int4 weights need their group size (e.g. 128)".to_string(),
            ));
        }
        let block = match m.quantization {
            Quantization::Int4 => m.quant_group_size.max(1),
            format => format.group_size(),
        };
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
        if m.num_moe_layers() < m.num_layers && m.intermediate_size == 0 {
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

/// The line of the `[section]` header, for a key that is missing from it.
fn locate_section(text: &str, section: &str) -> Option<(usize, usize)> {
    text.lines()
        .position(|l| l.trim() == format!("[{section}]"))
        .map(|index| (index + 1, 1))
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
        assert_eq!(p.model.geometry.num_layers, 4);
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
        // line 13 of the edited text, column 1, with the keys [model] takes
        assert!(
            err.starts_with(
                "tiny.toml:13:1: num_expertz: unknown field `num_expertz`, expected one of \
                 `name`, `path`, `architecture`, `quantization`, `attention_quantization`, \
                 `lm_head_quantization`, `quant_group_size`, `num_layers`,"
            ),
            "{err}"
        );
        assert!(err.contains("`sliding_window`"), "{err}");
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
    fn a_partial_profile_layers_over_the_checkpoint_and_flags_over_it() {
        let full = Profile::parse(TINY, "tiny.toml").unwrap();
        let geometry = full.model.geometry.clone();
        let facts = |max_position_embeddings| {
            Some(CheckpointFacts {
                geometry: &geometry,
                max_position_embeddings,
            })
        };
        let draft = ProfileDraft::parse("[serving]\nmax_model_len = 256\n", "s.toml").unwrap();
        let flags = ServingOverrides {
            max_num_seqs: Some(2),
            ..ServingOverrides::default()
        };
        let p = draft.clone().resolve(facts(1 << 20), &flags).unwrap();
        assert_eq!(p.model.geometry, geometry);
        assert_eq!(p.serving.max_model_len, 256);
        assert_eq!(p.serving.max_num_seqs, 2);
        assert_eq!(p.serving.max_num_batched_tokens, 512);
        assert_eq!(p.sources["model"], ValueSource::Checkpoint);
        assert_eq!(p.sources["max_model_len"], ValueSource::Profile);
        assert_eq!(p.sources["max_num_seqs"], ValueSource::Flag);
        assert_eq!(p.sources["kv_cache"], ValueSource::Default);
        assert!(
            p.serving.enable_prefix_caching,
            "prefix caching is on by default"
        );
        let off = ServingOverrides {
            enable_prefix_caching: Some(false),
            ..ServingOverrides::default()
        };
        let p_off = draft.clone().resolve(facts(1 << 20), &off).unwrap();
        assert!(!p_off.serving.enable_prefix_caching);
        assert_eq!(p_off.sources["enable_prefix_caching"], ValueSource::Flag);
        let in_file = ProfileDraft::parse(
            "[serving]\nmax_model_len = 256\nenable_prefix_caching = false\n",
            "s.toml",
        )
        .unwrap()
        .resolve(facts(1 << 20), &ServingOverrides::default())
        .unwrap();
        assert!(!in_file.serving.enable_prefix_caching);
        // Without the checkpoint the geometry is required, named at [model]'s line.
        let err = draft
            .resolve(None, &ServingOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("[model] architecture: missing"), "{err}");
        // The default batch holds one token per sequence.
        let many = ServingOverrides {
            max_num_seqs: Some(1000),
            ..ServingOverrides::default()
        };
        let p = ProfileDraft::built_in()
            .resolve(facts(1 << 20), &many)
            .unwrap();
        assert_eq!(p.serving.max_num_batched_tokens, 1000);
        // A flag's bad value names the flag, not the file.
        let zero = ServingOverrides {
            max_model_len: Some(0),
            ..ServingOverrides::default()
        };
        let err = ProfileDraft::built_in()
            .resolve(facts(1 << 20), &zero)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "--max-model-len: must be at least 1");
        // The default max_model_len is cut to the trained context; a
        // profile's or flag's is kept.
        let p = ProfileDraft::built_in()
            .resolve(facts(2048), &ServingOverrides::default())
            .unwrap();
        assert_eq!(p.serving.max_model_len, 2048);
        assert_eq!(p.sources["max_model_len"], ValueSource::Checkpoint);
        let p = ProfileDraft::built_in().resolve(facts(8192), &ServingOverrides::default());
        assert_eq!(p.unwrap().sources["max_model_len"], ValueSource::Default);
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
