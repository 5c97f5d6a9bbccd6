//! Flags and steps several subcommands share: which model and where it runs
//! (`generate`, `bench`, `serve`), and which host to read (`probe`, `plan`,
//! `k8s`, `top`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::find_profile;
use crate::backend::cuda::WeightsPolicy;
use crate::geometry::Architecture;
use crate::host::HostReading;
use crate::plan::profile::{
    CheckpointFacts, DeviceKind, KubeletMode, KvCacheDtype, KvCacheSize, Profile, ProfileDraft,
    ServingOverrides, StateDtype,
};
use crate::plan::speculative::SpeculativeConfig;
use crate::runtime::{DeviceOptions, HostSource};
use crate::text::ChatTemplate;
use crate::text::Tokenizer;
use crate::text::parsers::{
    OutputParsers, ParserNames, ReasoningParserName, TextTools, ToolParserName,
};

/// The profile used when neither `--model` nor `--profile` is given: the
/// tiny reference model in tests/fixtures.
pub const DEFAULT_PROFILE: &str = "qwen3-moe-tiny";

#[derive(Clone, Debug, clap::Args)]
pub struct ModelArgs {
    /// Checkpoint folder (config.json, safetensors, tokenizer)
    /// [default: the profile's model.path; with neither, the tiny test model].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Profile: a path or a name from profiles/ [default: limits derived from
    /// the checkpoint's config].
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// `auto` reads the checkpoint; `dummy` writes random weights with the
    /// checkpoint's config into a temporary folder first (benchmarks).
    #[arg(long, value_enum, default_value = "auto")]
    pub load_format: LoadFormat,
    /// CPU threads, at most the cores available to the process [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Read the host below this directory (fake trees in tests).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub host_root: PathBuf,
    /// Where the model runs [default: the profile's `[backend] device`,
    /// else auto: CUDA when a GPU is usable, else the CPU].
    #[arg(long, value_enum, value_name = "DEVICE")]
    pub backend: Option<BackendChoice>,
    /// Cache of compiled CUDA kernels [default: $SPARKRT_CACHE_DIR, else
    /// $XDG_CACHE_HOME/sparkrt, else ~/.cache/sparkrt].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// How the CUDA backend reaches the weights: auto (in place on an
    /// integrated GPU such as a GB10 when the driver allows, else one
    /// device copy), copy (always one device copy, the page cache dropped
    /// chunk by chunk as it goes), register (the mapping registered with
    /// the driver and read in place; an error where refused), map (the
    /// device reads the pageable mapping directly; an error where it
    /// cannot). Anything but auto is an error on the CPU backend.
    #[arg(long, value_enum, value_name = "POLICY", default_value = "auto")]
    pub weights_policy: WeightsPolicyChoice,
}

/// `--weights-policy`: [`WeightsPolicy`]'s values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsPolicyChoice {
    #[default]
    Auto,
    Copy,
    Register,
    Map,
}

/// How chat answers are parsed into reasoning and tool calls (`serve`), by
/// vLLM's flag names and parser names.
#[derive(Debug, Default, clap::Args)]
pub struct ParserArgs {
    /// Reasoning parser: qwen3, openai_gptoss or none [default: by the
    /// model's family: qwen3_moe, qwen3_next, qwen3_5_moe, qwen3_5 → qwen3,
    /// gpt_oss → openai_gptoss].
    #[arg(long, value_name = "NAME")]
    pub reasoning_parser: Option<ReasoningParserName>,
    /// Tool-call parser: hermes, qwen3_coder, openai_gptoss (or openai) or
    /// none [default: by the model's family and chat template: Qwen
    /// families → qwen3_coder when the template writes XML calls
    /// (`<function=…>`, Qwen3.5/3.6, Qwen3-Coder), hermes when it writes
    /// JSON; gpt_oss → openai_gptoss].
    #[arg(long, value_name = "NAME")]
    pub tool_call_parser: Option<ToolParserName>,
}

