//! `sparkrt make-checkpoint`: a random checkpoint with a real model's
//! geometry, written as a real folder (benchmarks; other engines can read it).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::checkpoint::config::ModelConfig;

#[derive(Debug, clap::Args)]
pub struct MakeCheckpointArgs {
    /// Folder whose config.json (and tokenizer files, if any) to copy.
    #[arg(long, value_name = "DIR")]
    pub like: PathBuf,
    /// Folder to write (created; must be empty or absent).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of safetensors shards (an index is written when more than one).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

pub fn run(args: &MakeCheckpointArgs) -> Result<ExitCode> {
    if args.shards == 0 {
        bail!("--shards must be at least 1");
    }
    if args.out.exists() && std::fs::read_dir(&args.out)?.next().is_some() {
        bail!("{} is not empty", args.out.display());
    }
    let config = ModelConfig::load(&args.like)?;
    let bar = super::progress_bar("writing random weights");
    crate::checkpoint::synthetic::write_checkpoint(
        &args.like,
        &config,
        &args.out,
        args.shards,
        args.seed,
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    bar.finish_and_clear();
    eprintln!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
