//! `sparkrt make-checkpoint`: a random checkpoint with a real model's
//! geometry, written as a real folder (benchmarks; other engines can read it);
//! or, with `--script`, a tiny model whose greedy output is a chosen token
//! sequence (`checkpoint::scripted`: end-to-end tests of the output parsers).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::checkpoint::config::ModelConfig;

#[derive(Debug, clap::Args)]
pub struct MakeCheckpointArgs {
    /// Folder whose config.json (and tokenizer files, if any) to copy.
    #[arg(long, value_name = "DIR", required_unless_present = "script")]
    pub like: Option<PathBuf>,
    /// A script (JSON: family, chat_template_file, output tokens) to build a
    /// scripted checkpoint from instead (see `checkpoint::scripted`).
    #[arg(long, value_name = "FILE", conflicts_with = "like")]
    pub script: Option<PathBuf>,
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
    if let Some(script) = &args.script {
        let (script, template) = crate::checkpoint::scripted::read_script(script)?;
        let built = crate::checkpoint::scripted::write_scripted(&script, &template, &args.out)?;
        eprintln!(
            "wrote {} (output ids {:?}, markers {:?})",
            args.out.display(),
            built.output_ids,
            built.markers
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(like) = &args.like else {
        bail!("give --like DIR or --script FILE");
    };
    let config = ModelConfig::load(like)?;
    let bar = super::progress_bar("writing random weights");
    crate::checkpoint::synthetic::write_checkpoint(
        like,
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