impl ParserArgs {
    /// The parsers for a model of `architecture` whose template writes
    /// `template_tools` calls, checked against its tokenizer.
    pub fn output_parsers(
        &self,
        architecture: Architecture,
        template_tools: Option<TextTools>,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<OutputParsers> {
        let names = ParserNames::for_model(
            Some(architecture),
            template_tools,
            self.reasoning_parser,
            self.tool_call_parser,
        );
        Ok(OutputParsers::new(names, tokenizer)?)
    }
}

/// `--backend`: the profile's `[backend] device` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Cpu,
    Cuda,
}

impl ModelArgs {
    /// The host below `--host-root`, its kubelet found where it usually is.
    pub fn host(&self) -> HostSource<'_> {
        HostSource {
            root: &self.host_root,
            kubelet_config: None,
        }
    }

    /// The device choice these flags make.
    pub fn device_options(&self) -> DeviceOptions {
        DeviceOptions {
            device: self.backend.map(|b| match b {
                BackendChoice::Auto => DeviceKind::Auto,
                BackendChoice::Cpu => DeviceKind::Cpu,
                BackendChoice::Cuda => DeviceKind::Cuda,
            }),
            cache_dir: self.cache_dir.clone(),
            weights_policy: match self.weights_policy {
                WeightsPolicyChoice::Auto => WeightsPolicy::Auto,
                WeightsPolicyChoice::Copy => WeightsPolicy::Copy,
                WeightsPolicyChoice::Register => WeightsPolicy::Register,
                WeightsPolicyChoice::Map => WeightsPolicy::Map,
            },
        }
    }
}

/// The chat template of `serve` and `generate`.
#[derive(Debug, clap::Args)]
pub struct ChatTemplateArgs {
    /// Chat template (a Jinja file) used instead of the checkpoint's
    /// `chat_template.jinja` or tokenizer_config.json `chat_template`; one
    /// that cannot be read or does not compile stops the start, naming it.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

impl ChatTemplateArgs {
    /// `--chat-template` if given (with the special tokens of `dir`), else
    /// the checkpoint's; `None` for a checkpoint without one.
    pub fn load(&self, dir: &Path) -> Result<Option<ChatTemplate>> {
        Ok(ChatTemplate::load(dir, self.chat_template.as_deref())?)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    Auto,
    Dummy,
}

/// Host options shared by `probe`, `plan`, `serve` and `top`.
#[derive(Clone, Debug, clap::Args)]
pub struct HostArgs {
    /// Read the host below this directory instead of `/` (fake trees in tests).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub host_root: PathBuf,
    /// Kubelet configuration file [default: <host-root>/var/lib/kubelet/config.yaml if present].
    #[arg(long, value_name = "FILE")]
    pub kubelet_config: Option<PathBuf>,
}

impl HostArgs {
    /// The host these flags name.
    pub fn source(&self) -> HostSource<'_> {
        HostSource {
            root: &self.host_root,
            kubelet_config: self.kubelet_config.as_deref(),
        }
    }

