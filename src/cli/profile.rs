//! `sparkrt profile init`: a commented profile written from a checkpoint's
//! config.json, for a kind of box.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::checkpoint::config::ModelConfig;
use crate::plan::profile::ServingSection;

#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    #[command(subcommand)]
    pub command: ProfileCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum ProfileCommand {
    /// Write a commented profile for the checkpoint in --model.
    Init(InitArgs),
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Checkpoint folder whose config.json gives the geometry.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// The kind of box the serving limits and reserves are for.
    #[arg(long = "box", value_enum, default_value = "generic")]
    pub target: BoxKind,
    /// Write here instead of stdout (an existing file is not overwritten).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `--box`: serving limits and host reserves by kind of machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BoxKind {
    /// The built-in defaults: modest limits for any machine.
    Generic,
    /// A DGX Spark (GB10, 128 GB unified memory), as the shipped profiles.
    Gb10,
}

pub fn run(args: &ProfileArgs) -> Result<ExitCode> {
    let ProfileCommand::Init(init) = &args.command;
    let text = init_profile(init)?;
    match &init.out {
        None => print!("{text}"),
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("sparkrt: wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The profile text for `args`.
pub fn init_profile(args: &InitArgs) -> Result<String> {
    let config = ModelConfig::load(&args.model)?;
    let dir = std::fs::canonicalize(&args.model)
        .with_context(|| format!("resolving {}", args.model.display()))?;
    let Some(dir_text) = dir.to_str() else {
        bail!("{} is not valid UTF-8", dir.display());
    };
    let name = dir
        .file_name()
        .map_or("model".to_string(), |n| n.to_string_lossy().into_owned());
    let geometry = toml::to_string(&config.geometry).context("writing the geometry")?;
    let (serving, os_reserve, safety_margin, what) = match args.target {
        BoxKind::Generic => (ServingSection::default(), "2GiB", "1GiB", "any machine"),
        BoxKind::Gb10 => (
            ServingSection {
                max_model_len: 32768,
                max_num_seqs: 16,
                max_num_batched_tokens: 8192,
                ..ServingSection::default()
            },
            "4GiB",
            "2GiB",
            "a DGX Spark (GB10, ~121.7 GiB MemTotal shared by CPU, GPU, page cache and kubelet)",
        ),
    };
    let s = &serving;
    Ok(format!(
        r#"# sparkrt profile for {name} on {what}.
# Written by `sparkrt profile init` from {dir_text}/config.json.
# Every section and key is optional: a missing one takes the value in its
# comment (or, for [model], the checkpoint's config.json when the checkpoint
# is at hand). Flags such as --max-model-len override [serving].

[model]
name = {name:?}
# Checkpoint folder (relative paths are relative to this file); --model overrides it.
path = {dir_text:?}
# The geometry, from config.json. Optional when the checkpoint is at hand
# (a value that disagrees with config.json is an error); needed to plan
# before the checkpoint is downloaded.
{geometry}
[serving]
# Longest sequence, prompt and output, in tokens (default 4096).
max_model_len = {}
# Sequences run at once (default 8).
max_num_seqs = {}
# Tokens one engine step takes (default max(512, max_num_seqs)).
max_num_batched_tokens = {}
# Data-parallel ranks the MoE workspace is sized for (default 1).
dp_size = {}
# bf16 or f32 (default bf16).
kv_cache_dtype = "{}"
# "auto": what remains after weights, workspace, activations and overhead,
# capped at max_num_seqs × max_model_len tokens; or a size such as "24GiB".
kv_cache = "auto"
# Tokens per KV block (default 16).
kv_block_size = {}

[host]
# Kept free for the OS, sshd and page-cache churn (default 2GiB).
os_reserve = "{os_reserve}"
# Kept free on top of every other reserve (default 1GiB).
safety_margin = "{safety_margin}"
# "auto": the kubelet's reservations if the host has one; "none" (default auto).
kubelet = "auto"

[backend]
# auto (CUDA when a usable GPU is present, else the CPU), cpu or cuda (default auto).
device = "auto"
"#,
        s.max_model_len,
        s.max_num_seqs,
        s.max_num_batched_tokens,
        s.dp_size,
        s.kv_cache_dtype.name(),
        s.kv_block_size,
    ))
}
