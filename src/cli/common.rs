//! Flags and steps several subcommands share: which model and where it runs
//! (`generate`, `bench`, `serve`), and which host to read (`probe`, `plan`,
//! `k8s`, `top`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{load_profile, model_dir};
use crate::geometry::Architecture;
use crate::host::HostReading;
use crate::plan::profile::{DeviceKind, KubeletMode, Profile};
use crate::runtime::{DeviceOptions, HostSource};
use crate::text::Tokenizer;
use crate::text::parsers::{OutputParsers, ParserNames, ReasoningParserName, ToolParserName};

/// The profile used when neither `--model` nor `--profile` is given: the
/// tiny reference model in tests/fixtures.
pub const DEFAULT_PROFILE: &str = "qwen3-moe-tiny";

#[derive(Debug, clap::Args)]
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
}

/// How chat answers are parsed into reasoning and tool calls (`serve`), by
/// vLLM's flag names and parser names.
#[derive(Debug, Default, clap::Args)]
pub struct ParserArgs {
    /// Reasoning parser: qwen3, openai_gptoss or none [default: by the
    /// model's family: qwen3_moe → qwen3, gpt_oss → openai_gptoss].
    #[arg(long, value_name = "NAME")]
    pub reasoning_parser: Option<ReasoningParserName>,
    /// Tool-call parser: hermes, openai_gptoss (or openai) or none
    /// [default: by the model's family: qwen3_moe → hermes, gpt_oss →
    /// openai_gptoss].
    #[arg(long, value_name = "NAME")]
    pub tool_call_parser: Option<ToolParserName>,
}

impl ParserArgs {
    /// The parsers for a model of `architecture`, checked against its
    /// tokenizer.
    pub fn output_parsers(
        &self,
        architecture: Architecture,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<OutputParsers> {
        let names = ParserNames::for_model(
            Some(architecture),
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
        }
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

/// The checkpoint folder and profile `args` name.
pub fn resolve(args: &ModelArgs) -> Result<(PathBuf, Option<Profile>)> {
    let (profile, profile_path) = match (&args.profile, &args.model) {
        (Some(name), _) => {
            let (p, path) = load_profile(name)?;
            (Some(p), Some(path))
        }
        (None, None) => {
            let (p, path) = load_profile(DEFAULT_PROFILE)?;
            (Some(p), Some(path))
        }
        (None, Some(_)) => (None, None),
    };
    let dir = match (&profile, &profile_path) {
        (Some(p), Some(path)) => model_dir(args.model.as_deref(), p, path),
        _ => args.model.clone(),
    }
    .context("no checkpoint: pass --model DIR or a profile with model.path")?;
    Ok((dir, profile))
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