    /// Reads the host as a profile's `[host] kubelet` setting asks.
    pub fn read(&self, kubelet: KubeletMode) -> Result<HostReading> {
        self.source()
            .read(kubelet)
            .with_context(|| format!("reading the host below {}", self.host_root.display()))
    }
}

/// The checkpoint folder and profile `args` name, the profile laid over
/// the checkpoint's config.json and `serving`'s flags over the profile.
pub fn resolve(args: &ModelArgs, serving: &ServingArgs) -> Result<(PathBuf, Profile)> {
    let name = match (&args.profile, &args.model) {
        (Some(name), _) => Some(name.as_str()),
        (None, None) => Some(DEFAULT_PROFILE),
        (None, Some(_)) => None,
    };
    let resolved = resolve_profile(name, args.model.as_deref(), serving, true)?;
    let dir = resolved
        .checkpoint
        .context("no checkpoint: pass --model DIR or a profile with model.path")?;
    Ok((dir, resolved.profile))
}

/// A profile resolved over its checkpoint, and where they were found.
pub struct Resolved {
    pub profile: Profile,
    /// The checkpoint folder whose config.json the profile was laid over.
    pub checkpoint: Option<PathBuf>,
    /// The profile file (`None`: the built-in defaults).
    pub profile_path: Option<PathBuf>,
}

/// Loads profile `name` (or none: the built-in defaults), finds its
/// checkpoint (`explicit`, else the profile's `model.path`; that one, when
/// `need_checkpoint` is false, only once downloaded) and lays the profile
/// over the checkpoint's config.json and the flags over the profile.
pub fn resolve_profile(
    name: Option<&str>,
    explicit: Option<&Path>,
    serving: &ServingArgs,
    need_checkpoint: bool,
) -> Result<Resolved> {
    let (draft, profile_path) = match name {
        Some(name) => {
            let path = find_profile(name)?;
            (ProfileDraft::load(&path)?, Some(path))
        }
        None => (ProfileDraft::built_in(), None),
    };
    let from_profile = draft.model_path().map(|path| {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            let base = profile_path.as_deref().and_then(Path::parent);
            base.unwrap_or(Path::new(".")).join(path)
        }
    });
    let checkpoint = match explicit {
        Some(dir) => Some(dir.to_path_buf()),
        None => from_profile.filter(|dir| need_checkpoint || dir.join("config.json").is_file()),
    };
    let config = match &checkpoint {
        Some(dir) => Some(crate::checkpoint::config::ModelConfig::load(dir)?),
        None => None,
    };
    let facts = config.as_ref().map(|c| CheckpointFacts {
        geometry: &c.geometry,
        max_position_embeddings: c.max_position_embeddings,
    });
    let profile = draft.resolve(facts, &serving.overrides()?)?;
    Ok(Resolved {
        profile,
        checkpoint,
        profile_path,
    })
}

/// Serving flags, one set for `plan`, `serve`, `generate` and `bench`. Each
/// overrides its profile key and the plan records it as `flag`. `--host`,
/// `--port` and the API key only matter to `serve`; `plan`, `generate` and
/// `bench` accept and ignore them, so one command line works for all four.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServingArgs {
    /// Longest sequence, prompt and output [profile: `[serving]
    /// max_model_len`; default 4096, at most the checkpoint's
    /// max_position_embeddings].
    #[arg(long, value_name = "TOKENS")]
    pub max_model_len: Option<usize>,
    /// Sequences run at once [profile: `max_num_seqs`; default 8].
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<usize>,
    /// Tokens one engine step takes [profile: `max_num_batched_tokens`;
    /// default max(512, max_num_seqs)].
    #[arg(long, value_name = "TOKENS")]
    pub max_num_batched_tokens: Option<usize>,
    /// Element type of keys and values, `bf16`, `f32` or `fp8` (E4M3 with
    /// the checkpoint's per-layer scales, else 1.0; `fp8_e4m3` too)
    /// [profile: `kv_cache_dtype`; default bf16].
    #[arg(long, value_name = "DTYPE", value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// KV cache size (`24GiB`) or `auto`: what remains, capped at max_num_seqs
    /// × max_model_len [profile: `kv_cache`; default auto; generate: the request].
    #[arg(long, value_name = "SIZE|auto", value_parser = parse_kv_cache)]
    pub kv_cache: Option<KvCacheSize>,
    /// Data-parallel ranks the MoE workspace is sized for [profile: `dp_size`; default 1].
    #[arg(long, value_name = "N")]
    pub dp_size: Option<usize>,
    /// Turn automatic prefix caching off: full KV blocks are not kept for
    /// later requests [profile: `enable_prefix_caching`; default on].
    #[arg(long, conflicts_with = "enable_prefix_caching")]
    pub no_prefix_caching: bool,
    /// vLLM's flag: automatic prefix caching on (the default here too).
    #[arg(long)]
    pub enable_prefix_caching: bool,
    /// Hybrid (Gated DeltaNet) models: recurrent-state snapshots the prefix
    /// cache keeps, each one sequence's state (`plan` prints its bytes); 0
    /// turns prefix caching off for them [profile: `state_snapshots`;
    /// default 2 × max_num_seqs].
    #[arg(long, value_name = "N")]
    pub state_snapshots: Option<usize>,
    /// Hybrid models: prompt positions between a prefill's state snapshots,
    /// a multiple of the KV block size; 0: only at the prompt's last full
    /// block [profile: `state_snapshot_interval`; default 1024].
    #[arg(long, value_name = "TOKENS")]
    pub state_snapshot_interval: Option<usize>,
    /// Speculative decoding, vLLM's JSON: `{"method": "ngram",
    /// "num_speculative_tokens": K, "prompt_lookup_min": N, "prompt_lookup_max": M}`
    /// (K 1–8 drafts per step; n-grams of N..M tokens, default 2..5, one
    /// given: both), or `{"method": "mtp", "num_speculative_tokens": K}`:
    /// the checkpoint's MTP head drafts (Qwen3.5 / 3.6 / Qwen3-Next; its
    /// weights, KV layer and buffers are planned). Greedy and seeded output
    /// are unchanged, only faster where drafts hold; `plan` prints what it
    /// costs. "ngram" and "mtp" are served [profile: `speculative_config`;
    /// default off].
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
    /// Hybrid models: element type of the recurrent-state pool, `f32` or
    /// `bf16` (half the bytes; the recurrence still computes in f32)
    /// [profile: `state_dtype`; default f32].
    #[arg(long, value_name = "DTYPE", value_parser = parse_state_dtype)]
    pub state_dtype: Option<StateDtype>,
    /// vLLM's flag, refused (exit 2): on unified memory the GPU's memory is
    /// the host's, so a fraction of it is no budget; use --kv-cache SIZE.
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f64>,
    /// Name served in /v1/models [profile: `[model] name`; default the
    /// folder name]; several (vLLM's form): the first is reported, requests
    /// may name any. The list takes every word up to the next flag, so a
    /// positional MODEL goes before it (as with vLLM).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// serve: address to listen on: an IPv4 or IPv6 address (`::1`, `[::1]`),
    /// `localhost` or a host name (resolved). Anything but loopback needs an
    /// API key (or `--insecure-no-api-key`).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// serve: port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// serve: the API key every route but /health and /ready requires
    /// (visible to `ps`: prefer --api-key-file or $SPARKRT_API_KEY).
    #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// serve: file holding the API key [default: $SPARKRT_API_KEY if set].
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
}

/// The environment variable `serve` reads the API key from when neither
/// `--api-key` nor `--api-key-file` is given.
pub const API_KEY_ENV: &str = "SPARKRT_API_KEY";

impl ServingArgs {
    /// The profile overrides these flags make.
    pub fn overrides(&self) -> Result<ServingOverrides> {
        if let Some(fraction) = self.gpu_memory_utilization {
            bail!(
                "--gpu-memory-utilization {fraction} is refused: on unified memory the GPU's \
                 memory is the host's, shared with the OS, the page cache and the kubelet, so a \
                 fraction of it is no budget. The plan budgets from MemAvailable less the \
                 eviction threshold and reserves; cap the KV cache with --kv-cache SIZE, or raise \
                 [host] os_reserve / safety_margin in a profile"
            );
        }
        Ok(ServingOverrides {
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            dp_size: self.dp_size,
            kv_cache_dtype: self.kv_cache_dtype,
            kv_cache: self.kv_cache,
            enable_prefix_caching: if self.no_prefix_caching {
                Some(false)
            } else {
                self.enable_prefix_caching.then_some(true)
            },
            state_snapshots: self.state_snapshots,
            state_snapshot_interval: self.state_snapshot_interval,
            speculative: match &self.speculative_config {
                Some(json) => Some(
                    SpeculativeConfig::from_json(json)
                        .map_err(|e| anyhow::anyhow!("--speculative-config: {e}"))?,
                ),
                None => None,
            },
            state_dtype: self.state_dtype,
            name: self.served_model_name.first().cloned(),
        })
    }

    /// The API key: `--api-key`, else `--api-key-file`, else $SPARKRT_API_KEY.
    pub fn api_key(&self) -> Result<Option<String>> {
        let (key, from) = if let Some(key) = &self.api_key {
            (key.trim().to_string(), "--api-key".to_string())
        } else if let Some(path) = &self.api_key_file {
            let text = crate::util::files::read_regular_to_string(
                path,
                crate::limits::MAX_SMALL_FILE_BYTES,
            )
            .with_context(|| format!("reading the API key file {}", path.display()))?;
            (
                text.trim().to_string(),
                format!("the API key file {}", path.display()),
            )
        } else {
            match std::env::var(API_KEY_ENV) {
                Ok(key) => (key.trim().to_string(), format!("${API_KEY_ENV}")),
                Err(std::env::VarError::NotPresent) => return Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => {
                    bail!("${API_KEY_ENV} is not valid UTF-8")
                }
            }
        };
        if key.is_empty() {
            bail!("{from} is empty");
        }
        Ok(Some(key))
    }
}

fn parse_kv_dtype(text: &str) -> Result<KvCacheDtype, String> {
    match text {
        "bf16" => Ok(KvCacheDtype::Bf16),
        "f32" => Ok(KvCacheDtype::F32),
        // vLLM's name for the same E4M3 cache.
        "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8),
        "fp8_e5m2" => Err(format!(
            "{text:?} is not supported: the FP8 KV cache is E4M3 (fp8 or fp8_e4m3)"
        )),
        other => Err(format!(
            "{other:?} is not a KV cache dtype: bf16, f32 or fp8 (fp8_e4m3)"
        )),
    }
}

fn parse_state_dtype(text: &str) -> Result<StateDtype, String> {
    match text {
        "bf16" => Ok(StateDtype::Bf16),
        "f32" => Ok(StateDtype::F32),
        other => Err(format!(
            "{other:?} is not a recurrent-state dtype: f32 or bf16"
        )),
    }
}

fn parse_kv_cache(text: &str) -> Result<KvCacheSize, String> {
    if text == "auto" {
        return Ok(KvCacheSize::Auto);
    }
    crate::units::parse_bytes(text)
        .map(KvCacheSize::Bytes)
        .map_err(|e| format!("{e} (a size such as 24GiB, or auto)"))
}

/// Sets rayon's global pool to `threads` (once per process). More threads
/// than the cores this process may use (`available_parallelism`: CPU
/// affinity and cgroup quota) are refused, not started: they would only
/// contend, and 100000 of them take the host's thread and memory budget.
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if n > cores {
            bail!(
                "--threads {n} is above the limit of {cores}: the cores available to this process"
            );
        }
        // Only the first call in a process sets the pool; later ones are moot.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    Ok(())
}

/// A temporary folder removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// With `--load-format dummy`, writes random weights like `dir`'s and
/// returns their folder (removed when the guard drops).
pub fn dummy_if_asked(args: &ModelArgs, dir: &Path) -> Result<(PathBuf, Option<TempDir>)> {
    if args.load_format == LoadFormat::Auto {
        return Ok((dir.to_path_buf(), None));
    }
    let config = crate::checkpoint::config::ModelConfig::load(dir)?;
    let out = std::env::temp_dir().join(format!("sparkrt-dummy-{}", std::process::id()));
    let guard = TempDir(out.clone());
    let bar = super::progress_bar("writing random weights");
    crate::checkpoint::synthetic::write_checkpoint(
        dir,
        &config,
        &out,
        1,
        0x5eed,
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    bar.finish_and_clear();
    Ok((out, Some(guard)))
}
